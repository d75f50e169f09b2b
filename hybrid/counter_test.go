package hybrid

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// Tests of the per-key state machine, with explicit times and no Redis:
// every reply is written out as Redis would give it. Redis time equals the
// Limiter's time (mono), so window i of period P spans [i*P, (i+1)*P).

const (
	sec = int64(time.Second)
	ms  = int64(time.Millisecond)
)

// keyTest is one key's state machine under test.
type keyTest struct {
	t   *testing.T
	p   *params
	f   fleet
	c   *counter
	seq int64
}

func newKeyTest(t *testing.T, limit ratelimit.Limit, set ...func(*config)) *keyTest {
	t.Helper()
	cfg := defaultConfig()
	cfg.holder = "me"
	for _, s := range set {
		s(&cfg)
	}
	p := newParams(limit, cfg)
	return &keyTest{t: t, p: p, c: &counter{key: "k", lead: p.leadOf("k")},
		f: fleet{instances: 1, tickGap: p.interval, lastGap: p.interval, breaker: breaker.Closed, clock: clockView{PeriodUS: p.periodUS}}}
}

func algorithm(a ratelimit.Algorithm) func(*config) { return func(c *config) { c.algorithm = a } }
func optimistic(c *config)                          { c.mode = Optimistic }

func (k *keyTest) take(n, now int64) (ratelimit.Decision, visit, bool) {
	var d ratelimit.Decision
	_, v, ok := k.c.take(k.p, n, now, &d)
	return d, v, ok
}

// mustTake takes n at now and fails unless it is admitted.
func (k *keyTest) mustTake(n, now int64) ratelimit.Decision {
	k.t.Helper()
	d, _, ok := k.take(n, now)
	if !ok || !d.Allowed {
		k.t.Fatalf("take %d at %v: ok %v, %+v; want admitted", n, time.Duration(now), ok, d)
	}
	return d
}

func (k *keyTest) id() callID {
	k.seq++
	return callID{seq: k.seq, nonce: "abcdef"}
}

// ask makes and launches the call of a decision of n units at now.
func (k *keyTest) ask(n, now int64) *leaseCall {
	lc := k.c.lock()
	defer lc.unlock()
	call := lc.ask(k.p, k.id(), n, now, k.f)
	lc.startFlight(call)
	return call
}

// reply applies r to call, as if Redis answered it at now.
func (k *keyTest) reply(call *leaseCall, now int64, r reply) effects {
	lc := k.c.lock()
	defer lc.unlock()
	e := lc.apply(k.p, call, r, exchange{before: now, after: now, ok: true}, k.f)
	if fl := call.flight; fl != nil {
		lc.endFlight(call, fl, nil, false)
	}
	return e
}

// lost ends call's flight without a reply.
func (k *keyTest) lost(call *leaseCall, notRun bool) {
	lc := k.c.lock()
	defer lc.unlock()
	lc.endFlight(call, call.flight, errLost, notRun)
}

var errLost = errorString("no reply")

type errorString string

func (e errorString) Error() string { return string(e) }

// win is lease.lua's reply to a call at now: grant units from the current
// window, whose count (what bounds further grants) is then count.
func (k *keyTest) win(now, grant, count int64) reply {
	idx := now / k.p.periodNS
	return reply{win: script.Reply{Idx: idx, Now: now / 1000, Reset: ((idx+1)*k.p.periodNS - now) / 1000, Grant: grant, Count: count}}
}

// tick runs the syncer's visit of the key at now. It returns the call to
// send, launched, when to visit next, and how soon the syncer must see
// the key again.
func (k *keyTest) tick(now int64) (*leaseCall, int64, visit) {
	lc := k.c.lock()
	defer lc.unlock()
	t, v := lc.observe(k.p, now, k.f)
	t.dead = k.c.dead.Load()
	call, at := lc.plan(k.p, k.id(), t, k.f)
	if call != nil {
		lc.startFlight(call)
	}
	return call, at, v
}

func (k *keyTest) debts() []debt {
	lc := k.c.lock()
	defer lc.unlock()
	return append([]debt(nil), lc.debts...)
}

func (k *keyTest) avail() int64 {
	if l := k.c.cur.Load(); l != nil {
		return l.avail.Load()
	}
	return -1
}

// lease gives the key a lease of grant units of the window at now.
func (k *keyTest) lease(now, grant, count int64) {
	k.t.Helper()
	call := k.ask(1, now)
	k.reply(call, now, k.win(now, grant, count))
	if got := k.avail(); got != grant {
		k.t.Fatalf("lease of %d at %v: the key holds %d", grant, time.Duration(now), got)
	}
}

var perSecond1000 = ratelimit.Limit{Rate: 1000, Period: time.Second}

// A hot key takes from its lease in memory: what remains is the lease and
// what Redis has free; the syncer hears of the key once the lease runs
// below a quarter of what it held.
func TestTakeFromLease(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	now := 10*sec + 200*ms
	k.lease(now, 40, 500) // 500 free in Redis beyond the lease
	steps := []struct {
		n         int64
		ok        bool
		remaining int
		visit     visit
	}{
		{n: 10, ok: true, remaining: 30 + 500},
		{n: 20, ok: true, remaining: 10 + 500},
		{n: 1, ok: true, remaining: 9 + 500, visit: visitSoon}, // below 40/4
		{n: 10, ok: false},                                     // more than the lease holds: the slow path
	}
	for i, s := range steps {
		d, v, ok := k.take(s.n, now)
		if ok != s.ok || v != s.visit || (ok && (!d.Allowed || d.Remaining != s.remaining || d.ResetAfter != 800*time.Millisecond)) {
			t.Errorf("step %d: take %d: ok %v visit %v %+v; want ok %v visit %v, remaining %d, reset 800ms", i, s.n, ok, v, d, s.ok, s.visit, s.remaining)
		}
	}
	if _, _, ok := k.take(1, 11*sec); ok {
		t.Error("a lease served after its window ended")
	}
	if got := k.c.cur.Load().tick.Load(); got != 3<<32|31 {
		t.Errorf("counted %d decisions of %d units, want 3 of 31", got>>32, uint32(got))
	}
}

// The hot path allocates nothing.
func TestTakeAllocatesNothing(t *testing.T) {
	k := newKeyTest(t, ratelimit.Limit{Rate: 1 << 30, Period: time.Hour})
	now := 10 * sec
	k.lease(now, 1<<29, 0)
	if a := testing.AllocsPerRun(1000, func() { k.take(1, now) }); a != 0 {
		t.Errorf("take allocates %v times", a)
	}
}

// A key whose lease ran dry asks Redis: the call is sized by want, the
// grant adds to the lease, and the decision takes from it.
func TestDryLeaseStrictAsks(t *testing.T) {
	k := newKeyTest(t, perSecond1000, func(c *config) { c.instances = 4 })
	k.f.instances = 4
	now := 10*sec + 300*ms
	if _, _, ok := k.take(1, now); ok {
		t.Fatal("a key without a lease decided in memory")
	}
	call := k.ask(3, now)
	floor := int64(1000 / (16 * 4))
	if a := call.win; a.Want != floor || a.Min != 3 || a.WantNext != 0 || a.Instances != 4 || len(a.Adjust) != 0 {
		t.Fatalf("call %+v; want Want %d (minLease) Min 3, nothing else", a, floor)
	}
	e := k.reply(call, now, k.win(now, floor, 100))
	if e.leases != 1 || e.leasedUnits != uint64(floor) {
		t.Errorf("effects %+v; want 1 lease of %d", e, floor)
	}
	d := k.mustTake(3, now)
	if d.Remaining != int(floor-3+900) {
		t.Errorf("remaining %d, want %d", d.Remaining, floor-3+900)
	}
	// Dry again with 2 left: a decision of 5 asks for the missing 3 at least.
	k.mustTake(floor-5, now)
	call = k.ask(5, now)
	if call.win.Min != 3 || call.win.Want != floor {
		t.Errorf("call %+v; want Min 3 (5 less the 2 held), Want %d", call.win, floor)
	}
}

