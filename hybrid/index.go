package hybrid

import (
	gosync "sync"
	"sync/atomic"
)

// keyIndex is the lock-free read path in front of the key table (see
// lookup): the counters of keys used more than once, by key. It is an
// open-addressing hash table of counters, probed linearly from the key's
// hash (seen.hash, kept in the counter), read without a lock; writers
// (a key's second use, a counter leaving the table) take mu.
//
// It replaced a sync.Map, whose lookups walk a trie of nodes and entries:
// on the sim's FixedWindow cold row (8 instances of 10,000 keys each, 94%
// of decisions taken in memory) the index's lookups were 31% of the
// instance's CPU, about 0.9µs each, most of it cache misses. Here a hit
// reads the slot, the counter and the key's bytes.
//
// A deleted slot holds tombstone, so the keys probed past it are still
// found; a table with too few empty slots is rebuilt, without its
// tombstones, into a new one that replaces it whole: readers of the old
// one see the index as it was, which is what a read concurrent with the
// writes sees anyway. A miss is always safe: the key table is searched
// next.
type keyIndex struct {
	tab atomic.Pointer[indexTable] // nil until the first store

	mu     gosync.Mutex
	live   int // slots holding a counter
	filled int // slots not empty: live and tombstones
}

type indexTable struct {
	slots []atomic.Pointer[counter]
	mask  uint64
}

// tombstone marks a slot whose counter was deleted.
var tombstone = &counter{}

// minIndexSlots is the smallest table the index makes.
const minIndexSlots = 64

// load returns the counter of the key kept as k, whose hash is h, or nil.
func (x *keyIndex) load(k string, h uint64) *counter {
	t := x.tab.Load()
	if t == nil {
		return nil
	}
	for i, n := h&t.mask, uint64(0); n <= t.mask; i, n = (i+1)&t.mask, n+1 {
		c := t.slots[i].Load()
		if c == nil {
			return nil
		}
		if c.hash == h && c != tombstone && c.key == k {
			return c
		}
	}
	return nil
}

// store puts c in the index, in place of the counter of its key there, if
// any.
func (x *keyIndex) store(c *counter) {
	x.mu.Lock()
	defer x.mu.Unlock()
	t := x.tab.Load()
	if t == nil || 4*(x.filled+1) > 3*len(t.slots) {
		t = x.rebuild(t)
	}
	free := -1
	for i, n := c.hash&t.mask, uint64(0); n <= t.mask; i, n = (i+1)&t.mask, n+1 {
		p := t.slots[i].Load()
		if p == nil {
			if free < 0 {
				free = int(i)
				x.filled++
			}
			break
		}
		if p == tombstone {
			if free < 0 {
				free = int(i)
			}
			continue
		}
		if p.hash == c.hash && p.key == c.key {
			t.slots[i].Store(c)
			return
		}
	}
	// (free >= 0: the table is never more than 3/4 filled)
	t.slots[free].Store(c)
	x.live++
}

// compareAndDelete takes c out of the index if it is there.
func (x *keyIndex) compareAndDelete(c *counter) {
	x.mu.Lock()
	defer x.mu.Unlock()
	t := x.tab.Load()
	if t == nil {
		return
	}
	for i, n := c.hash&t.mask, uint64(0); n <= t.mask; i, n = (i+1)&t.mask, n+1 {
		p := t.slots[i].Load()
		if p == nil {
			return
		}
		if p == c {
			t.slots[i].Store(tombstone)
			x.live--
			return
		}
	}
}

// rebuild makes, with x locked, a table for the live counters of t and one
// more with room to spare (at most half filled), without t's tombstones,
// and puts it in place of t.
func (x *keyIndex) rebuild(t *indexTable) *indexTable {
	n := minIndexSlots
	for 2*(x.live+1) > n {
		n *= 2
	}
	nt := &indexTable{slots: make([]atomic.Pointer[counter], n), mask: uint64(n - 1)}
	if t != nil {
		for i := range t.slots {
			c := t.slots[i].Load()
			if c == nil || c == tombstone {
				continue
			}
			j := c.hash & nt.mask
			for nt.slots[j].Load() != nil {
				j = (j + 1) & nt.mask
			}
			nt.slots[j].Store(c)
		}
	}
	x.filled = x.live
	x.tab.Store(nt)
	return nt
}

// len returns how many counters the index holds.
func (x *keyIndex) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.live
}
