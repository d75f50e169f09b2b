package hybrid

import (
	"hash/fnv"
	"sync/atomic"

	"github.com/hybridlimit/ratelimit/internal/script"
	bgsync "github.com/hybridlimit/ratelimit/sync"
)

// The keys a Limiter tracks: a lock-free index in front of a bounded LRU
// table (local.Table), which decides evictions.

// lookup finds or makes the counter of key. A hit takes no lock: the index
// is read-mostly, and the LRU table hears of a key's use at most once per
// sync tick. The table holds every key; the index only those used again
// since the table took them: a key seen once (the long tail of cold keys,
// most of a table of 100,000) costs no insertion into the index, nor a
// removal, and the index stays the size of the keys in use.
//
// A key is kept once, in the index, the table and the counter alike: a
// copy of it (so a caller's larger buffer is not retained), or, for a key
// longer than script.MaxVerbatimKey bytes, a digest of it (see indexKey),
// so a key costs a bounded number of bytes whatever its length.
func (h *Limiter) lookup(key string) *counter {
	return h.lookupWith(key, func(own string) *counter {
		return &counter{key: own, lead: h.p.leadOf(own)}
	})
}

// lookupWith is lookup, with mk to make the counter on a miss, given the
// key as kept.
func (h *Limiter) lookupWith(key string, mk func(own string) *counter) *counter {
	k := kept(key)
	hk := h.seen.hash(k)
	if c := h.indexed(k, hk); c != nil {
		return c
	}
	c, created := h.table.GetOrCreateKeyed(k, func(own string) *counter {
		h.held.add(hk, 1)
		c := mk(own)
		c.hash = hk
		return c
	})
	if !created {
		h.used(c)
	}
	return c
}

// find is lookup without making a counter: nil when the table holds none.
// It returns the key's hash (seen.hash) too. The held filter answers most
// lookups of keys without a counter before the key table (a lock) is
// searched: on a crowded instance (see crowd), where most decisions are
// of such keys, before the index too.
func (h *Limiter) find(key string) (c *counter, hk uint64) {
	k := kept(key)
	hk = h.seen.hash(k)
	crowded := h.crowd.crowded()
	if crowded && !h.held.may(hk) {
		return nil, hk
	}
	if c := h.indexed(k, hk); c != nil {
		return c, hk
	}
	if !crowded && !h.held.may(hk) {
		return nil, hk
	}
	c, ok := h.table.Get(k)
	if !ok {
		return nil, hk
	}
	h.used(c)
	return c, hk
}

// held counts the keys the table holds by their hash (seen.hash), a
// counting filter: a cell at 0 means no key of a hash that falls in it is
// held. A counter is added when the table makes it and taken away when
// it leaves the table (evicted, or idle: plan), so the cells never go
// below 0. A key said to be not held while another decision of it is
// making its counter is decided as a key without one is (first.go), as
// it is when its lookup comes just before the counter is made.
type held struct {
	cells []atomic.Int32
	mask  uint64
}

// newHeld makes a filter of a cell for every 4 slots of seen.
func newHeld(s *seen) held {
	n := max(len(s.slots)/4, 256)
	return held{cells: make([]atomic.Int32, n), mask: uint64(n - 1)}
}

func (f held) add(h uint64, d int32) { f.cells[h&f.mask].Add(d) }

// may reports whether a key of hash h may be held.
func (f held) may(h uint64) bool { return f.cells[h&f.mask].Load() != 0 }

// kept returns key as the Limiter keeps it (see lookup).
func kept(key string) string {
	if len(key) > script.MaxVerbatimKey {
		return indexKey(key)
	}
	return key
}

// indexed returns the counter of the key kept as k, of hash hk, from the
// index, or nil.
func (h *Limiter) indexed(k string, hk uint64) *counter {
	c := h.index.load(k, hk)
	if c == nil {
		return nil
	}
	if !c.touched.Load() {
		c.touched.Store(true)
		h.table.Get(k)
	}
	return c
}

