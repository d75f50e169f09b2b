package hybrid

import (
	"context"
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
// more CPU than the call itself. So a FixedWindow decision in Strict mode
// of a key the table does not hold, not asked on this instance in this
// window or the last (as far as seen records), is one plain exact call
// made without a counter: HINCRBY and PEXPIREAT (plainRequest), shared
// with every other call of its moment, its reply the decision. The key
// gets a counter only when the decision needs one: when it is asked again
// within two windows (seen tells, and the counter starts with that use
// counted, so the key warms as it would have with a counter all along),
// or when the reply is anything but an admission far from the limit (a
// denial, a reply too near the window's end, an error, no reply in time,
// a window nearly spent): then the counter settles the call as the
// counter path does, and the decision goes on there.

// seen is a lossy record of the window in which this instance last decided
// each key without a counter, and how far from the limit Redis said it
// was. A key hashes to a bucket of seenWays slots; a slot holds a
// fingerprint of the hash (24 bits), the remainder as a fraction of the
// limit (8 bits, rounded down) and the window's index (its low 32 bits). A
// key recorded takes a slot of its bucket not recorded in this window or
// the last, else the one recorded in the last, else one by its hash: when
// more keys than slots share a bucket within two windows, a key not found
// that was waits one decision longer to lease, and a fingerprint shared
// makes a counter one decision early; neither changes what is counted. No
// lock: a slot is one atomic word.
type seen struct {
	seed  maphash.Seed
	slots []atomic.Uint64
	mask  uint64 // of the buckets' first slots
}

const (
	seenWays        = 4
	seenFP   uint64 = 0xffffff << 40 // the fingerprint's bits
	seenFree uint64 = 0xff << 32     // the remainder's: 0 unknown, else 1 + 254 x remainder / limit
)

// newSeen sizes the record to the key table: a slot per key it holds, 1,024
// to 131,072 slots (1 MiB).
func newSeen(maxKeys int) *seen {
	n := 1 << min(max(bits.Len(uint(maxKeys)), 10), 17)
	return &seen{seed: maphash.MakeSeed(), slots: make([]atomic.Uint64, n), mask: uint64(n-1) &^ (seenWays - 1)}
}

// find reports whether k was recorded in window idx or idx-1, and if so
// returns what: the seed of its counter, for a limit of rate. When it was
// not, it records k in idx, its remainder unknown.
func (s *seen) find(k string, idx, rate int64) (seed, bool) {
	h := maphash.String(s.seed, k)
	fp := h & seenFP
	b := s.slots[h&s.mask:][:seenWays]
	for i := range b {
		v := b[i].Load()
		if w := uint32(v); v&seenFP == fp && (w == uint32(idx) || w == uint32(idx-1)) {
			sd := seed{idx: idx, uses: 1, asked: 1}
			if w != uint32(idx) {
				sd.idx = idx - 1
			}
			if q := int64(v&seenFree) >> 32; q > 0 {
				sd.free, sd.known = (q-1)*rate/254, true
			}
			return sd, true
		}
	}
	b[s.victim(b, h, fp, idx)].Store(fp | uint64(uint32(idx)))
	return seed{}, false
}

// note records that Redis had free units of a limit of rate left in
// window idx for k.
func (s *seen) note(k string, idx, free, rate int64) {
	h := maphash.String(s.seed, k)
	fp := h & seenFP
	b := s.slots[h&s.mask:][:seenWays]
	q := 1 + min(max(free, 0), rate)*254/rate
	b[s.victim(b, h, fp, idx)].Store(fp | uint64(q)<<32 | uint64(uint32(idx)))
}

// victim returns the slot of bucket b to record the key of hash h and
// fingerprint fp in, in window idx: its own, or one not recorded in this
// window or the last, or one recorded in the last, or one by its hash.
func (s *seen) victim(b []atomic.Uint64, h, fp uint64, idx int64) int {
	old := -1
	for i := range b {
		v := b[i].Load()
		switch w := uint32(v); {
		case v&seenFP == fp:
			return i
		case w != uint32(idx) && w != uint32(idx-1):
			return i
		case w == uint32(idx-1) && old < 0:
			old = i
		}
	}
	if old >= 0 {
		return old
	}
	return int(h>>24) % seenWays
}

// first decides a decision of n units at now of key, which
// has no counter, without making one when it can (see above), waiting on
// Redis until timeout fires or expired closes. When it did not decide, the
// decision goes on with the key's counter, made with t.seed
// (lookupSeeded), and what first made of the call.
func (h *Limiter) first(ctx context.Context, key string, n, now int64, timeout <-chan time.Time, expired <-chan struct{}) (t firstTry) {
	p := h.p
	if p.alg != ratelimit.FixedWindow || p.mode != Strict {
		return t
	}
	f := h.facts()
	idx, end := f.clock.Window(now)
	k := kept(key)
	if sd, ok := h.seen.find(k, idx, p.rate); ok {
		t.seed = sd // (with the remainder it saw: a fallback's credit is bounded by it)
		return t
	}
	if f.breaker != breaker.Closed || f.draining || p.cautious(f, end-p.periodNS, end) {
		return t
	}
	id := h.clockID()
	plain, pidx := plainWindow(p, id.now, now, f.clock)
	if !plain {
		return t
	}
	e := &exactCall{n: n, fw: true, plain: true, key: key, done: make(chan struct{}), serverUS: id.now}
	if e.serverUS <= 0 {
		e.serverUS = f.clock.ServerAt(now)
	}
	e.take = script.TakeArgs{Base: p.prefix + ":{" + tagOf(k) + "}:", Kind: p.kind, Limit: p.limit, Now: id.now, N: n, AdjustIdx: pidx}
	t.seed = seed{idx: pidx, uses: n} // (the counter, if one is made, decides the call: it counts it as asked then)
	h.exacts.Add(1)
	h.asks.add(e)
	answered, err := e.await(ctx, timeout, expired)
	t.e, t.err = answered, err // (nil: it stopped waiting, and the reply, when it comes, is owed back)
	if answered == nil || err != nil || e.late(h.clk.View()) || !e.admitted() {
		return t
	}
	r := e.res.take
	free := p.rate - r.Count
	if free <= 2*f.instances {
		return t // nearly spent: the counter keeps what is left (leasable)
	}
	h.seen.note(k, r.Idx, free, p.rate)
	h.st.exact.Add(1)
	h.st.retiredAllowed.Add(1)
	h.st.retiredWaited.Add(1)
	end = f.clock.MonoAt((r.Idx + 1) * p.periodUS)
	t.d = ratelimit.Decision{Allowed: true, Limit: p.limit, Algorithm: p.alg, Remaining: int(min(free, p.capacity)), ResetAfter: time.Duration(max(0, end-now))}
	t.done, t.e = true, nil
	return t
}

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
