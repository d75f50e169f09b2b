package global_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// cmdCounter counts the commands a client sends, by name, pipelines
// included.
type cmdCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *cmdCounter) count(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		h.n[strings.ToLower(c.Name())]++
	}
}

func (h *cmdCounter) get(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[name]
}

// countCommands adds a cmdCounter to c.
func countCommands(c redis.UniversalClient) *cmdCounter {
	h := &cmdCounter{n: map[string]int{}}
	c.AddHook(h)
	return h
}

// roomyWindow waits, if need be, until the window of period in progress
// on c's server has at least 20s left, and returns its index.
func roomyWindow(t *testing.T, c redis.UniversalClient, period time.Duration) int64 {
	t.Helper()
	p := period.Microseconds()
	if left := p - serverMicros(t, c)%p; left < 20*sec {
		time.Sleep(time.Duration(left+100*ms) * time.Microsecond)
	}
	return serverMicros(t, c) / p
}

func (h *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.count(cmds...); return next(ctx, cmds) }
}

// A FixedWindow decision is a plain HINCRBY and PEXPIRE of the counter the
// hybrid's leases count in, once the Limiter knows Redis' time: exact
// counts, the over-limit units given back, and take.lua only for the first
// sample of Redis time, decisions near a window's edge, and the denials
// after a key-window's first.
func TestPlainFixedWindow(t *testing.T) {
	for _, dep := range []struct {
		name string
		srv  func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.Standalone(t).Client() }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.NewCluster(t).Client() }},
	} {
		t.Run(dep.name, func(t *testing.T) {
			c := dep.srv(t)
			defer c.Close()
			hook := countCommands(c)
			ctx := context.Background()
			limit := ratelimit.Limit{Rate: 10, Period: time.Minute}
			prefix := uniquePrefix(t)
			l, err := global.New(c, limit, global.WithPrefix(prefix))
			require.NoError(t, err)
			idx := roomyWindow(t, c, limit.Period)
			const keys, calls = 200, 13
			var wg sync.WaitGroup
			admitted := make([]int, keys)
			errs := make(chan error, 8)
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := w; k < keys; k += 8 {
						for i := 0; i < calls; i++ {
							d, err := l.Allow(ctx, "u"+strconv.Itoa(k))
							if err != nil {
								errs <- err
								return
							}
							if d.Allowed {
								admitted[k]++
							}
							if d.Remaining < 0 || d.Remaining > limit.Rate || d.ResetAfter <= 0 || d.ResetAfter > limit.Period {
								errs <- fmt.Errorf("decision %+v out of range", d)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			for k := 0; k < keys; k++ {
				require.Equal(t, limit.Rate, admitted[k], "key u%d", k)
				base, err := script.KeyBase(prefix, "u"+strconv.Itoa(k))
				require.NoError(t, err)
				wk := script.WindowKey(base, script.Kind(ratelimit.FixedWindow, limit), idx)
				require.Equal(t, "hash", c.Type(ctx, wk).Val(), wk)
				require.Equal(t, "10", c.HGet(ctx, wk, "c").Val(), "%s: the units over the limit given back", wk)
				ttl := c.PTTL(ctx, wk).Val()
				require.Greater(t, ttl, time.Second)
				require.LessOrEqual(t, ttl, limit.Period+time.Second)
			}
			// Per key: 10 admissions (HINCRBY, PEXPIRE), the first denial
			// (HINCRBY, PEXPIRE, HINCRBY back), then take.lua. take.lua
			// also for the first sample of Redis time and a few near the
			// window's edge (none in this window), so allow for 8 of them
			// at the start (one per worker), each an EVALSHA and, the
			// script not loaded yet, an EVAL.
			calls0 := keys * calls
			lua := hook.get("evalsha") + hook.get("eval")
			t.Logf("%d decisions: HINCRBY %d, PEXPIRE %d, EVALSHA %d", calls0, hook.get("hincrby"), hook.get("pexpire"), lua)
			require.LessOrEqual(t, lua, keys*(calls-limit.Rate-1)+2*8)
			require.GreaterOrEqual(t, hook.get("hincrby"), keys*(limit.Rate+2)-2*8)
			requireAllTTL(t, c)
		})
	}
}

// A counter global's other scripts wrote is a string: the plain increment
// meets WRONGTYPE, counts nothing, and take.lua decides in it, for that
// and the later decisions of the key-window.
func TestPlainStringCounter(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	hook := countCommands(c)
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 5, Period: time.Hour}
	prefix := uniquePrefix(t)
	l, err := global.New(c, limit, global.WithPrefix(prefix))
	require.NoError(t, err)
	idx := roomyWindow(t, c, limit.Period)
	_, err = l.Allow(ctx, "warm") // a sample of Redis time
	require.NoError(t, err)
	base, err := script.KeyBase(prefix, "k")
	require.NoError(t, err)
	wk := script.WindowKey(base, script.Kind(ratelimit.FixedWindow, limit), idx)
	require.NoError(t, c.Set(ctx, wk, "3", time.Hour+time.Minute).Err())
	before := hook.get("hincrby")
	for i, want := range []bool{true, true, false, false} {
		d, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, want, d.Allowed, "call %d", i)
	}
	require.Equal(t, "5", c.Get(ctx, wk).Val())
	require.Equal(t, 1, hook.get("hincrby")-before, "WRONGTYPE once, then take.lua")
}

// With WithClock every decision counts at the time given: plain from the
// first, its window that time's.
func TestPlainWithClock(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	hook := countCommands(c)
	ctx := context.Background()
	clk := &fakeClock{}
	clk.Set(t0 + 999_999)
	limit := ratelimit.Limit{Rate: 2, Period: time.Second}
	l := newLimiter(t, c, limit, global.WithClock(clk.Now))
	for i, w := range []want{{true, 1, 0, 1}, {true, 0, 0, 1}, {false, 0, 1, 1}} {
		d, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		requireDecision(t, w, d, "call "+strconv.Itoa(i))
	}
	clk.Add(time.Microsecond) // the next window
	d, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	requireDecision(t, want{true, 1, 0, 1_000_000}, d, "the next window")
	require.Equal(t, 5, hook.get("hincrby"), "4 increments and one give-back")
	require.Zero(t, hook.get("evalsha")+hook.get("eval"))
}
