package global

import (
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// The ledger without Redis: which windows an outage makes cautious, the
// budget of a cautious window, and the window a decision counted in.
func TestLedger(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	instances := 4
	g := newLedger([]ratelimit.Limit{{Rate: 1000, Period: time.Second}}, []ratelimit.Algorithm{ratelimit.FixedWindow}, 500*time.Millisecond, func() int { return instances })
	for w := int64(0); w < 20; w++ {
		if g.cautious(0, w) {
			t.Fatalf("window %d cautious before any outage", w)
		}
	}
	// An outage from 5.3s to 7.2s: windows 5 to 7 are touched; window 8
	// begins 0.8s after it, past the 0.5s settle; windows beginning
	// within the settle would be cautious too.
	g.down(5*sec + 300_000)
	if !g.cautious(0, 5) || !g.cautious(0, 9) || g.cautious(0, 4) {
		t.Error("while the outage lasts, its window and those after it are cautious, not those before")
	}
	g.up(7*sec + 200_000)
	for w, want := range map[int64]bool{4: false, 5: true, 6: true, 7: true, 8: false} {
		if got := g.cautious(0, w); got != want {
			t.Errorf("window %d cautious %v; want %v", w, got, want)
		}
	}
	g.up(9 * sec) // a second answer does not move the end
	if g.cautious(0, 8) {
		t.Error("the outage's end moved with a later answer")
	}
	g.down(20*sec + 900_000)
	g.up(21*sec + 700_000)
	if !g.cautious(0, 22) {
		t.Error("a window beginning within the settle after an outage is not cautious")
	}

	// A window's budget: its last-known remainder shared by the
	// instances, else their share of the limit.
	k := g.lock("k", 5)
	e := &k.w[0]
	e.free = 402
	g.caution(0, e)
	if e.budget != 100 {
		t.Errorf("budget %d; want 402 / 4", e.budget)
	}
	e.used, e.debt = 7, 3
	k.mu.Unlock()
	k = g.lock("k", 6)
	e = &k.w[0]
	if e.win != 6 || e.used != 0 || e.debt != 0 || e.budget != -1 || e.free != -1 {
		t.Errorf("entry %+v; want window 6, fresh", e)
	}
	g.caution(0, e)
	if e.budget != 250 {
		t.Errorf("budget %d of a window begun during the outage; want 1000 / 4", e.budget)
	}
	k.mu.Unlock()
	if k = g.lock("k", 5); k.w[0].win != 6 {
		t.Error("an earlier window replaced a later one")
	}
	k.mu.Unlock()

	// The window a FixedWindow decision counted in, from the time read
	// before it and its ResetAfter.
	for _, c := range []struct {
		t     int64
		reset time.Duration
		want  int64
	}{
		{5*sec + 999_900, 100 * time.Microsecond, 5},     // decided in window 5
		{5*sec + 999_900, 999_950 * time.Microsecond, 6}, // crossed into window 6
		{5*sec + 100_000, 900 * time.Millisecond, 5},     //
		{5*sec + 100_000, 0, 5},                          // no reset: as asked
		{5*sec + 100_000, 100 * time.Millisecond, 5},     // (never before the window asked)
	} {
		if got := g.decidedIn(0, 5, c.t, c.reset); got != c.want {
			t.Errorf("decidedIn(5, %d, %v) = %d; want %d", c.t, c.reset, got, c.want)
		}
	}
}

// A Multi's ledger, limit by limit: a decision without Redis fits every
// cautious window's budget or is refused, reserving nothing; what the
// fallback admitted is owed to every limit but a SlidingLog, carried by the
// key's next call, and owed no more once Redis reports it applied.
func TestLedgerMulti(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	limits := []ratelimit.Limit{ratelimit.PerSecond(1000), ratelimit.PerMinute(100), {Rate: 10, Period: time.Second, Burst: 10}, ratelimit.PerHour(5)}
	algs := []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.SlidingLog}
	g := newLedger(limits, algs, 0, func() int { return 2 })
	states := make([]ratelimit.LimitState, len(limits))
	now := 60*sec + 500_000 // second 60, minute 1

	// Redis answers: 900 left in the second, 30 in the minute.
	var c ledgerCall
	if !g.begin(&c, "k", now, 1, states) {
		t.Fatal("refused before any outage")
	}
	g.end(&c, "k", now, true, 0, []ratelimit.LimitState{{Remaining: 900, ResetAfter: 500 * time.Millisecond},
		{Remaining: 30, ResetAfter: 59500 * time.Millisecond}, {}, {}})

	// Redis goes away: the budgets are 450 and 15; the fallback admits 10.
	c = ledgerCall{}
	if !g.begin(&c, "k", now+1, 10, states) {
		t.Fatal("refused before the outage was seen")
	}
	k := g.lockOutage(&c, "k", states)
	if k == nil {
		t.Fatal("10 refused within budgets of 450 and 15")
	}
	g.admitLocal(k, &c, now+1, make([]ratelimit.LimitState, len(limits)))
	if got := [4]int64{k.w[0].budget, k.w[1].budget, k.w[0].used, k.w[1].used}; got != [4]int64{450, 15, 10, 10} {
		t.Errorf("budgets and used %v; want 450 15 10 10", got)
	}
	if got := [4]int64{k.w[0].debt, k.w[1].debt, k.w[2].debt, k.w[3].debt}; got != [4]int64{10, 10, 10, 0} {
		t.Errorf("debts %v; want 10 each but the SlidingLog's", got)
	}
	k.mu.Unlock()

	// 6 more do not fit the minute's budget: refused, the minute denying
	// until its end, the second reporting its budget's rest.
	c = ledgerCall{}
	if g.begin(&c, "k", now+2, 6, states) {
		t.Fatal("6 admitted past the minute's budget of 15 with 10 used")
	}
	if s := states[1]; s.Allowed || s.RetryAfter != 59500*time.Millisecond-2*time.Microsecond || s.Remaining != 5 {
		t.Errorf("the minute's state %+v; want denied until its end, 5 remaining", s)
	}
	if s := states[0]; !s.Allowed || s.Remaining != 440 {
		t.Errorf("the second's state %+v; want allowed, 440 remaining", s)
	}
	if !states[2].Allowed || !states[3].Allowed {
		t.Error("a limit without a window denied")
	}
	// The refused call carries the debts still, to be sent alone; its
	// charge-only call failed: they are owed again.
	if c.charge != [ratelimit.MaxLimits]int64{10, 10, 10} {
		t.Errorf("a refusal's charges %v; want the debts", c.charge)
	}
	g.abort(&c, "k")

	// Redis is back: 5 fit; the call carries the debts, which Redis applies
	// for the second and the bucket, not for the minute (say its reply
	// was lost): the minute's is carried again.
	c = ledgerCall{}
	if !g.begin(&c, "k", now+3, 5, states) {
		t.Fatal("5 refused within the minute's budget")
	}
	if c.charge != [ratelimit.MaxLimits]int64{10, 10, 10} {
		t.Errorf("charges %v; want the debts", c.charge)
	}
	g.end(&c, "k", now+4, true, 0b101, []ratelimit.LimitState{{Remaining: 500, ResetAfter: 500*time.Millisecond - 3*time.Microsecond},
		{Remaining: 0, ResetAfter: 59500*time.Millisecond - 3*time.Microsecond}, {}, {}})
	k = g.lock("k", 60, 1)
	if got := [3]int64{k.w[0].debt, k.w[1].debt, k.w[2].debt}; got != [3]int64{0, 10, 0} {
		t.Errorf("debts %v after the charges applied; want the minute's only", got)
	}
	if k.w[1].used != 15 {
		t.Errorf("the minute's used %d; want its budget, 15", k.w[1].used)
	}
	k.mu.Unlock()
}

