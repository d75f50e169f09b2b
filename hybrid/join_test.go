package hybrid_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// A fleet that starts together learns its size within the join ramp, not
// a heartbeat period later: the first instance, which counted only itself
// when it joined, would otherwise lease a whole window it cannot use while
// the others are refused (TestBusyHostDefaults's first window, on a busy
// host). The heartbeat period here is 20s, so that only the ramp's early
// heartbeats can tell the first instance of the others within the test.
func TestFleetSizeLearnedSoonAfterJoin(t *testing.T) {
	srv := redistest.Standalone(t)
	limit := ratelimit.PerSecond(100)
	prefix := uniq(t)
	newLimiter := func() *hybrid.Limiter {
		c := srv.Client()
		t.Cleanup(func() { c.Close() })
		h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithHeartbeat(20*time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		return h
	}
	first := newLimiter()
	require.Equal(t, 1, first.Stats().Instances, "alone when it joined")
	// Its syncer's first heartbeat (the second round trip) is made and
	// still counts one: the others join after it.
	require.Eventually(t, func() bool { return first.Stats().RoundTrips >= 2 }, 10*time.Second, time.Millisecond)
	require.Equal(t, 1, first.Stats().Instances)
	second, third := newLimiter(), newLimiter()
	require.Equal(t, 2, second.Stats().Instances)
	require.Equal(t, 3, third.Stats().Instances)
	// The ramp's next heartbeat comes 20s / 16 after the first one; the
	// regular one would come 20s after it.
	require.Eventually(t, func() bool { return first.Stats().Instances == 3 }, 8*time.Second, 5*time.Millisecond,
		"the first instance must learn of the other two within the join ramp")
}
