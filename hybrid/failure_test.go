package hybrid_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
	"github.com/hybridlimit/ratelimit/internal/script"
)

const faultTimeout = 100 * time.Millisecond

// outcome of a load run: decisions, errors and the latency of every call.
type outcome struct {
	allowed, denied, errs int
	lat                   []time.Duration
}

func (o outcome) quantile(q float64) time.Duration {
	if len(o.lat) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), o.lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// load calls Allow on key from workers goroutines until stop is closed.
func load(h *hybrid.Limiter, key string, workers int, stop <-chan struct{}) outcome {
	var (
		mu  sync.Mutex
		out outcome
		wg  sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o outcome
			for {
				select {
				case <-stop:
					mu.Lock()
					out.allowed += o.allowed
					out.denied += o.denied
					out.errs += o.errs
					out.lat = append(out.lat, o.lat...)
					mu.Unlock()
					return
				default:
				}
				start := time.Now()
				d, err := h.Allow(context.Background(), key)
				o.lat = append(o.lat, time.Since(start))
				switch {
				case err != nil:
					o.errs++
				case d.Allowed:
					o.allowed++
				default:
					o.denied++
				}
				time.Sleep(time.Millisecond) // a busy service, not a spin loop
			}
		}()
	}
	<-stop
	wg.Wait()
	return out
}

func loadFor(h *hybrid.Limiter, key string, workers int, d time.Duration) outcome {
	stop := make(chan struct{})
	time.AfterFunc(d, func() { close(stop) })
	return load(h, key, workers, stop)
}

// loadThroughOpen runs load until the limiter's breaker has been open (or
// half-open) for d, or for at most limit in all. How soon the breaker
// opens depends on the client: a go-redis client with its default retries
// reports a refused connection only after about a second of backoff, and
// a call that gets no reply at all opens it at its deadline (a second at
// least), both later on a busy host; the failure mode is what is tested,
// for d once it rules.
func loadThroughOpen(h *hybrid.Limiter, key string, workers int, d, limit time.Duration) outcome {
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		end := time.Now().Add(limit)
		for time.Now().Before(end) && !h.Stats().Degraded {
			time.Sleep(5 * time.Millisecond)
		}
		if left := time.Until(end); left > 0 {
			time.Sleep(min(d, left))
		}
	}()
	return load(h, key, workers, stop)
}

// waitRecovered waits until the limiter's breaker is closed again; the
// syncer's background probe closes it without any decision.
func waitRecovered(t *testing.T, h *hybrid.Limiter) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for h.Stats().Degraded {
		require.True(t, time.Now().Before(deadline), "the limiter did not recover")
		time.Sleep(20 * time.Millisecond)
	}
}

type fault struct {
	name     string
	viaProxy bool
	keepData bool // the fault loses no Redis data
	answers  bool // Redis still answers, slowly: not an outage
	start    func(s *redistest.Server, p *faultproxy.Proxy)
	stop     func(t *testing.T, s *redistest.Server, p *faultproxy.Proxy)
}

var standaloneFaults = []fault{
	{name: "sigkill", start: func(s *redistest.Server, _ *faultproxy.Proxy) { s.Kill() },
		stop: func(t *testing.T, s *redistest.Server, _ *faultproxy.Proxy) { require.NoError(t, s.Restart()) }},
	{name: "sigstop", keepData: true, start: func(s *redistest.Server, _ *faultproxy.Proxy) { s.Freeze() },
		stop: func(t *testing.T, s *redistest.Server, _ *faultproxy.Proxy) { require.NoError(t, s.Thaw()) }},
	{name: "latency", viaProxy: true, keepData: true, answers: true,
		// each way: a round trip of twice the timeout, well within a call's deadline
		start: func(_ *redistest.Server, p *faultproxy.Proxy) { p.SetLatency(faultTimeout) },
		stop:  func(_ *testing.T, _ *redistest.Server, p *faultproxy.Proxy) { p.SetLatency(0) }},
	{name: "cut", viaProxy: true, keepData: true,
		start: func(_ *redistest.Server, p *faultproxy.Proxy) { p.Refuse(true) },
		stop:  func(_ *testing.T, _ *redistest.Server, p *faultproxy.Proxy) { p.Refuse(false) }},
}

