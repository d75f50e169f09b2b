package local_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

func newMulti(t testing.TB, limits []ratelimit.Limit, algs []ratelimit.Algorithm, c *fakeClock, opts ...local.Option) *local.Multi {
	t.Helper()
	m, err := local.NewMulti(limits, append([]local.Option{local.WithAlgorithms(algs...), local.WithClock(c.Now)}, opts...)...)
	require.NoError(t, err)
	return m
}

// TestMultiAllOrNothing walks a burst bucket, a per-second and a
// per-minute window through admissions and denials: a denial by one limit
// consumes from none, and the Decision describes the tightest limit.
func TestMultiAllOrNothing(t *testing.T) {
	c := newClock()
	c.us.Store(t0 - t0%60_000_000) // at the start of a minute
	sec, minute, bucket := ratelimit.PerSecond(3), ratelimit.PerMinute(5), ratelimit.Limit{Rate: 1, Period: time.Second, Burst: 4}
	m := newMulti(t, []ratelimit.Limit{sec, minute, bucket},
		[]ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow, ratelimit.TokenBucket}, c)
	ctx := context.Background()
	remaining := func(d ratelimit.Decision) []int {
		r := make([]int, len(d.Limits()))
		for i, s := range d.Limits() {
			r[i] = s.Remaining
		}
		return r
	}

	for i := 0; i < 3; i++ {
		d, err := m.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	// Denied by the per-second window alone: the others keep their counts.
	d, err := m.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, sec, d.Limit)
	require.Equal(t, time.Second, d.RetryAfter)
	require.Equal(t, []int{0, 2, 1}, remaining(d))
	require.Equal(t, []bool{false, true, true}, []bool{d.Limits()[0].Allowed, d.Limits()[1].Allowed, d.Limits()[2].Allowed})
	require.Equal(t, ratelimit.TokenBucket, d.Limits()[2].Algorithm)

	c.Advance(time.Second) // the bucket refilled one token: 2
	d, err = m.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, []int{1, 0, 0}, remaining(d))
	// Two limits at 0: the one that resets later describes the decision.
	require.Equal(t, minute, d.Limit)
	require.Equal(t, 59*time.Second, d.ResetAfter)
	require.Zero(t, d.RetryAfter)

	// Denied by the minute (59s) and the bucket (1s): the later retry.
	d, err = m.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, minute, d.Limit)
	require.Equal(t, 59*time.Second, d.RetryAfter)
	require.Equal(t, time.Second, d.Limits()[2].RetryAfter)
	require.Equal(t, []int{1, 0, 0}, remaining(d), "the per-second window still holds its one")
}

// TestMultiDenialLeavesNoTrace runs random requests through two Multis of
// mixed algorithms on one clock: a gets every request, b only those a
// admitted. Were a denial to consume from any limit, a and b would decide
// differently.
func TestMultiDenialLeavesNoTrace(t *testing.T) {
	limits := []ratelimit.Limit{
		{Rate: 2, Period: 300 * time.Millisecond, Burst: 5},
		{Rate: 7, Period: 1300 * time.Millisecond},
		{Rate: 20, Period: 10 * time.Second, Burst: 12},
	}
	for _, algs := range [][]ratelimit.Algorithm{
		{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow},
		{ratelimit.GCRA, ratelimit.SlidingLog, ratelimit.FixedWindow},
		{ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA},
	} {
		t.Run(fmt.Sprint(algs), func(t *testing.T) {
			c := newClock()
			a, b := newMulti(t, limits, algs, c), newMulti(t, limits, algs, c)
			rng := rand.New(rand.NewPCG(1, 2))
			ctx := context.Background()
			var denied int
			for i := 0; i < 5000; i++ {
				c.Advance(usd(rng.Int64N(120_001)))
				key := []string{"x", "y"}[rng.IntN(2)]
				n := 1 + rng.IntN(2)
				da, err := a.AllowN(ctx, key, n)
				require.NoError(t, err)
				if !da.Allowed {
					denied++
					continue
				}
				db, err := b.AllowN(ctx, key, n)
				require.NoError(t, err)
				require.Equal(t, da, db, "request %d", i)
			}
			require.Greater(t, denied, 1000)
		})
	}
}

