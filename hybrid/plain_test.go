package hybrid

import (
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// A FixedWindow exact call is a plain increment only when the window Redis
// would count it in is certain: Redis time known (a sample taken), and the
// call made farther than the clock's error bound from either end of the
// window; with WithClock's time, always, in that time's window.
func TestPlainWindow(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	clk := clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	for _, c := range []struct {
		at    int64
		plain bool
	}{
		{10*sec + 100*ms, true},
		{10*sec + 500*ms, true},
		{10*sec + 500*int64(time.Microsecond), false}, // within the bound of the start
		{10*sec + 999*ms, false},                      // within the bound of the end
		{10*sec + 997*ms, true},
	} {
		plain, idx := plainWindow(k.p, 0, c.at, clk)
		if plain != c.plain || plain && idx != 10 {
			t.Errorf("at %v: plain %v window %d; want %v, window 10", time.Duration(c.at), plain, idx, c.plain)
		}
	}
	if plain, _ := plainWindow(k.p, 0, 10*sec+100*ms, clockView{PeriodUS: k.p.periodUS}); plain {
		t.Error("plain before any sample of Redis time")
	}
	if plain, idx := plainWindow(k.p, 10_999_999, 0, clockView{PeriodUS: k.p.periodUS}); !plain || idx != 10 {
		t.Errorf("WithClock's time: plain %v window %d; want window 10", plain, idx)
	}
}

// A plain increment carries n and the key's debts of its window in one
// HINCRBY of the counter the lease script writes, with the expiry take.lua
// sets, and take.lua as its fallback; its reply admits within the limit,
// and over it the units are owed back.
func TestPlainIncrement(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 100*ms
	lc := k.c.lock()
	lc.owe(10, 4, 0)
	e := lc.newExact(k.p, k.id(), 2, now, now, k.f)
	lc.unlock()
	if !e.plain || e.take.AdjustIdx != 10 || e.take.Refund != 4 {
		t.Fatalf("exact call %+v; want a plain increment of window 10 carrying a refund of 4", e.take)
	}
	r := e.request()
	key := script.WindowKey(e.take.Base, e.take.Kind, 10)
	if r.script != nil || len(r.cmds) != 2 || r.fallback == nil || r.fallback.fallbackRequest().script != script.Take {
		t.Fatalf("request %+v; want two plain commands and take.lua as the fallback", r)
	}
	if c := r.cmds[0]; c[0] != "hincrby" || c[1] != key || c[2] != "c" || c[3] != int64(2-4) {
		t.Errorf("increment %v; want hincrby %s c -2", c, key)
	}
	if c := r.cmds[1]; c[0] != "pexpireat" || c[1] != key || c[2] != int64(12_000) {
		t.Errorf("expiry %v; want pexpireat %s at the window's end and a second", c, key)
	}
	// Admitted: the count after it within the limit.
	rep, err := r.parse.parseReply(int64(990))
	if err != nil || !rep.plain || !rep.take.Admitted || !rep.take.Adjusted || rep.take.Idx != 10 {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	e.answered(result{reply: rep}, exchange{before: now, after: now + ms, ok: true})
	if e.late(k.f.clock) {
		t.Fatal("a reply read 899ms before its window's end is late")
	}
	d, l, _ := k.c.decideExact(k.p, e, now+ms, k.f)
	if !d.Allowed || d.Remaining != 10 || d.ResetAfter != 899*time.Millisecond || l == nil || l.idx != 10 {
		t.Errorf("decision %+v lease %+v; want admitted, 10 remaining, reset 899ms", d, l)
	}
	if len(k.debts()) != 0 {
		t.Errorf("debts %+v; the refund went with the increment", k.debts())
	}
	// Over the limit: denied, and its units owed back to the window.
	lc = k.c.lock()
	e = lc.newExact(k.p, k.id(), 3, now, now, k.f)
	lc.unlock()
	rep, _ = e.request().parse.parseReply(int64(1002))
	e.answered(result{reply: rep}, exchange{before: now, after: now + ms, ok: true})
	d, _, _ = k.c.decideExact(k.p, e, now+ms, k.f)
	if d.Allowed {
		t.Errorf("decision %+v; want denied", d)
	}
	if got := k.debts(); len(got) != 1 || got[0] != (debt{idx: 10, refund: 3}) {
		t.Errorf("debts %+v; want the 3 units back to window 10", got)
	}
	if _, err := e.request().parse.parseReply("x"); err == nil {
		t.Error("a reply that is not an integer read without error")
	}
}

// A plain increment whose reply is read within the clock's error bound of
// its window's end may have counted in a window that was over: it decides
// nothing, and its units are owed back.
func TestPlainLate(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 900*ms
	lc := k.c.lock()
	e := lc.newExact(k.p, k.id(), 1, now, now, k.f)
	lc.unlock()
	rep, _ := e.request().parse.parseReply(int64(5))
	e.answered(result{reply: rep}, exchange{before: now, after: 10*sec + 999*ms + 500*int64(time.Microsecond), ok: true})
	if !e.late(k.f.clock) {
		t.Fatal("a reply read half a millisecond before its window's end is not late")
	}
	lc = k.c.lock()
	lc.settleExact(e, true)
	lc.unlock()
	if got := k.debts(); len(got) != 1 || got[0] != (debt{idx: 10, refund: 1}) {
		t.Errorf("debts %+v; want its unit back to window 10", got)
	}
	// take.lua's reply is never late: Redis chose the window.
	k.f.clock.ErrNS = 0
	lc = k.c.lock()
	e = lc.newExact(k.p, k.id(), 1, now, now, k.f)
	lc.unlock()
	if e.plain || e.late(k.f.clock) {
		t.Error("a take.lua call is plain or late")
	}
}

// A lease of the next window rolled in within the clock's error bound of
// its start, before Redis' window ended: a grant of Redis' window then
// serves, and the lease waits as the next one again (left in hand, the
// grant would have no place, and a decision short of quota would ask
// again until it gave up).
func TestGrantBeforeRolledWindow(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 5 * ms}
	now := 11*sec - 2*ms
	lc := k.c.lock()
	lc.putGrant(k.p, 11, 3, 11*sec, 12*sec, now-ms, k.f) // within the error bound of its start: current
	ahead := lc.cur.Load()
	if ahead == nil || ahead.idx != 11 {
		lc.unlock()
		t.Fatalf("current lease %+v; want window 11's", ahead)
	}
	ahead.avail.Store(0) // used up
	lc.putGrant(k.p, 10, 5, 10*sec, 11*sec, now, k.f)
	cur, next, debts := lc.cur.Load(), lc.next, append([]debt(nil), lc.debts...)
	lc.unlock()
	if cur == nil || cur.idx != 10 || cur.avail.Load() != 5 || next != ahead || len(debts) != 0 {
		t.Fatalf("current %+v next %+v debts %+v; want window 10's grant current, window 11's lease next", cur, next, debts)
	}
	k.mustTake(5, now)
	// Once window 10 ends, window 11's lease is current again.
	if rolled, _ := k.c.roll(k.p, 11*sec, k.f); !rolled || k.c.cur.Load() != ahead {
		t.Fatalf("rolled %v, current %+v; want window 11's lease back", rolled, k.c.cur.Load())
	}
}

// plainAsk makes the lease call of a decision of n units at now as the
// Limiter does: a plain lease when it can be one. The key has seen its
// window's remainder: 900 free, unless the test says otherwise.
func (k *keyTest) plainAsk(n, now int64) *leaseCall {
	lc := k.c.lock()
	defer lc.unlock()
	if _, known := lc.knownFree(now / k.p.periodNS); !known {
		lc.setFree(nil, now/k.p.periodNS, 900)
	}
	call := lc.ask(k.p, k.id(), n, now, k.f)
	lc.makePlain(k.p, call, now, k.f)
	lc.startFlight(call)
	return call
}

// A FixedWindow lease call that asks one window's units and carries no
// debts is a plain increment of that window's counter by what it wants,
// with the expiry lease.lua sets and lease.lua as its fallback. Its reply
// grants what fits under the limit, as lease.lua would; what was counted
// and not granted is owed back.
func TestPlainLease(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 100*ms
	call := k.plainAsk(1, now)
	want := call.win.Want
	if !call.plain || call.plainIdx != 10 || want < 2 {
		t.Fatalf("call %+v; want a plain lease of window 10 of more than the decision's unit", call.win)
	}
	r := call.request()
	key := script.WindowKey(call.win.Base, call.win.Kind, 10)
	if r.script != nil || len(r.cmds) != 3 || r.fallback == nil || r.fallback.fallbackRequest().script != script.Lease {
		t.Fatalf("request %+v; want three plain commands and lease.lua as the fallback", r)
	}
	if c := r.cmds[0]; c[0] != "hincrby" || c[1] != key || c[2] != "c" || c[3] != want {
		t.Errorf("increment %v; want hincrby %s c %d", c, key, want)
	}
	if c := r.cmds[1]; c[0] != "hset" || c[1] != key || c[2] != "r" || c[3] != call.win.Nonce+"!" {
		t.Errorf("record %v; want hset %s r %s!", c, key, call.win.Nonce)
	}
	if c := r.cmds[2]; c[0] != "pexpireat" || c[1] != key || c[2] != int64(12_000) {
		t.Errorf("expiry %v; want pexpireat %s at the window's end and a second", c, key)
	}
	// Within the limit: all of it granted.
	rep, err := r.parse.parseReply(int64(400) + want)
	if err != nil || !rep.plain || rep.win.Idx != 10 || rep.win.Grant != want || rep.win.Count != 400+want {
		t.Fatalf("reply %+v, %v; want all %d granted", rep, err, want)
	}
	k.reply(call, now, rep)
	if k.avail() != want || len(k.debts()) != 0 {
		t.Fatalf("holds %d, debts %+v; want %d and none", k.avail(), k.debts(), want)
	}
	lc := k.c.lock()
	free, known := lc.knownFree(10)
	lc.unlock()
	if !known || free != 1000-400-want {
		t.Errorf("known free %d %v; want %d", free, known, 1000-400-want)
	}

	// Over the limit: what fits is granted, the rest owed back.
	k = newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	call = k.plainAsk(1, now)
	want = call.win.Want
	rep, _ = call.request().parse.parseReply(1000 + want - 2)
	if rep.win.Grant != 2 {
		t.Fatalf("grant %d; want the 2 that fit", rep.win.Grant)
	}
	if e := k.reply(call, now, rep); e.visit != visitNow {
		t.Errorf("effects %+v; the excess must go back soon", e)
	}
	if got := k.debts(); k.avail() != 2 || len(got) != 1 || got[0] != (debt{idx: 10, refund: want - 2}) {
		t.Errorf("holds %d, debts %+v; want 2 held and %d owed back to window 10", k.avail(), got, want-2)
	}

	// Less than the call's Min fits: nothing granted, all of it owed back,
	// the key refused until the window ends.
	k = newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	call = k.plainAsk(3, now)
	want = call.win.Want
	rep, _ = call.request().parse.parseReply(1000 + want - 2)
	if rep.win.Grant != 0 || rep.win.Retry != 900_000 {
		t.Fatalf("reply %+v; want no grant, retry at the window's end", rep.win)
	}
	k.reply(call, now, rep)
	if got := k.debts(); k.avail() > 0 || len(got) != 1 || got[0] != (debt{idx: 10, refund: want}) {
		t.Errorf("holds %d, debts %+v; want nothing held and %d owed back", k.avail(), got, want)
	}
	if _, _, ok := k.take(1, now+ms); ok {
		t.Error("a refused key took in memory")
	}
}

// A plain lease read within the clock's error bound of its window's end
// may have counted after the window ended: no grant of it, all owed back.
func TestPlainLeaseLate(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 900*ms
	call := k.plainAsk(1, now)
	rep, _ := call.request().parse.parseReply(int64(10))
	lc := k.c.lock()
	lc.apply(k.p, call, rep, exchange{before: now, after: 11*sec - 500*int64(time.Microsecond), ok: true}, k.f)
	lc.endFlight(call, call.flight, nil, false)
	lc.unlock()
	if got := k.debts(); k.avail() > 0 || len(got) != 1 || got[0] != (debt{idx: 10, refund: call.win.Want}) {
		t.Errorf("holds %d, debts %+v; want nothing held, all owed back", k.avail(), got)
	}
}

// The syncer's lease of the next window near the current one's end is a
// plain increment of the next window's counter; its grant waits as the
// lease ahead.
func TestPlainLeaseAhead(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	k.lease(10*sec, 100, 100) // 900 free: far from the limit
	k.tick(10 * sec)
	for i := 0; i < 3; i++ {
		k.mustTake(1, 10*sec+500*ms)
	}
	now := 11*sec - 150*ms
	call, _, _ := k.tick(now)
	if call == nil || !call.plain || call.win.WantNext == 0 || call.win.Want != 0 {
		t.Fatalf("call %+v; want a plain lease of the next window", call)
	}
	r := call.request()
	if c := r.cmds[0]; c[0] != "hincrby" || c[1] != script.WindowKey(call.win.Base, call.win.Kind, 11) || c[3] != call.win.WantNext {
		t.Fatalf("increment %v; want window 11's counter by %d", c, call.win.WantNext)
	}
	if c := r.cmds[2]; c[2] != int64(13_000) {
		t.Errorf("expiry %v; want window 11's end and a second", c)
	}
	rep, _ := r.parse.parseReply(call.win.WantNext)
	e := k.reply(call, now, rep)
	if e.leasedAhead != 1 || k.c.next == nil || k.c.next.idx != 11 || k.c.next.avail.Load() != call.win.WantNext || len(k.debts()) != 0 {
		t.Errorf("effects %+v, next %+v, debts %+v; want window 11's lease ahead", e, k.c.next, k.debts())
	}
}

// Calls a plain increment cannot make go through lease.lua: without a
// sample of Redis time, near the window's edges, for a bucket,
// carrying debts, for a window whose remainder was not seen or would not
// leave half the limit free with every instance asking as much, and a call
// sent again after its reply was lost.
func TestPlainLeaseNot(t *testing.T) {
	withClock := func(k *keyTest) *keyTest {
		k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
		return k
	}
	now := 10*sec + 100*ms
	if call := newKeyTest(t, perSecond1000).plainAsk(1, now); call.plain {
		t.Error("plain before any sample of Redis time")
	}
	if call := withClock(newKeyTest(t, perSecond1000)).plainAsk(1, 11*sec-100*int64(time.Microsecond)); call.plain {
		t.Error("plain within the error bound of the window's end")
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		if call := withClock(newKeyTest(t, perSecond1000, algorithm(alg))).plainAsk(1, now); call.plain {
			t.Errorf("plain for %v", alg)
		}
	}
	k := withClock(newKeyTest(t, perSecond1000))
	lc := k.c.lock()
	lc.owe(10, 3, 0)
	lc.unlock()
	if call := k.plainAsk(1, now); call.plain || len(call.win.Adjust) != 1 {
		t.Errorf("call %+v: plain, or its debt left behind", call.win)
	}
	// near the limit, or the remainder never seen: what a plain increment
	// counts over the limit would refuse other instances until given back
	for _, c := range []struct {
		free  int64 // -1: unknown
		plain bool
	}{{500, false}, {500 + 62 - 1, false}, {500 + 62, true}, {-1, false}} { // (62: what the call asks)
		k = withClock(newKeyTest(t, perSecond1000))
		lc = k.c.lock()
		if c.free >= 0 {
			lc.setFree(nil, 10, c.free)
		}
		call := lc.ask(k.p, k.id(), 1, now, k.f)
		lc.makePlain(k.p, call, now, k.f)
		lc.unlock()
		if call.win.Want != 62 || call.plain != c.plain {
			t.Errorf("%d free (-1: unknown): asks %d, plain %v; want 62, %v", c.free, call.win.Want, call.plain, c.plain)
		}
	}
	k = withClock(newKeyTest(t, perSecond1000))
	call := k.plainAsk(1, now)
	k.lost(call, false)
	lc = k.c.lock()
	again := lc.ask(k.p, callID{}, 1, now, k.f)
	lc.unlock()
	if again != call || again.plain || !again.win.Resent || again.request().script != script.Lease {
		t.Errorf("resend %+v; want the same call, resent through lease.lua", again.win)
	}
}
