package service

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/script"
	"github.com/hybridlimit/ratelimit/local"
)

// RedisOptions configure the Redis backend. Client is required; the zero
// value of every other field is its default.
type RedisOptions struct {
	// Client is the Redis client of every limiter (standalone, Sentinel or
	// Cluster). The caller closes it after the backend.
	Client redis.UniversalClient
	// Addrs are the addresses Client was made with; when Redis does not
	// answer, Ready and the startup check dial them to report why (a
	// refused connection, an unknown host) rather than a bare timeout.
	Addrs []string
	// Prefix starts the backend's own Redis keys; default DefaultPrefix.
	Prefix string
	// Timeout bounds every wait on Redis of a decision (default
	// DefaultTimeout).
	Timeout time.Duration
	// SyncInterval is the hybrid limiters' sync interval (0: the library's).
	SyncInterval time.Duration
	// Instances fixes the fleet size; 0 learns it from heartbeats (the
	// hybrid limiters' own, and the backend's, see HealthInterval). Exact
	// rules with failure mode local admit Rate / fleet size per window
	// while Redis is unreachable (the fleet size assumed while never
	// learned: 16, as the hybrid limiters assume).
	Instances int
	// MaxKeys bounds the keys each hybrid limiter tracks (0: the library's).
	MaxKeys int
	// HealthInterval is how often the backend heartbeats in Redis (default
	// 1s): it registers this process in the fleet registry (a sorted set
	// under Prefix) and learns the fleet's size. Being a write, the
	// heartbeat also tells whether Redis serves the limiters, all of whose
	// calls write: a Redis out of memory (maxmemory with noeviction),
	// read-only or unable to persist answers a PING but refuses it; the
	// backend then reports every limiter degraded and itself not ready.
	HealthInterval time.Duration
	// EnvoyExpirationJitter adds up to that many seconds to the expiry of
	// the keys of LayoutEnvoy limiters (envoyproxy/ratelimit's
	// EXPIRATION_JITTER_MAX_SECONDS); 0: none.
	EnvoyExpirationJitter int64
	// Logger receives the backend's logs (default slog.Default()).
	Logger *slog.Logger
}

// DefaultHealthInterval is the default RedisOptions.HealthInterval.
const DefaultHealthInterval = time.Second

// unknownFleet is the fleet size assumed before any heartbeat told it,
// as the hybrid limiter assumes: taking it for one would let a fleet of N
// admit N times the limit while Redis is away.
const unknownFleet = 16

// redisBackend counts with the hybrid limiters (modes strict and
// optimistic) and the global ones (mode exact) of the library.
type redisBackend struct {
	o   RedisOptions
	log *slog.Logger
	id  string

	fleet  atomic.Int64             // fleet size learned from heartbeats; 0 while never learned
	health atomic.Pointer[healthAt] // the last heartbeat's outcome

	mu        sync.Mutex
	fallbacks map[*fleetFallback]bool // exact rules' local failure modes, sized by the fleet

	stop, done chan struct{}
	closeOnce  sync.Once
}

// healthAt is the outcome of one heartbeat.
type healthAt struct {
	err error // nil: Redis took the write
	at  time.Time
}

// NewRedisBackend returns the Redis backend. It heartbeats once before it
// returns (within 4 timeouts, at least 1s), and logs why Redis does not
// serve when it does not: decisions then follow the rules' failure modes
// until it does. Then it heartbeats every HealthInterval until Close.
func NewRedisBackend(o RedisOptions) (Backend, error) {
	if o.Client == nil {
		return nil, errors.New("service: a Redis client is required")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = DefaultHealthInterval
	}
	if o.Instances < 0 || o.MaxKeys < 0 || o.SyncInterval < 0 || o.EnvoyExpirationJitter < 0 {
		return nil, errors.New("service: Instances, MaxKeys, SyncInterval and EnvoyExpirationJitter must not be negative")
	}
	var id [9]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	b := &redisBackend{o: o, log: o.Logger, id: base64.RawURLEncoding.EncodeToString(id[:]),
		fallbacks: map[*fleetFallback]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	switch err := b.heartbeat(context.Background()); {
	case refusal(err):
		b.log.Warn("redis refuses writes at startup: decisions follow the rules' failure modes until it takes them",
			"redis", strings.Join(o.Addrs, ","), "error", err.Error())
	case err != nil:
		b.log.Warn("redis does not answer at startup: decisions follow the rules' failure modes until it does",
			"redis", strings.Join(o.Addrs, ","), "error", b.explain(context.Background(), err).Error())
	}
	go b.loop()
	return b, nil
}

// loop heartbeats every HealthInterval until Close, logging each change
// between serving and not.
func (b *redisBackend) loop() {
	defer close(b.done)
	t := time.NewTicker(b.o.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.heartbeat(context.Background())
		}
	}
}

