package global_test

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/hybridlimit/ratelimit/local"
)

func newMulti(t testing.TB, c redis.UniversalClient, limits []ratelimit.Limit, algs []ratelimit.Algorithm, opts ...global.Option) *global.Multi {
	t.Helper()
	m, err := global.NewMulti(c, limits, append([]global.Option{global.WithAlgorithms(algs...), global.WithPrefix(uniquePrefix(t))}, opts...)...)
	require.NoError(t, err)
	return m
}

// dump returns every key on c matching pattern (on every master of a
// Cluster) with its DUMP, so that two calls compare the whole state.
func dump(t testing.TB, c redis.UniversalClient, pattern string) map[string]string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	out := map[string]string{}
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			v, err := c.Dump(ctx, iter.Val()).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			out[iter.Val()] = v
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch cl := c.(type) {
	case *redis.ClusterClient:
		err = cl.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, cl)
	}
	require.NoError(t, err)
	return out
}

func keysOf(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestMultiDenialWritesNothing fills one limit at a time of a key's
// per-second, per-minute and per-day limits, for mixes of algorithms, on a
// standalone server and a Cluster: the request that limit denies leaves
// every key in Redis, the other limits' counters included, byte for byte
// unchanged; every key of the key lives in one slot and has an expiry.
func TestMultiDenialWritesNothing(t *testing.T) {
	srv := redistest.Standalone(t)
	cl := redistest.NewCluster(t)
	limits := []ratelimit.Limit{
		{Rate: 3, Period: time.Second, Burst: 3},
		{Rate: 5, Period: time.Minute, Burst: 5},
		{Rate: 7, Period: 24 * time.Hour, Burst: 7},
	}
	mixes := [][]ratelimit.Algorithm{
		{ratelimit.FixedWindow, ratelimit.FixedWindow, ratelimit.FixedWindow},
		{ratelimit.TokenBucket, ratelimit.SlidingWindow, ratelimit.FixedWindow},
		{ratelimit.GCRA, ratelimit.SlidingLog, ratelimit.TokenBucket},
	}
	for _, dep := range []struct {
		name string
		c    redis.UniversalClient
	}{{"standalone", srv.Client()}, {"cluster", cl.Client()}} {
		defer dep.c.Close()
		for _, algs := range mixes {
			t.Run(fmt.Sprintf("%s/%v", dep.name, algs), func(t *testing.T) {
				ctx := context.Background()
				clk := &fakeClock{}
				clk.Set(t0)
				prefix := uniquePrefix(t)
				m, err := global.NewMulti(dep.c, limits, global.WithAlgorithms(algs...), global.WithPrefix(prefix), global.WithClock(clk.Now))
				require.NoError(t, err)
				pattern := prefix + ":*"
				deny := func(want int) {
					t.Helper()
					before := dump(t, dep.c, pattern)
					d, err := m.Allow(ctx, "k")
					require.NoError(t, err)
					require.False(t, d.Allowed)
					require.Equal(t, limits[want], d.Limit, "the limit that denied: %+v", d)
					for i, s := range d.Limits() {
						require.Equal(t, i != want, s.Allowed, "limit %d: %+v", i, d)
					}
					require.Equal(t, before, dump(t, dep.c, pattern), "a denial wrote to Redis")
				}
				admit := func(times int) {
					t.Helper()
					for i := 0; i < times; i++ {
						d, err := m.Allow(ctx, "k")
						require.NoError(t, err)
						require.True(t, d.Allowed)
					}
				}
				admit(3)
				deny(0) // the per-second limit: 3 of 3
				clk.Add(time.Second)
				admit(2)
				deny(1) // the per-minute limit: 5 of 5, the second's 1 left
				clk.Add(2 * time.Minute)
				admit(2)
				deny(2) // the per-day limit: 7 of 7, the second's 1 and the minute's 3 left

				keys := keysOf(dump(t, dep.c, pattern))
				require.NotEmpty(t, keys)
				slot := -1
				for _, k := range keys {
					s, err := dep.c.ClusterKeySlot(ctx, k).Result()
					if dep.name == "standalone" { // no CLUSTER on a standalone server: compute it on the Cluster
						s, err = cl.Client().ClusterKeySlot(ctx, k).Result()
					}
					require.NoError(t, err)
					if slot < 0 {
						slot = int(s)
					}
					require.EqualValues(t, slot, s, "key %s", k)
				}
				t.Logf("keys: %v", keys)
			})
		}
		requireAllTTL(t, dep.c)
	}
}

// TestMultiNeverExceeded hammers one key with per-second, per-minute and
// per-day FixedWindow limits from 4 clients x 16 goroutines, on a
// standalone server and a Cluster, while a fake clock runs through 2
// minutes in steps of 30ms (the goroutines decide concurrently between
// steps): no window of any limit admits more than its Rate, every limit
// binds at some point, and the day's counter in Redis equals what was
// admitted.
func TestMultiNeverExceeded(t *testing.T) {
	srv := redistest.Standalone(t)
	cl := redistest.NewCluster(t)
	for _, dep := range []deployment{
		{"standalone", func() redis.UniversalClient { return srv.Client() }},
		{"cluster", func() redis.UniversalClient { return cl.Client() }},
	} {
		t.Run(dep.name, func(t *testing.T) {
			limits := []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(300), {Rate: 500, Period: 24 * time.Hour}}
			algs := []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow, ratelimit.FixedWindow}
			clk := &fakeClock{}
			clk.Set(t0)
			prefix := uniquePrefix(t)
			var ms []*global.Multi
			for i := 0; i < 4; i++ {
				c := dep.newClient()
				defer c.Close()
				m, err := global.NewMulti(c, limits, global.WithAlgorithms(algs...), global.WithPrefix(prefix), global.WithClock(clk.Now))
				require.NoError(t, err)
				ms = append(ms, m)
			}
			var (
				step      sync.RWMutex
				mu        sync.Mutex
				counts    = make([]map[int64]int, len(limits))
				wg        sync.WaitGroup
				done      atomic.Bool
				decisions atomic.Int64
				errs      = make(chan error, 64)
			)
			for i := range counts {
				counts[i] = map[int64]int{}
			}
			for g := 0; g < 64; g++ {
				wg.Add(1)
				go func(m *global.Multi) {
					defer wg.Done()
					for !done.Load() {
						step.RLock()
						now := clk.us.Load()
						d, err := m.Allow(context.Background(), "hot")
						decisions.Add(1)
						if err == nil && d.Allowed {
							mu.Lock()
							for i, l := range limits {
								counts[i][now/int64(l.Period/time.Microsecond)]++
							}
							mu.Unlock()
						}
						step.RUnlock()
						if err != nil {
							errs <- err
							return
						}
					}
				}(ms[g%len(ms)])
			}
			for i := int64(0); i < 4000; i++ { // 4000 x 30ms = 2 minutes
				for decisions.Load() < 6*i {
					runtime.Gosched()
				}
				step.Lock()
				clk.Add(30 * time.Millisecond)
				step.Unlock()
			}
			done.Store(true)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			for i, l := range limits {
				full := 0
				for _, n := range counts[i] {
					require.LessOrEqual(t, n, l.Rate, "limit %v", l)
					if n == l.Rate {
						full++
					}
				}
				t.Logf("%v: %d windows, %d full", l, len(counts[i]), full)
				require.Positive(t, full, "limit %v never bound", l)
			}
			c := dep.newClient()
			defer c.Close()
			day := int64(24 * time.Hour / time.Microsecond)
			key := prefix + ":{hot}:" + script.Kind(ratelimit.FixedWindow, limits[2]) + ":" + strconv.FormatInt(t0/day, 10)
			got, err := c.Get(context.Background(), key).Int()
			require.NoError(t, err)
			require.Equal(t, 500, got)
		})
	}
}