// During each fault no decision waits longer than the timeout (give or take
// scheduling) and none errs. A Redis that answers slowly is not an outage:
// the breaker stays closed, no decision comes from the failure mode, and
// strict mode admits only what Redis granted. Redis killed, stopped or cut
// off opens the breaker, and then the decisions follow the failure mode;
// FailLocal admits at most the window's last-known remainder shared by the
// instances. After the fault, the counts in Redis are exact again and hold
// what the outage admitted.
func TestFaults(t *testing.T) {
	limit := ratelimit.Limit{Rate: 100, Period: 10 * time.Second}
	const instances = 2
	for _, f := range standaloneFaults {
		for _, mode := range []ratelimit.FailureMode{ratelimit.FailLocal, ratelimit.FailOpen, ratelimit.FailClosed} {
			t.Run(f.name+"/"+mode.String(), func(t *testing.T) {
				srv := redistest.Standalone(t)
				p, err := faultproxy.New(srv.Addr())
				require.NoError(t, err)
				defer p.Close()
				addr := srv.Addr()
				if f.viaProxy {
					addr = p.Addr()
				}
				c := redis.NewClient(&redis.Options{Addr: addr})
				defer c.Close()
				direct := srv.Client()
				defer direct.Close()
				prefix := uniq(t)
				idx := freshWindow(t, direct, limit.Period, 8*time.Second)
				h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithTimeout(faultTimeout),
					hybrid.WithSyncInterval(50*time.Millisecond), hybrid.WithBreaker(2, 200*time.Millisecond),
					hybrid.WithInstances(instances), hybrid.WithFailureMode(mode))
				require.NoError(t, err)
				defer h.Close()

				for i := 0; i < 10; i++ {
					d, err := h.Allow(context.Background(), "k")
					require.NoError(t, err)
					require.True(t, d.Allowed)
				}
				time.Sleep(150 * time.Millisecond) // the syncer's top-ups land
				count := redisCount(t, direct, prefix, "k", idx)
				held := count - 10 // strict: Redis counts every leased unit
				require.Positive(t, held)
				// FailLocal's budget: the window's remainder when Redis last
				// answered, shared by the instances.
				budget := min(limit.Rate/instances, (limit.Rate-count)/instances)

				before := h.Stats()
				f.start(srv, p)
				var during outcome
				if f.answers {
					during = loadFor(h, "k", 4, 1500*time.Millisecond)
				} else {
					during = loadThroughOpen(h, "k", 4, 500*time.Millisecond, 4*time.Second)
				}
				s := h.Stats()
				degraded := s.Degraded
				f.stop(t, srv, p)
				// A lease call that timed out may still be granted and arrive
				// late: that quota was counted in Redis and is the instance's
				// to serve, like the lease it held when the fault began.
				held += int(h.Stats().LeasedUnits - before.LeasedUnits)

				t.Logf("held %d, budget %d; during the fault: allowed %d denied %d, no reply %d, fallback %d; latency p99 %v max %v",
					held, budget, during.allowed, during.denied, s.NoReply-before.NoReply, s.Fallback-before.Fallback, during.quantile(0.99), during.quantile(1))
				require.Zero(t, during.errs, "no decision may return an error")
				require.Less(t, during.quantile(1), 3*faultTimeout, "a decision waited on Redis")
				if f.answers {
					require.False(t, degraded, "a slow reply is not an outage")
					require.Zero(t, s.Fallback-before.Fallback, "no decision from the failure mode while Redis answers")
					require.LessOrEqual(t, during.allowed, held, "strict admits only what Redis granted")
				} else {
					require.True(t, degraded, "the breaker must open during the fault")
					switch mode {
					case ratelimit.FailOpen:
						require.LessOrEqual(t, uint64(during.denied), s.NoReply-before.NoReply, "FailOpen denies only before the breaker opens")
					case ratelimit.FailClosed:
						require.LessOrEqual(t, during.allowed, held, "FailClosed allows only leases already held")
					case ratelimit.FailLocal:
						require.LessOrEqual(t, during.allowed, held+budget, "FailLocal allows its budget plus the lease it held")
						require.GreaterOrEqual(t, during.allowed, budget, "FailLocal serves its budget")
					}
				}

				waitRecovered(t, h)
				require.NoError(t, h.Flush(context.Background()))
				total := 10 + during.allowed
				got := redisCount(t, direct, prefix, "k", idx)
				if f.keepData {
					require.Equal(t, total, got, "Redis counts exactly what the instance admitted")
				} else {
					// The restart lost the window's counts (no persistence):
					// what the outage admitted on credit is back in them.
					fallbackAdmitted := max(0, during.allowed-held)
					require.GreaterOrEqual(t, got, fallbackAdmitted)
					require.LessOrEqual(t, got, total)
				}
			})
		}
	}
}