// heartbeat registers this process in the fleet registry, learns the
// fleet's size, and notes whether Redis took the write.
func (b *redisBackend) heartbeat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.callTimeout())
	defer cancel()
	live := 3 * b.o.HealthInterval.Milliseconds()
	n, err := script.Instances.Run(ctx, b.o.Client, []string{b.fleetKey()}, b.id, live, "1").Int64()
	b.note(err)
	if err == nil && n > 0 && b.fleet.Swap(n) != n {
		b.resize()
	}
	return err
}

// fleetSize is the number of processes the local failure mode of an exact
// rule shares a limit among: Instances when given, else the size learned
// from heartbeats, unknownFleet while never learned.
func (b *redisBackend) fleetSize() int64 {
	if b.o.Instances > 0 {
		return int64(b.o.Instances)
	}
	if n := b.fleet.Load(); n > 0 {
		return n
	}
	return unknownFleet
}

// resize sizes every exact rule's local failure mode to the fleet. It
// runs after a heartbeat that reached Redis, when the failure modes are
// (nearly always) not deciding: an outage keeps the budget of the last
// size known.
func (b *redisBackend) resize() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for f := range b.fallbacks {
		if err := f.resize(b.fleetSize()); err != nil {
			b.log.Warn("resizing a local failure mode", "error", err.Error())
		}
	}
}

// note records the outcome of a write (a heartbeat, or a limiter's call
// Redis refused), logging each change between serving and not: once when
// Redis starts refusing writes or stops answering, once when it serves
// again.
func (b *redisBackend) note(err error) {
	prev := b.health.Swap(&healthAt{err: err, at: time.Now()})
	if prev == nil { // the first heartbeat: NewRedisBackend says it
		return
	}
	switch {
	case refusal(err) && !refusal(prev.err):
		b.log.Warn("redis refuses writes: every limiter decides by its failure mode until it takes them again", "error", err.Error())
	case err != nil && !refusal(err) && prev.err == nil:
		b.log.Warn("redis does not answer the heartbeat", "error", b.explain(context.Background(), err).Error())
	case err == nil && prev.err != nil:
		b.log.Info("redis serves again")
	}
}

func (b *redisBackend) fleetKey() string { return script.InstancesKey(b.o.Prefix + ":fleet") }

// refusing reports whether Redis refused the last write noted, with an
// error of its own (OOM, READONLY, MISCONF, NOAUTH...): it answers, but
// serves no limiter, every one of whose calls writes. A heartbeat that
// timed out does not count: a slow Redis is the breakers' business.
func (b *redisBackend) refusing() bool {
	h := b.health.Load()
	return h != nil && refusal(h.err)
}

// refusal reports whether err is Redis refusing a write: out of memory,
// read-only, unable to persist, or not allowed.
func refusal(err error) bool {
	if !isRedisError(err) {
		return false
	}
	var re redis.Error
	errors.As(err, &re)
	msg := re.Error()
	for _, p := range []string{"OOM ", "READONLY ", "MISCONF ", "NOAUTH ", "NOPERM ", "WRONGPASS ", "MASTERDOWN "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func isRedisError(err error) bool {
	var re redis.Error
	return err != nil && errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// degraded adds to a limiter's own breaker state what the heartbeat knows:
// a Redis that refuses writes serves no limiter.
func (b *redisBackend) degraded(own bool) bool { return own || b.refusing() }

// callTimeout bounds a call of the backend's own: as long as a hybrid
// limiter's calls.
func (b *redisBackend) callTimeout() time.Duration { return max(time.Second, 4*b.o.Timeout) }

// Ready returns nil when Redis answers a PING and takes the heartbeat's
// write within the timeout (at least 250ms); else why not: the dial error
// when Redis cannot be reached, Redis's own error when it refuses writes.
func (b *redisBackend) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(b.o.Timeout, 250*time.Millisecond))
	defer cancel()
	if err := b.o.Client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis unreachable: %w", b.explain(ctx, err))
	}
	if err := b.heartbeat(ctx); err != nil {
		if refusal(err) {
			return fmt.Errorf("redis refuses writes: %w", err)
		}
		if isRedisError(err) {
			return fmt.Errorf("redis fails the heartbeat: %w", err)
		}
		return fmt.Errorf("redis unreachable: %w", b.explain(ctx, err))
	}
	return nil
}