// want, the one sizing rule: the key's demand until the end with half
// again, less what it holds; at least n and minLease.
func TestWantSizing(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	now, end := 10*sec+500*ms, 11*sec
	cases := []struct {
		name                      string
		rate                      float64
		asked, prevAsked, n, have int64
		want                      int64
	}{
		{name: "no history: minLease", want: 62},
		{name: "n above minLease", n: 80, want: 80},
		{name: "smoothed rate", rate: 2000, have: 100, want: 1500 - 100},
		{name: "last window", prevAsked: 400, want: 300},
		{name: "this window, scaled to a period", asked: 300, prevAsked: 100, want: 450},
		{name: "holding more than needed", prevAsked: 400, have: 500, want: 62},
	}
	for _, c := range cases {
		lc := k.c.lock()
		lc.rate, lc.asked, lc.prevAsked, lc.askedIdx = c.rate, c.asked, c.prevAsked, 10
		got := lc.want(k.p, c.n, c.have, now, end, k.f)
		lc.unlock()
		if got != c.want {
			t.Errorf("%s: want %d, got %d", c.name, c.want, got)
		}
	}
}

// In optimistic mode a key without quota admits on credit, within Rate /
// (8 x instances) per window, and reports the credit at the next tick; the
// grant that comes with it replaces the estimated lease, credit budget
// and all.
func TestDryLeaseOptimisticBorrows(t *testing.T) {
	k := newKeyTest(t, perSecond1000, optimistic)
	k.f.instances = 2
	share := k.p.optimisticShare(k.f)
	if share != 62 {
		t.Fatalf("share %d, want 1000/16", share)
	}
	now := 10*sec + 100*ms
	for i := int64(0); i < share; i++ {
		d, _, v, ok := k.c.onCredit(k.p, 1, now, share, k.f)
		if !ok || !d.Allowed || d.Remaining != int(share-i-1) || v == visitNone {
			t.Fatalf("borrow %d: ok %v %+v visit %v", i, ok, d, v)
		}
	}
	if _, _, _, ok := k.c.onCredit(k.p, 1, now, share, k.f); ok {
		t.Fatal("borrowed past the share")
	}
	l := k.c.cur.Load()
	if l.known || l.idx != 10 || l.credit.Load() != share {
		t.Fatalf("lease %+v: want an estimated lease of window 10 holding %d credit", l, share)
	}
	call, _, _ := k.tick(now + 50*ms)
	if call == nil || len(call.win.Adjust) != 1 || call.win.Adjust[0] != (script.Adjust{Idx: 10, Use: share}) || call.win.Want == 0 {
		t.Fatalf("tick call %+v; want the credit reported and a lease asked", call)
	}
	e := k.reply(call, now+50*ms, k.win(now+50*ms, 100, 300))
	if e.reported != uint64(share) {
		t.Errorf("reported %d, want %d", e.reported, share)
	}
	nl := k.c.cur.Load()
	if !nl.known || nl.avail.Load() != 100 || nl.borrowed.Load() != share {
		t.Errorf("lease after the grant: known %v avail %d borrowed %d; want known, 100, the window's %d borrowed", nl.known, nl.avail.Load(), nl.borrowed.Load(), share)
	}
	if _, _, _, ok := k.c.onCredit(k.p, 1, now, share, k.f); ok {
		t.Error("the window's credit budget was handed out twice")
	}
}

// nextLease gives the key a lease of grant units of the window at now and
// one of next units of the window after it.
func (k *keyTest) nextLease(now, grant, next int64) {
	k.t.Helper()
	call := &leaseCall{c: k.c, win: script.LeaseArgs{Want: grant, WantNext: next}}
	lc := k.c.lock()
	lc.startFlight(call)
	lc.unlock()
	r := k.win(now, grant, grant)
	r.win.GrantNext, r.win.CountNext = next, next
	if e := k.reply(call, now, r); e.leasedAhead != 1 || e.visit != visitNow {
		k.t.Fatalf("lease ahead: effects %+v", e)
	}
}

// At the window's end the lease taken ahead becomes the one decisions take
// from, without Redis; what the old lease held is given back while its
// window still counts (SlidingWindow), and expires with it (FixedWindow).
func TestRollToLeaseAhead(t *testing.T) {
	for _, c := range []struct {
		alg     ratelimit.Algorithm
		refund  int64
		expired int64
	}{{ratelimit.FixedWindow, 0, 5}, {ratelimit.SlidingWindow, 5, 0}} {
		t.Run(c.alg.String(), func(t *testing.T) {
			k := newKeyTest(t, perSecond1000, algorithm(c.alg))
			k.nextLease(10*sec+900*ms, 10, 20)
			k.mustTake(5, 10*sec+990*ms)
			if k.c.next == nil || !k.c.next.pre {
				t.Fatal("no lease ahead")
			}
			now := 11 * sec
			if _, _, ok := k.take(1, now); ok {
				t.Fatal("took from a lease whose window ended")
			}
			rolled, v := k.c.roll(k.p, now, k.f)
			if !rolled || v != visitNow {
				t.Fatalf("roll: %v %v", rolled, v)
			}
			d := k.mustTake(1, now)
			if d.ResetAfter != time.Second || k.avail() != 19 {
				t.Errorf("after the roll: %+v, holds %d; want a second to go and 19", d, k.avail())
			}
			var refund int64
			for _, d := range k.debts() {
				refund += d.refund
			}
			if refund != c.refund || k.c.expired != c.expired {
				t.Errorf("the old lease's 5: refund %d expired %d; want %d, %d", refund, k.c.expired, c.refund, c.expired)
			}
		})
	}
}

// Without a lease ahead, the first decision of a window asks Redis; the
// grant for the new window becomes the current lease and the old one is
// retired.
func TestRollWithoutLeaseAhead(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.lease(10*sec+500*ms, 30, 30)
	now := 11*sec + 10*ms
	if rolled, _ := k.c.roll(k.p, now, k.f); rolled {
		t.Fatal("rolled to nothing")
	}
	if _, _, ok := k.take(1, now); ok {
		t.Fatal("decided without a lease of the window")
	}
	call := k.ask(1, now)
	e := k.reply(call, now, k.win(now, 40, 40))
	if l := k.c.cur.Load(); l.idx != 11 || l.avail.Load() != 40 || e.visit != visitNow || k.c.expired != 30 {
		t.Errorf("lease w%d holding %d, effects %+v, expired %d; want w11 40, the syncer told, 30 expired", l.idx, l.avail.Load(), e, k.c.expired)
	}
}

