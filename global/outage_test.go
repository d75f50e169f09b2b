package global_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/hybridlimit/ratelimit/local"
)

// An outage never lets a window of a FailLocal limiter pass the limit: a
// hot key far over 1,000 per second from 1, 2 and 8 instances, each with
// a local fallback of its share (Rate / instances) and told the fleet size
// (WithInstances), Redis frozen (SIGSTOP) across window boundaries, and
// within one window; and through the fault proxy, requests held and
// delivered late, and replies lost. Counted per window from each admission's ResetAfter,
// no window admits more than Rate: the window the outage begins in gets
// its last-known remainder shared by the instances, one that begins during
// it the instances' shares, and the window Redis comes back in stays
// within what the instances had left (their local admissions charged to
// Redis before their next decision there). An instance cut off alone
// before the outage (its calls timing out on a busy host while Redis
// answers the others) admits its budget, at most Rate / instances, on top
// of the others' grants (docs/failure-modes.md): a window may pass Rate
// by what such instances admitted on credit, which is checked to be
// within that budget.
func TestOutageRecoveryFailLocal(t *testing.T) {
	for _, c := range []struct {
		name      string
		instances int
		alg       ratelimit.Algorithm
		period    time.Duration
		freezeAt  time.Duration
		freezeFor time.Duration
	}{
		{"1 instance, across windows", 1, ratelimit.FixedWindow, time.Second, 1400 * time.Millisecond, 2600 * time.Millisecond},
		{"2 instances, across windows", 2, ratelimit.FixedWindow, time.Second, 1400 * time.Millisecond, 2600 * time.Millisecond},
		{"8 instances, across windows", 8, ratelimit.FixedWindow, time.Second, 1400 * time.Millisecond, 2600 * time.Millisecond},
		{"2 instances, within a window", 2, ratelimit.FixedWindow, 3 * time.Second, 3400 * time.Millisecond, 1800 * time.Millisecond},
		{"2 instances, SlidingWindow", 2, ratelimit.SlidingWindow, time.Second, 1400 * time.Millisecond, 2600 * time.Millisecond},
		// Through the fault proxy: requests held and delivered when it
		// resumes, their replies arriving after recovery.
		{"2 instances, held then delivered", 2, ratelimit.FixedWindow, time.Second, 1400 * time.Millisecond, 2600 * time.Millisecond},
		// Replies lost (the commands ran), connections closed with them.
		{"2 instances, replies lost", 2, ratelimit.FixedWindow, time.Second, 1400 * time.Millisecond, 2600 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			limit := ratelimit.Limit{Rate: 1000, Period: c.period}
			f := freeze
			switch {
			case strings.Contains(c.name, "held"):
				f = hold
			case strings.Contains(c.name, "lost"):
				f = loseReplies
			}
			var mu gosync.Mutex
			dropped := map[int64]int64{} // per window: admitted locally, never charged
			r := outageRun(t, c.instances, []time.Duration{limit.Period}, func(rc redis.UniversalClient, prefix string) ratelimit.Limiter {
				share := limit
				share.Rate = limit.Rate / c.instances
				fb, err := local.New(share, local.WithAlgorithm(c.alg))
				require.NoError(t, err)
				l, err := global.New(rc, limit, global.WithPrefix(prefix), global.WithAlgorithm(c.alg),
					global.WithFailureMode(ratelimit.FailLocal), global.WithFallback(credited{fb}), global.WithInstances(c.instances))
				require.NoError(t, err)
				global.OnDroppedDebt(l, func(win, units int64) {
					mu.Lock()
					dropped[win] += units
					mu.Unlock()
				})
				return l
			}, f, c.freezeAt, c.freezeFor, 5*time.Second+c.period)
			perWin, thawed := r.perWin[0], r.thawed[0]
			r.requireBound(t, 0, limit.Rate, c.instances)
			require.Greater(t, perWin[thawed], 0, "the window Redis came back in admitted")
			if c.alg == ratelimit.SlidingWindow {
				// What the instances admitted locally in the window Redis
				// came back in is charged to it there, as in a
				// FixedWindow: Redis counts every admission of the window
				// (and more: calls it ran whose replies came too late)
				// but what an instance still cut off when the window
				// ended could not charge, and the next window weighs
				// them all.
				n, err := r.client.Get(context.Background(), r.prefix+":{k}:"+script.Kind(c.alg, limit)+":"+strconv.FormatInt(thawed, 10)).Int()
				require.NoError(t, err)
				mu.Lock()
				lost := int(dropped[thawed])
				mu.Unlock()
				t.Logf("Redis counts %d in the window it came back in, %d admitted, %d never charged", n, perWin[thawed], lost)
				require.GreaterOrEqual(t, n+lost, perWin[thawed], "window %d: admissions not charged to Redis", thawed)
			}
		})
	}
}

