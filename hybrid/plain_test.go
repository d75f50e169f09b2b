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
	lc := k.c.lock()
	lc.owe(10, 4, 0)
	e := lc.newExact(k.p, k.id(), 2, now, now, k.f)
	lc.unlock()
	if !e.plain || e.take.AdjustIdx != 10 || e.take.Refund != 4 {
		t.Fatalf("exact call %+v; want a plain increment of window 10 carrying a refund of 4", e.take)
	}
	r := e.request()
	key := script.WindowKey(e.take.Base, e.take.Kind, 10)
	if r.script != nil || len(r.cmds) != 2 || r.fallback == nil || r.fallback().script != script.Take {
		t.Fatalf("request %+v; want two plain commands and take.lua as the fallback", r)
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