// A lease about to run dry is topped up at the tick, sized from the key's
// demand until the window's end.
func TestTopUpAtTick(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	start := 10 * sec
	k.lease(start, 100, 100)
	k.tick(start) // the first visit: demand counts from here
	for i := 0; i < 80; i++ {
		k.mustTake(1, start+50*ms)
	}
	now := start + 100*ms
	call, _, _ := k.tick(now)
	// 80 in the first 100ms: 800 per period; 900ms to go, with half again,
	// less the 20 held.
	if call == nil || call.win.Want != 1080-20 {
		t.Fatalf("call %+v; want a top-up of 1060", call)
	}
	k.reply(call, now, k.win(now, 1060, 1160))
	if got := k.avail(); got != 1080 {
		t.Errorf("holds %d, want 1080", got)
	}
}

// A visit of a key with nothing to send allocates nothing: most of the
// syncer's visits are such (a key's roll, its look at leasing ahead, its
// idle check), one per key and tick over many keys.
func TestQuietVisitAllocatesNothing(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	now := 10 * sec
	k.lease(now, 500, 500)
	k.tick(now)
	k.mustTake(1, now)
	now += 100 * ms
	if a := testing.AllocsPerRun(100, func() {
		if call, _, _ := k.tick(now); call != nil {
			t.Fatalf("a key holding 499 of 500 sent %+v", call.win)
		}
	}); a != 0 {
		t.Errorf("a visit with nothing to send allocates %v times", a)
	}
}

// A call planned without an identity (the syncer's: most visits send
// nothing) has none until identify gives it one, before it is sent.
func TestPlannedCallIdentity(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	now := 10 * sec
	k.lease(now, 100, 100)
	k.tick(now)
	for i := 0; i < 80; i++ {
		k.mustTake(1, now+50*ms)
	}
	now += 100 * ms
	lc := k.c.lock()
	defer lc.unlock()
	t0, _ := lc.observe(k.p, now, k.f)
	call, _ := lc.plan(k.p, callID{}, t0, k.f)
	if call == nil || call.seq() != 0 || call.win.Nonce != "" || call.win.Base == "" {
		t.Fatalf("call %+v; want a top-up with a key base and no identity yet", call)
	}
	call.identify(callID{seq: 7, nonce: "n7"})
	if call.seq() != 7 || call.win.Nonce != "n7" {
		t.Errorf("identified call %+v; want seq 7, nonce n7", call.win)
	}
}

// A lease taken ahead and never used by a key gone quiet goes back soon
// after its window begins.
func TestIdleGiveBack(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.nextLease(10*sec+900*ms, 10, 20)
	k.c.lastUse.Store(10*sec + 900*ms)
	lc := k.c.lock()
	lc.askedIdx, lc.asked = 10, 40 // 40 a window: quiet for 200ms is idle
	lc.unlock()
	if call, _, _ := k.tick(11*sec + 150*ms); call != nil {
		t.Fatalf("gave back after 150ms: %+v", call.win)
	}
	k.mustGiveBack(11*sec+250*ms, 11, 20)
}

// mustGiveBack runs the syncer's visit at now and fails unless it gives
// the key's lease back: a call refunding n units of window idx and asking
// nothing, the lease gone, n refunded once Redis answers.
func (k *keyTest) mustGiveBack(now, idx, n int64) {
	k.t.Helper()
	call, _, _ := k.tick(now)
	if call == nil || len(call.win.Adjust) != 1 || call.win.Adjust[0] != (script.Adjust{Idx: idx, Refund: n}) || call.win.Want != 0 {
		k.t.Fatalf("call %+v; want the %d unused of window %d given back", call, n, idx)
	}
	if k.c.cur.Load() != nil {
		k.t.Error("the lease stayed")
	}
	if e := k.reply(call, now, k.win(now, 0, 0)); e.refunded != uint64(n) {
		k.t.Errorf("refunded %d, want %d", e.refunded, n)
	}
}

// A key gone quiet gives its lease back while its window has a while to
// run (its client moved to another instance, which Redis refuses until
// the quota comes back): once surely quiet for its idle gap, to the
// resolution of its last use (a 32nd of the period), and not when the
// window would end within a gap of that.
func TestQuietKeyGiveBack(t *testing.T) {
	limit := ratelimit.Limit{Rate: 1000, Period: 10 * time.Second}
	start := 100 * sec // window 10
	used := func(k *keyTest, at int64) int64 {
		k.lease(start, 300, 300)
		lc := k.c.lock()
		lc.askedIdx, lc.asked = 9, 400 // 400 in the last window: quiet for 100ms is idle, and the gap is at least 200ms
		lc.unlock()
		k.mustTake(1, at)
		_, visit, _ := k.tick(at)
		return visit
	}

	k := newKeyTest(t, limit)
	grain := k.p.useGrain
	lastUse := start + sec
	if at, want := used(k, lastUse), lastUse+grain+200*ms; at != want {
		t.Fatalf("visit at %v, want %v: quiet for the grain and the gap", time.Duration(at), time.Duration(want))
	}
	if call, _, _ := k.tick(lastUse + grain + 199*ms); call != nil || k.c.cur.Load() == nil {
		t.Fatalf("gave back before the gap: %+v", call)
	}
	k.mustGiveBack(lastUse+grain+200*ms, 10, 299)

	k = newKeyTest(t, limit)
	lastUse = start + 10*sec - 1400*ms // quiet enough 887.5ms before the end: an instance Redis refused might not ask again before it
	used(k, lastUse)
	call, _, _ := k.tick(start + 10*sec - 10*ms)
	if k.c.cur.Load() == nil || call != nil && len(call.win.Adjust) != 0 {
		t.Errorf("gave back within a second of the window's end: %+v", call)
	}
}

// Within its lead of the window's end, a key asked in this window leases
// the next one in the same call; the grant waits as a lease ahead.
func TestLeaseAheadAtTick(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.lease(10*sec, 500, 500)
	k.tick(10 * sec)
	for i := 0; i < 3; i++ {
		k.mustTake(1, 10*sec+500*ms)
	}
	now := 11*sec - 150*ms // within any key's lead (at least 2 ticks)
	call, _, _ := k.tick(now)
	if call == nil || call.win.WantNext != k.p.minLease(k.f) || call.win.Lead <= 150_000 {
		t.Fatalf("call %+v; want the next window's floor, within a lead of over 150ms", call)
	}
	r := k.win(now, 0, 500)
	r.win.GrantNext, r.win.CountNext = 62, 62
	e := k.reply(call, now, r)
	if e.leasedAhead != 1 || k.c.next == nil || k.c.next.idx != 11 || !k.c.next.pre {
		t.Errorf("effects %+v, next %+v; want a lease of window 11 ahead", e, k.c.next)
	}
}

// What a key owes goes in its next call, per window, at most MaxAdjust
// windows; windows that bound nothing any more are dropped.
func TestDebtsAttached(t *testing.T) {
	for _, c := range []struct {
		alg            ratelimit.Algorithm
		owed           []int64
		attached, left []int64
	}{
		// FixedWindow: at 10.5s, windows 8 and 9 are over.
		{ratelimit.FixedWindow, []int64{8, 9, 10, 11}, []int64{10, 11}, nil},
		// SlidingWindow: window 9 still weighs on 10; 8 does not. Three
		// windows go in one call, the fourth waits for the next.
		{ratelimit.SlidingWindow, []int64{8, 9, 10, 11, 12}, []int64{9, 10, 11}, []int64{12}},
	} {
		t.Run(c.alg.String(), func(t *testing.T) {
			k := newKeyTest(t, perSecond1000, algorithm(c.alg))
			lc := k.c.lock()
			for _, idx := range c.owed {
				lc.owe(idx, idx, 1)
			}
			lc.unlock()
			call := k.ask(1, 10*sec+500*ms)
			var got, left []int64
			for _, a := range call.win.Adjust {
				got = append(got, a.Idx)
				if a.Refund != a.Idx || a.Use != 1 {
					t.Errorf("window %d: refund %d use %d", a.Idx, a.Refund, a.Use)
				}
			}
			for _, d := range k.debts() {
				left = append(left, d.idx)
			}
			if !slices.Equal(got, c.attached) || !slices.Equal(left, c.left) {
				t.Errorf("attached %v, left %v; want %v, %v", got, left, c.attached, c.left)
			}
		})
	}
}

