package hybrid_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// tally counts allowed decisions per key and window. The window of a
// decision is read from the decision itself: the test and Redis share this
// machine's clock, and ResetAfter is the time to the end of the window the
// decision counted in, as the limiter saw it at some instant during the
// call. So the window's end lies between the call's start and its return,
// each plus ResetAfter: a window boundary within that span is the one
// (calls far shorter than a window), whatever the scheduler delayed.
type tally struct {
	period time.Duration
	// late, when not zero, makes the tally count only calls that began
	// and returned within the last late of one window, less lateMargin at
	// its start (on this machine's clock, which Redis shares): see
	// newLateTally.
	late   time.Duration
	mu     sync.Mutex
	perWin map[string]map[int64]int
}

// lateMargin is how far into the late part of a window a call must begin
// to be counted by a late tally: more than the hybrid's error bound on
// Redis time on loopback, so the call is late as the limiter sees it too.
const lateMargin = 20 * time.Millisecond

func newTally(p time.Duration) *tally {
	return &tally{period: p, perWin: map[string]map[int64]int{}}
}

// newLateTally returns a tally of the calls made in the last late of a
// window of period p. A SlidingWindow key whose previous window reached
// limit r admits its r-th unit of the current window only in the window's
// last p/r (its previous window's weight, rounded down, is then zero): a
// key-window asked r times in that part reaches the limit, one asked
// earlier need not.
func newLateTally(p, late time.Duration) *tally {
	t := newTally(p)
	t.late = late
	return t
}

// add counts n units of decision d on key, made by a call that began at
// start and has just returned.
func (t *tally) add(key string, d ratelimit.Decision, n int, start time.Time) {
	p := t.period.Microseconds()
	if t.late > 0 {
		from, to := start.UnixMicro(), time.Now().UnixMicro()
		end := (from/p + 1) * p
		if to > end || from < end-(t.late-lateMargin).Microseconds() {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.perWin[key] == nil {
			t.perWin[key] = map[int64]int{}
		}
		t.perWin[key][from/p] += n
		return
	}
	lo := start.Add(d.ResetAfter).UnixMicro()
	hi := time.Now().Add(d.ResetAfter).UnixMicro()
	m := (lo + p - 1) / p // the first boundary at or after lo
	if m*p > hi {
		// none within the call (a clock read a moment apart): the nearest
		m = int64(math.Round(float64(lo+hi) / 2 / float64(p)))
	}
	idx := m - 1
	t.mu.Lock()
	m2 := t.perWin[key]
	if m2 == nil {
		m2 = map[int64]int{}
		t.perWin[key] = m2
	}
	m2[idx] += n
	t.mu.Unlock()
}

// windows returns the counts per key of the windows entirely inside
// [from, to] (full) and of all windows (all).
func (t *tally) windows(key string, from, to time.Time) (full, all map[int64]int) {
	p := t.period.Microseconds()
	first := (from.UnixMicro() + p - 1) / p // first window starting at or after from
	last := to.UnixMicro()/p - 1            // last window ending at or before to
	full, all = map[int64]int{}, map[int64]int{}
	t.mu.Lock()
	defer t.mu.Unlock()
	for idx, n := range t.perWin[key] {
		all[idx] = n
	}
	for idx := first; idx <= last; idx++ {
		full[idx] = t.perWin[key][idx]
	}
	return full, all
}

// hammer runs workers goroutines per limiter, each calling AllowN in a loop
// on the keys round-robin until d has passed.
func hammer(t *testing.T, lims []ratelimit.Limiter, keys []string, workers int, d time.Duration, tl *tally) (allowed, denied int64) {
	t.Helper()
	var a, dn atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for li, l := range lims {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(l ratelimit.Limiter, seed int) {
				defer wg.Done()
				for i := seed; time.Now().Before(stop); i++ {
					key := keys[i%len(keys)]
					start := time.Now()
					dec, err := l.AllowN(context.Background(), key, 1)
					if err != nil {
						t.Errorf("AllowN: %v", err)
						return
					}
					if dec.Remaining < 0 {
						t.Errorf("negative Remaining %d", dec.Remaining)
					}
					if dec.Allowed {
						a.Add(1)
						tl.add(key, dec, 1, start)
					} else {
						dn.Add(1)
						if dec.RetryAfter <= 0 {
							t.Errorf("denied without RetryAfter: %+v", dec)
						}
					}
				}
			}(l, li*workers+w)
		}
	}
	wg.Wait()
	return a.Load(), dn.Load()
}

// fleet makes n hybrid limiters, each with its own Redis client.
func fleet(t *testing.T, n int, newClient func() redis.UniversalClient, limit ratelimit.Limit, opts ...hybrid.Option) ([]*hybrid.Limiter, []ratelimit.Limiter) {
	t.Helper()
	var hs []*hybrid.Limiter
	var ls []ratelimit.Limiter
	for i := 0; i < n; i++ {
		c := newClient()
		t.Cleanup(func() { c.Close() })
		h, err := hybrid.New(c, limit, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		hs = append(hs, h)
		ls = append(ls, h)
	}
	return hs, ls
}

func sumStats(hs []*hybrid.Limiter) hybrid.Stats {
	var s hybrid.Stats
	for _, h := range hs {
		x := h.Stats()
		s.Decisions += x.Decisions
		s.Allowed += x.Allowed
		s.Denied += x.Denied
		s.LocalDecisions += x.LocalDecisions
		s.RoundTrips += x.RoundTrips
		s.SyncRoundTrips += x.SyncRoundTrips
		s.Leases += x.Leases
		s.LeasedUnits += x.LeasedUnits
		s.LeasedAhead += x.LeasedAhead
		s.NoReply += x.NoReply
		s.Refunded += x.Refunded
		s.Reported += x.Reported
		s.KeysTracked += x.KeysTracked
		s.FlushErrors += x.FlushErrors
		s.Fallback += x.Fallback
		s.ExactDecisions += x.ExactDecisions
	}
	return s
}

// redisCount reads the window counter a hybrid or global FixedWindow
// limiter keeps for key in window idx.
func redisCount(t *testing.T, c redis.UniversalClient, prefix, key string, idx int64) int {
	t.Helper()
	base, err := script.KeyBase(prefix, key)
	require.NoError(t, err)
	ctx := context.Background()
	// the FixedWindow counter of window idx, whatever its rate
	ks, err := c.Keys(ctx, script.WindowKey(base, "fw:*", idx)).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, len(ks), 1, "%v", ks)
	if len(ks) == 0 {
		return 0
	}
	k := ks[0]
	var n int
	if c.Type(ctx, k).Val() == "hash" {
		n, err = c.HGet(ctx, k, "c").Int()
	} else {
		n, err = c.Get(ctx, k).Int()
	}
	if err == redis.Nil {
		return 0
	}
	require.NoError(t, err)
	return n
}

// serverWindow returns the index of the current window on Redis time and
// how long it has left.
func serverWindow(t *testing.T, c redis.UniversalClient, p time.Duration) (int64, time.Duration) {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	us := now.UnixMicro()
	idx := us / p.Microseconds()
	return idx, time.Duration((idx+1)*p.Microseconds()-us) * time.Microsecond
}

// freshWindow waits until at least need is left of the current window.
func freshWindow(t *testing.T, c redis.UniversalClient, p, need time.Duration) int64 {
	t.Helper()
	idx, left := serverWindow(t, c, p)
	if left < need {
		time.Sleep(left + 5*time.Millisecond)
		idx, _ = serverWindow(t, c, p)
	}
	return idx
}

func uniq(t *testing.T) string { return fmt.Sprintf("t%d", time.Now().UnixNano()) }
