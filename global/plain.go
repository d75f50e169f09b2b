package global

import (
	"context"
	"hash/maphash"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/hybridlimit/ratelimit/internal/srvclock"
)

// FixedWindow as plain commands.
//
// A FixedWindow decision needs no script when the Limiter knows which
// window Redis counts it in: it is one HINCRBY of the window's counter
// (the hash field the hybrid's lease script and plain increments write
// too, so that every limiter on one prefix shares one count) and a
// PEXPIRE NX (only a counter without an expiry gets one, so a denial
// changes nothing), as envoyproxy/ratelimit sends INCRBY and EXPIRE. What
// Redis spends on a round trip (reading and writing the socket) is most
// of what a decision costs it, so concurrent decisions share round trips:
// they go out in batches, the next formed while one is out (auto-
// pipelining, as the hybrid's queue does; see pipeline); a lone decision
// goes at once. The count after the increment
// decides: admitted when within the limit; over it, the decision is
// denied and its n units are given back in the next batch, before it
// returns, so that a denial does not count.
//
// The window is the one of Redis' clock, which the Limiter estimates from
// the times take.lua's replies carry (srvclock): a decision too near a
// window's end or start to be certain of its window, or made before any
// sample or once the kept one is old, goes to take.lua, and so does one
// whose reply was read too near its window's end to be sure it ran before
// (its units stay counted in that window, which is over: the safe side).
// With WithClock every decision counts at the time given, so its window is
// known. A key-window once denied, or whose counter is a string (written
// by global's other scripts), goes to take.lua for the rest of the window:
// take.lua denies without a trace.
//
// Between an increment over the limit and its give-back, another decision
// of the key may read the count over by those units: a decision of n > 1
// near the limit may then be denied though it would fit after the
// give-back (never the other way: nothing is admitted over the limit).

// plainPath is a FixedWindow Limiter's state for plain decisions. It is
// safe for concurrent use; its reads take no lock.
type plainPath struct {
	clk   *srvclock.Clock // Redis time; nil with WithClock
	start time.Time       // mono 0 of clk
	// key-windows that go to take.lua (denied, or a string counter), by
	// a hash of the key and the window: a collision sends a decision to
	// take.lua, which is exact too
	lua  [256]atomic.Uint64
	seed maphash.Seed // of lua's hash
	pipe pipeline
}

// clockMaxAge is how long a sample of Redis time is kept once newer ones
// come: a decision after it goes to take.lua, which brings one.
const clockMaxAge = 10 * time.Second

func newPlainPath(client redis.UniversalClient, period time.Duration, withClock bool) *plainPath {
	p := &plainPath{start: time.Now(), seed: maphash.MakeSeed(), pipe: pipeline{client: client}}
	if !withClock {
		p.clk = srvclock.New(p.start.UnixMicro(), period, clockMaxAge)
	}
	return p
}

// mono is the time since p's start, ns.
func (p *plainPath) mono() int64 { return int64(time.Since(p.start)) }

// luaTag is the mark of key-window (h, idx) in p.lua: never 0.
func luaTag(h uint64, idx int64) uint64 { return (h ^ uint64(idx)*0x9e3779b97f4a7c15) | 1 }

func (p *plainPath) toLua(h uint64, idx int64) {
	p.lua[h%uint64(len(p.lua))].Store(luaTag(h, idx))
}

func (p *plainPath) goesToLua(h uint64, idx int64) bool {
	return p.lua[h%uint64(len(p.lua))].Load() == luaTag(h, idx)
}

// observe takes a sample of Redis time from a take.lua reply: Redis read
// serverUS between before and after (p.mono).
func (p *plainPath) observe(serverUS, before, after int64) {
	if p != nil && p.clk != nil {
		p.clk.Observe(serverUS, before, after)
	}
}

// takePlain decides n units of key base as plain commands (see above),
// adding use units of credit when win is the window they count in. It
// returns ok false when take.lua must decide instead; charged then
// reports whether the credit was counted all the same (it then is not to
// be sent again). It returns the reply as take does.
func (l *Limiter) takePlain(ctx context.Context, base string, n int, win, use int64) (res []int64, charged, ok bool, err error) {
	p := l.plain
	periodUS := int64(l.limit.Period / time.Microsecond)
	var at, serverUS, idx int64
	if l.clock != nil {
		serverUS = l.clock().UnixMicro()
		idx = serverUS / periodUS // (AllowN refused a time before the epoch)
	} else {
		at = p.mono()
		if p.clk.Stale(at) {
			return nil, false, false, nil // take.lua brings a sample
		}
		v := p.clk.View()
		var certain bool
		if certain, idx = v.Certain(at); !certain {
			return nil, false, false, nil
		}
		serverUS = v.ServerAt(at)
	}
	h := maphash.String(p.seed, base)
	if p.goesToLua(h, idx) {
		return nil, false, false, nil
	}
	d := int64(n)
	if use > 0 && win == idx {
		d += use
	}
	k := script.WindowKey(base, l.kind, idx)
	// the window's end, rounded up to the millisecond, and a second of
	// grace, as take.lua sets it
	ttl := ((idx+1)*periodUS-serverUS+999)/1000 + 1000
	c := &plainCall{key: k, d: d, ttlMS: ttl, done: make(chan struct{})}
	p.pipe.add(ctx, c)
	select {
	case <-c.done:
	case <-ctx.Done():
		// Whether it counted is not known: the credit is owed again
		// (counted twice at worst), the units may stay counted.
		return nil, false, false, ctx.Err()
	}
	if err = c.err; err != nil {
		if redis.HasErrorPrefix(err, "WRONGTYPE") {
			p.toLua(h, idx) // a string counter: nothing counted
			return nil, false, false, nil
		}
		return nil, false, false, err
	}
	charged = d > int64(n)
	if l.clock == nil && p.clk.View().Late(idx, p.mono()) {
		return nil, charged, false, nil
	}
	count, rate := c.count, int64(l.limit.Rate)
	reset := (idx+1)*periodUS - serverUS
	if count <= rate {
		return []int64{1, rate - count, 0, reset, idx}, charged, true, nil
	}
	// Denied: the n units go back, in the next batch, before the decision
	// returns (so that its caller's next decision finds them back), and
	// the window's later decisions here go to take.lua, which denies
	// without counting. A give-back that fails, or that the caller stops
	// waiting for, leaves them counted: the safe side.
	p.toLua(h, idx)
	back := &plainCall{key: k, d: -int64(n), done: make(chan struct{})}
	p.pipe.add(ctx, back)
	select {
	case <-back.done:
	case <-ctx.Done():
	}
	return []int64{0, max(0, rate-(count-int64(n))), reset, reset, idx}, charged, true, nil
}