// With the breaker open a decision makes no Redis call at all. Before it
// opens (a Redis that accepts connections and never answers opens it once
// calls time out), decisions wait at most the timeout and are denied:
// strict mode cannot tell a slow Redis from a dead one until then.
func TestBreakerOpenNoRedisCall(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer c.Close()
	hook := &rtcount.Hook{}
	c.AddHook(hook)
	h, err := hybrid.New(c, ratelimit.PerSecond(100), hybrid.WithPrefix(uniq(t)), hybrid.WithTimeout(faultTimeout),
		hybrid.WithSyncInterval(time.Hour), hybrid.WithBreaker(1, time.Hour), hybrid.WithInstances(1),
		hybrid.WithHeartbeat(time.Hour)) // (a heartbeat is no decision's call: under load one fell in the count)
	require.NoError(t, err)
	p.Block(true)
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; !h.Stats().Degraded; i++ {
		require.True(t, time.Now().Before(deadline), "the breaker did not open")
		start := time.Now()
		d, err := h.Allow(context.Background(), "first")
		require.NoError(t, err)
		require.Less(t, time.Since(start), 3*faultTimeout)
		if d.Allowed {
			require.True(t, h.Stats().Degraded, "strict: admitted without Redis while the breaker was closed")
		} else {
			require.Positive(t, d.RetryAfter)
		}
	}
	before := hook.Commands()
	fallback := h.Stats().Fallback
	for i := 0; i < 200; i++ {
		d, err := h.Allow(context.Background(), fmt.Sprintf("key-%d", i))
		require.NoError(t, err)
		require.True(t, d.Allowed, "FailLocal: a window nothing was heard of has the whole share")
	}
	require.Equal(t, before, hook.Commands(), "a decision called Redis with the breaker open")
	require.EqualValues(t, 200, h.Stats().Fallback-fallback)
	p.Block(false)
	h.Close()
}

// A flush whose reply was lost after Redis applied it is counted once when
// it is sent again.
func TestLostReplyCountedOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	direct := srv.Client()
	defer direct.Close()
	limit := ratelimit.Limit{Rate: 1000, Period: 20 * time.Second}
	prefix := uniq(t)
	idx := freshWindow(t, direct, limit.Period, 10*time.Second)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithSyncInterval(time.Hour), hybrid.WithInstances(1),
		hybrid.WithTimeout(time.Second))
	require.NoError(t, err)
	defer h.Close()
	for i := 0; i < 30; i++ {
		d, err := h.Allow(context.Background(), "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	leased := redisCount(t, direct, prefix, "k", idx)
	require.Greater(t, leased, 30)

	// Lose the reply to the flush's script call (its SHA is in the request),
	// after Redis applied it. The lease was a plain increment, so the
	// script is loaded first: a NOSCRIPT reply lost instead would leave a
	// call that never ran in doubt.
	require.NoError(t, script.Lease.Load(context.Background(), direct).Err())
	p.DropReplyTo([]byte(script.Lease.Hash()))
	require.Error(t, h.Flush(context.Background()), "the reply was lost")
	require.Equal(t, 30, redisCount(t, direct, prefix, "k", idx), "Redis applied the refund")
	require.NoError(t, h.Flush(context.Background()))
	require.Equal(t, 30, redisCount(t, direct, prefix, "k", idx), "the retried refund must not apply twice")
	require.EqualValues(t, 1, p.Stats().RepliesDropped)
}

// A plain lease whose reply was lost after Redis applied it is counted
// once: its resend (through lease.lua) finds the record the increment
// wrote, gives the units back and leases anew, and in the end Redis counts
// exactly what the instance admitted.
func TestLostPlainLeaseCountedOnce(t *testing.T) {
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) { lostPlainLeaseCountedOnce(t, alg) })
	}
}

