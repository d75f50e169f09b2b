package hybrid

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// A SlidingWindow exact call, made with Redis time known and far from the
// limit, is a plain sliding call: HINCRBY of its window's counter, HMGET
// of the one before and the one after, the counter's expiry two periods
// and a second after its window's start, lease.lua as its fallback. Its
// weight is taken at the earliest instant Redis can run it by the
// estimate (less the error bound and srvclock's margin); its replies admit
// when both bounds global's script checks are within the limit.
func TestPlainSlidingCall(t *testing.T) {
	k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 100*ms
	lc := k.c.lock()
	e := lc.newExact(k.p, k.id(), 2, now, now, k.f)
	lc.unlock()
	wantElapsed := int64(100_000 - 50 - 1000) // µs: 100ms less the error bound and the margin
	if !e.sw || e.swIdx != 10 || e.swElapsed != wantElapsed {
		t.Fatalf("exact call: sw %v window %d elapsed %dµs; want a plain sliding call of window 10 at %dµs", e.sw, e.swIdx, e.swElapsed, wantElapsed)
	}
	r := e.request()
	if r.script != nil || len(r.cmds) != 4 || r.fallback == nil || r.fallback.fallbackRequest().script != script.Lease {
		t.Fatalf("request %+v; want four plain commands and lease.lua as the fallback", r)
	}
	key := func(idx int64) string { return script.WindowKey(e.call.win.Base, e.call.win.Kind, idx) }
	want := [][]any{
		{"hincrby", key(10), "c", int64(2)},
		{"hmget", key(9), "c"},
		{"hmget", key(11), "c"},
		{"pexpireat", key(10), int64(13_000)},
	}
	for i, c := range want {
		for j, v := range c {
			if r.cmds[i][j] != v {
				t.Fatalf("command %d: %v; want %v", i, r.cmds[i], c)
			}
		}
	}
	if f := r.fallback.fallbackRequest(); len(f.args) == 0 {
		t.Fatal("the fallback carries no arguments")
	}
	if e.call.win.Want != 2 || e.call.win.Min != 2 || e.call.win.Instances != 1 {
		t.Errorf("fallback asks %+v; want exactly 2 units", e.call.win)
	}

	cmd := func(v any, err error) *redis.Cmd {
		c := redis.NewCmd(context.Background())
		if err != nil {
			c.SetErr(err)
		} else {
			c.SetVal(v)
		}
		return c
	}
	// prev 800 weighs floor(800 x 901,050 / 1,000,000) = 720.
	for _, c := range []struct {
		name        string
		curr        int64
		prev, next  *redis.Cmd
		grant, size int64
	}{
		{"under both bounds", 5, cmd([]any{"800"}, nil), cmd([]any{nil}, nil), 2, 725},
		{"the estimate at the limit", 280, cmd([]any{"800"}, nil), cmd([]any{nil}, nil), 2, 1000},
		{"the estimate over it", 281, cmd([]any{"800"}, nil), cmd([]any{nil}, nil), 0, 1001},
		{"the next window's leases over it", 5, cmd([]any{nil}, nil), cmd([]any{"996"}, nil), 0, 1001},
		{"a counter a global Multi wrote", 5, cmd(nil, replyErr("WRONGTYPE Operation against a key holding the wrong kind of value")), cmd([]any{nil}, nil), 0, 1000},
	} {
		rep, err := (*slidingExact)(e).parseReply(c.curr)
		if err == nil {
			rep, err = (*slidingExact)(e).parseReplies(rep, []*redis.Cmd{c.prev, c.next, cmd(int64(1), nil)})
		}
		if err != nil || !rep.plain || rep.win.Grant != c.grant || rep.win.Count != c.size || rep.win.Idx != 10 {
			t.Errorf("%s: reply %+v, %v; want grant %d, count %d", c.name, rep.win, err, c.grant, c.size)
		}
	}
	if _, err := (*slidingExact)(e).parseReplies(reply{}, []*redis.Cmd{cmd(nil, replyErr("LOADING Redis is loading the dataset in memory")), cmd([]any{nil}, nil)}); err == nil {
		t.Error("a failed read decided")
	}

	// A reply over the limit by the weight at the earliest instant Redis
	// can have run the call, but not by the weight at the latest (its
	// reply's arrival, 100ms into the window, and the error bound and the
	// margin: floor(800 x 898,950 / 1,000,000) = 719, and 719 + 281 is
	// the limit), decides nothing: its units are owed back, and the bound
	// it read is the window's known remainder.
	e.x = exchange{before: now, after: now, ok: true}
	e.res.reply, _ = (*slidingExact)(e).parseReply(int64(281))
	e.res.reply, _ = (*slidingExact)(e).parseReplies(e.res.reply, []*redis.Cmd{cmd([]any{"800"}, nil), cmd([]any{nil}, nil)})
	if !e.late(k.f.clock) {
		t.Fatal("a plain sliding reply over the limit only by the earliest weight decided")
	}
	lc = k.c.lock()
	lc.settleExact(e, true)
	free, known := lc.knownFree(10)
	debts := append([]debt(nil), lc.debts...)
	lc.unlock()
	if !known || free != -1 || len(debts) != 1 || debts[0].idx != 10 || debts[0].refund != 2 {
		t.Errorf("after a reply over the limit: free %d (known %v), debts %+v; want -1, and 2 owed back to window 10", free, known, debts)
	}
	// and so the next exact call of the window goes through lease.lua
	lc = k.c.lock()
	e2 := lc.newExact(k.p, k.id(), 1, now, now, k.f)
	lc.unlock()
	if e2.sw {
		t.Error("a plain sliding call near the limit")
	}
}