// TestMultiOfOneIsLimiter: a Multi of one limit decides as a Limiter.
func TestMultiOfOneIsLimiter(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.Limit{Rate: 4, Period: time.Second, Burst: 6}
	for _, alg := range ratelimit.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			clk := &fakeClock{}
			clk.Set(t0 + 123_457)
			m := newMulti(t, c, []ratelimit.Limit{limit}, []ratelimit.Algorithm{alg}, global.WithClock(clk.Now))
			l := newLimiter(t, c, limit, global.WithAlgorithm(alg), global.WithClock(clk.Now))
			ctx := context.Background()
			for i := 0; i < 200; i++ {
				clk.Add(time.Duration(i%7) * 37 * time.Millisecond)
				n := 1 + i%3
				dm, err := m.AllowN(ctx, "k", n)
				require.NoError(t, err)
				dl, err := l.AllowN(ctx, "k", n)
				require.NoError(t, err)
				require.Len(t, dm.Limits(), 1)
				dm = publicOf(dm)
				require.Equal(t, dl, dm, "request %d", i)
			}
		})
	}
}

func TestNewMultiRejectsBadInput(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	sec := ratelimit.PerSecond(10)
	for name, tc := range map[string]struct {
		client redis.UniversalClient
		limits []ratelimit.Limit
		opts   []global.Option
		err    error
	}{
		"nil client":    {nil, []ratelimit.Limit{sec}, nil, ratelimit.ErrInvalidOption},
		"no limits":     {c, nil, nil, ratelimit.ErrInvalidLimit},
		"invalid limit": {c, []ratelimit.Limit{sec, {Rate: 1}}, nil, ratelimit.ErrInvalidLimit},
		"same state":    {c, []ratelimit.Limit{sec, ratelimit.PerSecond(5)}, nil, ratelimit.ErrInvalidLimit},
		"algs count":    {c, []ratelimit.Limit{sec}, []global.Option{global.WithAlgorithms()}, ratelimit.ErrInvalidOption},
		"unknown alg":   {c, []ratelimit.Limit{sec}, []global.Option{global.WithAlgorithms(7)}, ratelimit.ErrInvalidAlgorithm},
		"bad prefix":    {c, []ratelimit.Limit{sec}, []global.Option{global.WithPrefix("{")}, ratelimit.ErrInvalidOption},
		"gcra T = 0":    {c, []ratelimit.Limit{{Rate: 1001, Period: time.Millisecond}}, []global.Option{global.WithAlgorithm(ratelimit.GCRA)}, ratelimit.ErrInvalidLimit},
	} {
		require.NotPanics(t, func() {
			m, err := global.NewMulti(tc.client, tc.limits, tc.opts...)
			require.ErrorIs(t, err, tc.err, name)
			require.Nil(t, m, name)
		})
	}
	_, err := global.New(c, sec, global.WithAlgorithms(ratelimit.GCRA, ratelimit.GCRA))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	l, err := global.New(c, sec, global.WithAlgorithms(ratelimit.GCRA))
	require.NoError(t, err)
	require.Equal(t, ratelimit.GCRA, l.Algorithm())
	m, err := global.NewMulti(c, []ratelimit.Limit{sec, ratelimit.PerMinute(100)})
	require.NoError(t, err)
	require.Equal(t, []ratelimit.Algorithm{global.DefaultAlgorithm, global.DefaultAlgorithm}, m.Algorithms())
	require.Equal(t, []ratelimit.Limit{sec, ratelimit.PerMinute(100)}, m.Limits())
}

