package hybrid_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// multiFleet makes n hybrid Multis, each with its own Redis client.
func multiFleet(t *testing.T, n int, newClient func() redis.UniversalClient, limits []ratelimit.Limit, opts ...hybrid.Option) []*hybrid.Multi {
	t.Helper()
	var ms []*hybrid.Multi
	for i := 0; i < n; i++ {
		c := newClient()
		t.Cleanup(func() { c.Close() })
		m, err := hybrid.NewMulti(c, limits, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		ms = append(ms, m)
	}
	return ms
}

// windowCount reads the counter of window idx of a window limit for key:
// what a hybrid or global limiter of that algorithm and limit counts in.
func windowCount(t *testing.T, c redis.UniversalClient, prefix, key string, a ratelimit.Algorithm, l ratelimit.Limit, idx int64) int {
	t.Helper()
	base, err := script.KeyBase(prefix, key)
	require.NoError(t, err)
	ctx := context.Background()
	k := script.WindowKey(base, script.Kind(a, l), idx)
	var n int
	switch typ := c.Type(ctx, k).Val(); typ {
	case "none":
		return 0
	case "hash":
		n, err = c.HGet(ctx, k, "c").Int()
	default:
		n, err = c.Get(ctx, k).Int()
	}
	require.NoError(t, err)
	return n
}

// multiTally counts a Multi's admissions per limit and window, each read
// from the limit's own ResetAfter (see tally).
type multiTally []*tally

func (mt multiTally) add(d ratelimit.Decision, n int, start time.Time) {
	for i, s := range d.Limits() {
		mt[i].add("k", ratelimit.Decision{ResetAfter: s.ResetAfter}, n, start)
	}
}

// A fleet of 4 instances hammers one key under a per-second, a
// per-minute and a per-day limit: no limit is exceeded in any window,
// every admission is counted by every limit, and no denial is counted by
// any: once flushed, the minute's and the day's counters in Redis equal
// what the fleet admitted (the minute binds at its limit), whatever limit
// denied the rest.
func TestMultiFleetNeverExceeded(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Standalone(t)
		testMultiFleet(t, func() redis.UniversalClient { return srv.Client() })
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.NewCluster(t)
		testMultiFleet(t, func() redis.UniversalClient { return cl.Client() })
	})
}

