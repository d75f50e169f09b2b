package hybrid

import (
	"testing"
	"time"

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
	k.c.lastUse.Store(9*sec + 800*ms) // seen before: it holds the next window (see TestHoldAhead)
	lc := k.c.lock()
	lc.owe(10, 4, 0)
	e := lc.newExact(k.p, k.id(), 2, now, now, k.f)
	lc.unlock()
	if !e.plain || e.take.AdjustIdx != 10 || e.take.Refund != 4 {
		t.Fatalf("exact call %+v; want a plain increment of window 10 carrying a refund of 4", e.take)
	}
	r := e.request()
	key := script.WindowKey(e.take.Base, e.take.Kind, 10)
	if r.script != nil || len(r.cmds) != 4 || r.ahead != 3 || r.fallback == nil || r.fallback().script != script.Take {
		t.Fatalf("request %+v; want four plain commands (two of them holding the next window) and take.lua as the fallback", r)
	}
	if c := r.cmds[0]; c[0] != "hincrby" || c[1] != key || c[2] != "c" || c[3] != int64(2-4) {
		t.Errorf("increment %v; want hincrby %s c -2", c, key)
	}
	if c := r.cmds[1]; c[0] != "pexpireat" || c[1] != key || c[2] != int64(12_000) {
		t.Errorf("expiry %v; want pexpireat %s at the window's end and a second", c, key)
	}
	// Admitted: the count after it within the limit.
	rep, err := r.parse(int64(990))
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
	rep, _ = e.request().parse(int64(1002))
	e.answered(result{reply: rep}, exchange{before: now, after: now + ms, ok: true})
	d, _, _ = k.c.decideExact(k.p, e, now+ms, k.f)
	if d.Allowed {
		t.Errorf("decision %+v; want denied", d)
	}
	if got := k.debts(); len(got) != 1 || got[0] != (debt{idx: 10, refund: 3}) {
		t.Errorf("debts %+v; want the 3 units back to window 10", got)
	}
	if _, err := e.request().parse("x"); err == nil {
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
	rep, _ := e.request().parse(int64(5))
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

// holdTick runs the syncer's visit of the key at now as Limiter.plan does:
// a lease call, or else the call that holds the next window.
func (k *keyTest) holdTick(now int64) (*leaseCall, *exactCall) {
	lc := k.c.lock()
	defer lc.unlock()
	t, _ := lc.observe(k.p, now, k.f)
	call, _ := lc.plan(k.p, k.id(), t, k.f)
	if call != nil {
		lc.startFlight(call)
		return call, nil
	}
	return nil, lc.holdNext(k.p, k.id(), now, now, t, k.f)
}

// plainReply answers plain exact call e as Redis would at now: its window's
// count after it, and the next window's after the hold.
func plainReply(t *testing.T, e *exactCall, now, count, ahead int64) {
	t.Helper()
	r := e.request()
	rep, err := r.parse(count)
	if err != nil {
		t.Fatal(err)
	}
	if r.ahead > 0 {
		rep.ahead, rep.aheadOK = ahead, true
	}
	e.answered(result{reply: rep}, exchange{before: now, after: now, ok: true})
}

// A cold key's exact call holds a unit of the next window in the same
// round trip; the key decides from it in memory in that window, and the
// syncer then holds the window after it (a call of no units nobody waits
// on). A hold not used stays counted to its window's end, never given back
// while the key is quiet, and is dropped then.
func TestHoldAhead(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 100*ms
	// A key not seen before holds nothing; nor one last seen more than
	// two periods before.
	for _, last := range []int64{0, 8*sec + 50*ms} {
		k.c.lastUse.Store(last)
		lc := k.c.lock()
		e := lc.newExact(k.p, k.id(), 1, now, now, k.f)
		lc.settleExact(e, false)
		lc.unlock()
		if !e.plain || e.ahead != 0 {
			t.Fatalf("last seen at %v: plain %v, hold %d; want a plain increment holding nothing", time.Duration(last), e.plain, e.ahead)
		}
	}
	k.c.lastUse.Store(8*sec + 200*ms)
	lc := k.c.lock()
	e := lc.newExact(k.p, k.id(), 1, now, now, k.f)
	lc.unlock()
	if !e.plain || e.ahead != 1 {
		t.Fatalf("exact call plain %v ahead %d; want a plain increment holding 1 unit ahead", e.plain, e.ahead)
	}
	r := e.request()
	key11 := script.WindowKey(e.take.Base, e.take.Kind, 11)
	if c := r.cmds[2]; c[0] != "hincrby" || c[1] != key11 || c[3] != int64(1) {
		t.Errorf("hold %v; want hincrby %s c 1", c, key11)
	}
	if c := r.cmds[3]; c[0] != "pexpireat" || c[1] != key11 || c[2] != int64(13_000) {
		t.Errorf("hold's expiry %v; want pexpireat %s at its window's end and a second", c, key11)
	}
	plainReply(t, e, now, 5, 7)
	d, _, x := k.c.decideExact(k.p, e, now+ms, k.f)
	if !d.Allowed || x.leasedAhead != 1 {
		t.Fatalf("decision %+v effects %+v; want admitted and a lease ahead", d, x)
	}
	if n := k.c.next; n == nil || n.idx != 11 || !n.held || !n.pre || n.avail.Load() != 1 || n.start != 11*sec || n.end != 12*sec {
		t.Fatalf("next lease %+v; want 1 unit of window 11 held", n)
	}
	if x.visit != visitNow {
		t.Errorf("visit %v; want the syncer to watch the new lease", x.visit)
	}
	if call, hold := k.holdTick(now + 2*ms); call != nil || hold != nil {
		t.Fatalf("tick after the decision sent %+v %+v", call, hold)
	}
	// Quiet through the window's start: kept.
	if call, hold := k.holdTick(11*sec + 500*ms); call != nil || hold != nil {
		t.Fatalf("quiet tick sent %+v %+v", call, hold)
	}
	if l := k.c.cur.Load(); l == nil || l.idx != 11 || l.avail.Load() != 1 || len(k.debts()) != 0 {
		t.Fatalf("current lease %+v, debts %+v; want the hold, kept", l, k.debts())
	}
	// Asked in window 11: decided in memory, and the syncer hears of it.
	if _, v, ok := k.take(1, 11*sec+600*ms); !ok || v != visitSoon {
		t.Fatalf("take from the hold: ok %v visit %v", ok, v)
	}
	call, hold := k.holdTick(11*sec + 650*ms)
	// (sized from its demand: 1 unit in this window, and half again)
	if call != nil || hold == nil || !hold.bg || hold.n != 0 || hold.ahead != 2 || hold.take.AdjustIdx != 11 {
		t.Fatalf("tick after the hold's use: lease call %+v, hold %+v; want a call holding window 12", call, hold)
	}
	if _, again := k.holdTick(11*sec + 700*ms); again != nil {
		t.Fatal("window 12 held twice")
	}
	// It carries nothing for window 11: the hold alone.
	key12 := script.WindowKey(e.take.Base, e.take.Kind, 12)
	if r := hold.request(); len(r.cmds) != 2 || r.ahead != 1 || r.cmds[0][0] != "hincrby" || r.cmds[0][1] != key12 || r.cmds[0][3] != int64(2) || r.cmds[1][0] != "pexpireat" {
		t.Fatalf("hold request %+v; want hincrby %s c 2 and its expiry", r.cmds, key12)
	}
	plainReply(t, hold, 11*sec+700*ms, 3, 4)
	lc = k.c.lock()
	lc.settleExact(hold, false)
	lc.holdAhead(k.p, hold, 11*sec+700*ms, k.f)
	lc.unlock()
	if n := k.c.next; n == nil || n.idx != 12 || !n.held || n.avail.Load() != 2 {
		t.Fatalf("next lease %+v; want 2 units of window 12 held", n)
	}
	// Not used in window 12: dropped at its end, nothing sent back.
	k.holdTick(12*sec + 500*ms)
	if call, hold := k.holdTick(13*sec + 10*ms); call != nil || hold != nil || len(k.debts()) != 0 || k.c.cur.Load() != nil {
		t.Fatalf("after the hold's window: call %+v hold %+v debts %+v lease %+v; want nothing", call, hold, k.debts(), k.c.cur.Load())
	}
	if k.c.expired != 2 {
		t.Errorf("expired %d; want the 2 unused units", k.c.expired)
	}
}

// A key past half its limit holds nothing ahead; a hold whose reply shows
// the key's count past half the limit goes back; so does one without a
// place.
func TestHoldAheadBusy(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 100*ms
	k.c.lastUse.Store(9 * sec)
	lc := k.c.lock()
	e := lc.newExact(k.p, k.id(), 1, now, now, k.f)
	lc.unlock()
	plainReply(t, e, now, 501, 3)
	if d, _, _ := k.c.decideExact(k.p, e, now+ms, k.f); !d.Allowed {
		t.Fatalf("decision %+v; want admitted", d)
	}
	if k.c.next != nil {
		t.Fatalf("next lease %+v; want none for a key past half its limit", k.c.next)
	}
	if got := k.debts(); len(got) != 1 || got[0] != (debt{idx: 11, refund: 1}) {
		t.Fatalf("debts %+v; want the hold back to window 11", got)
	}
	lc = k.c.lock()
	e = lc.newExact(k.p, k.id(), 1, now, now, k.f)
	lc.unlock()
	if e.ahead != 0 {
		t.Errorf("hold %d for a key known past half its limit; want none", e.ahead)
	}
	// Small shares hold nothing: 1000 / 8 instances is less than leaseShare x 8.
	k = newKeyTest(t, perSecond1000)
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	k.f.instances = 200
	k.c.lastUse.Store(9 * sec)
	lc = k.c.lock()
	e = lc.newExact(k.p, k.id(), 1, now, now, k.f)
	lc.unlock()
	if !e.plain || e.ahead != 0 {
		t.Errorf("plain %v hold %d with 200 instances; want a plain increment holding nothing", e.plain, e.ahead)
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