// used puts c, found in the table (used again), in the index: from now on
// it is found without a lock.
func (h *Limiter) used(c *counter) {
	if c.dead.Load() {
		return
	}
	h.index.store(c)
	if c.dead.Load() {
		// Dropped meanwhile: whoever dropped it (marked it dead, then
		// took it out of the index) may have looked before the store.
		h.index.compareAndDelete(c)
	}
}

// left marks c, which the key table no longer holds (evicted, or removed
// idle), dead: out of the held filter, and out of the index unless the
// key has a newer counter there.
func (h *Limiter) left(c *counter) {
	h.held.add(c.hash, -1)
	c.dead.Store(true)
	h.index.compareAndDelete(c)
}

// evicted is the key table's eviction callback: the counter's leases go
// back to Redis at the next sync.
func (h *Limiter) evicted(_ string, c *counter) {
	h.left(c)
	lc := c.lock()
	owes := lc.retireAll(h.p, h.mono(), h.facts())
	lc.unlock()
	if owes {
		h.tell(c, visitNow)
		return
	}
	h.archive(c)
}

// archive adds the counts of a counter that leaves for good to the retired
// statistics.
func (h *Limiter) archive(c *counter) {
	lc := c.lock()
	allowed, denied, waited, expired := lc.drain()
	lc.unlock()
	h.st.retiredAllowed.Add(allowed)
	h.st.retiredDenied.Add(denied)
	h.st.retiredWaited.Add(waited)
	h.st.retiredExpired.Add(uint64(expired))
}

// indexKey is how a key longer than script.MaxVerbatimKey is kept in
// memory: 0xff, then the hex SHA-256 of the key (script.HashTag's digest,
// so Redis sees the same tag), then padding to MaxVerbatimKey+1 bytes. No
// key short enough to be kept verbatim can equal it.
func indexKey(key string) string {
	tag := script.HashTag(key) // "#" and 64 hex digits
	var b [script.MaxVerbatimKey + 1]byte
	for i := range b {
		b[i] = 0xff
	}
	copy(b[1:], tag[1:])
	return string(b[:])
}

// tagOf returns the Redis hash tag of the key kept as k (see lookup).
func tagOf(k string) string {
	if len(k) > script.MaxVerbatimKey {
		return "#" + k[1:65]
	}
	return script.HashTag(k)
}

// keyBase is the Redis key base of user key k under prefix (see
// script.KeyBase): "<prefix>:{<tag>}:".
func keyBase(prefix, k string) string { return prefix + ":{" + tagOf(k) + "}:" }

// windowKey is script.WindowKey of window idx of kind for user key k under
// prefix, with the key base, the start of it (script.TaggedWindowKey).
func windowKey(prefix, k, kind string, idx int64) (key, base string) {
	return script.TaggedWindowKey(prefix, tagOf(k), kind, idx)
}

// leadOf is how long before its window's end a key leases the next window:
// at least two sync intervals, so the call lands before the roll, and
// spread by key over up to five more (within half the period), so that the
// leases of keys whose windows all end together go out over several ticks.
func (p *params) leadOf(k string) int64 {
	iv := p.interval
	spread := max(0, min(p.periodNS/2, 7*iv)-2*iv)
	f := fnv.New32a()
	f.Write([]byte(k))
	return 2*iv + int64(f.Sum32())%(spread+1)
}

// giveBack returns n units a decision took in window idx of c (see
// lockedCounter.giveBack).
func (h *Limiter) giveBack(c *counter, idx, n int64) {
	f := h.facts()
	lc := c.lock()
	v := lc.giveBack(h.p, idx, n, h.mono(), f)
	lc.unlock()
	h.tell(c, v)
	if n > 0 && h.signals(f) {
		c.blockedUntil.Store(0)
		h.tellSpent(idx, opOpen, c.key) // the window may have room again (spent.go)
	}
}

// mark has syncer visit c as v asks (not visitNone): visitSoon once per
// tick, without the syncer's lock when the key is marked already.
func (c *counter) mark(syncer *bgsync.Syncer[*counter], v visit) {
	if v == visitSoon {
		if !c.dirty.Load() && c.dirty.CompareAndSwap(false, true) {
			syncer.Mark(c)
		}
		return
	}
	c.dirty.Store(true)
	syncer.Mark(c)
}