func testMultiFleet(t *testing.T, newClient func() redis.UniversalClient) {
	sec, minute := ratelimit.PerSecond(25), ratelimit.PerMinute(80)
	day := ratelimit.Limit{Rate: 1000, Period: 24 * time.Hour}
	limits := []ratelimit.Limit{sec, minute, day}
	prefix := uniq(t)
	const instances, workers = 4, 4
	ms := multiFleet(t, instances, newClient, limits, hybrid.WithPrefix(prefix), hybrid.WithInstances(instances))
	c := newClient()
	defer c.Close()
	minIdx := freshWindow(t, c, time.Minute, 12*time.Second)
	dayIdx, _ := serverWindow(t, c, 24*time.Hour)

	mt := multiTally{newTally(time.Second), newTally(time.Minute), newTally(24 * time.Hour)}
	var allowed, denied atomic.Int64
	var deniedBy [3]atomic.Int64
	from := time.Now()
	stop := from.Add(5 * time.Second)
	var wg sync.WaitGroup
	for _, m := range ms {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				states := make([]ratelimit.LimitState, 0, 3)
				for time.Now().Before(stop) {
					start := time.Now()
					d, err := m.AllowNInto(context.Background(), "k", 1, &states)
					if err != nil {
						t.Errorf("AllowN: %v", err)
						return
					}
					if len(d.Limits()) != 3 || &d.Limits()[0] != &states[0] {
						t.Errorf("Limits %v not in the caller's buffer", d.Limits())
						return
					}
					if d.Allowed {
						allowed.Add(1)
						mt.add(d, 1, start)
						continue
					}
					denied.Add(1)
					if d.RetryAfter <= 0 {
						t.Errorf("denied without RetryAfter: %+v", d)
					}
					for i, s := range d.Limits() {
						if !s.Allowed {
							deniedBy[i].Add(1)
						}
					}
					time.Sleep(time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	to := time.Now()
	for _, m := range ms {
		require.NoError(t, m.Flush(context.Background()))
	}
	a := int(allowed.Load())
	t.Logf("allowed %d, denied %d (by the second %d, the minute %d, the day %d)",
		a, denied.Load(), deniedBy[0].Load(), deniedBy[1].Load(), deniedBy[2].Load())

	for i, l := range limits {
		_, all := mt[i].windows("k", from, to)
		for idx, n := range all {
			require.LessOrEqual(t, n, l.Rate, "limit %v window %d", l, idx)
		}
	}
	require.LessOrEqual(t, a, minute.Rate)
	require.GreaterOrEqual(t, a, minute.Rate*95/100, "the fleet reaches the minute's limit")
	require.Positive(t, deniedBy[0].Load(), "the second's limit denied")
	require.Positive(t, deniedBy[1].Load(), "the minute's limit denied")

	// Redis counted exactly the admissions, in the limits that kept their
	// window: the denials of the others left them alone.
	require.Equal(t, a, windowCount(t, c, prefix, "k", ratelimit.FixedWindow, minute, minIdx))
	require.Equal(t, a, windowCount(t, c, prefix, "k", ratelimit.FixedWindow, day, dayIdx))
}

// A request one limit denies leaves the others' counts unchanged, in
// whatever order the limits are given and whichever algorithm each has.
func TestMultiDeniedLeavesOthers(t *testing.T) {
	srv := redistest.Standalone(t)
	hour, day := ratelimit.PerHour(5), ratelimit.Limit{Rate: 1000, Period: 24 * time.Hour}
	for name, tc := range map[string]struct {
		limits []ratelimit.Limit
		algs   []ratelimit.Algorithm
	}{
		"tight first":       {[]ratelimit.Limit{hour, day}, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow}},
		"tight last":        {[]ratelimit.Limit{day, hour}, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow}},
		"sliding and fixed": {[]ratelimit.Limit{day, hour}, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow}},
	} {
		t.Run(name, func(t *testing.T) {
			c := srv.Client()
			defer c.Close()
			freshWindow(t, c, time.Hour, 10*time.Second)
			prefix := uniq(t)
			m, err := hybrid.NewMulti(c, tc.limits, hybrid.WithPrefix(prefix), hybrid.WithAlgorithms(tc.algs...))
			require.NoError(t, err)
			defer m.Close()
			allowed := 0
			for i := 0; i < 40; i++ {
				d, err := m.AllowN(context.Background(), "k", 1+i%2)
				require.NoError(t, err)
				if d.Allowed {
					allowed += 1 + i%2
				}
			}
			require.Equal(t, 5, allowed, "exactly the hour's limit")
			require.NoError(t, m.Flush(context.Background()))
			hourIdx, _ := serverWindow(t, c, time.Hour)
			dayIdx, _ := serverWindow(t, c, 24*time.Hour)
			for i, l := range tc.limits {
				idx := dayIdx
				if l == hour {
					idx = hourIdx
				}
				require.Equal(t, 5, windowCount(t, c, prefix, "k", tc.algs[i], l, idx), "limit %v", l)
			}
		})
	}
}

