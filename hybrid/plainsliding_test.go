package hybrid_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// A cold SlidingWindow key's decision is a plain sliding call (HINCRBY and
// two HMGETs, no script), and decides as global's SlidingWindow script
// does, whoever counted before it: admitted exactly when
// floor(prev x (P - e) / P) + curr + 1 <= R, prev and curr what global
// limiters admitted in the window before and in this one, e the time into
// this one, and curr + next + 1 <= R, next what hybrid instances leased
// ahead of the next window. Half the trials count through a global Multi, whose counters
// are strings: the increment or a read meets WRONGTYPE, and lease.lua
// decides instead. After each decision the counter holds exactly what was
// admitted: what a plain call counted and did not admit was given back,
// by a plain HINCRBY, no script asked again.
func TestPlainSlidingDecidesAsGlobal(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	clk := &fakeClock{}
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clk.ns.Store(base.UnixNano())
	limit := ratelimit.Limit{Rate: 10, Period: time.Second}
	prefix := uniq(t)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithAlgorithm(ratelimit.SlidingWindow),
		hybrid.WithClock(clk.now), hybrid.WithInstances(1))
	require.NoError(t, err)
	defer h.Close()
	g, err := global.New(c, limit, global.WithPrefix(prefix), global.WithAlgorithm(ratelimit.SlidingWindow), global.WithClock(clk.now))
	require.NoError(t, err)
	gm, err := global.NewMulti(c, []ratelimit.Limit{limit}, global.WithPrefix(prefix), global.WithAlgorithm(ratelimit.SlidingWindow), global.WithClock(clk.now))
	require.NoError(t, err)
	require.NoError(t, c.ConfigResetStat(ctx).Err())

	rng := rand.New(rand.NewPCG(1, 2))
	pUS := limit.Period.Microseconds()
	first := base.UnixMicro() / pUS
	var admitted, denied, plainAdmitted, plainDenied int
	for trial := 0; trial < 400; trial++ {
		key := "k" + strconv.Itoa(trial)
		// Who counted before the hybrid: in half the trials, counters set
		// as another hybrid instance leaves them (hashes); else a global
		// Limiter or a global Multi.
		var gl ratelimit.Limiter
		switch trial % 4 {
		case 2:
			gl = g
		case 3:
			gl = gm
		}
		kb, err := script.KeyBase(prefix, key)
		require.NoError(t, err)
		kind := script.Kind(ratelimit.SlidingWindow, limit)
		count := func(idx int64, n int) {
			if n == 0 {
				return
			}
			if gl == nil {
				k := script.WindowKey(kb, kind, first+idx)
				require.NoError(t, c.HSet(ctx, k, "c", n).Err())
				require.NoError(t, c.Expire(ctx, k, time.Minute).Err())
				return
			}
			d, err := gl.AllowN(ctx, key, n)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
		w := int64(3 * trial) // the trial's windows: w and w + 1
		at := func(idx int64, e time.Duration) {
			clk.ns.Store(base.Add(time.Duration(idx)*limit.Period + e).UnixNano())
		}
		// The window before: prev admitted at its start.
		prev := rng.IntN(limit.Rate + 1)
		at(w, time.Millisecond)
		count(w, prev)
		// This window: curr admitted at e1, the hybrid asked at e >= e1.
		// One trial in three fills the window to the limit at e, one to
		// one short of it; the others count at random, what fits.
		e1 := time.Duration(rng.Int64N(int64(limit.Period)))
		e := e1 + time.Duration(rng.Int64N(int64(limit.Period-e1)))
		est := prev * int(pUS-e1.Microseconds()) / int(pUS)
		curr := rng.IntN(limit.Rate - est + 1)
		if fill := trial % 3; fill < 2 {
			e1 = e
			est = prev * int(pUS-e.Microseconds()) / int(pUS)
			curr = max(0, limit.Rate-est-fill)
		}
		at(w+1, e1)
		count(w+1, curr)
		// What the instances leased ahead of the next window, at most
		// what fits beside curr, or one short of it (hybrid trials only).
		nxt := 0
		if trial%4 == 1 {
			nxt = max(0, limit.Rate-curr-rng.IntN(2))
			count(w+2, nxt)
		}
		at(w+1, e)
		eUS := e.Microseconds()
		expect := max(int64(prev)*(pUS-eUS)/pUS+int64(curr), int64(curr+nxt))+1 <= int64(limit.Rate)
		scripts := commandCalls(t, c, "evalsha")
		d, err := h.Allow(ctx, key)
		require.NoError(t, err)
		what := fmt.Sprintf("trial %d: prev %d, curr %d, next %d, e %v (%T)", trial, prev, curr, nxt, e, gl)
		require.Equal(t, expect, d.Allowed, what)
		if d.Allowed {
			admitted++
			if commandCalls(t, c, "evalsha") == scripts {
				plainAdmitted++
			}
		} else {
			denied++
			if gl == nil {
				// refused by what the plain call read (WithClock: its
				// weight is Redis's), its units given back by a plain
				// HINCRBY: no script asked again
				require.Equal(t, scripts, commandCalls(t, c, "evalsha"), "%s: a plain call's refusal asked again through lease.lua", what)
				plainDenied++
			}
		}
		n := curr
		if d.Allowed {
			n++
		}
		require.Equal(t, n, windowCount(t, c, prefix, key, ratelimit.SlidingWindow, limit, first+w+1), "%s: the window's count after the decision", what)
	}
	stats := commandStats(t, c)
	t.Logf("hybrid admitted %d (%d of them by a plain call alone), denied %d (%d by a plain call alone); HINCRBY %v, HMGET %v, EVALSHA %v (calls, failed)",
		admitted, plainAdmitted, denied, plainDenied, stats["hincrby"], stats["hmget"], stats["evalsha"])
	require.Positive(t, admitted)
	require.Positive(t, denied)
	require.Positive(t, plainAdmitted, "decisions admitted by a plain sliding call alone")
	require.Positive(t, plainDenied, "decisions denied by a plain sliding call alone")
	require.Positive(t, stats["hincrby"][1], "plain increments met counters the global Multi wrote (WRONGTYPE)")
}