// An admission counted in another window than the one its budget was
// checked in: by Redis in a cautious window begun since, whose budget
// another decision has spent, it is refused (Redis keeps it counted); by
// the fallback in a window the key's entry has left, it is refused too.
func TestLedgerCrossing(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	g := newLedger([]ratelimit.Limit{{Rate: 1000, Period: time.Second}}, []ratelimit.Algorithm{ratelimit.FixedWindow}, 0, func() int { return 4 })
	g.down(5*sec + 300_000) // an outage under way: windows 5 on are cautious
	st := make([]ratelimit.LimitState, 1)

	var c ledgerCall
	if !g.begin(&c, "x", 5*sec+999_000, 1, st) {
		t.Fatal("refused in a fresh window's budget")
	}
	k := g.lock("x", 6) // meanwhile another decision spends window 6's budget
	g.caution(0, &k.w[0])
	k.w[0].used = k.w[0].budget
	k.mu.Unlock()
	st[0] = ratelimit.LimitState{Allowed: true, Remaining: 10, ResetAfter: 500 * time.Millisecond} // Redis counted it in window 6
	if g.end(&c, "x", 6*sec+1, true, 0, st) || st[0].Allowed || st[0].RetryAfter != 500*time.Millisecond {
		t.Errorf("an admission past window 6's spent budget not refused: %+v", st[0])
	}

	k = g.lock("y", 6)
	g.caution(0, &k.w[0])
	k.mu.Unlock()
	c = ledgerCall{}
	if !g.begin(&c, "y", 5*sec+500_000, 1, st) {
		t.Fatal("refused within window 6's budget")
	}
	if k = g.lockOutage(&c, "y", st); k == nil {
		t.Fatal("refused within window 6's budget")
	}
	st[0] = ratelimit.LimitState{Allowed: true, ResetAfter: 400 * time.Millisecond} // the fallback counted it in window 5
	ok := g.admitLocal(k, &c, 5*sec+600_000, st)
	debt := k.w[0].debt
	k.mu.Unlock()
	if ok || st[0].Allowed || debt != 0 {
		t.Errorf("an admission in a window the entry has left noted (debt %d): %+v", debt, st[0])
	}
}