// explain replaces a timeout or a network error, which say little
// (go-redis retries a refused dial until the deadline), by the error of
// dialling the Redis addresses, when one fails.
func (b *redisBackend) explain(ctx context.Context, err error) error {
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.As(err, &ne) {
		return err
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(b.o.Timeout, 250*time.Millisecond))
	defer cancel()
	var d net.Dialer
	for _, a := range b.o.Addrs {
		c, derr := d.DialContext(dctx, "tcp", a)
		if derr != nil {
			return derr
		}
		c.Close()
	}
	return err
}

// Close stops the heartbeats and leaves the fleet registry (the limiters
// are closed by the Service).
func (b *redisBackend) Close() error {
	b.closeOnce.Do(func() {
		close(b.stop)
		<-b.done
		ctx, cancel := context.WithTimeout(context.Background(), b.callTimeout())
		defer cancel()
		script.Instances.Run(ctx, b.o.Client, []string{b.fleetKey()}, b.id, 3*b.o.HealthInterval.Milliseconds(), "0")
	})
	return nil
}

func (b *redisBackend) NewLimiter(spec Spec) (Limiter, error) {
	switch {
	case spec.Layout == LayoutEnvoy:
		if spec.Mode != config.Exact {
			return nil, fmt.Errorf("envoyproxy/ratelimit's keys are counted in mode exact, not %s", spec.Mode)
		}
		return b.newEnvoy(spec)
	case spec.Mode == config.Exact:
		return b.newExact(spec)
	}
	mode := hybrid.Strict
	if spec.Mode == config.Optimistic {
		mode = hybrid.Optimistic
	}
	name := spec.Name
	opts := []hybrid.Option{
		hybrid.WithMode(mode), hybrid.WithAlgorithms(spec.Algorithms...), hybrid.WithPrefix(spec.Prefix),
		hybrid.WithTimeout(b.o.Timeout), hybrid.WithFailureMode(spec.FailureMode),
		hybrid.WithObserver(func(ev hybrid.Event) { b.observe(name, spec.FailureMode, ev) }),
	}
	if b.o.SyncInterval > 0 {
		opts = append(opts, hybrid.WithSyncInterval(b.o.SyncInterval))
	}
	if b.o.MaxKeys > 0 {
		opts = append(opts, hybrid.WithMaxKeys(b.o.MaxKeys))
	}
	if b.o.Instances > 0 {
		opts = append(opts, hybrid.WithInstances(b.o.Instances))
	}
	if len(spec.Limits) > 1 {
		m, err := hybrid.NewMulti(b.o.Client, spec.Limits, opts...)
		if err != nil {
			return nil, err
		}
		return &hybridMulti{Multi: m, b: b}, nil
	}
	h, err := hybrid.New(b.o.Client, spec.Limits[0], opts...)
	if err != nil {
		return nil, err
	}
	return &hybridLimiter{Limiter: h, b: b}, nil
}

