package local

import (
	"hash/maphash"
	"strings"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// DefaultMaxKeys is the number of keys a Table (and so a Limiter) holds when
// NewTable is given maxKeys <= 0 or WithMaxKeys is not used. At most 400
// bytes per key (see Limiter) it bounds a Limiter to 40 MB, SlidingLog logs
// aside.
const DefaultMaxKeys = 100_000

// maxShards bounds the number of shards of a Table.
const maxShards = 64

// Table is a bounded, sharded map from string keys to values of type V that
// evicts the least recently used key of a shard when that shard is full.
//
// Keys are spread over a power-of-two number of shards by hash/maphash (with
// a seed of the table's own); each shard is a hashicorp/golang-lru
// simplelru.LRU under its own mutex, so operations on keys of different
// shards do not contend. The capacity is split over the shards, so the table
// holds at most Cap keys in total, and a key is evicted when its shard is
// full even if other shards have room.
//
// A Table must be made with NewTable; the zero Table is not usable. A Table
// is safe for concurrent use by multiple goroutines.
type Table[V any] struct {
	seed    maphash.Seed
	mask    uint64
	shards  []tableShard[V]
	onEvict func(key string, v V)
	cap     int
}

type tableShard[V any] struct {
	mu  sync.Mutex
	lru *simplelru.LRU[string, V]
	// The entry the last simplelru operation evicted, captured by the
	// simplelru callback under mu and handed to onEvict after mu is released.
	evKey string
	evVal V
	evOK  bool
	// For the Limiter's approximate promotion (see Limiter.AllowN): tick
	// counts the entries inserted or moved to the front; an entry moved to
	// the front fewer than gap ticks ago is within the front gap entries.
	tick uint64
	gap  uint64
	_    [64]byte // keep the hot mutexes of neighbouring shards on separate cache lines
}

// NewTable returns an empty Table holding at most maxKeys keys (DefaultMaxKeys
// when maxKeys <= 0). onEvict, when not nil, is called once for every entry
// the table evicts to stay within its capacity, after the shard's lock is
// released, on the goroutine whose insertion caused the eviction. It is not
// called for entries removed by RemoveIf.
func NewTable[V any](maxKeys int, onEvict func(key string, v V)) *Table[V] {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	n := 1
	for n < maxShards && n < maxKeys/16 {
		n <<= 1
	}
	t := &Table[V]{
		seed:    maphash.MakeSeed(),
		mask:    uint64(n - 1),
		shards:  make([]tableShard[V], n),
		onEvict: onEvict,
		cap:     maxKeys,
	}
	base, extra := maxKeys/n, maxKeys%n
	for i := range t.shards {
		s := &t.shards[i]
		size := base
		if i < extra {
			size++
		}
		lru, err := simplelru.NewLRU[string, V](size, func(k string, v V) {
			s.evKey, s.evVal, s.evOK = k, v, true
		})
		if err != nil { // size >= 1 because n <= maxKeys/16 or n == 1
			panic("local: " + err.Error())
		}
		s.lru = lru
		s.gap = uint64(max(1, size-max(1, size/4))) // size-1 at most: an entry is moved before it reaches the tail
	}
	return t
}

func (t *Table[V]) shard(key string) *tableShard[V] {
	return &t.shards[maphash.String(t.seed, key)&t.mask]
}

// takeEvicted returns and clears the entry captured by the eviction
// callback. It must be called with s.mu held.
func (s *tableShard[V]) takeEvicted() (key string, v V, ok bool) {
	if !s.evOK {
		return
	}
	key, v, ok = s.evKey, s.evVal, true
	var zero V
	s.evKey, s.evVal, s.evOK = "", zero, false
	return
}

// insert adds key (a copy of it) with v to s, whose lock the caller holds,
// drops what that evicts (the Limiters have no eviction callback) and
// returns the tick to record as the entry's promotion.
func (s *tableShard[V]) insert(key string, v V) uint64 {
	s.lru.Add(strings.Clone(key), v)
	s.takeEvicted()
	s.tick++
	return s.tick
}

// The Limiters promote an entry lazily: an entry moved to the front fewer
// than gap (3/4 of the shard's capacity) insertions or moves ago is still
// within the front three quarters of its shard, so it is left in place
// (stale reports when it is not). This spares the writes and cache misses
// of relinking neighbours on most decisions, and still evicts only keys
// left unused while at least a quarter of the shard's capacity of other
// keys were inserted or moved.

// stale reports whether an entry last moved to the front at tick promoted
// is due to move again. The caller holds s's lock.
func (s *tableShard[V]) stale(promoted uint64) bool { return s.tick-promoted >= s.gap }

// moveToFront moves key to the front of s, whose lock the caller holds, and
// returns the tick to record as its promotion.
func (s *tableShard[V]) moveToFront(key string) uint64 {
	s.lru.Get(key)
	s.tick++
	return s.tick
}

// Get returns the value stored for key and whether it was present, and marks
// key as the most recently used of its shard.
func (t *Table[V]) Get(key string) (V, bool) {
	s := t.shard(key)
	s.mu.Lock()
	v, ok := s.lru.Get(key)
	s.mu.Unlock()
	return v, ok
}

// Peek is like Get but does not mark key as recently used.
func (t *Table[V]) Peek(key string) (V, bool) {
	s := t.shard(key)
	s.mu.Lock()
	v, ok := s.lru.Peek(key)
	s.mu.Unlock()
	return v, ok
}

// GetOrCreate returns the value stored for key, marking it recently used, or,
// when key is absent, stores and returns create() with created true. create
// runs under the shard's lock, at most once per miss, and must not call back
// into the table. The table stores its own copy of key (strings.Clone), so it
// never pins a larger buffer key may be part of. If the insertion evicts an
// entry, onEvict runs after the lock is released, before GetOrCreate returns.
func (t *Table[V]) GetOrCreate(key string, create func() V) (v V, created bool) {
	return t.GetOrCreateKeyed(key, func(string) V { return create() })
}

// GetOrCreateKeyed is GetOrCreate with create given the table's own copy of
// key, the string the table stores: a value that keeps its key can share
// it, so the key's bytes are held once.
func (t *Table[V]) GetOrCreateKeyed(key string, create func(key string) V) (v V, created bool) {
	s := t.shard(key)
	s.mu.Lock()
	if v, ok := s.lru.Get(key); ok {
		s.mu.Unlock()
		return v, false
	}
	own := strings.Clone(key)
	v = create(own)
	s.lru.Add(own, v)
	ek, ev, evicted := s.takeEvicted()
	s.mu.Unlock()
	if evicted && t.onEvict != nil {
		t.onEvict(ek, ev)
	}
	return v, true
}

// RemoveIf removes key if it is present and pred, called with its value
// under the shard's lock, returns true. It reports whether key was removed.
// pred must not call back into the table. onEvict is not called.
func (t *Table[V]) RemoveIf(key string, pred func(V) bool) bool {
	s := t.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.lru.Peek(key)
	if !ok || !pred(v) {
		return false
	}
	s.lru.Remove(key)
	s.takeEvicted() // the simplelru callback fires on Remove too; not an eviction
	return true
}

// Range calls fn for the entries of the table, shard by shard, until fn
// returns false. Each shard's entries are copied under its lock and fn is
// called with no lock held, so fn may call any method of the table; it sees
// a snapshot of each shard, not of the whole table. Range does not change
// recency.
func (t *Table[V]) Range(fn func(key string, v V) bool) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		keys := s.lru.Keys()
		vals := s.lru.Values()
		s.mu.Unlock()
		for j, k := range keys {
			if !fn(k, vals[j]) {
				return
			}
		}
	}
}

// Len returns the number of keys in the table.
func (t *Table[V]) Len() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += s.lru.Len()
		s.mu.Unlock()
	}
	return n
}

// Cap returns the most keys the table holds: the maxKeys given to NewTable,
// or DefaultMaxKeys.
func (t *Table[V]) Cap() int { return t.cap }