// Calls that cannot be plain sliding calls: without a sample of Redis
// time, within the error bound of a window's edge, and with the window's
// remainder last seen under half the limit.
func TestPlainSlidingNot(t *testing.T) {
	withClock := func(k *keyTest) *keyTest {
		k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
		return k
	}
	exact := func(k *keyTest, n, at int64) *exactCall {
		lc := k.c.lock()
		defer lc.unlock()
		return lc.newExact(k.p, k.id(), n, at, at, k.f)
	}
	sliding := func() *keyTest { return newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow)) }
	if exact(sliding(), 1, 10*sec+100*ms).sw {
		t.Error("plain before any sample of Redis time")
	}
	if exact(withClock(sliding()), 1, 11*sec-100*int64(time.Microsecond)).sw {
		t.Error("plain within the error bound of the window's end")
	}
	k := withClock(sliding())
	lc := k.c.lock()
	lc.setFree(nil, 9, 499) // the window before: 499 of 1,000 left
	lc.unlock()
	if exact(k, 1, 10*sec+100*ms).sw {
		t.Error("plain with the last remainder seen under half the limit")
	}
	k = withClock(sliding())
	lc = k.c.lock()
	lc.setFree(nil, 10, 502)
	lc.unlock()
	if !exact(k, 2, 10*sec+100*ms).sw {
		t.Error("not plain with half the limit free after the call")
	}
	if exact(withClock(newKeyTest(t, perSecond1000, algorithm(ratelimit.TokenBucket))), 1, 10*sec+100*ms).sw {
		t.Error("plain sliding call for a bucket")
	}
}

// weighted and satAdd saturate at 2^53, as the scripts do.
func TestSlidingWeight(t *testing.T) {
	for _, c := range []struct{ c, left, period, want int64 }{
		{800, 901_050, 1_000_000, 720},
		{0, 5, 10, 0},
		{7, 0, 10, 0},
		{1 << 60, 1_000_000, 1_000_000, maxCount},
		{1 << 40, 1 << 20, 1 << 20, maxCount}, // the product reaches 2^60
	} {
		if got := weighted(c.c, c.left, c.period); got != c.want {
			t.Errorf("weighted(%d, %d, %d) = %d; want %d", c.c, c.left, c.period, got, c.want)
		}
	}
	if satAdd(maxCount, 5) != maxCount || satAdd(3, 4) != 7 || satAdd(maxCount-1, 1) != maxCount {
		t.Error("satAdd does not saturate at 2^53")
	}
}