// TestMultiOfOneIsLimiter: a Multi of one limit decides as a Limiter.
func TestMultiOfOneIsLimiter(t *testing.T) {
	limit := ratelimit.Limit{Rate: 7, Period: 1300 * time.Millisecond, Burst: 3}
	for _, alg := range ratelimit.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			c := newClock()
			m := newMulti(t, []ratelimit.Limit{limit}, []ratelimit.Algorithm{alg}, c)
			l := newLim(t, limit, alg, c)
			rng := rand.New(rand.NewPCG(3, uint64(alg)))
			ctx := context.Background()
			for i := 0; i < 3000; i++ {
				c.Advance(usd(rng.Int64N(300_001)))
				n := 1 + rng.IntN(3)
				dm, err := m.AllowN(ctx, "k", n)
				require.NoError(t, err)
				dl, err := l.AllowN(ctx, "k", n)
				require.NoError(t, err)
				require.Len(t, dm.Limits(), 1)
				require.Equal(t, ratelimit.LimitState{Limit: limit, Algorithm: alg, Allowed: dl.Allowed, Remaining: dl.Remaining,
					RetryAfter: dl.RetryAfter, ResetAfter: dl.ResetAfter}, dm.Limits()[0], "request %d", i)
				dm = publicOf(dm)
				require.Equal(t, dl, dm, "request %d", i)
			}
		})
	}
}

// TestMultiConcurrentNeverExceeded hammers one key from 8 goroutines with
// per-second, per-minute and per-day windows while the clock runs through 3
// minutes in steps of 4.5ms (the goroutines decide concurrently between
// steps): every window of every limit admits at most its Rate, and the
// daily limit is reached.
func TestMultiConcurrentNeverExceeded(t *testing.T) {
	c := newClock()
	limits := []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(200), {Rate: 500, Period: 24 * time.Hour}}
	m := newMulti(t, limits, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow, ratelimit.FixedWindow}, c)
	var (
		step   sync.RWMutex // held to advance the clock; read-held to decide
		mu     sync.Mutex
		counts = make([]map[int64]int, len(limits)) // window index -> admitted
		wg     sync.WaitGroup
		done   atomic.Bool
		errs   atomic.Int64

		decisions atomic.Int64
	)
	for i := range counts {
		counts[i] = map[int64]int{}
	}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				step.RLock()
				now := c.us.Load()
				d, err := m.Allow(context.Background(), "k")
				decisions.Add(1)
				if err != nil {
					errs.Add(1)
				} else if d.Allowed {
					mu.Lock()
					for i, l := range limits {
						counts[i][now/int64(l.Period/time.Microsecond)]++
					}
					mu.Unlock()
				}
				step.RUnlock()
			}
		}()
	}
	for i := int64(0); i < 40_000; i++ { // 40k x 4.5ms = 3 minutes
		for decisions.Load() < 4*i { // a few decisions per step, whatever the scheduler does
			runtime.Gosched()
		}
		step.Lock()
		c.Advance(4500 * time.Microsecond)
		step.Unlock()
	}
	done.Store(true)
	wg.Wait()
	require.Zero(t, errs.Load())
	for i, l := range limits {
		peak := 0
		for _, n := range counts[i] {
			require.LessOrEqual(t, n, l.Rate, "limit %v", l)
			peak = max(peak, n)
		}
		t.Logf("%v: %d windows, peak %d", l, len(counts[i]), peak)
	}
	require.Equal(t, 500, sum(counts[2]), "the daily limit is reached")
}

func sum(m map[int64]int) int {
	s := 0
	for _, v := range m {
		s += v
	}
	return s
}

func TestNewMultiErrors(t *testing.T) {
	sec := ratelimit.PerSecond(10)
	for name, c := range map[string]struct {
		limits []ratelimit.Limit
		opts   []local.Option
		err    error
	}{
		"no limits":     {nil, nil, ratelimit.ErrInvalidLimit},
		"invalid limit": {[]ratelimit.Limit{sec, {Rate: 1}}, nil, ratelimit.ErrInvalidLimit},
		"same state":    {[]ratelimit.Limit{sec, ratelimit.PerSecond(5)}, nil, ratelimit.ErrInvalidLimit},
		"algs count":    {[]ratelimit.Limit{sec}, []local.Option{local.WithAlgorithms(ratelimit.GCRA, ratelimit.GCRA)}, ratelimit.ErrInvalidOption},
		"unknown alg":   {[]ratelimit.Limit{sec}, []local.Option{local.WithAlgorithms(42)}, ratelimit.ErrInvalidAlgorithm},
		"max keys":      {[]ratelimit.Limit{sec}, []local.Option{local.WithMaxKeys(-1)}, ratelimit.ErrInvalidOption},
	} {
		_, err := local.NewMulti(c.limits, c.opts...)
		require.ErrorIs(t, err, c.err, name)
	}
	// New takes one algorithm through WithAlgorithms, and no more.
	l, err := local.New(sec, local.WithAlgorithms(ratelimit.GCRA))
	require.NoError(t, err)
	require.Equal(t, ratelimit.GCRA, l.Algorithm())
	_, err = local.New(sec, local.WithAlgorithms(ratelimit.GCRA, ratelimit.GCRA))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	// The later of WithAlgorithm and WithAlgorithms wins.
	m, err := local.NewMulti([]ratelimit.Limit{sec, ratelimit.PerMinute(100)},
		local.WithAlgorithms(ratelimit.GCRA, ratelimit.GCRA), local.WithAlgorithm(ratelimit.FixedWindow))
	require.NoError(t, err)
	require.Equal(t, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow}, m.Algorithms())
	// The default is DefaultAlgorithm for every limit.
	m, err = local.NewMulti([]ratelimit.Limit{sec, ratelimit.PerMinute(100)})
	require.NoError(t, err)
	require.Equal(t, []ratelimit.Algorithm{local.DefaultAlgorithm, local.DefaultAlgorithm}, m.Algorithms())
	require.Equal(t, []ratelimit.Limit{sec, ratelimit.PerMinute(100)}, m.Limits())
}

