package local

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
)

// The default clock reads the wall clock: between two time.Now readings.
func TestMonoClockReadsWallClock(t *testing.T) {
	c := newMonoClock()
	for i := 0; i < 1000; i++ {
		before := time.Now().UnixMicro()
		got := c.nowMicro()
		after := time.Now().UnixMicro()
		require.GreaterOrEqual(t, got, before-1) // ns→µs floors may differ by one
		require.LessOrEqual(t, got, after+1)
	}
}

// An anchor older than reanchorEvery is replaced on the next read, and a
// stepped anchor (as after a system clock step) is followed.
func TestMonoClockReanchors(t *testing.T) {
	c := newMonoClock()
	old := c.anchor.Load()
	stale := &clockAnchor{mono: old.mono.Add(-2 * reanchorEvery), wall: old.wall - int64(time.Hour)}
	c.anchor.Store(stale)
	got := c.nowMicro()
	require.NotSame(t, stale, c.anchor.Load())
	require.InDelta(t, time.Now().UnixMicro(), got, float64(time.Second/time.Microsecond))

	// Within reanchorEvery the anchor is kept (and an offset wall is followed).
	a := c.anchor.Load()
	shifted := &clockAnchor{mono: a.mono, wall: a.wall + int64(time.Hour)}
	c.anchor.Store(shifted)
	got = c.nowMicro()
	require.Same(t, shifted, c.anchor.Load())
	require.Greater(t, got, time.Now().UnixMicro()+int64(59*time.Minute/time.Microsecond))
}

// Decisions with the default clock allocate nothing.
func TestDefaultClockHotPathAllocs(t *testing.T) {
	lim, err := New(ratelimit.PerSecond(1_000_000))
	require.NoError(t, err)
	require.Nil(t, lim.clock)
	require.Zero(t, testing.AllocsPerRun(1000, func() { lim.Allow(t.Context(), "k") }))
}
