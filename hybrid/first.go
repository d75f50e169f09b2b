package hybrid

import (
	"hash/maphash"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// A key's first decision in two windows: counted without a counter.
//
// Most keys of the long tail (a user, an API key, an IP seen less than
// once a window) are in the key table only because they were just asked:
// the counter made for one exact call is filled, scheduled, visited by
// the syncer and dropped again two periods later, which costs an instance
// more CPU than the call itself. So a decision in Strict mode of a key the
// table does not hold, not asked on this instance in this window or the
// last (as far as seen records), is one exact call made without a
// counter, shared with every other call of its moment, its reply the
// decision: for FixedWindow a plain increment (HINCRBY and PEXPIREAT,
// plainRequest), for SlidingWindow a plain sliding call (plainsliding.go),
// for a bucket the bucket script for its units (a bucket's "window" is
// this instance's period). The key gets a counter only when the decision
// needs one: when it is asked again within two windows (a FixedWindow or
// bucket key; a SlidingWindow key only once asked twice in one window,
// when it would lease: see cold; seen tells, and the counter starts with
// that use counted, so the key warms as it would have with a counter all
// along),
// or when the reply is anything but an admission far from the limit (a
// denial, a reply too near the window's end, an error, no reply in time,
// a window nearly spent): then the counter settles the call as the
// counter path does, and the decision goes on there. On a crowded instance
// (see crowd) "asked again" is asked crowdedAt times in one window: there
// a key asked about once a window or less stays without a counter, and
// the held filter tells most of its decisions so before the key table is
// searched.

// seen is a lossy record of the window in which this instance last decided
// each key without a counter, how often it did in that window, and how far
// from the limit Redis said it was. A key hashes to a bucket of seenWays
// slots; a slot holds a fingerprint of the hash (24 bits), the remainder
// as a fraction of the limit (8 bits, rounded down), the decisions of the
// window (4 bits, up to 15) and the window's index (its low 28 bits). A
// key recorded takes a slot of its bucket not recorded in this window or
// the last, else the one recorded in the last, else one by its hash: when
// more keys than slots share a bucket within two windows, a key not found
// that was waits longer to lease, and a fingerprint shared makes a counter
// early; neither changes what is counted. No lock: a slot is one atomic
// word (two decisions of a key recording at once may count one).
type seen struct {
	seed  maphash.Seed
	slots []atomic.Uint64
	mask  uint64 // of the buckets' first slots
}

const (
	seenWays         = 4
	seenFP    uint64 = 0xffffff << 40 // the fingerprint's bits
	seenFree  uint64 = 0xff << 32     // the remainder's: 0 unknown, else 1 + 254 x remainder / limit
	seenCount uint64 = 0xf << 28      // the decisions recorded in the slot's window
	seenIdx   uint64 = 1<<28 - 1      // the window's index, its low bits
)

// newSeen sizes the record to the key table: a slot per key it holds, 1,024
// to 131,072 slots (1 MiB).
func newSeen(maxKeys int) *seen {
	n := 1 << min(max(bits.Len(uint(maxKeys)), 10), 17)
	return &seen{seed: maphash.MakeSeed(), slots: make([]atomic.Uint64, n), mask: uint64(n-1) &^ (seenWays - 1)}
}

// seenWindow reports which window slot v was recorded in: 0 window idx,
// 1 the one before, -1 another or none.
func seenWindow(v uint64, idx int64) int {
	switch v & seenIdx {
	case uint64(idx) & seenIdx:
		return 0
	case uint64(idx-1) & seenIdx:
		return 1
	}
	return -1
}

// hash returns the hash the record knows the key kept as k by.
func (s *seen) hash(k string) uint64 { return maphash.String(s.seed, k) }

// find records a decision of the key of hash h in window idx, and reports
// whether the key is to get its counter now, and if so returns what it
// starts with (for a limit of rate): when the decision is the key's
// need-th recorded in window idx, or, with need at most leaseAt, when the
// key was recorded in the window before.
func (s *seen) find(h uint64, idx, rate int64, need int) (seed, bool) {
	return s.findFor(h, idx, rate, need, need <= leaseAt)
}

// findFor is find, the key getting its counter for a record of the window
// before only when carry (a FixedWindow or bucket key asked in two windows
// running leases; a SlidingWindow key only once asked leaseAt times in
// one).
func (s *seen) findFor(h uint64, idx, rate int64, need int, carry bool) (seed, bool) {
	fp := h & seenFP
	b := s.slots[h&s.mask:][:seenWays]
	for i := range b {
		v := b[i].Load()
		if v&seenFP != fp || isSpentMark(v) { // (the fleet's word, no decision: see spent.go)
			continue
		}
		w := seenWindow(v, idx)
		if w < 0 {
			break // long ago: recorded anew below
		}
		count := 1 + int(v&seenCount>>28) // with this decision (0 in the window before)
		if w == 1 {
			if !carry {
				b[i].Store(fp | 1<<28 | uint64(idx)&seenIdx) // a new window, its remainder unknown
				return seed{}, false
			}
			count = 1
		} else if count < need {
			b[i].Store(v&^seenCount | uint64(min(count, 15))<<28)
			return seed{}, false
		}
		sd := seed{idx: idx - int64(w), uses: int64(count - 1 + w), asked: int64(count - 1 + w)}
		if q := int64(v&seenFree) >> 32; q > 0 {
			sd.free, sd.known = (q-1)*rate/254, true
		}
		return sd, true
	}
	b[s.victim(b, h, fp, idx)].Store(fp | 1<<28 | uint64(idx)&seenIdx)
	return seed{}, false
}

// note records that Redis had free units of a limit of rate left in
// window idx for the key of hash h.
func (s *seen) note(h uint64, idx, free, rate int64) {
	fp := h & seenFP
	b := s.slots[h&s.mask:][:seenWays]
	q := 1 + min(max(free, 0), rate)*254/rate
	i := s.victim(b, h, fp, idx)
	count := uint64(1) << 28
	if v := b[i].Load(); v&seenFP == fp && seenWindow(v, idx) == 0 {
		count = max(v&seenCount, count)
	}
	b[i].Store(fp | uint64(q)<<32 | count | uint64(idx)&seenIdx)
}

// victim returns the slot of bucket b to record the key of hash h and
// fingerprint fp in, in window idx: its own, or one not recorded in this
// window or the last, or one recorded in the last, or one by its hash.
func (s *seen) victim(b []atomic.Uint64, h, fp uint64, idx int64) int {
	old := -1
	for i := range b {
		v := b[i].Load()
		switch w := seenWindow(v, idx); {
		case v&seenFP == fp:
			return i
		case w < 0:
			return i
		case w == 1 && old < 0:
			old = i
		}
	}
	if old >= 0 {
		return old
	}
	return int(h>>24) % seenWays
}

// first decides a decision of n units at now of key, which
// has no counter, without making one when it can (see above); hk is the
// key's hash when find computed it, else 0. It waits on
// Redis as w says (see waitFor). When it did not decide, the
// decision goes on with the key's counter, made with t.seed
// (lookupSeeded), and what first made of the call.
func (h *Limiter) first(key string, hk uint64, n, now int64, w waitFor) (t firstTry) {
	p := h.p
	if p.alg == ratelimit.SlidingLog || p.mode != Strict {
		return t
	}
	fw := p.alg == ratelimit.FixedWindow
	f := h.facts()
	idx, end := f.clock.Window(now)
	if p.bucket {
		idx, end = p.policy.window(nil, now, f) // (a bucket's key counts its decisions by this instance's periods)
	}
	k := kept(key)
	need := leaseAt
	if h.crowd.crowded() {
		need = crowdedAt
	}
	if hk == 0 { // (not hashed by find)
		hk = h.seen.hash(k)
	}
	if (fw || p.alg == ratelimit.SlidingWindow) && h.signals(f) {
		h.listen()
		if h.seen.spent(hk, idx) { // the fleet said the window is full (spent.go)
			h.st.retiredDenied.Add(1)
			h.st.spentDenied.Add(1)
			t.d, t.done = p.spentDenial(now, end), true
			return t
		}
	}
	if sd, ok := h.seen.findFor(hk, idx, p.rate, need, (fw || p.bucket) && need <= leaseAt); ok {
		t.seed = sd // (with the remainder it saw: a fallback's credit is bounded by it)
		return t
	}
	if f.breaker != breaker.Closed || f.draining || p.cautious(f, end-p.periodNS, end) {
		return t
	}
	id := h.clockID()
	var e *exactCall
	switch {
	case p.bucket:
		base := keyBase(p.prefix, k)
		// the bucket script for exactly n, as a key with a counter sends it
		e = (&exactWithArgs{exactCall: exactCall{n: n, key: key, done: make(chan struct{})},
			args: leaseCall{bucket: true, bkt: script.BucketArgs{Base: base, Algorithm: p.alg, Limit: p.limit, Now: id.now, Want: n, Min: n, Instances: 1, Head: p.head}}}).exact()
	case fw:
		plain, pidx := plainWindow(p, id.now, now, f.clock)
		if !plain {
			return t
		}
		e = &exactCall{n: n, fw: true, plain: true, key: key, done: make(chan struct{}), serverUS: id.now}
		if e.serverUS <= 0 {
			e.serverUS = f.clock.ServerAt(now)
		}
		wkey, base := windowKey(p.prefix, k, p.kind, pidx)
		e.take = script.TakeArgs{Base: base, Kind: p.kind, Limit: p.limit, Now: id.now, N: n, AdjustIdx: pidx}
		e.wkey = wkey
	default:
		// a plain sliding call (plainsliding.go), lease.lua for exactly n
		// its fallback
		ok, swIdx, srv, elapsed := slidingPlainAt(p, id.now, now, f)
		if !ok {
			return t
		}
		base := keyBase(p.prefix, k)
		e = (&exactWithArgs{exactCall: exactCall{n: n, key: key, done: make(chan struct{}), sw: true, swIdx: swIdx, swElapsed: elapsed, serverUS: srv},
			args: leaseCall{win: script.LeaseArgs{Base: base, Kind: p.kind, Limit: p.limit, Now: id.now, Want: n, Min: n, Instances: 1}}}).exact()
	}
	t.seed = seed{idx: e.window(), uses: n} // (the counter, if one is made, decides the call: it counts it as asked then)
	if p.bucket {
		t.seed.idx = idx
	}
	h.exacts.Add(1)
	w.done, w.exact = e.done, e
	answered, err := e.waited(h.own(e, w))
	t.e, t.err = answered, err // (nil: it stopped waiting, and the reply, when it comes, is owed back)
	if answered == nil || err != nil || e.late(h.clk.View()) || !e.admitted() {
		return t
	}
	var ridx, free int64
	switch {
	case p.bucket:
		ridx, free = idx, e.res.bkt.Level
	case fw:
		ridx, free = e.res.take.Idx, p.rate-e.res.take.Count
	default:
		ridx, free = e.res.win.Idx, p.rate-e.res.win.Count
	}
	if free <= 2*f.instances {
		return t // nearly spent: the counter keeps what is left (leasable)
	}
	h.seen.note(hk, ridx, free, p.rate)
	h.st.exact.Add(1)
	h.st.retiredAllowed.Add(1)
	h.st.retiredWaited.Add(1)
	reset := f.clock.MonoAt((ridx+1)*p.periodUS) - now
	if p.bucket {
		reset = p.bucketReset(min(free, p.capacity))
	}
	t.d = ratelimit.Decision{Allowed: true, Limit: p.limit, Algorithm: p.alg, Remaining: int(min(free, p.capacity)), ResetAfter: time.Duration(max(0, reset))}
	t.done, t.e = true, nil
	return t
}

// crowd estimates how many calls a round trip that decisions wait on
// carries: an average over about the last 16 such round trips. An instance
// whose decisions wait on Redis by the dozen at once is crowded: there an
// exact call costs little more than its command in a shared pipeline,
// while a counter and its leases cost several times that in the
// instance's CPU (the key table, the syncer's visits, the lease calls
// and their replies). The sim's 4 x 64 row, 100,000 keys asked about a
// third of a window each (docs/tuning.md): 2.1x per-request Redis with
// counters made at a key's second decision in two windows, 2.9x with
// them made only at its crowdedAt-th in one. With few decisions waiting
// at once (the cold row: 4 per instance, about 3.6 calls a round trip)
// the leases of keys asked once a window are what lets the closed loop
// climb, and a decision taken in memory saves a round trip's wait.
type crowd struct{ avg atomic.Int64 } // calls per round trip, in 16ths

const (
	crowdedCalls = 32 // calls per waited round trip from which an instance is crowded
	crowdedAt    = 4  // a key's decisions in one window that make its counter on a crowded instance
)

// add counts a round trip that carried calls calls decisions wait on.
// (Two queues adding at once may lose one: it is an estimate.)
func (c *crowd) add(calls int) {
	old := c.avg.Load()
	c.avg.Store(old + (int64(calls)*16-old)/16)
}

// crowded reports whether the round trips decisions wait on lately carried
// crowdedCalls calls or more on average.
func (c *crowd) crowded() bool { return c.avg.Load() >= crowdedCalls*16 }

// firstTry is what first did.
type firstTry struct {
	d    ratelimit.Decision // the decision, when done
	done bool
	e    *exactCall // the call made, with its reply, for the key's counter to settle and decide
	err  error      // the call's error, or why the decision stopped waiting (then e is nil)
	seed seed       // what the key's counter starts with
}

// seed is what a key's new counter starts with: uses units asked through
// the slow path in window idx (see cold) before it had a counter, asked of
// them decided without it (its demand: see observe), and, when known, what
// Redis had free in that window then (see knownFree).
type seed struct {
	idx, uses, asked, free int64
	known                  bool
}

// lookupSeeded is lookup, and a counter it makes starts with sd.
func (h *Limiter) lookupSeeded(key string, sd seed) *counter {
	if sd.uses == 0 {
		return h.lookup(key)
	}
	return h.lookupWith(key, func(own string) *counter {
		c := &counter{key: own, lead: h.p.leadOf(own), slowIdx: sd.idx, slowUses: sd.uses, askedIdx: sd.idx, asked: sd.asked}
		if sd.known {
			c.freeIdx, c.freeVal = sd.idx, sd.free
		}
		return c
	})
}
