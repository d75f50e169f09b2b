package hybrid

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
	bgsync "github.com/hybridlimit/ratelimit/sync"
)

// refLimiter is the reference of a key's lease and hot path: the same rules
// as counter, lease and the Limiter methods that take from and install
// into them, written plainly, every operation under one mutex. The
// lock-free implementation is run against it in a randomized differential
// test (as go.uber.org/ratelimit keeps its mutex limiter beside the atomic
// one).
//
// Time is mono nanoseconds, and Redis time equals it (offset 0): window i
// spans [i*P, (i+1)*P).
type refLimiter struct {
	mu      gosync.Mutex
	p, r    int64
	cur     *refLease
	next    *refLease
	blocked int64
	debts   map[int64][2]int64 // window -> refund, use
	freeIdx int64
	freeVal int64
	hasFree bool
}

type refLease struct {
	idx, start, end int64
	avail           int64
	free            int64 // unknownFree when not heard of
	known, pre      bool
}

func newRef(limit ratelimit.Limit) *refLimiter {
	return &refLimiter{p: int64(limit.Period), r: int64(limit.Rate), debts: map[int64][2]int64{}}
}

// outcome of a decision in memory: allowed, denied in memory (a window
// known spent), or a miss (Redis must be asked).
type outcome struct {
	kind                  string // "allowed", "denied", "miss"
	remaining, retry, rst int64
}

func (r *refLimiter) take(n, mono int64) outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	if o, ok := r.fast(n, mono); ok {
		return o
	}
	if r.roll(mono) {
		if o, ok := r.fast(n, mono); ok {
			return o
		}
	}
	return outcome{kind: "miss"}
}

func (r *refLimiter) fast(n, mono int64) (outcome, bool) {
	l := r.cur
	valid := l != nil && mono < l.end
	if valid && l.avail >= n {
		l.avail -= n
		free := l.free
		if free == unknownFree || free < 0 {
			free = 0
		}
		return outcome{kind: "allowed", remaining: min(l.avail+free, r.r), rst: l.end - mono}, true
	}
	if mono < r.blocked {
		o := outcome{kind: "denied", retry: r.blocked - mono, rst: r.blocked - mono}
		if valid {
			o.remaining, o.rst = max(0, l.avail), l.end-mono
		}
		return o, true
	}
	return outcome{}, false
}

func (r *refLimiter) moot(idx, mono int64) bool { return mono >= (idx+1)*r.p } // FixedWindow

func (r *refLimiter) owe(idx, refund int64) {
	if refund == 0 {
		return
	}
	d := r.debts[idx]
	d[0] += refund
	r.debts[idx] = d
}

func (r *refLimiter) retire(l *refLease, mono int64) {
	if r.moot(l.idx, mono) {
		l.avail = 0
	}
	r.owe(l.idx, l.avail)
	l.avail = 0
}

func (r *refLimiter) roll(mono int64) bool {
	nl := r.next
	if nl == nil {
		return false
	}
	cur := r.cur
	if cur != nil && cur.idx < nl.idx && mono < cur.end {
		return false
	}
	if cur == nil && mono < nl.start {
		return false
	}
	r.next = nil
	if (cur != nil && cur.idx >= nl.idx) || mono >= nl.end {
		r.retire(nl, mono)
		return false
	}
	r.cur = nl
	if cur != nil {
		r.retire(cur, mono)
	}
	return true
}

func (r *refLimiter) newLease(idx, start, end int64) *refLease {
	l := &refLease{idx: idx, start: start, end: end, known: true, free: unknownFree}
	if r.hasFree && idx == r.freeIdx {
		l.free = r.freeVal
	}
	return l
}

func (r *refLimiter) setFree(l *refLease, idx, free int64) {
	if l != nil && l.idx == idx {
		l.free = free
	}
	if !r.hasFree || idx >= r.freeIdx {
		r.freeIdx, r.freeVal, r.hasFree = idx, free, true
	}
}

func (r *refLimiter) place(idx, g, start, end, mono int64) {
	cur := r.cur
	switch {
	case mono >= end:
		r.owe(idx, g)
	case cur != nil && cur.idx == idx:
		cur.avail += g
		r.blocked = 0
	case mono >= start && (cur == nil || cur.idx < idx):
		nl := r.newLease(idx, start, end)
		nl.avail = g
		if r.next != nil && r.next.idx == idx {
			nl = r.next
			r.next = nil
			nl.avail += g
			nl.pre = false
		}
		r.cur = nl
		if cur != nil {
			r.retire(cur, mono)
		}
		if r.next != nil && r.next.idx <= idx {
			r.retire(r.next, mono)
			r.next = nil
		}
		r.blocked = 0
	case r.next != nil && r.next.idx == idx:
		r.next.avail += g
	case r.next == nil && (cur == nil || cur.idx < idx):
		nl := r.newLease(idx, start, end)
		nl.avail, nl.pre = g, true
		r.next = nl
	default:
		r.owe(idx, g)
	}
}

