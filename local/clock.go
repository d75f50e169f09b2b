package local

import (
	"sync/atomic"
	"time"
)

// reanchorEvery is how often the default clock re-reads the wall clock.
const reanchorEvery = time.Second

// monoClock is the default clock of a Limiter: the wall clock, read with one
// monotonic clock read per call instead of time.Now's two (wall and
// monotonic). It takes the wall time at an anchor and adds the monotonic time
// elapsed since, re-anchoring on time.Now every reanchorEvery, so it follows
// a step of the system clock within a second and otherwise reads exactly
// what time.Now().UnixMicro() would.
type monoClock struct {
	anchor atomic.Pointer[clockAnchor]
}

type clockAnchor struct {
	mono time.Time // carries the monotonic reading
	wall int64     // mono's wall time, ns since the epoch
}

func newMonoClock() *monoClock {
	c := &monoClock{}
	c.reanchor(nil)
	return c
}

func (c *monoClock) reanchor(old *clockAnchor) *clockAnchor {
	now := time.Now()
	a := &clockAnchor{mono: now, wall: now.UnixNano()}
	if c.anchor.CompareAndSwap(old, a) {
		return a
	}
	return c.anchor.Load() // another goroutine re-anchored first
}

// nowMicro returns the current time in µs since the Unix epoch.
func (c *monoClock) nowMicro() int64 {
	a := c.anchor.Load()
	d := time.Since(a.mono) // monotonic only: one clock read
	if d >= reanchorEvery || d < 0 {
		a = c.reanchor(a)
		d = time.Since(a.mono)
	}
	return (a.wall + int64(d)) / 1000
}