// global.Multi under FailLocal keeps each limit's outage bound: a Multi of
// 1,000 per second (FixedWindow) and 5,000 per minute (SlidingWindow), a
// hot key driven far over both from 1 and 2 instances, each with a
// local.Multi fallback of its share of each limit and told the fleet size,
// Redis frozen (SIGSTOP) for 2.6s across windows. Counted per window of
// each limit from each admission's Limits[i].ResetAfter, no window of
// either limit passes its Rate: each limit's window gets its last-known
// remainder shared by the instances, what they admitted locally is charged
// to every limit in Redis, and a window the outage touched stays within
// the budgets after it (the minute, all of the run). The fleet still
// admits while Redis is away.
func TestOutageRecoveryFailLocalMulti(t *testing.T) {
	limits := []ratelimit.Limit{ratelimit.PerSecond(1000), ratelimit.PerMinute(5000)}
	algs := []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow}
	for _, instances := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d instances", instances), func(t *testing.T) {
			r := outageRun(t, instances, []time.Duration{time.Second, time.Minute}, func(rc redis.UniversalClient, prefix string) ratelimit.Limiter {
				shares := append([]ratelimit.Limit(nil), limits...)
				for i := range shares {
					shares[i].Rate /= instances
				}
				fb, err := local.NewMulti(shares, local.WithAlgorithms(algs...))
				require.NoError(t, err)
				m, err := global.NewMulti(rc, limits, global.WithPrefix(prefix), global.WithAlgorithms(algs...),
					global.WithFailureMode(ratelimit.FailLocal), global.WithFallback(creditedMulti{fb}), global.WithInstances(instances))
				require.NoError(t, err)
				return m
			}, freeze, 1400*time.Millisecond, 2600*time.Millisecond, 6*time.Second)
			for i, l := range limits {
				r.requireBound(t, i, l.Rate, instances)
			}
			during := 0
			for idx := r.froze[0] + 1; idx < r.thawed[0]; idx++ {
				during += r.perWin[0][idx]
			}
			require.Positive(t, during, "the fleet admitted while Redis was away")
		})
	}
}

// outage is how Redis goes away and comes back: start and stop, and
// whether the limiters reach it through the fault proxy.
type outage struct {
	proxy       bool
	start, stop func(*redistest.Server, *faultproxy.Proxy) error
}

var (
	freeze = outage{start: func(s *redistest.Server, _ *faultproxy.Proxy) error { return s.Freeze() },
		stop: func(s *redistest.Server, _ *faultproxy.Proxy) error { return s.Thaw() }}
	hold = outage{proxy: true, start: func(_ *redistest.Server, p *faultproxy.Proxy) error { p.Block(true); return nil },
		stop: func(_ *redistest.Server, p *faultproxy.Proxy) error { p.Block(false); return nil }}
	loseReplies = outage{proxy: true, start: func(_ *redistest.Server, p *faultproxy.Proxy) error { p.DropReplies(1 << 30); return nil },
		stop: func(_ *redistest.Server, p *faultproxy.Proxy) error { p.DropReplies(0); return nil }}
)

// outageResult is what an outageRun saw, limit by limit: what the fleet
// admitted per window, the windows the outage began and ended in; and
// Redis itself, and the limiters' prefix, to look at their state.
type outageResult struct {
	perWin        []map[int64]int
	froze, thawed []int64
	client        redis.UniversalClient
	prefix        string

	// Per limit and window, what instances cut off alone admitted on
	// credit (their fallback limiters, marked through credited) before
	// Redis went away for all: in all, and the most by one instance.
	// docs/failure-modes.md, "The outage bound": an instance whose calls
	// time out while Redis answers the others (a host so loaded, as
	// under -race beside other work) admits its budget, at most
	// Rate / instances, on top of what Redis grants the rest of the
	// fleet, until its credit is charged.
	alone, aloneMost []map[int64]int
}