// install applies a reply read at mono (sent at mono too).
func (r *refLimiter) install(want, wantNext int64, rep script.Reply, mono int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := (rep.Idx + 1) * r.p
	r.roll(mono)
	if want > 0 || rep.Grant > 0 {
		r.setFree(r.cur, rep.Idx, r.r-rep.Count)
		switch {
		case rep.Grant > 0:
			r.place(rep.Idx, rep.Grant, end-r.p, end, mono)
		case rep.Retry > 0 && rep.Reset > 0:
			r.blocked = mono + rep.Retry*1000
		}
	}
	if wantNext > 0 || rep.GrantNext > 0 {
		l := r.next
		if l == nil || l.idx != rep.Idx+1 {
			l = r.cur
		}
		r.setFree(l, rep.Idx+1, r.r-rep.CountNext)
		if rep.GrantNext > 0 {
			r.place(rep.Idx+1, rep.GrantNext, end, end+r.p, mono)
		}
	}
}

func (r *refLimiter) retireAll(mono int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil {
		r.retire(r.cur, mono)
		r.cur = nil
	}
	if r.next != nil {
		r.retire(r.next, mono)
		r.next = nil
	}
}

// state is what both implementations are compared on.
type state struct {
	cur, next string
	blocked   int64
	debts     string
}

func leaseString(idx, avail, end int64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("w%d:%d@%d", idx, avail, end)
}