func lostPlainLeaseCountedOnce(t *testing.T, alg ratelimit.Algorithm) {
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	direct := srv.Client()
	defer direct.Close()
	limit := ratelimit.Limit{Rate: 1000, Period: 20 * time.Second}
	prefix := uniq(t)
	idx := freshWindow(t, direct, limit.Period, 10*time.Second)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithSyncInterval(time.Hour), hybrid.WithInstances(1),
		hybrid.WithTimeout(200*time.Millisecond), hybrid.WithAlgorithm(alg))
	require.NoError(t, err)
	defer h.Close()
	ctx := context.Background()
	count := func() int { return windowCount(t, direct, prefix, "k", alg, limit, idx) }
	// the key's first decision is counted exactly (a cold key); the
	// second leases, by a plain increment whose reply is lost
	d, err := h.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, 1, count())
	p.DropReplyTo([]byte("!\r\n")) // the record's value, nonce + "!"
	admitted := 1
	for i := 0; i < 30; i++ {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	require.EqualValues(t, 1, p.Stats().RepliesDropped, "the plain lease's reply was lost")
	require.Greater(t, admitted, 20, "the key leased again after the lost reply")
	require.NoError(t, h.Flush(ctx))
	require.Equal(t, admitted, count(), "Redis counts exactly what the instance admitted")
}

// A Redis out of memory (maxmemory with noeviction) is a failure like any
// other: fallback decisions, no error, no crash; scripts that only read or
// shrink keep working.
func TestOutOfMemory(t *testing.T) {
	srv := redistest.Standalone(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	junk := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		err := c.Set(ctx, fmt.Sprintf("junk%d", i), junk, time.Hour).Err()
		if err != nil {
			require.Contains(t, err.Error(), "OOM")
			break
		}
		require.Less(t, i, 10000)
	}
	limit := ratelimit.PerMinute(100)
	freshWindow(t, c, limit.Period, 10*time.Second) // TIME still answers: it writes nothing
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(uniq(t)), hybrid.WithTimeout(faultTimeout),
		hybrid.WithInstances(4))
	require.NoError(t, err)
	defer h.Close()
	allowed := 0
	for i := 0; i < 40; i++ {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		if d.Allowed {
			allowed++
		}
	}
	// Used memory hovers at the limit: a lease may still get through.
	s := h.Stats()
	t.Logf("allowed %d of 40; stats %+v", allowed, s)
	require.GreaterOrEqual(t, allowed, 25, "FailLocal: this instance's share, Rate / instances")
	require.LessOrEqual(t, allowed, 25+int(s.LeasedUnits), "FailLocal: the share plus what Redis granted")
	require.Positive(t, s.Fallback)
	// The breaker's probe writes: a Redis that refuses writes stays an
	// outage, the breaker does not flap closed on its answers.
	for i := 0; i < 10; i++ {
		time.Sleep(150 * time.Millisecond)
		require.True(t, h.Stats().Degraded, "sample %d: a Redis out of memory read as serving", i)
	}
	require.ErrorContains(t, h.Ping(ctx), "OOM")
}