// requireBound checks the outage bound of limit i, of rate events per
// window, shared by instances: no window admitted more than rate, but for
// what instances cut off alone admitted on credit, and none of them more
// than its share, rate / instances, the most its budget can be.
func (r outageResult) requireBound(t *testing.T, i, rate, instances int) {
	t.Helper()
	for w, n := range r.aloneMost[i] {
		require.LessOrEqual(t, n, rate/instances, "limit %d, window %d: an instance cut off alone admitted past its share on credit", i, w)
	}
	for w, n := range r.perWin[i] {
		require.LessOrEqual(t, n, rate+r.alone[i][w], "limit %d, window %d (froze in %d, thawed in %d)", i, w, r.froze[i], r.thawed[i])
	}
}

// credited wraps a FailLocal fallback limiter: each admission it makes is
// marked on the flag its caller's context carries (creditFlag), so that
// outageRun tells admissions on credit from Redis' grants. creditedMulti
// is credited for a Multi's fallback, which global.Multi asks through
// AllowNInto.
type (
	credited      struct{ ratelimit.Limiter }
	creditedMulti struct{ ratelimit.MultiLimiter }
	creditFlag    struct{}
)

func (c credited) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	d, err := c.Limiter.AllowN(ctx, key, n)
	markCredit(ctx, d)
	return d, err
}

func (c creditedMulti) AllowNInto(ctx context.Context, key string, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	d, err := c.MultiLimiter.AllowNInto(ctx, key, n, states)
	markCredit(ctx, d)
	return d, err
}

func markCredit(ctx context.Context, d ratelimit.Decision) {
	if f, ok := ctx.Value(creditFlag{}).(*bool); ok && d.Allowed {
		*f = true
	}
}

// maxOutageWait is how long past its time an outageRun's outage may wait
// for every instance to know the window spent: three of the first limit's
// periods.
func maxOutageWait(periods []time.Duration) time.Duration { return 3 * periods[0] }

