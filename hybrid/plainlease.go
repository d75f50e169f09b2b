package hybrid

import (
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Plain leases: a FixedWindow lease of one window taken by a plain
// increment of its counter, not by the lease script. (A SlidingWindow
// lease is one too, with the reads of the windows that bound it: see
// plainsliding.go.)
//
// A lease call that only asks units of one window (the current one, for a
// decision or a key running dry, or the next one, leased ahead near the
// window's end) and carries no debts is sent as the cold keys' exact calls
// are (see exactCall): HINCRBY of the window's counter by the units
// wanted, with its PEXPIREAT, no script. The reply is the count after the
// increment, and the grant is read from it as lease.lua would make it:
// what fits under the limit of what was asked (all of it when the count
// is within the limit), nothing when that is less than the call's Min.
// What was counted and not granted is owed back, with the key's next call.
// The same call through lease.lua costs several times the Redis CPU (the
// script's work, and its call), and keys that lease about once a window
// (many keys over many instances) make one such call per window each.
//
// What lease.lua does that a plain increment cannot: it caps a grant at
// the remainder over the instances; a plain lease is made only far from
// the limit by the remainder the instance last saw (knownFree), where that
// cap does not bite (see makePlain); and it knows
// whether a call whose reply was lost ran. A plain call writes the record
// lease.lua keeps for that, nonce + "!" after the increment, and is sent
// again through lease.lua, which gives its units back when it finds the
// record and then leases as for a new call; when another call's record
// replaced it, it grants nothing, and the units stay counted (the safe
// side: quota stranded, never counted twice).
//
// The window must be Redis' own: the current window's increment is plain
// only when the instance knows Redis time well enough to be sure which
// window Redis is in (srvclock.View.Certain, as for an exact call), and a
// grant of it read too near the window's end is given back (Late). The
// next window's counter is named by its index, so a lease ahead only needs
// the current window to be known.

// makePlain turns the new call k, made at at (mono), into a plain lease
// when it can be one (see above).
func (lc *lockedCounter) makePlain(p *params, k *leaseCall, at int64, f fleet) {
	a := &k.win
	if k.bucket || p.alg != ratelimit.FixedWindow && p.alg != ratelimit.SlidingWindow || a.Resent || len(a.Adjust) > 0 || (a.Want > 0) == (a.WantNext > 0) {
		return
	}
	idx, _ := p.policy.window(lc, at, f)
	serverUS, elapsed := a.Now, int64(0)
	if serverUS > 0 {
		if floorDiv(serverUS, p.periodUS) != idx {
			return
		}
		elapsed = serverUS - idx*p.periodUS
	} else {
		certain, ridx := f.clock.Certain(at)
		if !certain || ridx != idx {
			return
		}
		serverUS = f.clock.ServerAt(at)
		elapsed = earliestElapsed(p, serverUS, idx, f.clock)
	}
	w, win := a.Want, idx
	if a.WantNext > 0 {
		w, win = a.WantNext, idx+1
	}
	// Only far from the limit: a plain increment counts all it asks before
	// Redis can say what fits, and what does not fit stays counted until it
	// is given back (with the key's next call), which near the limit would
	// refuse other instances quota that is there. The remainder last seen
	// of the window (or of the one before, for a window not yet seen) must
	// leave half the limit free with every instance asking as much.
	free, known := lc.knownFree(win)
	if !known {
		free, known = lc.knownFree(win - 1)
	}
	// (This also keeps w below lease.lua's cap, the remainder's share.)
	if !known || free < p.rate/2+max(1, a.Instances)*w {
		return
	}
	k.plain, k.plainIdx, k.serverUS, k.plainElapsed = true, idx, serverUS, elapsed
}

// plainRequest is k as a plain increment of its one window's counter.
func (k *leaseCall) plainRequest() request {
	a := &k.win
	if slidingKind(a.Kind) {
		return k.slidingRequest()
	}
	win, w := k.plainWindow()
	key := script.WindowKey(a.Base, a.Kind, win)
	periodUS := int64(a.Limit.Period / time.Microsecond)
	expireAt := ((win+1)*periodUS+999)/1000 + 1000 // ms, as lease.lua's expiry
	return request{
		cmds: [][]any{
			{"hincrby", key, "c", w},
			// the record a resend finds (lease.lua): written after the
			// increment, so that it says the increment ran
			{"hset", key, "r", a.Nonce + "!"},
			{"pexpireat", key, expireAt},
		},
		parse:    (*plainLease)(k),
		fallback: leaseFallback(k.win),
	}
}

// leaseFallback is the fallback of a plain lease with arguments a: the
// lease by lease.lua, for a counter a global limiter wrote (a string). It
// holds a copy: a pipeline abandoned at its deadline may still make its
// fallback while the key sends the call again (resend marks it resent).
func leaseFallback(a script.LeaseArgs) fallbackFunc {
	return func() request {
		return request{script: script.Lease, keys: a.Keys(), args: a.Args(), parse: parseFunc(parseLease)}
	}
}

// plainWindow returns the window plain call k increments, and by how much.
// (k does not change while it is on its way: the key's next call is made
// once its reply was read.)
func (k *leaseCall) plainWindow() (win, w int64) {
	if k.win.WantNext > 0 {
		return k.plainIdx + 1, k.win.WantNext
	}
	return k.plainIdx, k.win.Want
}

// plainLease is a leaseCall sent as a plain increment: it reads the
// increment's reply as lease.lua's. (The reply is read before the call's
// flight ends, while nothing changes the call.)
type plainLease leaseCall

func (k *plainLease) parseReply(v any) (reply, error) {
	c, err := hincrbyReply(v)
	if err != nil {
		return reply{}, err
	}
	a := &k.win
	idx, now, r := k.plainIdx, k.serverUS, int64(a.Limit.Rate)
	win, w := (*leaseCall)(k).plainWindow()
	lo := max(1, a.Min)
	if win != idx {
		lo = 1
	}
	periodUS := int64(a.Limit.Period / time.Microsecond)
	before := c - w
	g := min(w, r-before)
	if g < lo {
		g = 0
	}
	rep := reply{plain: true, win: script.Reply{Idx: idx, Now: now, Reset: (idx+1)*periodUS - now}}
	if win == idx {
		rep.win.Grant, rep.win.Count = g, before+g
		if g == 0 {
			rep.win.Retry = max(1, rep.win.Reset)
		}
	} else {
		rep.win.GrantNext, rep.win.CountNext = g, before+g
	}
	return rep, nil
}
