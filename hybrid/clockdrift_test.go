package hybrid_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// Plain leases (a FixedWindow or SlidingWindow key far from its limit)
// carry no sample of Redis time: the time their reply holds is the
// instance's own estimate, made before the call went out. The estimate
// stays within its error bound of Redis's clock through thousands of them.
// Observing them as samples pulled the estimate back by each call's wait,
// 108-221µs off against a claimed bound of 6.5µs here, and further at
// every sample's renewal (10s).
func TestPlainLeasesKeepClock(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			c := srv.Client()
			defer c.Close()
			h, err := hybrid.New(c, ratelimit.PerSecond(100_000), hybrid.WithPrefix(uniq(t)), hybrid.WithAlgorithm(alg))
			require.NoError(t, err)
			defer h.Close()
			ctx := context.Background()
			stop := time.Now().Add(2500 * time.Millisecond)
			checked := 0
			for i := 0; time.Now().Before(stop); i++ {
				_, err := h.Allow(ctx, "k"+strconv.Itoa(i%200))
				require.NoError(t, err)
				if i%5000 == 0 {
					// Redis read its clock between the two estimates: an
					// honest estimate is within its bound of that reading
					// (and 10µs for TIME's resolution and rounding).
					lo, errNS := hybrid.ServerNow(h)
					srvT, err := c.Time(ctx).Result()
					require.NoError(t, err)
					hi, _ := hybrid.ServerNow(h)
					if errNS > 0 {
						slack := errNS/1000 + 10
						require.True(t, srvT.UnixMicro() >= lo-slack && srvT.UnixMicro() <= hi+slack,
							"decision %d: Redis read %d while the estimate went from %d to %d, its bound %dns", i, srvT.UnixMicro(), lo, hi, errNS)
						checked++
					}
				}
			}
			require.Positive(t, h.Stats().Leases, "keys leased")
			require.Positive(t, checked)
		})
	}
}