func debtString(m map[int64][2]int64) string {
	var ks []int64
	for k, v := range m {
		if v != [2]int64{} {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	s := ""
	for _, k := range ks {
		s += fmt.Sprintf("w%d:%d/%d ", k, m[k][0], m[k][1])
	}
	return s
}

func (r *refLimiter) state() state {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := state{blocked: r.blocked, debts: debtString(r.debts)}
	if l := r.cur; l != nil {
		s.cur = leaseString(l.idx, l.avail, l.end, true)
	} else {
		s.cur = "-"
	}
	if l := r.next; l != nil {
		s.next = leaseString(l.idx, l.avail, l.end, true)
	} else {
		s.next = "-"
	}
	return s
}

// testLimiter is a Limiter with no Redis behind it, for the counter's
// in-memory logic: Redis time equals mono (offset 0) and no sample ever
// moves it.
func testLimiter(t *testing.T, limit ratelimit.Limit) *Limiter {
	t.Helper()
	cfg := defaultConfig()
	cfg.instances = 1
	h := &Limiter{
		limit: limit, rate: int64(limit.Rate), capacity: int64(limit.Capacity(cfg.algorithm)), cfg: cfg,
		kind: script.Kind(cfg.algorithm, limit), periodNS: int64(limit.Period), periodUS: int64(limit.Period / time.Microsecond),
		useGrain: int64(limit.Period) / 32, start: time.Now(),
		clk: newServerClock(0, limit.Period, time.Hour),
	}
	s, err := bgsync.New[*counter](func(context.Context, []*counter) ([]*counter, error) { return nil, nil },
		bgsync.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	h.syncer = s
	h.tickGap.Store(int64(cfg.syncInterval))
	t.Cleanup(func() { s.Close(context.Background()) })
	return h
}

func realState(c *counter) state {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := state{blocked: c.blockedUntil.Load(), cur: "-", next: "-"}
	if l := c.cur.Load(); l != nil {
		s.cur = leaseString(l.idx, l.avail.Load(), l.end, true)
	}
	if l := c.next; l != nil {
		s.next = leaseString(l.idx, l.avail.Load(), l.end, true)
	}
	m := map[int64][2]int64{}
	for _, d := range c.debts {
		v := m[d.idx]
		v[0] += d.refund
		v[1] += d.use
		m[d.idx] = v
	}
	s.debts = debtString(m)
	return s
}

func realTake(h *Limiter, c *counter, n, mono int64) outcome {
	d, _, ok := h.fast(c, n, mono)
	if !ok && h.roll(c, mono) {
		d, _, ok = h.fast(c, n, mono)
	}
	if !ok {
		return outcome{kind: "miss"}
	}
	o := outcome{kind: "denied", remaining: int64(d.Remaining), retry: int64(d.RetryAfter), rst: int64(d.ResetAfter)}
	if d.Allowed {
		o.kind = "allowed"
	}
	return o
}

func realInstall(h *Limiter, c *counter, want, wantNext int64, rep script.Reply, mono int64) {
	c.mu.Lock()
	h.install(c, script.LeaseArgs{Want: want, WantNext: wantNext}, rep, mono, mono)
	c.mu.Unlock()
}

// A randomized differential test: the same random operations (decisions,
// grants of the current and the next window, spent-window replies, window
// ends, retirements) on the lock-free counter and on the mutex reference
// give the same decisions and leave the same state after every step.
func TestReferenceDifferential(t *testing.T) {
	limit := ratelimit.Limit{Rate: 1000, Period: 100 * time.Millisecond}
	p := int64(limit.Period)
	for seed := uint64(1); seed <= 12; seed++ {
		h := testLimiter(t, limit)
		c := &counter{key: "k"}
		ref := newRef(limit)
		rng := rand.New(rand.NewPCG(seed, 7))
		mono := 10 * p // Redis time equals mono
		for step := 0; step < 1500; step++ {
			var what string
			switch x := rng.IntN(100); {
			case x < 55:
				n := 1 + rng.Int64N(8)
				got, want := realTake(h, c, n, mono), ref.take(n, mono)
				what = fmt.Sprintf("take %d", n)
				if got != want {
					t.Fatalf("seed %d step %d %s at %d: lock-free %+v, reference %+v", seed, step, what, mono, got, want)
				}
			case x < 75:
				idx := mono / p
				g := rng.Int64N(40)
				rep := script.Reply{Idx: idx, Now: mono / 1000, Reset: ((idx+1)*p - mono) / 1000, Grant: g, Count: 1 + rng.Int64N(1000)}
				if g == 0 {
					rep.Retry = rep.Reset
				}
				want := g + rng.Int64N(2)
				var wantNext int64
				if rng.IntN(3) == 0 {
					wantNext = 1 + rng.Int64N(30)
					rep.GrantNext = rng.Int64N(wantNext + 1)
					rep.CountNext = rep.GrantNext
				}
				what = fmt.Sprintf("reply %+v", rep)
				realInstall(h, c, want, wantNext, rep, mono)
				ref.install(want, wantNext, rep, mono)
			case x < 80:
				// a reply about the window before (a late one)
				idx := mono/p - 1
				rep := script.Reply{Idx: idx, Now: mono / 1000, Reset: ((idx+1)*p - mono) / 1000, Grant: 1 + rng.Int64N(20), Count: 500}
				what = fmt.Sprintf("late reply %+v", rep)
				realInstall(h, c, 1, 0, rep, mono)
				ref.install(1, 0, rep, mono)
			case x < 83:
				what = "retire"
				h.retireAt(c, mono)
				ref.retireAll(mono)
			default:
				// time passes: often within the window, sometimes to its
				// very end or across it
				switch rng.IntN(4) {
				case 0:
					mono = (mono/p + 1) * p
				case 1:
					mono = (mono/p+1)*p - 1000
				default:
					mono += rng.Int64N(p/3) / 1000 * 1000 // Redis time is in microseconds
				}
				what = "time"
			}
			if got, want := realState(c), ref.state(); got != want {
				t.Fatalf("seed %d step %d after %s at %d:\nlock-free %+v\nreference %+v", seed, step, what, mono, got, want)
			}
		}
	}
}

// Concurrent decisions on the lock-free counter while grants arrive and
// windows roll admit exactly what was granted and not given back: units
// are neither lost nor taken twice.
func TestReferenceConservation(t *testing.T) {
	limit := ratelimit.Limit{Rate: math.MaxInt32, Period: 50 * time.Millisecond}
	p := int64(limit.Period)
	h := testLimiter(t, limit)
	c := &counter{key: "k"}
	var mono atomic.Int64
	mono.Store(10 * p)
	var taken atomic.Int64
	stop := make(chan struct{})
	var wg gosync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := int64(1 + g%3)
				if d, _, ok := h.fast(c, n, mono.Load()); ok && d.Allowed {
					taken.Add(n)
				} else if h.roll(c, mono.Load()) {
					if d, _, ok := h.fast(c, n, mono.Load()); ok && d.Allowed {
						taken.Add(n)
					}
				}
			}
		}(g)
	}
	var granted int64
	rng := rand.New(rand.NewPCG(3, 3))
	for i := 0; i < 3000; i++ {
		m := mono.Load()
		idx := m / p
		rep := script.Reply{Idx: idx, Now: m / 1000, Reset: ((idx+1)*p - m) / 1000, Grant: 1 + rng.Int64N(50), Count: 1}
		want := rep.Grant
		var wantNext int64
		if rng.IntN(4) == 0 {
			wantNext = 1 + rng.Int64N(50)
			rep.GrantNext, rep.CountNext = wantNext, 1
		}
		granted += rep.Grant + rep.GrantNext
		realInstall(h, c, want, wantNext, rep, m)
		if rng.IntN(10) == 0 {
			mono.Store((idx + 1) * p) // the window ends
		} else {
			mono.Add(rng.Int64N(p/50) / 1000 * 1000)
		}
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // let the takers run
		}
	}
	close(stop)
	wg.Wait()
	// What is left is in the leases in hand or owed back, or was dropped
	// as its window ended (moot): count the moot drops by retiring with
	// a clock that makes nothing moot.
	c.mu.Lock()
	var left int64
	for _, l := range []*lease{c.cur.Load(), c.next} {
		if l != nil {
			left += l.avail.Load()
		}
	}
	for _, d := range c.debts {
		left += d.refund
	}
	expired := c.expired
	c.mu.Unlock()
	t.Logf("granted %d: taken %d, left in leases or owed %d, expired with their window %d", granted, taken.Load(), left, expired)
	if taken.Load()+left+expired != granted {
		t.Fatalf("taken %d + held or owed %d + expired %d != granted %d: units lost or taken twice", taken.Load(), left, expired, granted)
	}
	if taken.Load() == 0 {
		t.Fatal("nothing was taken")
	}
}