func TestMultiAllowNRejectsBadInput(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	prefix := uniquePrefix(t)
	m, err := global.NewMulti(c, []ratelimit.Limit{{Rate: 10, Period: time.Second, Burst: 3}, ratelimit.PerMinute(100)},
		global.WithAlgorithms(ratelimit.TokenBucket, ratelimit.FixedWindow), global.WithPrefix(prefix))
	require.NoError(t, err)
	for _, tc := range []struct {
		key string
		n   int
		err error
	}{{"", 1, ratelimit.ErrInvalidKey}, {"k", 0, ratelimit.ErrInvalidN}, {"k", 4, ratelimit.ErrInvalidN}} {
		d, err := m.AllowN(ctx, tc.key, tc.n)
		require.ErrorIs(t, err, tc.err)
		require.Equal(t, ratelimit.Decision{}, d)
		_, err = m.Reserve(ctx, tc.key, tc.n)
		require.ErrorIs(t, err, tc.err)
	}
	require.Empty(t, dump(t, c, prefix+":*"), "bad input reached Redis")
	d, err := m.AllowN(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	// AllowNInto fills the buffer it is given.
	buf := make([]ratelimit.LimitState, 2, 4)
	d, err = m.AllowNInto(ctx, "k", 1, &buf)
	require.NoError(t, err)
	require.Same(t, &buf[0], &d.Limits()[0])
}

// TestMultiFailureModes: with a failure mode, a frozen Redis turns a
// multi-limit decision into the fallback's (a local.Multi of the share) or
// into FailOpen's and FailClosed's answers, each limit listed.
func TestMultiFailureModes(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	limits := []ratelimit.Limit{ratelimit.PerSecond(10), ratelimit.PerMinute(100)}
	fb, err := local.NewMulti([]ratelimit.Limit{ratelimit.PerSecond(2), ratelimit.PerMinute(50)}, local.WithAlgorithm(ratelimit.FixedWindow))
	require.NoError(t, err)
	mk := func(mode ratelimit.FailureMode) *global.Multi {
		return newMulti(t, c, limits, []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.FixedWindow},
			global.WithFailureMode(mode), global.WithFallback(fb), global.WithTimeout(50*time.Millisecond), global.WithBreaker(1, time.Hour))
	}
	open, closed, loc := mk(ratelimit.FailOpen), mk(ratelimit.FailClosed), mk(ratelimit.FailLocal)
	ctx := context.Background()
	require.NoError(t, srv.Freeze())
	defer srv.Thaw()
	for _, tc := range []struct {
		m       *global.Multi
		allowed int
	}{{open, 5}, {closed, 0}, {loc, 2}} {
		allowed := 0
		for i := 0; i < 5; i++ {
			d, err := tc.m.Allow(ctx, "k")
			require.NoError(t, err)
			require.Len(t, d.Limits(), 2)
			if d.Allowed {
				allowed++
			} else {
				require.Positive(t, d.RetryAfter)
			}
		}
		require.Equal(t, tc.allowed, allowed)
	}
}

// publicOf returns d without its per-limit states: what a Limiter of one
// limit decides.
func publicOf(d ratelimit.Decision) ratelimit.Decision {
	return ratelimit.Decision{Allowed: d.Allowed, Limit: d.Limit, Algorithm: d.Algorithm,
		Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
}
