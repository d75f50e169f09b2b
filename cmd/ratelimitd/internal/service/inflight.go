package service

import (
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// inflight counts the decisions in progress on one snapshot, so that the
// limiters only it uses are closed once no decision can reach them any
// more. The count is spread over cache-line-sized shards picked at random:
// decisions on different cores rarely touch the same line.
type inflight struct {
	shards [16]struct {
		n atomic.Int64
		_ [56]byte
	}
}

func (f *inflight) enter() int {
	i := int(rand.Uint32() % uint32(len(f.shards)))
	f.shards[i].n.Add(1)
	return i
}

func (f *inflight) leave(i int) { f.shards[i].n.Add(-1) }

// idle reports whether no decision is in progress. Read after the snapshot
// was replaced, it is exact: a decision that entered after the replacement
// sees it (enter re-reads the snapshot) and leaves without deciding.
func (f *inflight) idle() bool {
	var n int64
	for i := range f.shards {
		n += f.shards[i].n.Load()
	}
	return n == 0
}

// waitIdle waits until no decision is in progress on f, or until stop is
// closed or the bound has passed; it reports whether f is idle.
func (f *inflight) waitIdle(bound time.Duration, stop <-chan struct{}) bool {
	deadline := time.Now().Add(bound)
	for !f.idle() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-stop:
			return f.idle()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return true
}

// enter returns the snapshot in force, counted as in use until
// snap.inflight.leave(shard); nil when none was ever applied.
func (s *Service) enter() (snap *snapshot, shard int) {
	for {
		snap = s.snap.Load()
		if snap == nil {
			return nil, 0
		}
		shard = snap.inflight.enter()
		if s.snap.Load() == snap {
			return snap, shard
		}
		snap.inflight.leave(shard) // replaced meanwhile: use the new one
	}
}