// A key Redis refused is denied in memory until Redis said the quota would
// fit, or for a second at most: then it asks again, as other instances may
// have given back what they held. Smaller decisions may still ask.
func TestRefusedKeyAsksAgain(t *testing.T) {
	for _, c := range []struct {
		name          string
		period        time.Duration
		blocked, told time.Duration // denied in memory for, and the RetryAfter given then
	}{
		{"a second", time.Second, 800 * time.Millisecond, 800 * time.Millisecond},
		{"a minute", time.Minute, time.Second, 59*time.Second + 800*time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newKeyTest(t, ratelimit.Limit{Rate: 1000, Period: c.period})
			p := int64(c.period)
			now := 10*p + 200*ms
			call := k.ask(5, now)
			r := k.win(now, 0, 998)
			r.win.Retry = r.win.Reset
			k.reply(call, now, r)
			d, _, ok := k.take(5, now+100*ms)
			if !ok || d.Allowed || d.RetryAfter != c.told-100*time.Millisecond {
				t.Fatalf("refused key: ok %v %+v; want denied, RetryAfter %v", ok, d, c.told-100*time.Millisecond)
			}
			if _, _, ok := k.take(2, now+100*ms); ok {
				t.Error("a decision smaller than the one refused did not ask")
			}
			if _, _, ok := k.take(5, now+int64(c.blocked)); ok {
				t.Errorf("still denied in memory after %v", c.blocked)
			}
		})
	}
}

// A call whose reply was lost stays outstanding and goes again at the next
// tick, marked resent; when Redis cannot tell whether it ran, nothing is
// granted and its refunds are not counted (the safe side), but its credit
// is. A call that certainly did not run goes again as new.
func TestLostReply(t *testing.T) {
	for _, notRun := range []bool{false, true} {
		k := newKeyTest(t, perSecond1000)
		now := 10*sec + 100*ms
		lc := k.c.lock()
		lc.owe(10, 7, 3)
		lc.unlock()
		call := k.ask(1, now)
		k.lost(call, notRun)
		if k.c.out != call {
			t.Fatal("the call was forgotten")
		}
		again, at, _ := k.tick(now + 100*ms)
		if again != call || at != 0 || call.win.Resent == notRun {
			t.Fatalf("notRun %v: tick sent %p (resent %v), visit at %d; want the same call, resent %v", notRun, again, call.win.Resent, at, !notRun)
		}
		r := k.win(now+100*ms, 50, 60)
		r.win.Unknown = !notRun
		e := k.reply(call, now+100*ms, r)
		want := effects{refunded: 7, reported: 3, leases: 1, leasedUnits: 50}
		if !notRun {
			want = effects{reported: 3}
		}
		e.visit = 0
		if e != want {
			t.Errorf("notRun %v: effects %+v, want %+v", notRun, e, want)
		}
		if k.c.out != nil {
			t.Error("the call is still outstanding")
		}
		// A second reply to the same call changes nothing.
		if e := k.reply(call, now+100*ms, k.win(now+100*ms, 50, 60)); e != (effects{}) {
			t.Errorf("a second reply had effects %+v", e)
		}
	}
}

// A grant that arrives after its window ended, or while the Limiter
// drains, is owed back at once.
func TestGrantOwedBack(t *testing.T) {
	for _, c := range []struct {
		name     string
		draining bool
		at       int64
	}{{"late", false, 11*sec + 10*ms}, {"draining", true, 10*sec + 500*ms}} {
		t.Run(c.name, func(t *testing.T) {
			k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
			now := 10*sec + 500*ms
			call := k.ask(1, now)
			k.f.draining = c.draining
			lc := k.c.lock()
			e := lc.apply(k.p, call, k.win(now, 30, 30), exchange{before: now, after: c.at, ok: true}, k.f)
			lc.unlock()
			if got := k.debts(); e.visit != visitNow || len(got) != 1 || got[0] != (debt{idx: 10, refund: 30}) || k.c.cur.Load() != nil {
				t.Errorf("effects %+v, debts %+v, lease %v; want the 30 owed back to window 10", e, got, k.c.cur.Load())
			}
		})
	}
}

var tokens100 = ratelimit.Limit{Rate: 100, Period: time.Second, Burst: 100}

// A bucket leases tokens with no window: the lease lasts until the key
// goes quiet, then its tokens go back, beside the credit; or until its
// record in Redis ends (minHold after the call), whichever is first.
func TestBucketLeaseAndGiveBack(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			k := newKeyTest(t, tokens100, algorithm(alg))
			now := 10*sec + 300*ms
			call := k.ask(1, now)
			if !call.bucket || call.bkt.Want != 6 || call.bkt.Min != 1 { // minLease: 100/16
				t.Fatalf("call %+v; want a bucket call for minLease of 6", call.bkt)
			}
			if call.bkt.Holder != "me" || call.bkt.Keep != 0 || call.bkt.HoldUS != minHold/1000 {
				t.Fatalf("call %+v; want the holder's record: nothing kept, for minHold", call.bkt)
			}
			e := k.reply(call, now, reply{bkt: script.BucketReply{Grant: 6, Level: 94}})
			if e.leases != 1 || e.leasedUnits != 6 {
				t.Fatalf("effects %+v", e)
			}
			d := k.mustTake(1, now)
			// 5 held and 94 in the bucket: 1 token short of full, 10ms.
			if d.Remaining != 99 || d.ResetAfter != 10*time.Millisecond {
				t.Errorf("decision %+v; want 99 remaining, full in 10ms", d)
			}
			if _, _, ok := k.take(1, now+minHold-1); !ok {
				t.Error("a lease of tokens ended before its record")
			}
			if _, _, ok := k.take(1, now+minHold); ok {
				t.Error("a lease of tokens served past its record")
			}
			k.c.lastUse.Store(now)
			if call, _, _ := k.tick(now + 50*ms); call != nil {
				t.Fatalf("a key with tokens enough sent %+v", call.bkt)
			}
			lc := k.c.lock()
			lc.owe(0, 0, 2) // 2 tokens of credit to report
			lc.unlock()
			call, _, _ = k.tick(now + 2*sec) // quiet for longer than its idle gap
			if call == nil || call.bkt.Refund != 4 || call.bkt.Use != 2 || call.bkt.Keep != 0 || call.bkt.Want != 0 {
				t.Fatalf("tick call %+v; want the 4 tokens held back and the 2 of credit, nothing kept", call)
			}
			if k.c.cur.Load() != nil {
				t.Error("the tokens stayed")
			}
		})
	}
}

