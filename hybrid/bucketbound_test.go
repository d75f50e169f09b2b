package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Tokens an instance holds in its lease are still the bucket's: while they
// are out, the bucket refills only to its capacity less them. Else an
// instance that leased tokens and then went quiet for a while would find
// them in hand when the bucket was full again, and the fleet could admit
// both at one instant: more than Burst, in no time. Here instance a holds
// a lease across two seconds of a clock that stands still otherwise; then
// both instances take all they can at one instant: Burst at most.
func TestBucketHeldTokensStayInTheBucket(t *testing.T) {
	srv := redistest.Standalone(t)
	limit := ratelimit.Limit{Rate: 100, Period: time.Second, Burst: 20}
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			c := srv.Client()
			defer c.Close()
			clk := &fakeClock{}
			clk.ns.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
			prefix := uniq(t)
			base, err := script.KeyBase(prefix, "k")
			require.NoError(t, err)
			newLimiter := func() *hybrid.Limiter {
				h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(2),
					hybrid.WithAlgorithm(alg), hybrid.WithClock(clk.now))
				require.NoError(t, err)
				t.Cleanup(func() { _ = h.Close() })
				return h
			}
			a, b := newLimiter(), newLimiter()
			ctx := context.Background()
			allowed := func(h *hybrid.Limiter) bool {
				t.Helper()
				d, err := h.Allow(ctx, "k")
				require.NoError(t, err)
				return d.Allowed
			}
			// a asks in two periods running, 40 a second in the second: it
			// leases tokens, and holds some
			require.True(t, allowed(a))
			clk.advance(time.Second)
			var held int64
			for range 20 {
				require.True(t, allowed(a))
				clk.advance(25 * time.Millisecond)
				time.Sleep(10 * time.Millisecond) // (the syncer's ticks run on the real clock)
				s := a.Stats()
				held = int64(s.LeasedUnits) - int64(s.Allowed-s.ExactDecisions) - int64(s.Refunded+s.Expired)
			}
			require.Positive(t, held, "a holds tokens")
			// two seconds on, the bucket has refilled all it could: all but
			// what the records hold (a's, with any tokens it left to them
			// unused, which Stats counts as expired)
			clk.advance(2 * time.Second)
			recs := base + script.Kind(alg, limit)
			if alg == ratelimit.GCRA {
				recs += ":held"
			}
			recorded, err := c.HGet(ctx, recs, "s").Int()
			require.NoError(t, err)
			require.Positive(t, recorded, "a's record holds tokens")
			n := 0
			for _, h := range []*hybrid.Limiter{a, b, a, b} {
				for allowed(h) {
					n++
					require.LessOrEqual(t, n, 2*limit.Burst, "a runaway")
				}
			}
			require.LessOrEqual(t, n, limit.Burst, "admitted at one instant, a holding %d tokens", held)
			require.GreaterOrEqual(t, n, limit.Burst-recorded, "the bucket less what a's record held, at least")
			t.Logf("a held %d tokens (its record %d); %d admitted at one instant", held, recorded, n)
		})
	}
}