// commandCalls returns how many times Redis ran command name.
func commandCalls(t *testing.T, c *redis.Client, name string) int64 {
	t.Helper()
	return commandStats(t, c)[name][0]
}

// SlidingWindow keys at 1 and 2 per second, 4 instances on defaults
// driving 3,000 of them far past the limit, most decisions of them cold
// (plain sliding calls, and lease.lua once a key is near its limit): no
// fixed window ever holds more than the limit (a sliding window's current
// count alone is bounded by it), and at least 97% of the key-windows
// driven past the limit reach it. Driven past means asked limit times in
// the window's last 1/limit, where the previous window's weight, rounded
// down, is zero whatever it holds: a key at 2 per second whose previous
// window reached 2 admits only one unit in the first half of a window, so
// a window asked three times, all early, need not reach 2.
func TestSmallSlidingLimitsReachQuota(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	require.NoError(t, c.ConfigResetStat(context.Background()).Err())
	smallLimits(t, srv, ratelimit.SlidingWindow)
	stats := commandStats(t, c)
	t.Logf("HINCRBY %v, HMGET %v, EVALSHA %v (calls, failed)", stats["hincrby"], stats["hmget"], stats["evalsha"])
	require.Positive(t, stats["hmget"][0], "plain sliding calls were sent")
	require.Positive(t, stats["evalsha"][0], "lease.lua decided near the limit")
}

// SlidingWindow leases far from the limit are plain too (a plain sliding
// lease: HINCRBY, the reads of the windows that bound it, the record, the
// expiry): the cases of TestPlainLeasesShareQuota, for SlidingWindow, with
// a global Limiter and a global Multi of SlidingWindow beside the hybrid
// instances in the mixed ones. (A sliding window's current count alone is
// bounded by the limit: no fixed window may hold more. Near the limit,
// reaching it is not asserted: see plainLeasesShareQuota.)
func TestPlainSlidingLeasesShareQuota(t *testing.T) {
	srv := redistest.Standalone(t)
	plainLeasesShareQuota(t, srv, ratelimit.SlidingWindow)
}