// A bucket key that goes quiet leaves the few tokens its lease still
// holds to the refill, no call sent, when the bucket was last heard at
// least half full and they are no more than it refills in a sync interval
// (100/s, 100ms: 10); it gives them back when the bucket was heard fuller
// than half empty, when they are more than that, or when Flush drains.
func TestBucketLeftToRefill(t *testing.T) {
	cases := []struct {
		name          string
		grant, level  int64 // the lease's grant and the level Redis reported
		draining      bool
		refund, owned int64 // what the release gives back, and what it leaves
	}{
		{"far from empty", 6, 94, false, 0, 5},
		{"half full", 6, 50, false, 0, 5},
		{"under half", 6, 49, false, 5, 0},
		{"more than a tick's refill", 12, 88, false, 11, 0},
		{"drained by Flush", 6, 94, true, 5, 0},
	}
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		for _, c := range cases {
			t.Run(alg.String()+"/"+c.name, func(t *testing.T) {
				k := newKeyTest(t, tokens100, algorithm(alg))
				now := 10*sec + 300*ms
				call := k.ask(1, now)
				k.reply(call, now, reply{bkt: script.BucketReply{Grant: c.grant, Level: c.level}})
				k.mustTake(1, now)
				k.c.lastUse.Store(now)
				k.f.draining = c.draining
				call, _, _ = k.tick(now + 2*sec) // quiet for longer than its idle gap
				switch {
				case c.refund == 0 && call != nil:
					t.Fatalf("sent %+v; want the tokens left to the refill, no call", call.bkt)
				case c.refund > 0 && (call == nil || call.bkt.Refund != c.refund):
					t.Fatalf("call %+v; want %d tokens given back", call, c.refund)
				}
				lc := k.c.lock()
				expired := lc.expired
				lc.unlock()
				if expired != c.owned {
					t.Errorf("%d tokens left to the refill (Stats().Expired), want %d", expired, c.owned)
				}
				if k.c.cur.Load() != nil {
					t.Error("the lease stayed")
				}
			})
		}
	}
}

// A quiet bucket key keeps its lease for up to two periods less two ticks
// while its bucket was last heard at least half full (bucketHold): a
// decision after more than a period of quiet is taken in memory, and the
// lease goes at a visit of its own, left to the refill, before the key
// would leave the table. Under half full it goes after a period, given
// back.
func TestBucketHeldWhileFar(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		for _, c := range []struct {
			name  string
			level int64
			held  bool
		}{{"half full", 50, true}, {"under half", 49, false}} {
			t.Run(alg.String()+"/"+c.name, func(t *testing.T) {
				k := newKeyTest(t, tokens100, algorithm(alg))
				now := 10*sec + 300*ms
				call := k.ask(1, now)
				k.reply(call, now, reply{bkt: script.BucketReply{Grant: 6, Level: c.level}})
				k.mustTake(1, now)
				k.c.lastUse.Store(now)
				now += 1500 * ms // quiet for more than a period
				call, _, _ = k.tick(now)
				if !c.held {
					if k.c.cur.Load() != nil || call == nil || call.bkt.Refund != 5 {
						t.Fatalf("lease %v, call %+v; want the lease's 5 tokens given back", k.c.cur.Load(), call)
					}
					return
				}
				if call != nil || k.c.cur.Load() == nil {
					t.Fatalf("call %+v, lease %v; want the lease kept, nothing sent", call, k.c.cur.Load())
				}
				k.mustTake(1, now) // in memory
				k.c.lastUse.Store(now)
				lc := k.c.lock()
				if hold := lc.bucketHold(k.p, k.f); hold >= idlePeriods*k.p.periodNS {
					t.Errorf("held for %v; want less than the %d periods after which the key leaves the table", time.Duration(hold), idlePeriods)
				}
				lc.unlock()
				call, _, _ = k.tick(now + 1900*ms) // quiet for longer than its hold, not yet for two periods
				if call != nil || k.c.cur.Load() != nil {
					t.Fatalf("call %+v, lease %v; want the lease gone, its 4 tokens left to the refill", call, k.c.cur.Load())
				}
				lc = k.c.lock()
				expired := lc.expired
				lc.unlock()
				if expired != 4 {
					t.Errorf("%d tokens left to the refill, want 4", expired)
				}
			})
		}
	}
}

// A bucket's credit budget (optimistic mode) is per period of the
// instance's clock, as a window's is per window.
func TestBucketCreditBudget(t *testing.T) {
	k := newKeyTest(t, tokens100, algorithm(ratelimit.TokenBucket), optimistic)
	share := k.p.optimisticShare(k.f) // 100/8
	for _, now := range []int64{10*sec + 100*ms, 11*sec + 100*ms} {
		for i := int64(0); i < share; i++ {
			if _, _, _, ok := k.c.onCredit(k.p, 1, now, share, k.f); !ok {
				t.Fatalf("at %v: borrow %d of %d refused", time.Duration(now), i+1, share)
			}
		}
		if _, _, _, ok := k.c.onCredit(k.p, 1, now+500*ms, share, k.f); ok {
			t.Fatalf("at %v: borrowed past the period's share", time.Duration(now))
		}
	}
	if got := k.c.cur.Load().credit.Load(); got != 2*share {
		t.Errorf("credit %d, want %d", got, 2*share)
	}
}

// Settling a reservation for less gives the difference back to the lease
// of its window while the lease is in hand; to Redis while the window still
// counts; nowhere once it does not.
func TestSettleGivesBack(t *testing.T) {
	k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
	now := 10*sec + 100*ms
	k.lease(now, 50, 50)
	k.mustTake(20, now)
	lc := k.c.lock()
	if v := lc.giveBack(k.p, 10, 15, now, k.f); v != visitNone || k.avail() != 45 {
		t.Errorf("same window: visit %v, holds %d; want none, 45", v, k.avail())
	}
	if v := lc.giveBack(k.p, 9, 4, now, k.f); v != visitNow || len(lc.debts) != 1 || lc.debts[0] != (debt{idx: 9, refund: 4}) {
		t.Errorf("the window before: visit %v debts %+v; want 4 owed to window 9", v, lc.debts)
	}
	if v := lc.giveBack(k.p, 8, 3, now, k.f); v != visitNone || lc.expired != 3 {
		t.Errorf("a window that no longer counts: visit %v, expired %d; want dropped", v, lc.expired)
	}
	lc.unlock()
}

// Settling for more takes the excess from the lease, the rest on credit
// past any budget, reported at the next tick.
func TestSettleCharges(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	now := 10*sec + 100*ms
	k.lease(now, 10, 10)
	if v := k.c.charge(k.p, 25, now, k.f); v == visitNone {
		t.Error("credit without a visit")
	}
	l := k.c.cur.Load()
	if l.avail.Load() != 0 || l.credit.Load() != 15 {
		t.Errorf("lease holds %d, credit %d; want 0 and 15", l.avail.Load(), l.credit.Load())
	}
	call, _, _ := k.tick(now + 50*ms)
	if call == nil || len(call.win.Adjust) != 1 || call.win.Adjust[0] != (script.Adjust{Idx: 10, Use: 15}) {
		t.Errorf("tick call %+v; want the 15 reported", call)
	}
}