// pipeline sends plain calls to Redis in batches: an idle pipeline sends
// at once; while a batch is on its way, the calls queued meanwhile go
// together in the next, when it comes back, or, once it has been out for
// besideAfter (a few loopback round trips: its sender is held up, or
// Redis is slow or far), in one beside it, up to maxBatchesOut at once.
// A goroutine sends while calls are queued and ends when none is left,
// so nothing outlives the work (a Limiter has no Close). go-redis splits
// a batch per Cluster node.
//
// One batch out at a time costs Redis least (a round trip is most of what
// a decision costs it); a second beside a batch held up keeps the tail
// short. Measured with ratelimitd's exact mode on the long tail at 64
// callers (docs/ratelimitd.md), one batch out at a time had a p99.9 of
// 31-37 ms, four at once 13-24 ms but 1.3-2x the Redis CPU per decision;
// this rule, about both's best.
type pipeline struct {
	client  redis.UniversalClient
	mu      sync.Mutex
	items   []*plainCall
	running int         // goroutines sending
	sentAt  int64       // when the last batch went out, Unix ns
	noNX    atomic.Bool // Redis knows no PEXPIRE NX (before 7.0)
}

// plainCall is one HINCRBY of a counter's field c and, for a decision, its
// PEXPIRE NX.
type plainCall struct {
	key      string
	d        int64         // the increment
	ttlMS    int64         // > 0: PEXPIRE NX after it
	deadline time.Time     // the caller's, if any
	done     chan struct{} // closed when count or err is set
	count    int64         // the count after the increment
	err      error
}

// The pipeline's rule: see above.
const (
	maxBatchesOut = 4
	besideAfter   = 500 * time.Microsecond
)

// add queues c, with ctx's deadline, and starts a goroutine to send it
// when none is sending, or when the last batch has been out besideAfter.
func (q *pipeline) add(ctx context.Context, c *plainCall) {
	c.deadline, _ = ctx.Deadline() // none: the client's timeouts apply
	q.mu.Lock()
	q.items = append(q.items, c)
	start := q.running == 0 || q.running < maxBatchesOut && time.Now().UnixNano()-q.sentAt >= int64(besideAfter)
	if start {
		q.running++
	}
	q.mu.Unlock()
	if start {
		go q.drain()
	}
}

// drain sends the queued calls in batches until none is left.
func (q *pipeline) drain() {
	for {
		q.mu.Lock()
		batch := q.items
		q.items = nil
		q.sentAt = time.Now().UnixNano()
		if len(batch) == 0 {
			q.running--
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		q.send(batch)
		// Let the callers just answered queue their next calls before
		// the next batch is taken (as the hybrid's queue does): else they
		// miss it, and one Limiter's callers split into groups that
		// alternate round trips.
		for range returnYields {
			runtime.Gosched()
		}
	}
}

// returnYields: how many times a sender yields its processor after a batch.
const returnYields = 4

// send sends batch as one pipeline, with the latest of its deadlines (none
// if a call has none), and hands each call its reply.
func (q *pipeline) send(batch []*plainCall) {
	ctx := context.Background()
	var latest time.Time
	for _, c := range batch {
		if c.deadline.IsZero() {
			latest = time.Time{}
			break
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	if !latest.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	nx := !q.noNX.Load()
	incrs := make([]*redis.IntCmd, len(batch))
	expires := make([]redis.Cmder, len(batch))
	_, _ = q.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, c := range batch {
			incrs[i] = pl.HIncrBy(ctx, c.key, "c", c.d)
			switch {
			case c.ttlMS <= 0:
			case nx:
				expires[i] = pl.Do(ctx, "pexpire", c.key, c.ttlMS, "nx")
			default:
				expires[i] = pl.PExpire(ctx, c.key, time.Duration(c.ttlMS)*time.Millisecond)
			}
		}
		return nil
	})
	for i, c := range batch {
		c.count, c.err = incrs[i].Val(), incrs[i].Err()
		if e := expires[i]; c.err == nil && e != nil && e.Err() != nil {
			if nx && redis.HasErrorPrefix(e.Err(), "ERR") {
				// Redis before 7.0: no NX; the counter is counted
				q.noNX.Store(true)
				c.err = q.client.PExpire(ctx, c.key, time.Duration(c.ttlMS)*time.Millisecond).Err()
			} else {
				c.err = e.Err()
			}
		}
		close(c.done)
	}
}