// replyErr is an error reply of Redis, as go-redis reads one.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// A SlidingWindow lease call of the current window far from the limit is a
// plain sliding lease: the increment, the reads of the windows before and
// after, the record, the expiry two periods and a second from the window's
// start. Its grant is what lease.lua grants from the bound before the
// increment; what did not fit is owed back.
func TestPlainSlidingLease(t *testing.T) {
	k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	now := 10*sec + 100*ms
	call := k.plainAsk(1, now)
	w := call.win.Want
	if !call.plain || call.plainIdx != 10 || call.plainElapsed != 100_000-50-1000 || w < 1 {
		t.Fatalf("call %+v (plain %v, window %d, elapsed %dµs); want a plain lease of window 10 at 98,950µs", call.win, call.plain, call.plainIdx, call.plainElapsed)
	}
	r := call.request()
	key := func(idx int64) string { return script.WindowKey(call.win.Base, call.win.Kind, idx) }
	want := [][]any{
		{"hincrby", key(10), "c", w},
		{"hmget", key(9), "c"},
		{"hmget", key(11), "c"},
		{"hset", key(10), "r", call.win.Nonce + "!"},
		{"pexpireat", key(10), int64(13_000)},
	}
	if len(r.cmds) != len(want) || r.fallback == nil || r.fallback.fallbackRequest().script != script.Lease {
		t.Fatalf("request %+v; want five plain commands and lease.lua as the fallback", r.cmds)
	}
	for i, c := range want {
		for j, v := range c {
			if r.cmds[i][j] != v {
				t.Fatalf("command %d: %v; want %v", i, r.cmds[i], c)
			}
		}
	}
	cmd := func(v any) *redis.Cmd {
		c := redis.NewCmd(context.Background())
		c.SetVal(v)
		return c
	}
	rp := r.parse.(repliesParser)
	parse := func(before int64, prev, next any) reply {
		t.Helper()
		rep, err := rp.parseReply(before + w)
		if err == nil {
			rep, err = rp.parseReplies(rep, []*redis.Cmd{cmd([]any{prev}), cmd([]any{next}), cmd(int64(1)), cmd(int64(1))})
		}
		if err != nil || !rep.plain || rep.win.Idx != 10 {
			t.Fatalf("reply %+v, %v", rep.win, err)
		}
		return rep
	}
	// prev 800 weighs 720 at 98,950µs into the window: with 100 counted
	// before, 180 fit
	if rep := parse(100, "800", nil); rep.win.Grant != min(w, 180) || rep.win.Count != 820+rep.win.Grant {
		t.Errorf("grant %d count %d; want %d and %d", rep.win.Grant, rep.win.Count, min(w, 180), 820+min(w, 180))
	}
	// the next window's leases bound it: 100 + 899 leaves 1, under Min
	call.win.Min = 2
	if rep := parse(100, nil, "899"); rep.win.Grant != 0 || rep.win.Retry <= 0 {
		t.Errorf("grant %d retry %d; want none, and a retry", rep.win.Grant, rep.win.Retry)
	}
	call.win.Min = 1
	rep := parse(100, "800", nil)
	e := k.reply(call, now, rep)
	if g := rep.win.Grant; k.c.cur.Load() == nil || k.c.cur.Load().avail.Load() < g || e.visit == visitNone && g < w {
		t.Errorf("after the reply: lease %+v, effects %+v", k.c.cur.Load(), e)
	}
}

// A lease ahead of the next SlidingWindow window is a plain lease of the
// next window's counter, bounded by the current count plus the next
// (lease.lua's used(idx + 1)): it reads the current window's counter.
func TestPlainSlidingLeaseAhead(t *testing.T) {
	k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
	k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
	k.lease(10*sec, 100, 100) // 900 free: far from the limit
	k.tick(10 * sec)
	for range slidingAheadAt - 1 {
		k.mustTake(1, 10*sec+500*ms)
	}
	now := 11*sec - 150*ms
	if call, _, _ := k.tick(now - 50*ms); call != nil {
		t.Fatalf("call %+v; want none: a key asked %d times leases no window ahead", call, slidingAheadAt-1)
	}
	k.mustTake(1, 10*sec+900*ms)
	call, _, _ := k.tick(now)
	if call == nil || !call.plain || call.win.WantNext == 0 || call.win.Want != 0 {
		t.Fatalf("call %+v; want a plain lease of the next window", call)
	}
	r := call.request()
	w := call.win.WantNext
	key := func(idx int64) string { return script.WindowKey(call.win.Base, call.win.Kind, idx) }
	if c := r.cmds[0]; c[0] != "hincrby" || c[1] != key(11) || c[3] != w {
		t.Fatalf("increment %v; want window 11's counter by %d", c, w)
	}
	if r.cmds[1][1] != key(10) || r.cmds[4][2] != int64(14_000) {
		t.Errorf("commands %v; want window 10's counter read, and window 11's expiry two periods and a second from its start", r.cmds)
	}
	cmd := func(v any) *redis.Cmd {
		c := redis.NewCmd(context.Background())
		c.SetVal(v)
		return c
	}
	rp := r.parse.(repliesParser)
	rep, err := rp.parseReply(int64(50) + w) // 50 leased ahead by others
	if err == nil {
		rep, err = rp.parseReplies(rep, []*redis.Cmd{cmd([]any{"940"}), cmd([]any{"940"}), cmd(int64(1)), cmd(int64(1))})
	}
	// 940 + 50 leaves 10
	if err != nil || rep.win.GrantNext != min(w, 10) || rep.win.CountNext != 990+min(w, 10) || rep.win.Grant != 0 {
		t.Fatalf("reply %+v, %v; want %d granted ahead", rep.win, err, min(w, 10))
	}
	e := k.reply(call, now, rep)
	if e.leasedAhead != 1 || k.c.next == nil || k.c.next.idx != 11 || k.c.next.avail.Load() != min(w, 10) {
		t.Errorf("effects %+v, next %+v; want window 11's lease ahead", e, k.c.next)
	}
	if d := k.debts(); w > 10 && (len(d) != 1 || d[0].idx != 11 || d[0].refund != w-10) {
		t.Errorf("debts %+v; want %d owed back to window 11", d, w-10)
	}
}