// When a lease call gets no reply in time while the breaker is closed,
// Redis' last word on the window stands: strict denies (until the window
// ends when Redis said it was spent); optimistic admits on credit within
// its share, bounded by what Redis last said was free.
func TestSlowReply(t *testing.T) {
	now := 10*sec + 500*ms
	k := newKeyTest(t, perSecond1000)
	d, _, _ := k.c.slowReply(k.p, 1, now, k.f)
	if d.Allowed || d.RetryAfter != 100*time.Millisecond {
		t.Errorf("strict, nothing known: %+v; want denied, retry after a tick", d)
	}
	k.lease(now, 5, 1000) // Redis: the window is spent
	k.mustTake(5, now)
	d, _, _ = k.c.slowReply(k.p, 1, now, k.f)
	if d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Errorf("strict, spent: %+v; want denied until the window ends", d)
	}

	k = newKeyTest(t, perSecond1000, optimistic)
	k.f.instances = 2
	k.lease(now, 1, 1000-40) // 40 free, shared by 2 instances: 20
	k.mustTake(1, now)
	admitted := 0
	for i := 0; i < 100; i++ {
		if d, _, _ := k.c.slowReply(k.p, 1, now, k.f); d.Allowed {
			admitted++
		}
	}
	if admitted != 20 {
		t.Errorf("optimistic admitted %d on credit, want 20 (40 free, 2 instances)", admitted)
	}
}

// While the breaker is open the failure mode decides: FailLocal within
// Rate / instances per window, bounded by the window's last-known
// remainder shared by the instances; FailOpen admits; FailClosed denies
// for as long as the breaker stays open.
func TestFallback(t *testing.T) {
	now := 10*sec + 500*ms
	admitted := func(k *keyTest) (n int, last ratelimit.Decision) {
		for i := 0; i < 2000; i++ {
			d, _, _ := k.c.fallback(k.p, 1, now, k.f)
			if d.Allowed {
				n++
			}
			last = d
		}
		return n, last
	}
	for _, c := range []struct {
		name    string
		mode    ratelimit.FailureMode
		free    int64 // last known free in the window; -1: never heard
		want    int
		retryMS int64
	}{
		{"local, unknown window", ratelimit.FailLocal, -1, 250, 500},
		{"local, 300 known free", ratelimit.FailLocal, 300, 75, 500},
		{"open", ratelimit.FailOpen, -1, 2000, 0},
		{"closed", ratelimit.FailClosed, -1, 0, 500},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newKeyTest(t, perSecond1000, func(cfg *config) { cfg.failure = c.mode })
			k.f.instances, k.f.breaker = 4, breaker.Open
			if c.free >= 0 {
				lc := k.c.lock()
				lc.setFree(nil, 10, c.free)
				lc.unlock()
			}
			n, last := admitted(k)
			if n != c.want {
				t.Errorf("admitted %d, want %d", n, c.want)
			}
			if c.want < 2000 && last.RetryAfter != time.Duration(c.retryMS)*time.Millisecond {
				t.Errorf("denied with RetryAfter %v, want %dms", last.RetryAfter, c.retryMS)
			}
		})
	}
}

// A key nothing marks is visited when it must be: within its lead of the
// window's end to lease ahead, once its window ends (SlidingWindow), and
// once idle for two periods; a key out of the table is not scheduled.
func TestNextVisit(t *testing.T) {
	k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
	now := 10*sec + 100*ms
	k.lease(now, 50, 50)
	k.mustTake(1, now)
	_, at, _ := k.tick(now)
	if want := 11*sec - k.c.lead; at != want {
		t.Errorf("visit at %v, want %v (the lead before the window's end)", time.Duration(at), time.Duration(want))
	}
	k.c.dead.Store(true)
	if _, at, _ := k.tick(now + 10*ms); at != 0 {
		t.Errorf("a key out of the table scheduled at %v", time.Duration(at))
	}
}

// A SlidingWindow lease whose window was last heard far from the limit is
// not visited at its window's end (what it leaves would be kept with the
// key anyway): it stays until the key's next lease retires it, and its
// refund is then owed. Near the limit it is visited then, and gives back
// at once.
func TestSlidingLeaseKeptPastItsEnd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		count int64 // the window's count after the lease
		atEnd bool
	}{
		{"far from the limit", 50, false},
		{"near the limit", 900, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
			k.lease(10*sec+100*ms, 50, tc.count)
			k.mustTake(1, 10*sec+100*ms)
			if call, at, _ := k.tick(11*sec - 10*ms); call != nil {
				t.Fatalf("call %+v at the lead; want none", call)
			} else if (at == 11*sec) != tc.atEnd {
				t.Fatalf("next visit at %v; visited at the window's end: %v, want %v", time.Duration(at), at == 11*sec, tc.atEnd)
			}
			if tc.atEnd {
				return
			}
			k.lease(11*sec+300*ms, 20, 100) // the next window's first lease retires the old one
			if d := k.debts(); len(d) != 1 || d[0].idx != 10 || d[0].refund != 49 {
				t.Errorf("debts %+v; want window 10's 49 unused units owed back", d)
			}
		})
	}
}

// cold: a key asked fewer than leaseAt units in this window and the last
// is counted exactly, as is any key whose instance's share is too small to
// lease or whose window is nearly spent; a key with units in hand leases
// what it lacks.
func TestColdRegime(t *testing.T) {
	now := 10*sec + 100*ms
	k := newKeyTest(t, perSecond1000)
	lc := k.c.lock()
	if !lc.cold(k.p, 1, now, k.f) {
		t.Error("a key's first decision leased")
	}
	if lc.cold(k.p, 1, now+10*ms, k.f) {
		t.Error("the second unit of a window was counted exactly: leaseAt is 2")
	}
	// The next window: the last one had 2 units.
	if lc.cold(k.p, 1, 11*sec+10*ms, k.f) {
		t.Error("a key used twice the window before was counted exactly")
	}
	// Two windows later, once: cold again.
	if !lc.cold(k.p, 1, 13*sec+10*ms, k.f) {
		t.Error("a key quiet for a window leased")
	}
	// Asked once in the window before and once now: about once a window,
	// and a FixedWindow lease left unused expires with its window.
	if lc.cold(k.p, 1, 14*sec+10*ms, k.f) {
		t.Error("a FixedWindow key asked in each of two windows running was counted exactly")
	}
	lc.unlock()

	sliding := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
	lc = sliding.c.lock()
	for _, at := range []int64{13*sec + 10*ms, 14*sec + 10*ms} {
		if !lc.cold(sliding.p, 1, at, sliding.f) {
			t.Error("a SlidingWindow key asked once a window leased: what it leaves costs a refund")
		}
	}
	lc.unlock()

	small := newKeyTest(t, ratelimit.Limit{Rate: 20, Period: time.Second})
	small.f.instances = 4 // 5 each: too small to lease
	lc = small.c.lock()
	lc.asked, lc.askedIdx = 50, 10
	if !lc.cold(small.p, 1, now, small.f) {
		t.Error("a share of 5 leased")
	}
	lc.unlock()

	spent := newKeyTest(t, perSecond1000)
	spent.lease(now, 1, 1000-2) // 2 free in Redis, 1 instance: nearly spent
	spent.mustTake(1, now)
	lc = spent.c.lock()
	lc.asked, lc.askedIdx = 500, 10
	if !lc.cold(spent.p, 1, now, spent.f) {
		t.Error("a nearly spent window leased")
	}
	spent.c.cur.Load().avail.Store(3)
	if lc.cold(spent.p, 5, now, spent.f) {
		t.Error("a key holding units was counted exactly, its units stranded")
	}
	lc.unlock()
}