// newExact makes the global limiter of an exact rule. Its local failure
// mode admits the rule's limits shared by the fleet (see fleetSize), and
// each window limit's last-known remainder shared by it.
func (b *redisBackend) newExact(spec Spec) (Limiter, error) {
	opts := []global.Option{
		global.WithAlgorithms(spec.Algorithms...), global.WithPrefix(spec.Prefix),
		global.WithFailureMode(spec.FailureMode), global.WithTimeout(b.o.Timeout),
	}
	var fb *fleetFallback
	if spec.FailureMode == ratelimit.FailLocal {
		var err error
		if fb, err = b.newFleetFallback(spec); err != nil {
			return nil, err
		}
		if len(spec.Limits) > 1 {
			opts = append(opts, global.WithFallback(&fleetFallbackMulti{fb}))
		} else {
			opts = append(opts, global.WithFallback(fb))
		}
		// Each window's last-known remainder shared by the fleet, and what
		// was admitted locally charged when Redis is back, for one limit
		// as for several (see docs/failure-modes.md, The global limiter).
		opts = append(opts, global.WithInstancesFunc(func() int { return int(b.fleetSize()) }))
	}
	var (
		lim Limiter
		err error
	)
	if len(spec.Limits) > 1 {
		var m *global.Multi
		if m, err = global.NewMulti(b.o.Client, spec.Limits, opts...); err == nil {
			lim = &globalMulti{Multi: m, fb: fb, b: b}
		}
	} else {
		var g *global.Limiter
		if g, err = global.New(b.o.Client, spec.Limits[0], opts...); err == nil {
			lim = &globalLimiter{Limiter: g, fb: fb, b: b}
		}
	}
	if err != nil {
		b.forget(fb)
		return nil, err
	}
	return lim, nil
}

// newFleetFallback makes the local failure mode of an exact limiter of
// spec, sized by the fleet and resized with it until forget.
func (b *redisBackend) newFleetFallback(spec Spec) (*fleetFallback, error) {
	fb := &fleetFallback{limits: spec.Limits, algs: spec.Algorithms}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := fb.resize(b.fleetSize()); err != nil {
		return nil, fmt.Errorf("local fallback: %w", err)
	}
	b.fallbacks[fb] = true
	return fb, nil
}

// forget stops resizing fb (nil: none), whose limiter is closed.
func (b *redisBackend) forget(fb *fleetFallback) {
	if fb != nil {
		b.mu.Lock()
		delete(b.fallbacks, fb)
		b.mu.Unlock()
	}
}