// A SlidingWindow key far from its limit keeps at a tick the refund its
// lease left at its window's end, for its next call to carry (a call of
// its own costs a lease.lua call per lease); near the limit, for a key
// leaving the table and while Flush or Close drain, the refund goes at
// once; a refund a call asks beside is carried as before.
func TestSlidingRefundsKept(t *testing.T) {
	setup := func(count int64) *keyTest {
		k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
		k.lease(10*sec+100*ms, 50, count) // 50 leased; the window's bound then count
		k.mustTake(1, 10*sec+100*ms)
		return k
	}
	quiet := 11*sec + 10*ms // the window over, the key quiet since
	k := setup(100)         // 900 free: far
	if call, _, _ := k.tick(quiet); call != nil {
		t.Errorf("far from the limit a refund went alone: %+v", call.win)
	}
	if d := k.debts(); len(d) != 1 || d[0].idx != 10 || d[0].refund != 49 {
		t.Fatalf("debts %+v; want the 49 units left unused kept for window 10", d)
	}
	// kept, it waits for no tick: the syncer does not visit the key again
	// for it (each such visit kept it again, until it was dropped)
	awaits := func() bool {
		lc := k.c.lock()
		defer lc.unlock()
		return lc.awaitsTick()
	}
	if awaits() {
		t.Errorf("a key owing only a kept refund awaits the next tick")
	}
	// the key's next call carries it
	lc := k.c.lock()
	call := lc.ask(k.p, k.id(), 1, quiet+time.Millisecond.Nanoseconds(), k.f)
	lc.unlock()
	if len(call.win.Adjust) != 1 || call.win.Adjust[0].Refund != 49 {
		t.Errorf("the next call carries %+v; want the refund of 49", call.win.Adjust)
	}
	// a debt owed anew, or the key leaving the table, needs a tick again
	for name, change := range map[string]func(lc *lockedCounter){
		"a refund owed anew": func(lc *lockedCounter) { lc.owe(11, 1, 0) },
		"out of the table":   func(lc *lockedCounter) { lc.dead.Store(true) },
	} {
		k = setup(100)
		k.tick(quiet)
		if awaits() {
			t.Fatalf("%s: a kept refund awaits the next tick", name)
		}
		lc := k.c.lock()
		change(lc)
		lc.unlock()
		if !awaits() {
			t.Errorf("%s: the key's debts %+v await no tick", name, k.debts())
		}
	}

	k = setup(600) // 400 free: near
	if call, _, _ := k.tick(quiet); call == nil || len(call.win.Adjust) != 1 || call.win.Adjust[0].Refund != 49 {
		t.Errorf("near the limit: call %+v; want the refund of 49 sent", call)
	}
	if !awaits() {
		t.Errorf("near the limit: the refund's call on its way awaits no tick")
	}
	k = setup(100)
	k.c.dead.Store(true)
	if call, _, _ := k.tick(quiet); call == nil || len(call.win.Adjust) != 1 {
		t.Errorf("a key out of the table: call %+v; want its refund sent", call)
	}
	k = setup(100)
	k.f.draining = true
	if call, _, _ := k.tick(quiet); call == nil || len(call.win.Adjust) != 1 {
		t.Errorf("while draining: call %+v; want the refund sent", call)
	}
	// two periods on the window bounds nothing: the refund is dropped
	k = setup(100)
	k.tick(quiet)
	if call, _, _ := k.tick(12*sec + 10*ms); call != nil || len(k.debts()) != 0 {
		t.Errorf("two periods on: call %+v, debts %+v; want none", call, k.debts())
	}
}