// A key is worth leasing the next window for when asked twice in this
// one, or, FixedWindow only, in this one and the last: its plain lease
// ahead left unused expires with the window, where a SlidingWindow one
// costs a refund call.
func TestWorthAhead(t *testing.T) {
	for _, c := range []struct {
		alg              ratelimit.Algorithm
		asked, prevAsked int64
		want             bool
	}{
		{ratelimit.FixedWindow, 2, 0, true},
		{ratelimit.FixedWindow, 1, 1, true},
		{ratelimit.FixedWindow, 1, 0, false},
		{ratelimit.FixedWindow, 0, 5, false}, // not asked yet this window
		{ratelimit.SlidingWindow, slidingAheadAt, 0, true},
		{ratelimit.SlidingWindow, slidingAheadAt - 1, 5, false}, // (see slidingAheadAt)
		{ratelimit.SlidingWindow, 1, 1, false},
	} {
		k := newKeyTest(t, perSecond1000, algorithm(c.alg))
		lc := k.c.lock()
		lc.asked, lc.prevAsked = c.asked, c.prevAsked
		if got := lc.worthAhead(k.p); got != c.want {
			t.Errorf("%v asked %d, %d the window before: worth leasing ahead %v; want %v", c.alg, c.asked, c.prevAsked, got, c.want)
		}
		lc.unlock()
	}
}

// An exact call for FixedWindow carries what the key owes the window it
// counts in, credit first; its reply decides, and what did not apply is
// owed again.
func TestExactCall(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	now := 10*sec + 100*ms
	lc := k.c.lock()
	lc.owe(10, 4, 0)
	lc.owe(9, 2, 0)
	lc.unlock()
	k.c.charge(k.p, 3, now, k.f) // 3 of credit on an estimated lease of window 10
	lc = k.c.lock()
	e := lc.newExact(k.p, k.id(), 2, now, now, k.f)
	lc.unlock()
	if a := e.take; !e.fw || a.N != 2 || a.AdjustIdx != 10 || a.Refund != 4 || a.Use != 3 {
		t.Fatalf("take %+v; want 2 units with window 10's refund of 4 and credit of 3", a)
	}
	if d := k.debts(); len(d) != 1 || d[0] != (debt{idx: 9, refund: 2}) {
		t.Fatalf("debts left %+v; want window 9's", d)
	}
	// Redis counted it in window 10, the adjustment applied.
	e.answered(result{reply: reply{take: script.TakeReply{Idx: 10, Now: now / 1000, Count: 990, Admitted: true, Adjusted: true}}}, exchange{before: now, after: now, ok: true})
	d, l, _ := k.c.decideExact(k.p, e, now, k.f)
	if !d.Allowed || d.Remaining != 10 || d.ResetAfter != 900*time.Millisecond || l == nil || l.idx != 10 {
		t.Errorf("decision %+v lease %+v; want admitted, 10 remaining, reset 900ms, window 10", d, l)
	}
	if got := k.c.exact.Load(); got != 1<<32|2 {
		t.Errorf("exact count %x", got)
	}
	// A denial: refused for the units until the window ends, smaller ones
	// may ask.
	lc = k.c.lock()
	e = lc.newExact(k.p, k.id(), 5, now, now, k.f)
	lc.unlock()
	e.answered(result{reply: reply{take: script.TakeReply{Idx: 10, Now: now / 1000, Count: 997}}}, exchange{before: now, after: now, ok: true})
	d, l, _ = k.c.decideExact(k.p, e, now, k.f)
	if d.Allowed || l != nil || d.RetryAfter != 900*time.Millisecond || d.Remaining != 3 {
		t.Errorf("denial %+v; want retry at the window's end, 3 remaining", d)
	}
	if _, _, ok := k.take(5, now+ms); !ok {
		t.Error("a decision as large as the refused one asked again")
	}
	if _, _, ok := k.take(3, now+ms); ok {
		t.Error("a smaller decision was denied in memory")
	}
}

// An exact call settles on the safe side: its reply lost, credit is owed
// again (counted twice at worst) and refunds are dropped; its reply after
// the decision left, what it counted is owed back; an adjustment of a
// window that was not the current one is owed again.
func TestExactCallSettles(t *testing.T) {
	now := 10*sec + 100*ms
	setup := func() (*keyTest, *exactCall) {
		k := newKeyTest(t, perSecond1000)
		lc := k.c.lock()
		lc.owe(10, 4, 3)
		e := lc.newExact(k.p, k.id(), 2, now, now, k.f)
		lc.unlock()
		return k, e
	}
	k, e := setup()
	e.answered(result{err: errLost}, exchange{})
	lc := k.c.lock()
	if v := lc.settleExact(e, false); v != visitNow || len(lc.debts) != 1 || lc.debts[0] != (debt{idx: 10, use: 3}) {
		t.Errorf("lost: visit %v debts %+v; want the credit of 3 owed again, the refund dropped", v, lc.debts)
	}
	lc.unlock()

	k, e = setup()
	if !e.abandon() {
		t.Fatal("abandon after no reply")
	}
	e.answered(result{reply: reply{take: script.TakeReply{Idx: 10, Count: 5, Admitted: true, Adjusted: true}}}, exchange{ok: true})
	lc = k.c.lock()
	if v := lc.settleExact(e, true); v != visitNow || len(lc.debts) != 1 || lc.debts[0] != (debt{idx: 10, refund: 2}) {
		t.Errorf("abandoned: visit %v debts %+v; want the 2 counted owed back", v, lc.debts)
	}
	lc.unlock()

	k, e = setup()
	e.answered(result{reply: reply{take: script.TakeReply{Idx: 11, Count: 2, Admitted: true}}}, exchange{ok: true})
	lc = k.c.lock()
	if v := lc.settleExact(e, false); v != visitNow || len(lc.debts) != 1 || lc.debts[0] != (debt{idx: 10, refund: 4, use: 3}) {
		t.Errorf("another window: visit %v debts %+v; want window 10's adjustment owed again", v, lc.debts)
	}
	lc.unlock()
}

// For SlidingWindow and the buckets, an exact call is a lease call for
// exactly n units, from one instance's point of view (no share cap), with
// no replay record, carrying what the key owes; for a bucket, but its
// refunds, which go only with what the key keeps (buckets.hold), and with
// no record of held tokens: it holds none.
func TestExactCallLeaseScripts(t *testing.T) {
	now := 10*sec + 100*ms
	k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
	k.f.instances = 8
	lc := k.c.lock()
	lc.owe(9, 5, 1)
	e := lc.newExact(k.p, k.id(), 3, now, now, k.f)
	lc.unlock()
	if a := e.call.win; e.fw || a.Want != 3 || a.Min != 3 || a.Instances != 1 || a.Nonce != "" || len(a.Adjust) != 1 || a.Adjust[0] != (script.Adjust{Idx: 9, Refund: 5, Use: 1}) {
		t.Errorf("sliding: %+v", a)
	}
	b := newKeyTest(t, tokens100, algorithm(ratelimit.GCRA))
	lc = b.c.lock()
	lc.owe(0, 5, 1)
	lc.oweBack(true, 0, 2)
	e = lc.newExact(b.p, b.id(), 3, now, now, b.f)
	if a := e.call.bkt; !e.call.bucket || a.Want != 3 || a.Min != 3 || a.Instances != 1 || a.Refund != 0 || a.Use != 1 || a.Back != 2 || a.Holder != "" {
		t.Errorf("bucket: %+v", a)
	}
	if len(lc.debts) != 1 || lc.debts[0] != (debt{refund: 5}) {
		t.Errorf("bucket debts %+v; want the refund of 5 left with the key", lc.debts)
	}
	lc.unlock()
	e.answered(result{reply: reply{bkt: script.BucketReply{Grant: 3, Level: 50}}}, exchange{ok: true})
	d, _, _ := b.c.decideExact(b.p, e, now, b.f)
	if !d.Allowed || d.Remaining != 50 || d.ResetAfter != 500*time.Millisecond {
		t.Errorf("bucket decision %+v; want 50 remaining, full in 500ms", d)
	}
}

