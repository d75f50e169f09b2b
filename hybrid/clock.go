package hybrid

import (
	gosync "sync"
	"sync/atomic"
	"time"
)

// serverClock estimates Redis server time on this process' monotonic clock.
// Every instant it deals in is "mono": nanoseconds since the limiter's
// start on the monotonic clock; server times are microseconds since the
// epoch. Nothing in it reads a clock: time is passed in, so it is tested
// without Redis and without sleeps.
//
// It keeps the offset between server time and the local wall clock NTP
// style: from the reply with the shortest round trip (a sample's error is
// at most half its round trip, as Redis read TIME somewhere between sending
// and receiving), replaced by any newer sample once the kept one is older
// than maxAge, so a drifting clock is followed.
//
// Reads are lock-free; observe takes a mutex.
type serverClock struct {
	startUS  int64 // local wall clock at mono 0, microseconds since the epoch
	periodUS int64
	maxAge   int64 // ns

	offsetUS atomic.Int64 // server minus local wall clock, microseconds
	errNS    atomic.Int64 // bound of offsetUS's error
	mu       gosync.Mutex // guards rtt and at
	rtt      int64        // round trip of the kept sample, ns
	at       int64        // mono of the kept sample; 0: none yet
}

func newServerClock(startUS int64, period, maxAge time.Duration) *serverClock {
	return &serverClock{startUS: startUS, periodUS: int64(period / time.Microsecond), maxAge: int64(maxAge)}
}

// observe takes a sample: Redis read its time serverUS between before and
// after (mono).
func (k *serverClock) observe(serverUS, before, after int64) {
	rtt := after - before
	localUS := k.startUS + (before+after)/2/1000
	k.mu.Lock()
	if k.at == 0 || rtt <= k.rtt || after-k.at > k.maxAge {
		k.rtt, k.at = rtt, after
		k.offsetUS.Store(serverUS - localUS)
		k.errNS.Store(rtt/2 + int64(time.Microsecond)) // + TIME's resolution
	}
	k.mu.Unlock()
}

// view returns the estimate as it stands, as a value.
func (k *serverClock) view() clockView {
	return clockView{startUS: k.startUS, periodUS: k.periodUS, offsetUS: k.offsetUS.Load(), errNS: k.errNS.Load()}
}

func (k *serverClock) serverAt(mono int64) int64          { return k.view().serverAt(mono) }
func (k *serverClock) monoAt(serverUS int64) int64        { return k.view().monoAt(serverUS) }
func (k *serverClock) window(mono int64) (idx, end int64) { return k.view().window(mono) }
func (k *serverClock) end(idx, resetUS, before, after int64) int64 {
	return k.view().end(idx, resetUS, before, after)
}
func (k *serverClock) errorBound() int64 { return k.errNS.Load() }

// clockView is the server clock's estimate at one moment, as a value: what
// the keys' state machines read Redis time through.
type clockView struct {
	startUS  int64 // local wall clock at mono 0, microseconds since the epoch
	periodUS int64
	offsetUS int64 // server minus local wall clock, microseconds
	errNS    int64 // bound of offsetUS's error
}

// serverAt returns the server time at mono, by the estimate.
func (v clockView) serverAt(mono int64) int64 {
	return v.startUS + mono/1000 + v.offsetUS
}

// monoAt maps a server time to mono, by the estimate.
func (v clockView) monoAt(serverUS int64) int64 {
	return (serverUS - v.offsetUS - v.startUS) * 1000
}

// window returns the window mono falls in by the estimate: its index and
// its end (mono).
func (v clockView) window(mono int64) (idx, end int64) {
	now := v.serverAt(mono)
	idx = now / v.periodUS
	return idx, mono + ((idx+1)*v.periodUS-now)*1000
}

// end returns when window idx ends (mono), from a reply that said, at a
// server time read between before and after, that it had resetUS to go:
// the end lies in [before + reset, after + reset], and within that the
// offset's estimate is the best guess. A reply that waited long in a run
// queue therefore does not cut its window short, and one sent long ago
// does not stretch it.
func (v clockView) end(idx, resetUS, before, after int64) int64 {
	lo, hi := before+resetUS*1000, after+resetUS*1000
	return min(max(v.monoAt((idx+1)*v.periodUS), lo), hi)
}

// errorBound is how far the estimate may be from server time, ns.
func (v clockView) errorBound() int64 { return v.errNS }