// A plain sliding reply over the limit even by the previous count's weight
// at the latest instant Redis can have run the call decides: a denial
// with no call asked again, the key refused until the units could fit by
// what the call read (as lease.lua computes a refusal's retry), and its
// units owed back only when their give-back certainly did not run.
func TestPlainSlidingRefusalDecides(t *testing.T) {
	now := 10*sec + 100*ms
	refused := func(curr int64, back int8) (*keyTest, *exactCall) {
		k := newKeyTest(t, perSecond1000, algorithm(ratelimit.SlidingWindow))
		k.f.clock = clockView{PeriodUS: k.p.periodUS, ErrNS: 50 * int64(time.Microsecond)}
		lc := k.c.lock()
		e := lc.newExact(k.p, k.id(), 2, now, now, k.f)
		lc.unlock()
		e.x = exchange{before: now, after: now, ok: true}
		e.res.reply, _ = (*slidingExact)(e).parseReply(curr)
		e.res.reply, _ = (*slidingExact)(e).parseReplies(e.res.reply, []*redis.Cmd{hmgetReply("800"), hmgetReply(nil)})
		e.back = back
		e.done = make(chan struct{})
		e.answered(e.res, e.x)
		return k, e
	}
	// curr 300 after the call (298 before it), prev 800: at the latest
	// instant, 101.05ms into the window, floor(800 x 0.89895) = 719, and
	// 719 + 300 is over 1,000. Two units fit once the weight is 700 or
	// less: floor(800 x (P - e) / P) <= 700 from e = 123,751µs.
	k, e := refused(300, backSent)
	if e.late(k.f.clock) {
		t.Fatal("a plain sliding reply over the limit by the latest weight did not decide")
	}
	wantRetry := int64(123_751) - e.swElapsed
	if e.res.win.Retry != wantRetry {
		t.Errorf("retry %dµs; want %dµs (the units fit 123,751µs into the window)", e.res.win.Retry, wantRetry)
	}
	d, l, _ := k.c.decideExact(k.p, e, now, k.f)
	if d.Allowed || l != nil {
		t.Fatalf("decision %+v; want a denial", d)
	}
	fitAt := 10*sec + 123_751*int64(time.Microsecond)
	if d.RetryAfter != time.Duration(fitAt-now) {
		t.Errorf("RetryAfter %v; want %v (until the units fit)", d.RetryAfter, time.Duration(fitAt-now))
	}
	if _, _, ok := k.take(1, fitAt-ms); ok {
		t.Error("the key was not refused in memory until the units fit")
	}
	lc := k.c.lock()
	debts := len(lc.debts)
	free, known := lc.knownFree(10)
	lc.unlock()
	if debts != 0 || !known || free >= 2 {
		t.Errorf("after a refusal given back: %d debts, free %d (known %v); want none owed, and the window known near its limit", debts, free, known)
	}

	// A give-back that certainly did not run leaves the units owed.
	k, e = refused(300, backNotRun)
	k.c.decideExact(k.p, e, now, k.f)
	lc = k.c.lock()
	owed := append([]debt(nil), lc.debts...)
	lc.unlock()
	if len(owed) != 1 || owed[0].idx != 10 || owed[0].refund != 2 {
		t.Errorf("debts %+v after a give-back that did not run; want 2 owed back to window 10", owed)
	}

	// With the next window's leases leaving no room, the units fit only
	// in the next window, once this one's count weighs little enough.
	k, e = refused(5, backSent)
	e.res.reply, _ = (*slidingExact)(e).parseReply(int64(5))
	e.res.reply, _ = (*slidingExact)(e).parseReplies(e.res.reply, []*redis.Cmd{hmgetReply(nil), hmgetReply("996")})
	if e.late(k.f.clock) {
		t.Fatal("a reply over the limit by the next window's leases did not decide")
	}
	// curr 3 without the call; beside the next window's 996 the call's 2
	// units leave 2: floor(3 x (P - e) / P) <= 2 from 1µs into the next
	// window
	if want := int64(1_000_001) - e.swElapsed; e.res.win.Retry != want {
		t.Errorf("retry %dµs; want %dµs", e.res.win.Retry, want)
	}
}

// hmgetReply is an HMGET's reply of one field.
func hmgetReply(v any) *redis.Cmd {
	c := redis.NewCmd(context.Background())
	c.SetVal([]any{v})
	return c
}

// firstAt is the least time into a window at which the window before's
// count, weighted by what is left, leaves room (periodUS + 1: never):
// checked against every instant of a small period. A count of zero
// weighs nothing: 0, as lease.lua's first.
func TestSlidingFirstAt(t *testing.T) {
	const period = 1000
	for c := int64(0); c <= 12; c++ {
		for room := int64(-1); room <= 12; room++ {
			want := int64(period + 1)
			if c == 0 {
				want = 0
			}
			for e := int64(0); e <= period && c > 0; e++ {
				if weighted(c, period-e, period) <= room {
					want = e
					break
				}
			}
			if got := firstAt(c, room, period); got != want {
				t.Errorf("firstAt(%d, %d, %d) = %d; want %d", c, room, period, got, want)
			}
		}
	}
}