// A Cluster master dies and its replica takes over: decisions go on without
// waiting or erring, and the limiter returns to Redis by itself.
func TestClusterFailover(t *testing.T) {
	cl := redistest.NewCluster(t)
	c := cl.Client()
	defer c.Close()
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 100, Period: time.Second}
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(uniq(t)), hybrid.WithTimeout(faultTimeout),
		hybrid.WithSyncInterval(50*time.Millisecond), hybrid.WithInstances(2), hybrid.WithBreaker(2, 200*time.Millisecond))
	require.NoError(t, err)
	defer h.Close()
	for i := 0; i < 5; i++ {
		_, err := h.Allow(ctx, "k")
		require.NoError(t, err)
	}
	// kill the master serving the key's slot
	base := "x:{k}:"
	master, err := c.MasterForKey(ctx, base)
	require.NoError(t, err)
	addr := master.Options().Addr
	node := cl.Node(addr)
	require.NotNil(t, node, addr)
	stop := make(chan struct{})
	var out outcome
	done := make(chan struct{})
	go func() { out = load(h, "k", 4, stop); close(done) }()
	node.Kill()
	// wait until the cluster is healthy again without the dead node
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.ReloadState(ctx) // the slot map the client cached still names the dead master
		m, err := c.MasterForKey(ctx, base)
		if err == nil && m.Options().Addr != addr && m.Ping(ctx).Err() == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "no replica took over")
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	close(stop)
	<-done
	t.Logf("failover: allowed %d denied %d errors %d; latency p99 %v max %v; stats %+v",
		out.allowed, out.denied, out.errs, out.quantile(0.99), out.quantile(1), h.Stats())
	require.Zero(t, out.errs)
	require.Less(t, out.quantile(1), 3*faultTimeout)
	waitRecovered(t, h)
	leases := h.Stats().Leases
	for i := 0; i < 5 && h.Stats().Leases == leases; i++ {
		time.Sleep(limit.Period)
		h.Allow(ctx, "k")
	}
	require.Greater(t, h.Stats().Leases, leases, "the limiter leases from the promoted replica")
}

// 20 SIGKILL/restart cycles under load: no error, no stuck instance, no
// goroutine left behind.
func TestKillRestartCycles(t *testing.T) {
	srv := redistest.Standalone(t)
	// The harness's wait for the restarted redis-server process is not the
	// limiter's.
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/hybridlimit/ratelimit/internal/redistest.(*Server).start.func1")}
	c := srv.Client()
	h, err := hybrid.New(c, ratelimit.Limit{Rate: 200, Period: 500 * time.Millisecond}, hybrid.WithPrefix(uniq(t)),
		hybrid.WithTimeout(faultTimeout), hybrid.WithSyncInterval(20*time.Millisecond),
		hybrid.WithBreaker(2, 100*time.Millisecond), hybrid.WithInstances(2))
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errs atomic.Int64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := h.Allow(context.Background(), fmt.Sprintf("k%d", (w+i)%6)); err != nil {
					errs.Add(1)
				}
				time.Sleep(500 * time.Microsecond)
			}
		}(w)
	}
	for cycle := 0; cycle < 20; cycle++ {
		time.Sleep(60 * time.Millisecond)
		srv.Kill()
		time.Sleep(60 * time.Millisecond)
		require.NoError(t, srv.Restart())
	}
	waitRecovered(t, h)
	leases := h.Stats().Leases
	deadline := time.Now().Add(10 * time.Second)
	for h.Stats().Leases == leases {
		require.True(t, time.Now().Before(deadline), "the instance is stuck: no lease after the last restart")
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	require.Zero(t, errs.Load())
	require.NoError(t, h.Close())
	require.NoError(t, c.Close())
	goleak.VerifyNone(t, opts...)
}