// outageRun hammers one key, "k", from instances FailLocal limiters made
// by mk (each given its own client and the one prefix), of limits of the
// given periods, while Redis goes away (f) from freezeAt after the first
// period's window's start (also a minute's, for a period of a minute), or
// once the fleet knows that window spent, for freezeFor, and returns what
// they admitted per window of each limit (a Limiter's Decision or a
// Multi's Limits, from ResetAfter).
func outageRun(t *testing.T, instances int, periods []time.Duration, mk func(redis.UniversalClient, string) ratelimit.Limiter, f outage, freezeAt, freezeFor, runFor time.Duration) outageResult {
	t.Helper()
	srv := redistest.Standalone(t)
	addr := srv.Addr()
	var proxy *faultproxy.Proxy
	if f.proxy {
		var err error
		proxy, err = faultproxy.New(srv.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { proxy.Close() })
		addr = proxy.Addr()
	}
	prefix := uniquePrefix(t)
	var ls []ratelimit.Limiter
	for i := 0; i < instances; i++ {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		ls = append(ls, mk(c, prefix))
	}
	r := outageResult{client: srv.Client(), prefix: prefix}
	t.Cleanup(func() { r.client.Close() })
	p := periods[0].Microseconds()
	for _, q := range periods {
		if q == time.Minute { // the whole run within one minute
			if now := time.Now(); now.Add(runFor+maxOutageWait(periods)+2*time.Second).Truncate(time.Minute) != now.Truncate(time.Minute) {
				time.Sleep(time.Until(now.Truncate(time.Minute).Add(time.Minute)))
			}
		}
	}
	now := time.Now().UnixMicro()
	time.Sleep(time.Duration((now/p+1)*p-now)*time.Microsecond + 2*time.Millisecond) // a window's start
	start := time.Now()
	for range periods {
		r.perWin = append(r.perWin, map[int64]int{})
	}
	// The outage begins at freezeAt, or later, once every instance has been
	// refused in the window (of the first limit) it begins in: the bound
	// holds when every instance knew the window's remainder lately
	// (docs/failure-modes.md, "Stale news"), and a hot key gives that only
	// once its window is spent. A host too slow to spend it by freezeAt
	// (seen under -race beside other work: 997 of 1,000 in a whole window)
	// has the outage wait, up to maxOutageWait, rather than begin on news
	// some instances' admissions have made stale. The run ends runFor
	// after the start the outage was meant to have.
	refused := make([]atomic.Int64, len(ls)) // per instance: the window of its last refusal
	for i := range refused {
		refused[i].Store(-1)
	}
	ready := func(now int64) bool {
		for i := range refused {
			if refused[i].Load() != now/p {
				return false
			}
		}
		pos, margin := now%p, int64(50_000)
		if freezeFor < periods[0] {
			return pos+freezeFor.Microseconds()+margin < p // thawed in the same window
		}
		return pos+margin < p
	}
	var stopAt, frozeAt, thawedAt atomic.Int64 // UnixMicro
	stopAt.Store(math.MaxInt64)
	go func() {
		time.Sleep(freezeAt)
		for !ready(time.Now().UnixMicro()) {
			if time.Since(start) > freezeAt+maxOutageWait(periods) {
				stopAt.Store(0) // not ready in time: outageRun fails
				return
			}
			time.Sleep(time.Millisecond)
		}
		frozeAt.Store(time.Now().UnixMicro())
		if err := f.start(srv, proxy); err != nil {
			t.Error(err)
		}
		time.Sleep(freezeFor)
		thawedAt.Store(time.Now().UnixMicro())
		if err := f.stop(srv, proxy); err != nil {
			t.Error(err)
		}
		stopAt.Store(frozeAt.Load() + (runFor - freezeAt).Microseconds())
	}()
	var mu gosync.Mutex
	var errs atomic.Int64
	var wg gosync.WaitGroup
	alone := make([][]map[int64]int, len(ls)) // per instance and limit
	for li, l := range ls {
		for range periods {
			alone[li] = append(alone[li], map[int64]int{})
		}
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var credit bool
				ctx := context.WithValue(context.Background(), creditFlag{}, &credit)
				for time.Now().UnixMicro() < stopAt.Load() {
					credit = false
					t0 := time.Now().UnixMicro()
					d, err := l.AllowN(ctx, "k", 1)
					t1 := time.Now().UnixMicro()
					if err != nil {
						errs.Add(1)
						continue
					}
					if !d.Allowed && t0/p == t1/p {
						refused[li].Store(t1 / p)
					}
					if d.Allowed {
						// The window the decider counted it in: the one
						// whose end is ResetAfter after it decided,
						// between t0 and t1, by its clock (Redis', or
						// the fallback's, anchored apart from the wall
						// clock); rounded to the nearest window's end,
						// which the call's duration and the clocks'
						// offset are far from reaching.
						mu.Lock()
						for i, q := range periods {
							reset := d.ResetAfter
							if ls := d.Limits(); ls != nil {
								reset = ls[i].ResetAfter
							}
							p := q.Microseconds()
							w := ((t0+t1)/2+reset.Microseconds()+p/2)/p - 1
							r.perWin[i][w]++
							if fa := frozeAt.Load(); credit && (fa == 0 || t1 < fa) {
								alone[li][i][w]++ // on credit, while Redis answered the fleet
							}
						}
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	require.NotZero(t, frozeAt.Load(), "the fleet did not spend a window of its hot key within %v of the outage's time: the host is too slow to test the bound", maxOutageWait(periods))
	for _, q := range periods {
		r.froze = append(r.froze, frozeAt.Load()/q.Microseconds())
		r.thawed = append(r.thawed, thawedAt.Load()/q.Microseconds())
	}
	for l := range periods {
		r.alone, r.aloneMost = append(r.alone, map[int64]int{}), append(r.aloneMost, map[int64]int{})
		for li := range ls {
			for w, n := range alone[li][l] {
				r.alone[l][w] += n
				r.aloneMost[l][w] = max(r.aloneMost[l][w], n)
			}
		}
	}
	var b strings.Builder
	for l, perWin := range r.perWin {
		if len(periods) > 1 {
			fmt.Fprintf(&b, "\n  limit %d (%v):", l, periods[l])
		}
		idx := make([]int64, 0, len(perWin))
		for i := range perWin {
			idx = append(idx, i)
		}
		sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
		froze, thawed := r.froze[l], r.thawed[l]
		for _, i := range idx {
			mark := ""
			switch {
			case i == froze && i == thawed:
				mark = " (froze and thawed)"
			case i == froze:
				mark = " (froze)"
			case i == thawed:
				mark = " (thawed)"
			case i > froze && i < thawed:
				mark = " (frozen)"
			}
			if n := r.alone[l][i]; n > 0 {
				mark += fmt.Sprintf(" (%d on credit, cut off alone)", n)
			}
			fmt.Fprintf(&b, " %d%s", perWin[i], mark)
		}
	}
	var fallback uint64
	for _, l := range ls {
		fallback += l.(interface{ FallbackDecisions() uint64 }).FallbackDecisions()
	}
	t.Logf("admitted per window:%s; fallback decisions %d, errors %d", b.String(), fallback, errs.Load())
	require.Zero(t, errs.Load())
	require.Positive(t, fallback)
	return r
}

// The buckets under FailLocal through a Redis freeze: 4 instances, each
// with a local bucket of a quarter of the rate and of the burst, a hot key
// driven far past 1,000 per second (burst 500), Redis frozen for 2.6s.
// What the instances admit locally is charged to the bucket in Redis when
// it is back, so at every admission the fleet has admitted at most the
// bucket's allowance, Burst + Rate x elapsed, plus one Burst more: the
// local buckets, full when the outage began.
func TestOutageRecoveryFailLocalBucket(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			const instances = 4
			srv := redistest.Standalone(t)
			limit := ratelimit.Limit{Rate: 1000, Period: time.Second, Burst: 500}
			prefix := uniquePrefix(t)
			var ls []*global.Limiter
			for i := 0; i < instances; i++ {
				c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
				t.Cleanup(func() { c.Close() })
				fb, err := local.New(ratelimit.Limit{Rate: limit.Rate / instances, Period: limit.Period, Burst: limit.Burst / instances}, local.WithAlgorithm(alg))
				require.NoError(t, err)
				l, err := global.New(c, limit, global.WithPrefix(prefix), global.WithAlgorithm(alg),
					global.WithFailureMode(ratelimit.FailLocal), global.WithFallback(fb), global.WithInstances(instances))
				require.NoError(t, err)
				ls = append(ls, l)
			}
			go func() {
				time.Sleep(1400 * time.Millisecond)
				if err := srv.Freeze(); err != nil {
					t.Error(err)
				}
				time.Sleep(2600 * time.Millisecond)
				if err := srv.Thaw(); err != nil {
					t.Error(err)
				}
			}()
			var mu gosync.Mutex
			var at []time.Duration
			var wg gosync.WaitGroup
			start := time.Now()
			stop := start.Add(5 * time.Second)
			for _, l := range ls {
				for w := 0; w < 4; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var mine []time.Duration
						for time.Now().Before(stop) {
							d, err := l.Allow(context.Background(), "b")
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								mine = append(mine, time.Since(start))
							}
						}
						mu.Lock()
						at = append(at, mine...)
						mu.Unlock()
					}()
				}
			}
			wg.Wait()
			sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
			var fallback uint64
			for _, l := range ls {
				fallback += l.FallbackDecisions()
			}
			worst := 0.0
			for i, e := range at {
				allow := 2*float64(limit.Burst) + float64(limit.Rate)*e.Seconds()
				worst = max(worst, float64(i+1)-(float64(limit.Burst)+float64(limit.Rate)*e.Seconds()))
				require.LessOrEqual(t, float64(i+1), allow, "admission %d at %v: over 2 x Burst + Rate x elapsed", i+1, e)
			}
			t.Logf("admitted %d in 5s (Burst + Rate x 5s = %d); most over Burst + Rate x elapsed: %.0f; fallback decisions %d",
				len(at), limit.Burst+5*limit.Rate, worst, fallback)
			require.Positive(t, fallback)
		})
	}
}
