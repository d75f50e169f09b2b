package hybrid

import (
	"time"
	"unsafe"

	"github.com/hybridlimit/ratelimit/internal/script"
)

// NodeQueues returns how many Redis nodes h's decisions have sent calls to
// through queues of their own (a Cluster's masters; 0 for one server).
func NodeQueues(h *Limiter) int {
	h.asks.mu.Lock()
	defer h.asks.mu.Unlock()
	return len(h.asks.nodes)
}

// CreditShare returns what h would admit of key on credit (FailLocal) in
// the window now falls in, were its breaker to open now: the window's
// last-known remainder shared by the instances, or Rate / instances when
// it heard nothing of the window. Bucket keys are not windows: -1.
func CreditShare(h *Limiter, key string) int64 {
	if h.p.bucket {
		return -1
	}
	c := h.lookup(key)
	now, f := h.mono(), h.facts()
	lc := c.lock()
	defer lc.unlock()
	idx, _ := f.clock.Window(now)
	if l := lc.cur.Load(); l != nil && now < l.end() {
		idx = l.idx
	}
	return lc.creditShare(idx, h.p.localShare(f), f)
}

// KeyCopies returns how many copies of key's bytes (or of its digest, for
// a long key) h keeps for its table, the key's counter and its index (once
// used again): 1 when they share one, 0 when h does not track key.
func KeyCopies(h *Limiter, key string) int {
	k := key
	if len(k) > script.MaxVerbatimKey {
		k = indexKey(key)
	}
	c, ok := h.table.Peek(k)
	if !ok {
		return 0
	}
	held := map[*byte]bool{unsafe.StringData(c.key): true}
	h.table.Range(func(tk string, tc *counter) bool {
		if tc == c {
			held[unsafe.StringData(tk)] = true
		}
		return true
	})
	if ic := h.index.load(k, c.hash); ic != nil {
		held[unsafe.StringData(ic.key)] = true // (the index keeps the counter, and no key of its own)
	}
	return len(held)
}

// WithHeartbeat sets how often h heartbeats to learn the fleet's size
// (default a second), for tests that need a heartbeat long enough to tell
// the join ramp's heartbeats from the regular ones.
func WithHeartbeat(every time.Duration) Option {
	return optionFunc(func(c *config) error {
		c.heartbeatEvery = every
		return nil
	})
}

// Crowd makes h's decisions find it crowded (see crowd), as after round
// trips that each carried calls calls. The round trips its decisions wait
// on after this move the estimate back, a sixteenth of the way each.
func Crowd(h *Limiter, calls int) {
	for range 64 {
		h.crowd.add(calls)
	}
}

// ServerNow returns h's estimate of Redis time now (µs since the epoch)
// and its error bound (ns; 0 before any sample).
func ServerNow(h *Limiter) (us, errNS int64) {
	v := h.clk.View()
	return v.ServerAt(h.mono()), v.ErrNS
}

// SpentSubscriptions returns how many times h subscribed to its channel of
// windows spent (a second: the connection was made anew).
func SpentSubscriptions(h *Limiter) uint64 {
	if h.spent == nil {
		return 0
	}
	return h.spent.subscribed.Load()
}

// SpentRefused reports whether Redis refused h's words of windows spent.
func SpentRefused(h *Limiter) bool { return h.spent != nil && h.spent.refused.Load() }

// ExactCalls reports the exact calls on their way, and those that got no
// reply (their exchange ended without one).
func ExactCalls(h *Limiter) (out, lost int64) { return h.exacts.Load(), h.lostExacts.Load() }