func (b *redisBackend) observe(name string, failure ratelimit.FailureMode, ev hybrid.Event) {
	if refusal(ev.Err) && !b.refusing() {
		// Known before the next heartbeat: the probe that closes the
		// hybrid's breaker writes nothing, and Redis answers it.
		b.note(ev.Err)
	}
	switch ev.Kind {
	case hybrid.EventDegraded:
		lvl := slog.LevelWarn
		if b.refusing() { // said once already, by the heartbeat
			lvl = slog.LevelDebug
		}
		b.log.Log(context.Background(), lvl, "redis unreachable: deciding by the failure mode", "limiter", name, "failure_mode", failure.String())
	case hybrid.EventRecovered:
		if b.refusing() {
			// The hybrid's breaker closes on a probe that writes nothing,
			// which a Redis refusing writes answers.
			b.log.Debug("circuit breaker closed by a probe, but redis still refuses writes", "limiter", name)
			return
		}
		b.log.Info("redis reachable again", "limiter", name)
	case hybrid.EventFlushError:
		lvl := slog.LevelWarn
		if b.refusing() {
			lvl = slog.LevelDebug
		}
		b.log.Log(context.Background(), lvl, "background sync failed; it will be retried", "limiter", name, "error", errString(ev.Err))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// hybridLimiter is a hybrid limiter of one limit.
type hybridLimiter struct {
	*hybrid.Limiter
	b *redisBackend
}

func (h *hybridLimiter) Stats() LimiterStats {
	st := h.Limiter.Stats()
	return LimiterStats{Fallback: st.Fallback, LocalDecisions: st.LocalDecisions, Leases: st.Leases,
		Tracked: true, KeysTracked: st.KeysTracked, Instances: st.Instances,
		DegradedKnown: true, Degraded: h.b.degraded(st.Degraded)}
}

// hybridMulti is a hybrid limiter of several limits. Its counters are
// summed over the limits (a decision on three limits counts three), its
// keys are the most any limit tracks, its instances what the first
// learned.
type hybridMulti struct {
	*hybrid.Multi
	b *redisBackend
}

func (h *hybridMulti) Stats() LimiterStats {
	var st LimiterStats
	for i, x := range h.Multi.Stats() {
		st.Fallback += x.Fallback
		st.LocalDecisions += x.LocalDecisions
		st.Leases += x.Leases
		st.KeysTracked = max(st.KeysTracked, x.KeysTracked)
		st.Degraded = st.Degraded || x.Degraded
		if i == 0 {
			st.Instances = x.Instances
		}
	}
	st.Tracked, st.DegradedKnown, st.Degraded = true, true, h.b.degraded(st.Degraded)
	return st
}

// globalLimiter is a global limiter of one limit (mode exact).
type globalLimiter struct {
	*global.Limiter
	fb *fleetFallback // nil unless the failure mode is local
	b  *redisBackend
}

func (g *globalLimiter) Stats() LimiterStats {
	st := LimiterStats{Fallback: g.FallbackDecisions(), DegradedKnown: true, Degraded: g.b.degraded(g.Degraded())}
	if g.fb != nil {
		st.Instances = int(g.fb.fleet())
	}
	return st
}

func (g *globalLimiter) Flush(context.Context) error { return nil }
func (g *globalLimiter) Close() error                { g.b.forget(g.fb); return nil }

// globalMulti is a global limiter of several limits. global.Multi reports
// neither its fallback decisions nor its breaker: those of the local
// failure mode are counted here, the others' are not, and it is known
// degraded only when Redis refuses writes.
type globalMulti struct {
	*global.Multi
	fb *fleetFallback // nil unless the failure mode is local
	b  *redisBackend
}

func (g *globalMulti) Stats() LimiterStats {
	var st LimiterStats
	if g.fb != nil {
		st.Fallback, st.Instances = g.fb.n.Load(), int(g.fb.fleet())
	}
	if g.b.refusing() {
		st.DegradedKnown, st.Degraded = true, true
	}
	return st
}

func (g *globalMulti) Flush(context.Context) error { return nil }
func (g *globalMulti) Close() error                { g.b.forget(g.fb); return nil }

// fleetFallback is the local failure mode of an exact rule: a local
// limiter of the rule's limits, each Rate divided by the fleet's size (at
// least 1), counting its decisions (global.Multi does not count them). It
// is remade, empty, when the fleet's size changes.
type fleetFallback struct {
	limits []ratelimit.Limit
	algs   []ratelimit.Algorithm
	cur    atomic.Pointer[sizedFallback]
	n      atomic.Uint64 // decisions taken
}

type sizedFallback struct {
	fleet int64
	one   *local.Limiter // one limit
	multi *local.Multi   // several
}

// fleet is the fleet size the failure mode is sized for.
func (f *fleetFallback) fleet() int64 { return f.cur.Load().fleet }

// resize makes the local limiter for a fleet of n, unless it has it.
func (f *fleetFallback) resize(n int64) error {
	if c := f.cur.Load(); c != nil && c.fleet == n {
		return nil
	}
	shares := make([]ratelimit.Limit, len(f.limits))
	for i, l := range f.limits {
		shares[i] = l
		shares[i].Rate = max(1, int(int64(l.Rate)/max(1, n)))
	}
	s := &sizedFallback{fleet: n}
	var err error
	if len(shares) > 1 {
		s.multi, err = local.NewMulti(shares, local.WithAlgorithms(f.algs...))
	} else {
		s.one, err = local.New(shares[0], local.WithAlgorithm(f.algs[0]))
	}
	if err != nil {
		return err
	}
	f.cur.Store(s)
	return nil
}

func (f *fleetFallback) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	f.n.Add(1)
	c := f.cur.Load()
	if c.multi != nil {
		return c.multi.AllowN(ctx, key, n)
	}
	return c.one.AllowN(ctx, key, n)
}

// Reserve reserves in the share, counting a decision.
func (f *fleetFallback) Reserve(ctx context.Context, key string, estimate int) (*ratelimit.Reservation, error) {
	f.n.Add(1)
	c := f.cur.Load()
	if c.multi != nil {
		return c.multi.Reserve(ctx, key, estimate)
	}
	return c.one.Reserve(ctx, key, estimate)
}

// fleetFallbackMulti is fleetFallback as the ratelimit.MultiLimiter a
// global.Multi's failure mode asks.
type fleetFallbackMulti struct{ *fleetFallback }

func (f *fleetFallbackMulti) AllowNInto(ctx context.Context, key string, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	f.n.Add(1)
	return f.cur.Load().multi.AllowNInto(ctx, key, n, states)
}

func (f *fleetFallbackMulti) Limits() []ratelimit.Limit { return f.cur.Load().multi.Limits() }
func (f *fleetFallbackMulti) Algorithms() []ratelimit.Algorithm {
	return f.cur.Load().multi.Algorithms()
}