func TestMultiAllowNErrors(t *testing.T) {
	c := newClock()
	m := newMulti(t, []ratelimit.Limit{{Rate: 10, Period: time.Second, Burst: 3}, ratelimit.PerMinute(100)},
		[]ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow}, c)
	ctx := context.Background()
	_, err := m.Allow(ctx, "")
	require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
	for _, n := range []int{0, -1, 4} { // 4: above the bucket's burst
		d, err := m.AllowN(ctx, "k", n)
		require.ErrorIs(t, err, ratelimit.ErrInvalidN, "n=%d", n)
		require.Equal(t, ratelimit.Decision{}, d)
	}
	d, err := m.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, d.Allowed)
}

// TestMultiAllowNIntoDoesNotAllocate: with a buffer, a decision on a known
// key allocates nothing.
func TestMultiAllowNIntoDoesNotAllocate(t *testing.T) {
	c := newClock()
	m := newMulti(t, []ratelimit.Limit{ratelimit.PerSecond(1000), ratelimit.PerMinute(100_000), {Rate: 1000, Period: time.Second}},
		[]ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket}, c)
	ctx := context.Background()
	buf := make([]ratelimit.LimitState, 0, 3)
	_, err := m.AllowNInto(ctx, "k", 1, &buf)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		d, _ := m.AllowNInto(ctx, "k", 1, &buf)
		if len(d.Limits()) != 3 || &d.Limits()[0] != &buf[0] {
			t.Fatal("Limits is not the buffer")
		}
	})
	require.Zero(t, allocs)
}

// TestMultiHeapBounded: a Multi keeps at most WithMaxKeys keys, however
// many it has seen, at a bounded cost per key (logged for the docs).
func TestMultiHeapBounded(t *testing.T) {
	const total, maxKeys = 300_000, 20_000
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c := newClock()
	m := newMulti(t, []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(100), {Rate: 1000, Period: 24 * time.Hour}},
		[]ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow}, c, local.WithMaxKeys(maxKeys))
	ctx := context.Background()
	buf := make([]ratelimit.LimitState, 0, 3)
	for i := 0; i < total; i++ {
		if _, err := m.AllowNInto(ctx, "user:"+strconv.Itoa(i), 1, &buf); err != nil {
			t.Fatal(err)
		}
	}
	require.Equal(t, maxKeys, m.Len())
	runtime.GC()
	runtime.ReadMemStats(&after)
	perKey := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / maxKeys
	t.Logf("3 limits: %d bytes per key (HeapAlloc delta / maxKeys)", perKey)
	require.Less(t, perKey, int64(1024))
	runtime.KeepAlive(m)
}

// TestMultiLongKeys: keys kept by their digest (long ones, and those
// starting with the digest mark) decide, reserve and settle as any other.
func TestMultiLongKeys(t *testing.T) {
	c := newClock()
	m := newMulti(t, []ratelimit.Limit{ratelimit.PerSecond(5), ratelimit.PerMinute(8)},
		[]ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow}, c)
	ctx := context.Background()
	for _, key := range []string{strings.Repeat("k", 10_000), "\x00short", strings.Repeat("k", 129)} {
		r, err := m.Reserve(ctx, key, 5)
		require.NoError(t, err)
		require.True(t, r.OK())
		d, err := m.Allow(ctx, key)
		require.NoError(t, err)
		require.False(t, d.Allowed, "the reservation holds the second's 5")
		require.NoError(t, r.Settle(ctx, 2))
		d, err = m.AllowN(ctx, key, 3)
		require.NoError(t, err)
		require.True(t, d.Allowed, "3 came back to the key's own state")
		require.Equal(t, []int{0, 3}, []int{d.Limits()[0].Remaining, d.Limits()[1].Remaining})
	}
	require.Equal(t, 3, m.Len())
}

// publicOf returns d without its per-limit states: what a Limiter of one
// limit decides.
func publicOf(d ratelimit.Decision) ratelimit.Decision {
	return ratelimit.Decision{Allowed: d.Allowed, Limit: d.Limit, Algorithm: d.Algorithm,
		Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
}
