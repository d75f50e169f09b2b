package hybrid

// Applying the reply of a lease call to the key's state.

// effects is what a transition asks of the Limiter besides a call: counts
// for Stats, and how soon the syncer must see the key.
type effects struct {
	leases, leasedUnits, leasedAhead, refunded, reported uint64
	visit                                                visit
}

func (e *effects) add(o effects) {
	e.leases += o.leases
	e.leasedUnits += o.leasedUnits
	e.leasedAhead += o.leasedAhead
	e.refunded += o.refunded
	e.reported += o.reported
	e.visit = e.visit.or(o.visit)
}

// apply handles the reply r of call k, which Redis answered within
// exchange x: the call is no longer outstanding; its refunds and credit are
// in Redis; its grants are installed.
func (lc *lockedCounter) apply(p *params, k *leaseCall, r reply, x exchange, f fleet) effects {
	if lc.out != k {
		// A second reply to a call sent more than once: the first one was
		// installed.
		return effects{}
	}
	lc.out = nil
	var e effects
	unknown := r.win.Unknown
	if k.bucket {
		unknown = r.bkt.Unknown
		if !unknown {
			e.refunded += uint64(k.bkt.Refund + k.bkt.Back)
		}
		e.reported += uint64(k.bkt.Use)
	} else {
		for _, a := range k.win.Adjust {
			if !unknown {
				e.refunded += uint64(a.Refund)
			}
			e.reported += uint64(a.Use)
		}
	}
	if unknown {
		return e // nothing was granted
	}
	e.add(p.policy.takeGrants(lc, k, &r, x, f))
	return e
}

func (w windows) takeGrants(lc *lockedCounter, k *leaseCall, rep *reply, x exchange, f fleet) effects {
	a, r := &k.win, &rep.win
	p := w.p
	end := f.clock.End(r.Idx, r.Reset, x.before, x.after) // window r.Idx's end
	var e effects
	if rep.plain {
		// a plain lease (see makePlain): the window's end by the estimate,
		// and what was counted and not granted owed back
		end = f.clock.MonoAt((r.Idx + 1) * p.periodUS)
		if a.Want > 0 && r.Grant > 0 && a.Now <= 0 && f.clock.Late(r.Idx, x.after) {
			r.Grant, r.Retry = 0, 0 // perhaps counted after its window ended: no grant of it
		}
		lc.owe(r.Idx, a.Want-r.Grant, 0)
		lc.owe(r.Idx+1, a.WantNext-r.GrantNext, 0)
		if a.Want > r.Grant || a.WantNext > r.GrantNext {
			e.visit = visitNow
		}
	}
	_, v := lc.roll(p, x.after, f)
	e.visit = e.visit.or(v)
	if a.Want > 0 || r.Grant > 0 {
		lc.setFree(lc.cur.Load(), r.Idx, p.rate-r.Count)
		switch {
		case r.Grant > 0:
			e.add(lc.putGrant(p, r.Idx, r.Grant, end-p.periodNS, end, x.after, f))
		case r.Retry > 0 && r.Reset > 0:
			lc.counter().block(a.Min, x.before, x.before+r.Retry*1000)
		}
	}
	if a.WantNext > 0 || r.GrantNext > 0 {
		l := lc.next
		if l == nil || l.idx != r.Idx+1 {
			l = lc.cur.Load()
		}
		lc.setFree(l, r.Idx+1, p.rate-r.CountNext)
		if r.GrantNext > 0 {
			e.leasedAhead++
			e.add(lc.putGrant(p, r.Idx+1, r.GrantNext, end, end+p.periodNS, x.after, f))
		}
	}
	return e
}

// putGrant puts g units granted from window idx (from start to end, mono)
// into the key's leases, at now: into the lease of that window in hand, a
// new current lease, or a lease for the next window; what has no place is
// owed back.
func (lc *lockedCounter) putGrant(p *params, idx, g, start, end, now int64, f fleet) effects {
	e := effects{leases: 1, leasedUnits: uint64(g)}
	if p.cautious(f, start, end) {
		if kept := lc.afterOutage(p, idx, g, f); kept < g {
			e.visit = visitNow // the rest goes back
			if g = kept; g == 0 {
				return e
			}
		}
	}
	cur := lc.cur.Load()
	switch {
	case lc.dead.Load() || f.draining || now >= end:
		lc.owe(idx, g, 0)
		e.visit = visitNow
	case cur != nil && cur.idx == idx && cur.known:
		cur.grow(g)
		lc.blockedUntil.Store(0)
	case cur != nil && cur.idx == idx:
		// The lease in hand was estimated to hold credit: a known lease of
		// the same window replaces it, and its quota, credit and budget
		// move over. Publish first, then retire: a caller holding the old
		// one fails its CAS and finds the new one.
		nl := lc.newLease(idx, start, end, true)
		nl.grow(g)
		carried := nl.borrowed.Load()
		lc.cur.Store(nl)
		nl.borrowed.Add(max(0, cur.closeBorrowing()-carried))
		nl.credit.Add(cur.credit.Swap(0))
		nl.grow(cur.avail.Swap(0))
		lc.old = append(lc.old, cur)
		lc.blockedUntil.Store(0)
	case now >= start-f.clock.ErrorBound() && (cur == nil || cur.idx < idx):
		// The window has begun: a new current lease, which takes over the
		// quota leased ahead for it, if any (given back, it would come too
		// late for callers already told the window is spent).
		nl := lc.newLease(idx, start, end, true)
		if n := lc.next; n != nil && n.idx == idx {
			lc.next = nil
			nl = n
			nl.pre = false
		}
		nl.grow(g)
		lc.cur.Store(nl)
		if cur != nil {
			lc.retireAndStep(p, cur, now, f)
			e.visit = visitNow
		}
		if lc.next != nil && lc.next.idx <= idx {
			lc.retire(p, lc.next, now, f)
			lc.next = nil
			e.visit = visitNow
		}
		lc.blockedUntil.Store(0)
	case lc.next != nil && lc.next.idx == idx:
		lc.next.grow(g)
	case lc.next == nil && (cur == nil || cur.idx < idx):
		nl := lc.newLease(idx, start, end, true)
		nl.grow(g)
		nl.pre = true
		lc.next = nl
		e.visit = visitNow // the syncer watches it: given back if the key goes quiet
	case cur != nil && cur.idx == idx+1 && lc.next == nil:
		// Redis still counts in window idx, and the lease in hand is of
		// the next one, rolled in within the clock's error bound of its
		// start (see roll): it waits as the next lease again, and the
		// grant serves until then. (Left in hand, the grant would have no
		// place, and a decision short of quota would ask again and again.)
		nl := lc.newLease(idx, start, end, true)
		nl.grow(g)
		lc.cur.Store(nl)
		lc.next = cur
		lc.blockedUntil.Store(0)
	default: // an older window than the one in hand
		lc.owe(idx, g, 0)
		e.visit = visitNow
	}
	return e
}