// Replies of concurrent decisions are noted in any order: a window's
// last-known remainder is the least one reported, so that an outage that
// begins after the window is spent shares nothing of it, even when the
// reply of a decision made earlier (a larger remainder) is noted last.
func TestLedgerRemainderLeastReported(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	g := newLedger([]ratelimit.Limit{{Rate: 1000, Period: time.Second}}, []ratelimit.Algorithm{ratelimit.FixedWindow}, 500*time.Millisecond, func() int { return 2 })
	now := 5*sec + 100_000
	reply := func(remaining int) {
		var c ledgerCall
		st := []ratelimit.LimitState{{}}
		if !g.begin(&c, "k", now, 1, st) {
			t.Fatal("no outage yet: the decision goes to Redis")
		}
		st[0] = ratelimit.LimitState{Allowed: remaining > 0, Remaining: remaining, ResetAfter: 900 * time.Millisecond}
		if !g.end(&c, "k", now, remaining > 0, 0, st) {
			t.Fatal("not a cautious window: the reply stands")
		}
	}
	reply(0)  // decided last by Redis: the window is spent
	reply(10) // decided before it, noted after it
	g.down(now + 1000)
	k := g.lock("k", 5)
	defer k.mu.Unlock()
	e := &k.w[0]
	if e.free != 0 {
		t.Errorf("last-known remainder %d; want the least reported, 0", e.free)
	}
	g.caution(0, e)
	if e.budget != 0 {
		t.Errorf("budget %d of a window spent before the outage; want 0", e.budget)
	}
}

// A window cautious before any news of it (one beginning shortly after an
// outage: its budget is the instances' share of the limit) hears later
// from Redis that it is spent: what its budget still allows shrinks to
// the share of that news, so an outage beginning then admits nothing more
// in it on credit. Before, the budget kept the share of no news, and an
// instance cut off for a moment before a window (a busy host) could admit
// up to Rate / instances on credit in a window Redis had spent when it
// froze (seen as 1,012 of 1,000 in TestOutageRecoveryFailLocal beside two
// busy loops).
func TestLedgerBudgetShrinksWithNews(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	g := newLedger([]ratelimit.Limit{{Rate: 1000, Period: time.Second}}, []ratelimit.Algorithm{ratelimit.FixedWindow}, 1200*time.Millisecond, func() int { return 8 })
	g.down(4*sec + 500_000) // cut off for 100ms in window 4
	g.up(4*sec + 600_000)   // window 5 begins within the settle: cautious
	st := []ratelimit.LimitState{{}}
	decide := func(now int64, remaining int, admitted bool) {
		t.Helper()
		var c ledgerCall
		if !g.begin(&c, "k", now, 1, st) {
			t.Fatalf("refused at %d by the budget: %+v", now, st[0])
		}
		st[0] = ratelimit.LimitState{Allowed: admitted, Remaining: remaining, ResetAfter: time.Duration((now/sec+1)*sec-now) * time.Microsecond}
		if !g.end(&c, "k", now, admitted, 0, st) {
			t.Fatalf("a reply within the budget refused at %d", now)
		}
	}
	for i := int64(0); i < 10; i++ {
		decide(5*sec+100_000+i, 500-int(i), true) // others take most of the window meanwhile
	}
	k := g.lock("k", 5)
	if e := k.w[0]; e.budget != 1+500/8 || e.used != 10 {
		t.Errorf("budget %d, used %d; want the least of each news' share past what was used then, 1 + 500 / 8, and 10", e.budget, e.used)
	}
	k.mu.Unlock()
	decide(5*sec+200_000, 0, false) // Redis refuses: the window is spent
	var c ledgerCall
	g.begin(&c, "k", 5*sec+300_000, 1, st)
	if k := g.lockOutage(&c, "k", st); k != nil {
		k.mu.Unlock()
		t.Errorf("Redis gone after it reported the window spent, the instance may still admit on credit: %+v", k.w[0])
	}
}
