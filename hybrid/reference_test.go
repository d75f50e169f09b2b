package hybrid

import (
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
	mu       gosync.Mutex
	p, r     int64
	capacity int64
	alg      ratelimit.Algorithm
	cur      *refLease
	next     *refLease
	blocked  int64
	debts    map[int64][2]int64 // window -> refund, use
	freeIdx  int64
	freeVal  int64
	hasFree  bool
}

type refLease struct {
	idx, start, end int64
	avail           int64
	free            int64 // unknownFree when not heard of
	known, pre      bool
}

func newRef(limit ratelimit.Limit, alg ratelimit.Algorithm) *refLimiter {
	return &refLimiter{p: int64(limit.Period), r: int64(limit.Rate), capacity: int64(limit.Capacity(alg)), alg: alg, debts: map[int64][2]int64{}}
}

func (r *refLimiter) bucket() bool { return r.alg == ratelimit.TokenBucket || r.alg == ratelimit.GCRA }

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
		rem := min(l.avail+free, r.capacity)
		if r.bucket() { // until the bucket is full again
			return outcome{kind: "allowed", remaining: rem, rst: (r.capacity - rem) * r.p / r.r}, true
		}
		return outcome{kind: "allowed", remaining: rem, rst: l.end - mono}, true
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

// moot: a FixedWindow counter once its window ended, a SlidingWindow one a
// period later, a bucket never.
func (r *refLimiter) obsolete(idx, mono int64) bool {
	switch r.alg {
	case ratelimit.FixedWindow:
		return mono >= (idx+1)*r.p
	case ratelimit.SlidingWindow:
		return mono >= (idx+2)*r.p
	}
	return false
}

// keep is what a bucket call made at mono says the lease keeps: what a
// lease still serving holds.
func (r *refLimiter) keep(mono int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && mono < r.cur.end {
		return max(0, r.cur.avail)
	}
	return 0
}

// installBucket applies a bucket call's reply read at mono, the call made
// at built saying the lease kept keep, for a record of hold ns: the lease
// serves until built + hold when the record covers what it kept; what it
// kept is spent when the record covered less; a replayed call (Kept -1)
// leaves the lease's end no later than it was.
func (r *refLimiter) installBucket(want, keep, built, hold int64, rep script.BucketReply, mono int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setLevel(r.cur, rep.Level)
	end := built + hold
	if r.cur != nil {
		switch {
		case rep.Kept < 0:
			end = min(r.cur.end, end)
		case rep.Kept < keep:
			r.cur.avail = 0
		}
		r.cur.end = end
	}
	switch {
	case rep.Grant > 0:
		if r.cur == nil {
			r.cur = &refLease{end: end, known: true, free: unknownFree}
			if r.hasFree && r.freeIdx == 0 {
				r.cur.free = r.freeVal
			}
		}
		r.cur.avail += rep.Grant
		r.blocked = 0
	case want > 0 && rep.Retry > 0:
		r.blocked = mono + rep.Retry*1000
	}
}

func (r *refLimiter) owe(idx, refund int64) {
	if refund == 0 {
		return
	}
	d := r.debts[idx]
	d[0] += refund
	r.debts[idx] = d
}