// The Decision of a Multi describes the tightest limit and lists them all;
// a denied one says which limit denied and when to come back.
func TestMultiDecision(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	freshWindow(t, c, time.Hour, 10*time.Second)
	hour, day := ratelimit.PerHour(3), ratelimit.Limit{Rate: 10, Period: 24 * time.Hour}
	m, err := hybrid.NewMulti(c, []ratelimit.Limit{day, hour}, hybrid.WithPrefix(uniq(t)))
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, []ratelimit.Limit{day, hour}, m.Limits())
	require.Equal(t, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow}, m.Algorithms())

	d, err := m.Allow(context.Background(), "k")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Len(t, d.Limits(), 2)
	require.Equal(t, hour, d.Limit, "the tightest: least Remaining")
	require.Equal(t, 2, d.Remaining)
	require.Equal(t, 9, d.Limits()[0].Remaining)
	require.Equal(t, 2, d.Limits()[1].Remaining)
	for _, s := range d.Limits() {
		require.True(t, s.Allowed)
		require.Equal(t, ratelimit.FixedWindow, s.Algorithm)
	}
	_, err = m.AllowN(context.Background(), "k", 2)
	require.NoError(t, err)
	d, err = m.Allow(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, hour, d.Limit)
	require.True(t, d.Limits()[0].Allowed, "the day alone would admit it")
	require.Equal(t, 7, d.Limits()[0].Remaining, "and kept its count")
	require.False(t, d.Limits()[1].Allowed)
	require.Positive(t, d.RetryAfter)
	require.LessOrEqual(t, d.RetryAfter, time.Hour)
}

// Bad input gets clear errors, never a panic.
func TestMultiBadInput(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	sec := ratelimit.PerSecond(10)
	for name, tc := range map[string]struct {
		limits []ratelimit.Limit
		opts   []hybrid.Option
		err    error
	}{
		"none":        {nil, nil, ratelimit.ErrInvalidLimit},
		"invalid":     {[]ratelimit.Limit{sec, {}}, nil, ratelimit.ErrInvalidLimit},
		"same state":  {[]ratelimit.Limit{sec, ratelimit.PerSecond(5)}, nil, ratelimit.ErrInvalidLimit},
		"algs short":  {[]ratelimit.Limit{sec, ratelimit.PerMinute(5)}, []hybrid.Option{hybrid.WithAlgorithms(ratelimit.FixedWindow)}, ratelimit.ErrInvalidOption},
		"sliding log": {[]ratelimit.Limit{sec}, []hybrid.Option{hybrid.WithAlgorithms(ratelimit.SlidingLog)}, ratelimit.ErrInvalidAlgorithm},
		"too many":    {make([]ratelimit.Limit, ratelimit.MaxLimits+1), nil, ratelimit.ErrInvalidLimit},
		"bad option":  {[]ratelimit.Limit{sec}, []hybrid.Option{hybrid.WithTimeout(-1)}, ratelimit.ErrInvalidOption},
	} {
		_, err := hybrid.NewMulti(c, tc.limits, tc.opts...)
		require.ErrorIs(t, err, tc.err, name)
	}
	_, err := hybrid.NewMulti(nil, []ratelimit.Limit{sec})
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	_, err = hybrid.New(c, sec, hybrid.WithAlgorithms(ratelimit.FixedWindow, ratelimit.GCRA))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "New takes one algorithm")

	bucket := ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 3}
	m, err := hybrid.NewMulti(c, []ratelimit.Limit{bucket, ratelimit.PerMinute(100)},
		hybrid.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow), hybrid.WithPrefix(uniq(t)))
	require.NoError(t, err)
	_, err = m.AllowN(context.Background(), "", 1)
	require.ErrorIs(t, err, ratelimit.ErrInvalidKey)
	_, err = m.AllowN(context.Background(), "k", 0)
	require.ErrorIs(t, err, ratelimit.ErrInvalidN)
	_, err = m.AllowN(context.Background(), "k", 4)
	require.ErrorIs(t, err, ratelimit.ErrInvalidN, "above the bucket's burst")
	d, err := m.AllowN(context.Background(), "k", 3)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, m.Close())
	_, err = m.Allow(context.Background(), "k")
	require.ErrorIs(t, err, ratelimit.ErrClosed)
	_, err = m.Reserve(context.Background(), "k", 1)
	require.ErrorIs(t, err, ratelimit.ErrClosed)
}

