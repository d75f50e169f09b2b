// Package srvclock estimates a Redis server's clock on this process'
// monotonic clock, so that a client can tell which window of a limit Redis
// would count a command in without asking Redis for its TIME: the hybrid
// limiter's cold path and global's plain FixedWindow path send a plain
// increment of the window they compute.
//
// Every instant it deals in is "mono": nanoseconds since the owner's start
// on the monotonic clock; server times are microseconds since the epoch.
// Nothing in it reads a clock: time is passed in, so it is tested without
// Redis and without sleeps.
package srvclock

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock keeps the offset between server time and the local wall clock NTP
// style: from the reply with the shortest round trip (a sample's error is
// at most half its round trip, as Redis read TIME somewhere between sending
// and receiving), replaced by any newer sample once the kept one is older
// than maxAge, so a drifting clock is followed.
//
// A Clock is made by New. Reads are lock-free; Observe takes a mutex.
type Clock struct {
	startUS  int64 // local wall clock at mono 0, microseconds since the epoch
	periodUS int64
	maxAge   int64 // ns

	offsetUS atomic.Int64 // server minus local wall clock, microseconds
	errNS    atomic.Int64 // bound of offsetUS's error; 0: no sample yet
	mu       sync.Mutex   // guards rtt and at
	rtt      int64        // round trip of the kept sample, ns
	at       atomic.Int64 // mono of the kept sample; 0: none yet
}

// New returns a Clock whose mono 0 is the local wall time startUS, for
// windows of period, keeping a sample at most maxAge once newer ones come.
func New(startUS int64, period, maxAge time.Duration) *Clock {
	return &Clock{startUS: startUS, periodUS: int64(period / time.Microsecond), maxAge: int64(maxAge)}
}

// Observe takes a sample: Redis read its time serverUS between before and
// after (mono).
func (k *Clock) Observe(serverUS, before, after int64) {
	rtt := after - before
	localUS := k.startUS + (before+after)/2/1000
	k.mu.Lock()
	if at := k.at.Load(); at == 0 || rtt <= k.rtt || after-at > k.maxAge {
		k.rtt = rtt
		k.at.Store(max(after, 1))
		k.offsetUS.Store(serverUS - localUS)
		k.errNS.Store(rtt/2 + int64(time.Microsecond)) // + TIME's resolution
	}
	k.mu.Unlock()
}

// Stale reports whether, at mono, a newer sample would replace the kept
// one (or there is none): whoever relies on the estimate should take one.
func (k *Clock) Stale(mono int64) bool {
	at := k.at.Load()
	return at == 0 || mono-at > k.maxAge
}

// View returns the estimate as it stands, as a value.
func (k *Clock) View() View {
	return View{StartUS: k.startUS, PeriodUS: k.periodUS, OffsetUS: k.offsetUS.Load(), ErrNS: k.errNS.Load()}
}

// ServerAt returns the server time at mono, by the estimate.
func (k *Clock) ServerAt(mono int64) int64 { return k.View().ServerAt(mono) }

// MonoAt maps a server time to mono, by the estimate.
func (k *Clock) MonoAt(serverUS int64) int64 { return k.View().MonoAt(serverUS) }

// Window returns the window mono falls in by the estimate: its index and
// its end (mono).
func (k *Clock) Window(mono int64) (idx, end int64) { return k.View().Window(mono) }

// End is View.End of the estimate as it stands.
func (k *Clock) End(idx, resetUS, before, after int64) int64 {
	return k.View().End(idx, resetUS, before, after)
}

// ErrorBound is how far the estimate may be from server time, ns; 0
// before any sample.
func (k *Clock) ErrorBound() int64 { return k.errNS.Load() }

// View is a Clock's estimate at one moment, as a value.
type View struct {
	StartUS  int64 // local wall clock at mono 0, microseconds since the epoch
	PeriodUS int64 // the windows' period
	OffsetUS int64 // server minus local wall clock, microseconds
	ErrNS    int64 // bound of OffsetUS's error; 0: no sample yet
}

// ServerAt returns the server time at mono, by the estimate.
func (v View) ServerAt(mono int64) int64 {
	return v.StartUS + mono/1000 + v.OffsetUS
}

// MonoAt maps a server time to mono, by the estimate.
func (v View) MonoAt(serverUS int64) int64 {
	return (serverUS - v.OffsetUS - v.StartUS) * 1000
}

// Window returns the window mono falls in by the estimate: its index and
// its end (mono).
func (v View) Window(mono int64) (idx, end int64) {
	now := v.ServerAt(mono)
	idx = now / v.PeriodUS
	return idx, mono + ((idx+1)*v.PeriodUS-now)*1000
}

// End returns when window idx ends (mono), from a reply that said, at a
// server time read between before and after, that it had resetUS to go:
// the end lies in [before + reset, after + reset], and within that the
// offset's estimate is the best guess. A reply that waited long in a run
// queue therefore does not cut its window short, and one sent long ago
// does not stretch it.
func (v View) End(idx, resetUS, before, after int64) int64 {
	lo, hi := before+resetUS*1000, after+resetUS*1000
	return min(max(v.MonoAt((idx+1)*v.PeriodUS), lo), hi)
}

// ErrorBound is how far the estimate may be from server time, ns.
func (v View) ErrorBound() int64 { return v.ErrNS }

// Margin is what Certain and Late add to the error bound: for the local
// clock's drift since the bound was taken, and rounding.
const Margin = int64(time.Millisecond)

// Certain reports whether a command sent at mono is run by Redis, by its
// own clock, within one window, and which: Redis runs it no earlier than
// mono, and that instant is farther than the error bound (and Margin) from
// either end of the window by the estimate. Before any sample, nothing is
// certain. Whether Redis ran it before the window's end is for the reply
// to tell (Late).
func (v View) Certain(mono int64) (bool, int64) {
	if v.ErrNS <= 0 {
		return false, 0
	}
	margin := v.ErrNS + Margin
	idx, end := v.Window(mono - margin)
	if end-v.PeriodUS*1000 > mono-margin || mono+margin >= end {
		return false, 0
	}
	return true, idx
}

// Late reports whether a command's reply read at after (mono) may come
// from a run after window idx ended by Redis' clock: it was read within
// the error bound (and Margin) of the end. Such a reply says nothing of
// the window the command was meant for.
func (v View) Late(idx, after int64) bool {
	end := v.MonoAt((idx + 1) * v.PeriodUS)
	return after+max(v.ErrNS, 0)+Margin >= end
}