func (r *refLimiter) retire(l *refLease, mono int64) {
	if r.obsolete(l.idx, mono) {
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

// setFree keeps the least remainder heard of a window.
func (r *refLimiter) setFree(l *refLease, idx, free int64) {
	if l != nil && l.idx == idx {
		if l.free != unknownFree {
			free = min(free, l.free)
		}
		l.free = free
	}
	switch {
	case !r.hasFree || idx > r.freeIdx:
		r.freeIdx, r.freeVal, r.hasFree = idx, free, true
	case idx == r.freeIdx:
		r.freeVal = min(r.freeVal, free)
	}
}

// setLevel keeps a bucket's last level.
func (r *refLimiter) setLevel(l *refLease, level int64) {
	if l != nil {
		l.free = level
	}
	r.freeIdx, r.freeVal, r.hasFree = 0, level, true
}

func (r *refLimiter) putGrant(idx, g, start, end, mono int64) {
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
	case cur != nil && cur.idx == idx+1 && r.next == nil:
		// Redis still counts in window idx: the next window's lease waits
		// as next again
		nl := r.newLease(idx, start, end)
		nl.avail = g
		r.cur, r.next = nl, cur
		r.blocked = 0
	default:
		r.owe(idx, g)
	}
}

// install applies a reply read at mono (sent at mono too).
func (r *refLimiter) takeGrants(want, wantNext int64, rep script.Reply, mono int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := (rep.Idx + 1) * r.p
	r.roll(mono)
	if want > 0 || rep.Grant > 0 {
		r.setFree(r.cur, rep.Idx, r.r-rep.Count)
		switch {
		case rep.Grant > 0:
			r.putGrant(rep.Idx, rep.Grant, end-r.p, end, mono)
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
			r.putGrant(rep.Idx+1, rep.GrantNext, end, end+r.p, mono)
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

// testParams are the rules and fleet of a limiter with no Redis behind
// it, for the key's state machine: one instance, and Redis time equal to
// mono (offset 0, no error).
func testParams(limit ratelimit.Limit, alg ratelimit.Algorithm) (*params, fleet) {
	cfg := defaultConfig()
	cfg.instances = 1
	cfg.algorithm = alg
	p := newParams(limit, cfg)
	return p, fleet{instances: 1, tickGap: p.interval, clock: clockView{PeriodUS: p.periodUS}}
}

func realState(c *counter) state {
	lc := c.lock()
	defer lc.unlock()
	s := state{blocked: c.blockedUntil.Load(), cur: "-", next: "-"}
	if l := c.cur.Load(); l != nil {
		s.cur = leaseString(l.idx, l.avail.Load(), l.end(), true)
	}
	if l := c.next; l != nil {
		s.next = leaseString(l.idx, l.avail.Load(), l.end(), true)
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

func realTake(p *params, f fleet, c *counter, n, mono int64) outcome {
	var d ratelimit.Decision
	_, _, ok := c.take(p, n, mono, &d)
	if !ok {
		if rolled, _ := c.roll(p, mono, f); rolled {
			_, _, ok = c.take(p, n, mono, &d)
		}
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

func realInstallBucket(p *params, f fleet, c *counter, want, keep, built, hold int64, rep script.BucketReply, mono int64) {
	lc := c.lock()
	k := &leaseCall{c: c, bucket: true, built: built, bkt: script.BucketArgs{Want: want, Keep: keep, HoldUS: hold / 1000}}
	p.policy.takeGrants(lc, k, &reply{bkt: rep}, exchange{before: mono, after: mono, ok: true}, f)
	lc.unlock()
}

func realInstall(p *params, f fleet, c *counter, want, wantNext int64, rep script.Reply, mono int64) {
	lc := c.lock()
	k := &leaseCall{c: c, win: script.LeaseArgs{Want: want, WantNext: wantNext}}
	p.policy.takeGrants(lc, k, &reply{win: rep}, exchange{before: mono, after: mono, ok: true}, f)
	lc.unlock()
}

// A randomized differential test, for every algorithm the hybrid leases:
// the same random operations (decisions, grants of the current and the
// next window or of tokens, spent-window replies, window ends, retirements)
// on the lock-free counter and on the mutex reference give the same
// decisions and leave the same state after every step.
func TestReferenceDifferential(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) { differential(t, alg) })
	}
}

func differential(t *testing.T, alg ratelimit.Algorithm) {
	limit := ratelimit.Limit{Rate: 1000, Period: 100 * time.Millisecond, Burst: 1000}
	p := int64(limit.Period)
	for seed := uint64(1); seed <= 12; seed++ {
		pr, f := testParams(limit, alg)
		c := &counter{key: "k"}
		ref := newRef(limit, alg)
		rng := rand.New(rand.NewPCG(seed, 7))
		mono := 10 * p // Redis time equals mono
		for step := 0; step < 1500; step++ {
			var what string
			switch x := rng.IntN(100); {
			case x < 55:
				n := 1 + rng.Int64N(8)
				got, want := realTake(pr, f, c, n, mono), ref.take(n, mono)
				what = fmt.Sprintf("take %d", n)
				if got != want {
					t.Fatalf("seed %d step %d %s at %d: lock-free %+v, reference %+v", seed, step, what, mono, got, want)
				}
			case x < 80 && ref.bucket():
				g := rng.Int64N(40)
				rep := script.BucketReply{Grant: g, Level: rng.Int64N(1000) - 100}
				if g == 0 {
					rep.Retry = 1 + rng.Int64N(p/1000)
				}
				want := g + rng.Int64N(2)
				// the call was made a little before, keeping what the lease
				// then held; its record covers that, or less (gone), or is
				// not known (replayed)
				built := max(0, mono-rng.Int64N(p/10)/1000*1000)
				keep := ref.keep(built)
				switch rng.IntN(8) {
				case 0:
					rep.Kept = -1
				case 1:
					rep.Kept = rng.Int64N(keep + 1)
				default:
					rep.Kept = keep
				}
				hold := 3 * p // (a record of three periods: leases end within the run)
				what = fmt.Sprintf("bucket reply %+v (made at %d keeping %d)", rep, built, keep)
				realInstallBucket(pr, f, c, want, keep, built, hold, rep, mono)
				ref.installBucket(want, keep, built, hold, rep, mono)
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
				realInstall(pr, f, c, want, wantNext, rep, mono)
				ref.takeGrants(want, wantNext, rep, mono)
			case x < 80:
				// a reply about the window before (a late one)
				idx := mono/p - 1
				rep := script.Reply{Idx: idx, Now: mono / 1000, Reset: ((idx+1)*p - mono) / 1000, Grant: 1 + rng.Int64N(20), Count: 500}
				what = fmt.Sprintf("late reply %+v", rep)
				realInstall(pr, f, c, 1, 0, rep, mono)
				ref.takeGrants(1, 0, rep, mono)
			case x < 83:
				what = "retire"
				lc := c.lock()
				lc.retireAll(pr, mono, f)
				lc.unlock()
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
	pr, f := testParams(limit, ratelimit.FixedWindow)
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
				var d ratelimit.Decision
				if _, _, ok := c.take(pr, n, mono.Load(), &d); ok && d.Allowed {
					taken.Add(n)
				} else if rolled, _ := c.roll(pr, mono.Load(), f); rolled {
					if _, _, ok := c.take(pr, n, mono.Load(), &d); ok && d.Allowed {
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
		realInstall(pr, f, c, want, wantNext, rep, m)
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
	lc := c.lock()
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
	lc.unlock()
	t.Logf("granted %d: taken %d, left in leases or owed %d, expired with their window %d", granted, taken.Load(), left, expired)
	if taken.Load()+left+expired != granted {
		t.Fatalf("taken %d + held or owed %d + expired %d != granted %d: units lost or taken twice", taken.Load(), left, expired, granted)
	}
	if taken.Load() == 0 {
		t.Fatal("nothing was taken")
	}
}