// After an outage, a key's grants in a window the outage touched and its
// own credit there share one budget (its FailLocal budget): what Redis
// grants beyond it is owed back at once; a window that begins after the
// instance recovered, and after the others may have, is not bounded.
func TestAfterOutage(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	k.f.instances = 4 // a budget of 250 a window
	now := 10*sec + 100*ms
	k.f.breaker, k.f.outageFrom = breaker.Open, 9*sec
	for i := 0; i < 100; i++ { // 100 on credit while Redis is away
		if d, _, _ := k.c.fallback(k.p, 1, now, k.f); !d.Allowed {
			t.Fatalf("fallback %d denied", i)
		}
	}
	k.f.breaker, k.f.outageTo = breaker.Closed, now+100*ms // back
	now += 200 * ms
	call := k.ask(1, now)
	e := k.reply(call, now, k.win(now, 400, 500))
	if k.avail() != 150 || e.visit != visitNow {
		t.Fatalf("kept %d of a grant of 400, visit %v; want 150 (250 less the 100 on credit), the rest owed", k.avail(), e.visit)
	}
	var refund int64
	for _, d := range k.debts() {
		if d.idx == 10 {
			refund += d.refund
		}
	}
	if refund != 250 {
		t.Errorf("owed back %d of window 10, want 250", refund)
	}
	// The credit budget left is the budget less what was granted since.
	lc := k.c.lock()
	if left := lc.budgetLeft(10, 250); left != 100 {
		t.Errorf("budget left %d, want 100", left)
	}
	lc.unlock()
	// A window that begins well after the recovery leases freely.
	later := 12*sec + 100*ms
	call = k.ask(1, later)
	k.reply(call, later, k.win(later, 400, 400))
	if l := k.c.cur.Load(); l.idx != 12 || l.avail.Load() != 400 {
		t.Errorf("window 12: holds %d, want the 400 granted", l.avail.Load())
	}
}

// A grant that comes while the breaker is still open (Redis, back, ran a
// call sent before the outage) and the credit decisions take meanwhile
// share one budget, however they interleave: decisions on 4 goroutines
// take credit until denied while the reply is applied, and the credit
// they took and what the key kept of the grant together stay within the
// budget (250: a limit of 1,000 over 4 instances).
func TestAfterOutageGrantBesideCredit(t *testing.T) {
	for round := 0; round < 300; round++ {
		k := newKeyTest(t, perSecond1000)
		k.f.instances = 4
		now := 10*sec + 100*ms
		call := k.ask(1, now) // on its way when Redis went away
		k.f.breaker, k.f.outageFrom = breaker.Open, now
		var credit atomic.Int64
		var wg sync.WaitGroup
		begin := make(chan struct{})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-begin
				for {
					d, _, _ := k.c.fallback(k.p, 1, now, k.f)
					if !d.Allowed {
						return
					}
					credit.Add(1)
				}
			}()
		}
		close(begin)
		for credit.Load() < int64(round%200) {
			runtime.Gosched()
		}
		k.reply(call, now, k.win(now, 400, 500))
		wg.Wait()
		if kept := k.avail(); credit.Load()+kept > 250 {
			t.Fatalf("round %d: %d on credit and %d kept of the grant: %d, over the budget of 250", round, credit.Load(), kept, credit.Load()+kept)
		}
	}
}

// A window's remainder is the least heard of it: a reply applied late
// (two pipelines on their way) does not make it larger.
func TestLeastRemainder(t *testing.T) {
	k := newKeyTest(t, perSecond1000)
	now := 10*sec + 100*ms
	k.lease(now, 10, 600)
	call := k.ask(11, now)
	k.reply(call, now, k.win(now, 5, 300)) // an older reply: a larger remainder
	lc := k.c.lock()
	if f, ok := lc.knownFree(10); !ok || f != 400 {
		t.Errorf("remainder %d %v, want 400: the least heard", f, ok)
	}
	lc.unlock()
}

// A bucket lease serves until HoldUS after its call was made, and each
// reply whose record covers what the lease kept pushes that on; a reply
// whose record was gone (it covered less) leaves the lease's tokens
// spent. A unit a decision gives back goes into the lease only while the
// record covers it: once a call reported the lease smaller, it goes to the
// bucket as Back.
func TestBucketLeaseRecord(t *testing.T) {
	k := newKeyTest(t, tokens100, algorithm(ratelimit.TokenBucket))
	now := 10*sec + 300*ms
	call := k.ask(1, now)
	k.reply(call, now+ms, reply{bkt: script.BucketReply{Grant: 6, Level: 94, Kept: 0}})
	if l := k.c.cur.Load(); l == nil || l.end() != now+minHold || l.recorded != 6 {
		t.Fatalf("lease %+v; want one ending minHold after its call, its record 6", l)
	}
	k.mustTake(2, now+2*ms)
	lc := k.c.lock()
	if v := lc.giveBack(k.p, 0, 2, now+3*ms, k.f); v != visitNone || k.avail() != 6 {
		t.Errorf("give back 2 of 6 recorded: visit %v, avail %d; want them in the lease", v, k.avail())
	}
	lc.unlock()
	k.mustTake(3, now+4*ms)
	// a top-up made at +1s keeps the 3 left: the record covers them
	later := now + sec
	lc = k.c.lock()
	call = lc.ask(k.p, k.id(), 5, later, k.f)
	lc.startFlight(call)
	lc.unlock()
	if call.bkt.Keep != 3 || call.bkt.Holder != "me" {
		t.Fatalf("call %+v; want the lease's 3 kept", call.bkt)
	}
	lc = k.c.lock()
	if v := lc.giveBack(k.p, 0, 3, later, k.f); v != visitNow || k.avail() != 3 || len(lc.debts) != 1 || lc.debts[0] != (debt{back: 3}) {
		t.Errorf("give back 3 past the record: visit %v, avail %d, debts %+v; want them owed as Back", v, k.avail(), lc.debts)
	}
	lc.unlock()
	k.reply(call, later+ms, reply{bkt: script.BucketReply{Grant: 5, Level: 80, Kept: 3}})
	if l := k.c.cur.Load(); l.end() != later+minHold || k.avail() != 8 || l.recorded != 8 {
		t.Errorf("lease end %v avail %d recorded %d; want pushed to minHold after the top-up, 8 held", time.Duration(l.end()), k.avail(), l.recorded)
	}
	// a call whose record was gone: the 8 kept are spent, the grant serves
	lc = k.c.lock()
	call = lc.ask(k.p, k.id(), 20, later+2*ms, k.f)
	lc.startFlight(call)
	lc.unlock()
	k.reply(call, later+3*ms, reply{bkt: script.BucketReply{Grant: 4, Level: 70, Kept: 0}})
	if k.avail() != 4 {
		t.Errorf("avail %d; want only the 4 granted", k.avail())
	}
	// past its end the lease serves nothing, and a call keeps nothing of it
	end := k.c.cur.Load().end()
	if _, _, ok := k.take(1, end); ok {
		t.Error("the lease served past its record's deadline")
	}
	lc = k.c.lock()
	call = lc.ask(k.p, k.id(), 1, end, k.f)
	lc.unlock()
	if call.bkt.Keep != 0 || k.avail() != 0 {
		t.Errorf("call %+v, avail %d; want nothing kept of a lease past its end", call.bkt, k.avail())
	}
}
