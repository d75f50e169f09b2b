package hybrid_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// outageRun drives one hot key far over its limit from a fleet while
// Redis freezes (SIGSTOP) from freezeAt to thawAt after the start, and
// returns what the fleet admitted per window (from each decision's
// ResetAfter) with the windows the freeze began and ended in, and what the
// documented bound allows past Rate in each window given what the
// instances knew (see outageResult.slack).
type outageRun struct {
	instances int
	opts      []hybrid.Option
	limit     ratelimit.Limit
	freezeAt  time.Duration // after the start of a window
	freezeFor time.Duration
	runFor    time.Duration
	// through the fault proxy instead of SIGSTOP: hold (requests held,
	// delivered when it resumes, replies after recovery) or lose (replies
	// lost, the commands applied)
	proxy string
}

// outageResult is what an outageRun saw.
type outageResult struct {
	perWin            map[int64]int // admitted per window
	frozeIn, thawedIn int64         // the windows Redis froze and thawed in
	slack             map[int64]int // what the documented bound allows past Rate, per window
	frozenShares      []int64       // each instance's credit budget in the window Redis froze in, read as it froze
	alone             []string      // breaker openings while Redis answered the others
}

func (o outageRun) run(t *testing.T) (res outageResult) {
	t.Helper()
	srv := redistest.Standalone(t)
	direct := srv.Client()
	defer direct.Close()
	prefix := uniq(t)
	var ls []ratelimit.Limiter
	var hs []*hybrid.Limiter
	addr := srv.Addr()
	var proxy *faultproxy.Proxy
	if o.proxy != "" {
		var err error
		proxy, err = faultproxy.New(srv.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { proxy.Close() })
		addr = proxy.Addr()
	}
	events := make([]*eventLog, o.instances)
	for i := 0; i < o.instances; i++ {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		events[i] = &eventLog{}
		h, err := hybrid.New(c, o.limit, append([]hybrid.Option{hybrid.WithPrefix(prefix), hybrid.WithObserver(events[i].add)}, o.opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		ls, hs = append(ls, h), append(hs, h)
	}
	// Start at a window's start.
	_, left := serverWindow(t, direct, o.limit.Period)
	time.Sleep(left + 2*time.Millisecond)
	start := time.Now()
	p := o.limit.Period.Microseconds()
	frozeIn := start.Add(o.freezeAt).UnixMicro() / p
	thawedIn := start.Add(o.freezeAt+o.freezeFor).UnixMicro() / p
	shares := make([]int64, len(hs))
	frozeAt := make(chan time.Time, 1)
	go func() {
		time.Sleep(o.freezeAt)
		// What each instance knows of the window as Redis goes away: its
		// credit budget there (knowledge only ever shrinks it).
		for i, h := range hs {
			shares[i] = hybrid.CreditShare(h, "k")
		}
		frozeAt <- time.Now()
		switch o.proxy {
		case "hold":
			proxy.Block(true)
		case "lose":
			proxy.DropReplies(1 << 30)
		default:
			require.NoError(t, srv.Freeze())
		}
		time.Sleep(o.freezeFor)
		switch o.proxy {
		case "hold":
			proxy.Block(false)
		case "lose":
			proxy.DropReplies(0)
		default:
			require.NoError(t, srv.Thaw())
		}
	}()
	tl := newTally(o.limit.Period)
	hammerRandom(t, ls, []string{"k"}, 4, o.runFor, tl, nil)
	_, all := tl.windows("k", start, time.Now())
	res = outageResult{perWin: all, frozeIn: frozeIn, thawedIn: thawedIn, frozenShares: shares, slack: map[int64]int{}}
	froze := <-frozeAt
	thawed := start.Add(o.freezeAt + o.freezeFor)
	// The bound (docs/failure-modes.md, "The outage bound") in the window
	// Redis went away in is Rate - F + F_1/N + ... + F_N/N: past Rate by at
	// most each instance's budget there (F_i/N, its last news of the
	// remainder shared; 0 when it knew the window spent, as a key driven far
	// over its limit mostly is; stale news of a remainder taken meanwhile by
	// others, on a busy host, counts). And an instance whose breaker opened
	// while Redis answered the others (a host so busy its calls time out) is
	// cut off alone: it admits its budget, up to Rate / instances, in each
	// window its breaker is open in, on top of what Redis grants the others.
	for i, h := range hs {
		own := map[int64]int{frozeIn: int(max(0, shares[i]))}
		per := o.limit.Rate / max(1, h.Stats().Instances)
		for _, iv := range events[i].openings(time.Now()) {
			if !iv[0].Before(froze) && !iv[0].After(thawed) {
				continue // opened with the freeze: the fleet's outage
			}
			res.alone = append(res.alone, fmt.Sprintf("instance %d %v..%v", i, iv[0].Sub(froze).Round(time.Millisecond), iv[1].Sub(froze).Round(time.Millisecond)))
			const margin = 50 * time.Millisecond // the instance's estimate of Redis time
			for w := iv[0].Add(-margin).UnixMicro() / p; w <= iv[1].Add(margin).UnixMicro()/p; w++ {
				own[w] = max(own[w], per)
			}
		}
		for w, n := range own {
			res.slack[w] += n
		}
	}
	var idx []int64
	for i := range all {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
	var b strings.Builder
	for _, i := range idx {
		mark := ""
		switch {
		case i == frozeIn && i == thawedIn:
			mark = " (froze and thawed)"
		case i == frozeIn:
			mark = " (froze)"
		case i == thawedIn:
			mark = " (thawed)"
		case i > frozeIn && i < thawedIn:
			mark = " (frozen)"
		}
		fmt.Fprintf(&b, " w%d:%d%s", i-idx[0], all[i], mark)
	}
	s := sumStats(hs)
	t.Logf("admitted per window:%s; fallback %d, no reply %d, degraded now %v", b.String(), s.Fallback, s.NoReply, s.Degraded)
	for i, h := range hs {
		x := h.Stats()
		t.Logf("instance %d: allowed %d leased %d refunded %d exact %d reported %d fallback %d; credit budget as Redis froze %d; breaker (from the freeze): %s", i, x.Allowed, x.LeasedUnits, x.Refunded, x.ExactDecisions, x.Reported, x.Fallback, shares[i], events[i].since(froze))
	}
	if len(res.alone) > 0 {
		t.Logf("breakers open while Redis answered the others: %s", strings.Join(res.alone, ", "))
	}
	return res
}

// eventLog records a Limiter's breaker events.
type eventLog struct {
	mu sync.Mutex
	ev []hybrid.Event
}

func (e *eventLog) add(ev hybrid.Event) {
	if ev.Kind == hybrid.EventFlushError {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ev = append(e.ev, ev)
}

// openings returns the intervals the breaker was open in, the last one
// ending at now if it is still open.
func (e *eventLog) openings(now time.Time) [][2]time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out [][2]time.Time
	for _, ev := range e.ev {
		switch {
		case ev.Kind == hybrid.EventDegraded:
			out = append(out, [2]time.Time{ev.Time, now})
		case ev.Kind == hybrid.EventRecovered && len(out) > 0:
			out[len(out)-1][1] = ev.Time
		}
	}
	return out
}

// since lists the breaker's openings and closings, each at its time
// relative to t0.
func (e *eventLog) since(t0 time.Time) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for _, ev := range e.ev {
		fmt.Fprintf(&b, " %s@%v", ev.Kind, ev.Time.Sub(t0).Round(time.Millisecond))
	}
	return b.String()
}

// An outage never lets a window pass the limit, the window where Redis
// comes back included: a hot key far over its limit, a fleet of 1, 2 and 8
// instances, Redis frozen (SIGSTOP) across window boundaries and within
// one window, and through the fault proxy: requests held and delivered
// late (their replies after recovery), replies lost. While Redis is away each instance admits on credit within
// its budget (FailLocal, the default: the window's last-known remainder
// shared by the instances); when it is back, what the instances admitted
// locally is charged to the window before anything more is granted in it
// (afterOutage), whatever order the reports and grants come in. Strict:
// never over Rate in any window; optimistic: within its stated bound,
// Rate + Rate / 8.
func TestOutageRecoveryBound(t *testing.T) {
	spanning := func(o outageRun) outageRun { // 1s windows, frozen 2.6s from mid-window
		o.limit.Period, o.freezeAt, o.freezeFor, o.runFor = time.Second, 1400*time.Millisecond, 2600*time.Millisecond, 5*time.Second
		return o
	}
	inside := func(o outageRun) outageRun { // 4s windows, frozen 2.8s within one
		o.limit.Period, o.freezeAt, o.freezeFor, o.runFor = 4*time.Second, 4400*time.Millisecond, 2800*time.Millisecond, 9*time.Second
		return o
	}
	fast := hybrid.WithTimeout(100 * time.Millisecond) // the breaker opens within a second
	cases := []struct {
		name string
		o    outageRun
		over int // what a window may admit past Rate
	}{
		{"1 instance, learned/spanning", spanning(outageRun{instances: 1, opts: []hybrid.Option{fast}}), 0},
		{"1 instance, learned/inside", inside(outageRun{instances: 1, opts: []hybrid.Option{fast}}), 0},
		{"2 instances, defaults/spanning", spanning(outageRun{instances: 2, opts: []hybrid.Option{hybrid.WithInstances(2)}}), 0},
		{"8 instances/spanning", spanning(outageRun{instances: 8, opts: []hybrid.Option{fast}}), 0},
		{"8 instances/inside", inside(outageRun{instances: 8, opts: []hybrid.Option{fast}}), 0},
		{"2 instances, SlidingWindow/spanning", spanning(outageRun{instances: 2, opts: []hybrid.Option{fast, hybrid.WithAlgorithm(ratelimit.SlidingWindow)}}), 0},
		{"2 instances, optimistic/spanning", spanning(outageRun{instances: 2, opts: []hybrid.Option{fast, hybrid.WithMode(hybrid.Optimistic)}}), 1000 / 8},
		{"2 instances, held then delivered/spanning", spanning(outageRun{instances: 2, opts: []hybrid.Option{fast}, proxy: "hold"}), 0},
		{"2 instances, replies lost/spanning", spanning(outageRun{instances: 2, opts: []hybrid.Option{fast}, proxy: "lose"}), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.o.limit.Rate = 1000
			r := c.o.run(t)
			for idx, n := range r.perWin {
				require.LessOrEqual(t, n, c.o.limit.Rate+c.over+r.slack[idx], "window %d (froze in %d, thawed in %d): Rate + %d + the instances' budgets %d",
					idx, r.frozeIn, r.thawedIn, c.over, r.slack[idx])
			}
			require.Greater(t, r.perWin[r.thawedIn], 0, "the window where Redis came back admits")
		})
	}
}

// The buckets through a Redis freeze: at every admission the fleet has
// admitted at most Burst + Rate x elapsed, and one period's Rate more (the
// instances' local budgets are per period of their own clocks, which do
// not start together), whatever order the reports and grants come in
// once Redis is back.
func TestOutageRecoveryBucket(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			srv := redistest.Standalone(t)
			lim := ratelimit.Limit{Rate: 1000, Period: time.Second, Burst: 500}
			_, ls := fleet(t, 4, func() redis.UniversalClient { return srv.Client() }, lim,
				hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(alg), hybrid.WithInstances(4), hybrid.WithTimeout(100*time.Millisecond))
			go func() {
				time.Sleep(1400 * time.Millisecond)
				require.NoError(t, srv.Freeze())
				time.Sleep(2600 * time.Millisecond)
				require.NoError(t, srv.Thaw())
			}()
			const d = 5 * time.Second
			_, at := bucketRun(t, ls, 4, d)
			for i, e := range at {
				allow := float64(lim.Burst) + float64(lim.Rate)*(e.Seconds()+1)
				require.LessOrEqual(t, float64(i+1), allow, "admission %d at %v: over Burst + Rate x (elapsed + a period)", i+1, e)
			}
			t.Logf("admitted %d in %v (Burst + Rate x elapsed: %d)", len(at), d, lim.Burst+int(lim.Rate*int(d.Seconds())))
		})
	}
}