// The outage bound (docs/failure-modes.md): with FailLocal, in the window
// an outage begins, a fleet admits at most 2 x Rate - F, F what was left
// of the window in Redis when it went away (so Rate for an outage at a
// window's start); in a window that begins during the outage, at most
// Rate (each of the N instances admits Rate / N).
func TestOutageBound(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	direct := srv.Client()
	defer direct.Close()
	limit := ratelimit.Limit{Rate: 400, Period: 2 * time.Second}
	const instances = 4
	prefix := uniq(t)
	var ls []ratelimit.Limiter
	for i := 0; i < instances; i++ {
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithInstances(instances),
			hybrid.WithTimeout(faultTimeout), hybrid.WithBreaker(1, time.Hour), hybrid.WithSyncInterval(50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		ls = append(ls, h)
	}
	// Start in the first tenth of a window; use about half of it.
	idx, left := serverWindow(t, direct, limit.Period)
	if left < limit.Period*9/10 {
		time.Sleep(left + 5*time.Millisecond)
		idx, _ = serverWindow(t, direct, limit.Period)
	}
	tl := newTally(limit.Period)
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		l := ls[i%instances]
		start := time.Now()
		d, err := l.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		tl.add("k", d, 1, start)
	}
	time.Sleep(150 * time.Millisecond) // every instance reconciles
	free := limit.Rate - redisCount(t, direct, prefix, "k", idx)
	p.Refuse(true) // Redis is gone for every instance
	from := time.Now()
	_, _ = hammer(t, ls, []string{"k"}, 2, time.Until(time.UnixMicro((idx+2)*limit.Period.Microseconds()).Add(100*time.Millisecond)), tl)
	_, all := tl.windows("k", from, time.Now())
	t.Logf("window %d: free %d when Redis went away; admitted per window %v", idx, free, all)
	require.LessOrEqual(t, all[idx], 2*limit.Rate-free, "the window the outage began in")
	require.LessOrEqual(t, all[idx+1], limit.Rate, "a window that began during the outage")
	require.Greater(t, all[idx+1], limit.Rate*9/10, "FailLocal serves each instance's share")
	p.Refuse(false)
}

// A SlidingWindow refusal that a plain sliding call decides gives its
// units back in a plain HINCRBY of -n, which the decision waits for; when
// that give-back's reply is lost (after Redis applied it), the decision
// still returns a denial, at its deadline, and the units are not owed
// again: the window counts exactly what was admitted, before the key's
// debts are flushed and after.
func TestLostSlidingGiveBackCountedOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	p, err := faultproxy.New(srv.Addr())
	require.NoError(t, err)
	defer p.Close()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer c.Close()
	direct := srv.Client()
	defer direct.Close()
	ctx := context.Background()
	limit := ratelimit.Limit{Rate: 2, Period: 20 * time.Second}
	prefix := uniq(t)
	idx := freshWindow(t, direct, limit.Period, 10*time.Second)
	h, err := hybrid.New(c, limit, hybrid.WithPrefix(prefix), hybrid.WithSyncInterval(time.Hour), hybrid.WithInstances(1),
		hybrid.WithTimeout(300*time.Millisecond), hybrid.WithAlgorithm(ratelimit.SlidingWindow))
	require.NoError(t, err)
	defer h.Close()
	count := func() int { return windowCount(t, direct, prefix, "k", ratelimit.SlidingWindow, limit, idx) }
	// A decision of another key brings a sample of Redis time (lease.lua):
	// from then on a cold key's calls are plain.
	d, err := h.Allow(ctx, "warm")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	// Another instance filled k's window.
	base, err := script.KeyBase(prefix, "k")
	require.NoError(t, err)
	wk := script.WindowKey(base, script.Kind(ratelimit.SlidingWindow, limit), idx)
	require.NoError(t, direct.HSet(ctx, wk, "c", 2).Err())
	require.NoError(t, direct.Expire(ctx, wk, time.Minute).Err())
	require.NoError(t, direct.ConfigResetStat(ctx).Err())

	p.DropReplyTo([]byte("$2\r\n-1\r\n")) // the give-back's -1
	d, err = h.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.EqualValues(t, 1, p.Stats().RepliesDropped, "the give-back's reply was lost")
	stats := commandStats(t, direct)
	require.EqualValues(t, 2, stats["hincrby"][0], "the plain call's increment and its give-back")
	require.Zero(t, stats["evalsha"][0], "no script asked again")
	require.Equal(t, 2, count(), "the give-back applied: the window holds what was admitted")
	// (the lost reply may have opened the breaker: wait for it to close)
	require.Eventually(t, func() bool {
		_, err := h.Allow(ctx, "other")
		return err == nil && !h.Stats().Degraded
	}, 10*time.Second, 50*time.Millisecond)
	require.NoError(t, h.Flush(ctx))
	require.Equal(t, 2, count(), "the units were not given back twice")
}
