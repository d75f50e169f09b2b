package httplimit_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/httplimit"
	"github.com/hybridlimit/ratelimit/local"
)

// Every algorithm's quota with the default options, for a Burst below,
// equal to and above Rate and none: X-RateLimit-Limit and the q of
// RateLimit-Policy are what one key can be admitted at once (Rate for the
// window algorithms, Burst or Rate for the buckets), the scale Remaining
// counts on, with no WithQuota needed.
func TestQuotaEveryAlgorithm(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, a := range ratelimit.Algorithms() {
		for _, burst := range []int{0, 3, 10, 20} {
			limit := ratelimit.Limit{Rate: 10, Period: time.Minute, Burst: burst}
			t.Run(a.String()+"/burst"+strconv.Itoa(burst), func(t *testing.T) {
				want := limit.Rate
				if !a.IsWindow() && burst > 0 {
					want = burst
				}
				lim, err := local.New(limit, local.WithAlgorithm(a), local.WithClock(func() time.Time { return now }))
				require.NoError(t, err)
				srv, rec := serve(t, lim, httplimit.WithKey(httplimit.Header("X-User")))
				for i := 0; i <= want; i++ {
					r := get(t, srv, "X-User", "u")
					d := rec.last(t).Decision
					require.Equal(t, i < want, d.Allowed, "request %d", i)
					require.Equal(t, max(want-1-i, 0), d.Remaining, "request %d", i)
					checkHeaders(t, r, d, want, httplimit.DefaultPolicyName)
				}
			})
		}
	}
}