// A token bucket for bursts and a fixed window per minute, mixed: a fleet
// never exceeds either, and the window's counter in Redis equals what the
// fleet admitted.
func TestMultiMixedAlgorithms(t *testing.T) {
	srv := redistest.Standalone(t)
	bucket := ratelimit.Limit{Rate: 20, Period: time.Second, Burst: 10}
	minute := ratelimit.PerMinute(60)
	prefix := uniq(t)
	const instances = 4
	ms := multiFleet(t, instances, func() redis.UniversalClient { return srv.Client() }, []ratelimit.Limit{bucket, minute},
		hybrid.WithPrefix(prefix), hybrid.WithInstances(instances), hybrid.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow))
	c := srv.Client()
	defer c.Close()
	minIdx := freshWindow(t, c, time.Minute, 10*time.Second)
	var allowed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, m := range ms {
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < 3*time.Second {
					d, err := m.Allow(context.Background(), "k")
					if err != nil {
						t.Errorf("Allow: %v", err)
						return
					}
					if d.Allowed {
						allowed.Add(1)
					} else {
						time.Sleep(time.Millisecond)
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, m := range ms {
		require.NoError(t, m.Flush(context.Background()))
	}
	a := int(allowed.Load())
	bound := bucket.Burst + int(math.Ceil(float64(bucket.Rate)*elapsed.Seconds()))
	t.Logf("allowed %d in %v: the bucket allows %d, the minute %d", a, elapsed, bound, minute.Rate)
	require.LessOrEqual(t, a, min(bound, minute.Rate))
	require.GreaterOrEqual(t, a, minute.Rate*9/10, "the bucket let through what the minute allows")
	require.Equal(t, a, windowCount(t, c, prefix, "k", ratelimit.FixedWindow, minute, minIdx))
}

// A Multi never waits on Redis longer than its timeout in all, however
// many of its limits must lease, and a hanging Redis turns into the
// failure mode's answer, not an error.
func TestMultiOutage(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	m, err := hybrid.NewMulti(c, []ratelimit.Limit{ratelimit.PerSecond(100), ratelimit.PerMinute(1000), ratelimit.PerHour(5000)},
		hybrid.WithTimeout(50*time.Millisecond), hybrid.WithInstances(1), hybrid.WithFailureMode(ratelimit.FailClosed))
	require.NoError(t, err)
	defer m.Close()
	require.Error(t, m.Ping(context.Background()))
	d, err := m.Allow(context.Background(), "k")
	require.NoError(t, err)
	require.False(t, d.Allowed, "FailClosed")
	require.Positive(t, d.RetryAfter)
}

// A key far under every limit is never denied, with many keys: while a
// decision leases, the syncer may drop the key's counter (it looked idle)
// and the limit's slow path then leases on its successor; the decision
// goes on with the successor, and what it gives back goes to the lease it
// took from. (ratelimitd's benchmark met this: 10,000 keys on a token
// bucket, a per-second window and an hourly one; a decision whose counter
// was dropped found no lease on it round after round, and was denied with
// every limit's quota untouched.)
func TestMultiManyKeysCounterDropped(t *testing.T) {
	skipUnderRace(t) // 200,000 decisions: 4s without the detector, 70s with it
	srv := redistest.Standalone(t)
	c := srv.Client()
	t.Cleanup(func() { c.Close() })
	limits := []ratelimit.Limit{
		{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000},
		{Rate: 1_000_000, Period: time.Second},
		{Rate: 2_000_000, Period: time.Hour},
	}
	m, err := hybrid.NewMulti(c, limits, hybrid.WithPrefix(uniq(t)),
		hybrid.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.FixedWindow))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
		_, err := m.Allow(context.Background(), keys[i])
		require.NoError(t, err)
	}
	var next, denied, errs atomic.Int64
	var first atomic.Pointer[string]
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st []ratelimit.LimitState
			for i := next.Add(1); i <= 200_000; i = next.Add(1) {
				d, err := m.AllowNInto(context.Background(), keys[int(i)%len(keys)], 1, &st)
				switch {
				case err != nil:
					errs.Add(1)
				case !d.Allowed:
					if denied.Add(1) == 1 {
						s := fmt.Sprintf("%+v, limits %+v", d, st)
						first.Store(&s)
					}
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, errs.Load())
	if p := first.Load(); p != nil {
		t.Logf("first denial: %s", *p)
	}
	require.Zero(t, denied.Load(), "every key is far under every limit")
}
