package ratelimit_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/local"
)

// wantCapacity is the most events one key can hold at once: Rate for the
// window algorithms, whatever Burst says; Burst for the buckets, or Rate
// when Burst is 0.
func wantCapacity(l ratelimit.Limit, a ratelimit.Algorithm) int {
	if a.IsWindow() || l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// Every algorithm's X-RateLimit-Limit, for a Burst below, equal to and
// above Rate and none: a real decision of a local limiter through
// SetHeaders. X-RateLimit-Limit must never exceed what the key can be
// admitted at once, and Remaining must never exceed it.
func TestSetHeadersEveryAlgorithm(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, a := range ratelimit.Algorithms() {
		for _, burst := range []int{0, 5, 100, 200} {
			l := ratelimit.Limit{Rate: 100, Period: time.Minute, Burst: burst}
			t.Run(a.String()+"/burst"+strconv.Itoa(burst), func(t *testing.T) {
				lim, err := local.New(l, local.WithAlgorithm(a), local.WithClock(func() time.Time { return now }))
				require.NoError(t, err)
				d, err := lim.Allow(context.Background(), "k")
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.Equal(t, a, d.Algorithm)
				h := http.Header{}
				ratelimit.SetHeaders(h, d)
				want := wantCapacity(l, a)
				require.Equal(t, strconv.Itoa(want), h.Get(ratelimit.HeaderLimit), "X-RateLimit-Limit")
				require.Equal(t, strconv.Itoa(want-1), h.Get(ratelimit.HeaderRemaining), "X-RateLimit-Remaining")
			})
		}
	}
}

// The limiters on Redis say which algorithm counted each decision too, so
// that SetHeaders advertises the right capacity: global for every
// algorithm, the hybrid for both of its own, with a Burst that the window
// algorithms ignore.
func TestSetHeadersRedisLimiters(t *testing.T) {
	srv := redistest.Standalone(t)
	client := srv.Client()
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	l := ratelimit.Limit{Rate: 100, Period: time.Hour, Burst: 5}
	prefix := "hdr" + strconv.FormatInt(time.Now().UnixNano(), 36)
	check := func(t *testing.T, lim ratelimit.Limiter, a ratelimit.Algorithm) {
		t.Helper()
		d, err := lim.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, a, d.Algorithm)
		require.Equal(t, l, d.Limit)
		h := http.Header{}
		ratelimit.SetHeaders(h, d)
		require.Equal(t, strconv.Itoa(wantCapacity(l, a)), h.Get(ratelimit.HeaderLimit))
	}
	for _, a := range ratelimit.Algorithms() {
		t.Run("global/"+a.String(), func(t *testing.T) {
			lim, err := global.New(client, l, global.WithAlgorithm(a), global.WithPrefix(prefix+"g"+a.String()))
			require.NoError(t, err)
			check(t, lim, a)
		})
	}
	for _, a := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		t.Run("hybrid/"+a.String(), func(t *testing.T) {
			lim, err := hybrid.New(client, l, hybrid.WithAlgorithm(a), hybrid.WithPrefix(prefix+"h"+a.String()),
				hybrid.WithTimeout(2*time.Second), hybrid.WithInstances(1))
			require.NoError(t, err)
			defer lim.Close()
			check(t, lim, a)
		})
	}
}
