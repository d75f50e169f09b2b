package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
)

// Defaults of Options.
const (
	DefaultPrefix       = "ratelimitd"
	DefaultTimeout      = hybrid.DefaultTimeout // 500ms: 100ms denied under load (docs/failure-modes.md)
	DefaultMaxOverrides = 64
	// DefaultMaxDescriptors bounds the descriptors of one call, and
	// DefaultMaxEntries the entries of one descriptor (see Options).
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 16
)

// Options configure a Service. Client or Backend is required; the zero
// value of every other field is its default.
type Options struct {
	// Client is the Redis client every limiter uses (standalone, Sentinel or
	// Cluster), through the Redis backend (NewRedisBackend) the Service
	// makes when Backend is nil. The Service adds a hook to it that counts
	// round trips; the caller closes it after Close.
	Client redis.UniversalClient
	// RedisAddrs are the addresses Client was made with: when Redis cannot
	// be reached, Ready says why (a refused dial, an unknown host).
	RedisAddrs []string
	// Backend, when not nil, makes the limiters instead of the Redis
	// backend (Client, Timeout, SyncInterval, Instances and MaxKeys then
	// do not apply to them). The Service closes it in Close.
	Backend Backend
	// Clock is the time the service reads of its own (the reset of a
	// descriptor denied without counting); default time.Now. A test gives
	// it the memory backend's clock.
	Clock func() time.Time
	// Prefix starts every Redis key (default "ratelimitd"); it must not hold
	// '{' or '}'.
	Prefix string
	// Timeout bounds every wait on Redis of a decision, exact rules'
	// included (default DefaultTimeout, the hybrid limiter's 500ms).
	Timeout time.Duration
	// SyncInterval is the hybrid limiters' sync interval (0: the library's
	// default).
	SyncInterval time.Duration
	// Instances fixes the fleet size; 0 learns it from heartbeats. Exact
	// rules with failure mode local admit Rate / fleet size per window while
	// Redis is unreachable (see RedisOptions.Instances).
	Instances int
	// MaxKeys bounds the keys each hybrid limiter tracks (0: the library's
	// default).
	MaxKeys int
	// MaxOverrides bounds the distinct limits requests may set with a
	// descriptor's limit override (default 64).
	MaxOverrides int
	// MaxRuleLabels bounds the rule labels requests make in the metrics
	// (limit overrides, detailed_metric, value_to_metric): default
	// DefaultMaxRuleLabels; see OtherLabel.
	MaxRuleLabels int
	// MaxDescriptors bounds the descriptors of one call, and MaxEntries
	// the entries of one descriptor (defaults 64 and 16): a call over
	// either is refused with InvalidArgument before anything is counted,
	// so the work and the goroutines of one call are bounded.
	MaxDescriptors, MaxEntries int
	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset to each response, for the descriptor closest to its
	// limit (as envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED).
	ResponseHeaders bool
	// ShadowMode answers OK whatever the decisions (envoyproxy/ratelimit's
	// global SHADOW_MODE): everything is counted and measured, nothing is
	// denied. ratelimit_shadow_overrides_total counts the overridden answers.
	ShadowMode bool
	// Defaults are the mode, algorithm and failure mode of limit overrides
	// sent in requests (those of config rules come from the Config).
	Defaults config.Defaults
	// Compat holds the settings of envoyproxy/ratelimit's behaviours a
	// migrating deployment may ask for (see Compat).
	Compat Compat
	// Logger receives the service's logs (default: slog.Default()).
	Logger *slog.Logger
}

// Service answers ShouldRateLimit. Make it with New, give it rules with
// Apply, and Close it to give every lease back.
type Service struct {
	pb.UnimplementedRateLimitServiceServer

	opts      Options
	log       *slog.Logger
	backend   Backend
	now       func() time.Time
	snap      atomic.Pointer[snapshot]
	sent      rtcount.Hook // what the service's client sent Redis
	m         *metrics
	overrides sync.Map // overrideKey -> *override

	cuts       atomic.Uint64 // items a call's deadline cut short (see cut)
	shut       atomic.Bool   // Close has begun: decisions are refused
	stop       chan struct{} // closed by Close: retirements stop waiting
	mu         sync.Mutex    // guards the fields below; never held by a decision
	pool       map[signature]*entry
	closing    map[*entry]bool
	retired    retired
	nOverride  int
	closed     bool
	lastRetire chan struct{}  // closed when the last reload's retirement is done
	bg         sync.WaitGroup // retirements and flushes after a reload
}

// drainBound bounds the wait for the decisions in progress on a replaced
// snapshot (each waits on Redis one timeout at most).
const drainBound = 30 * time.Second

// snapshot is the rules in force and the limiters they count in. It never
// changes once published.
type snapshot struct {
	cfg      *config.Config
	rules    []ruleState       // indexed by config.Rule.ID
	static   map[labelKey]bool // the rule labels of the configuration (each rule's path)
	inflight inflight
}

type ruleState struct {
	rule   *config.Rule
	ent    *entry                            // nil: unlimited, or requests_per_unit 0
	limit  *pb.RateLimitResponse_RateLimit   // current_limit of every status; shared, never modified
	limits []*pb.RateLimitResponse_RateLimit // for a rule of several limits, each one's (limit is the first's)
	ctr    [nResults]prometheus.Counter      // decisions by result, under the rule's static label
	hits   prometheus.Counter
}

// limitFor returns the current_limit of a status of decision d: for a rule
// of several limits, that of the limit d describes (the tightest), found
// by its algorithm and period, which are distinct per rule. The Rate of d
// may be a failure mode's share, so it is not compared.
func (rs *ruleState) limitFor(d ratelimit.Decision) *pb.RateLimitResponse_RateLimit {
	for i, l := range rs.rule.Limits {
		if l.Algorithm == d.Algorithm && l.Unit.Duration() == d.Limit.Period {
			return rs.limits[i]
		}
	}
	return rs.limit
}

// New returns a Service with no rules: it answers Unavailable until Apply.
func New(opts Options) (*Service, error) {
	if opts.Client == nil && opts.Backend == nil {
		return nil, errors.New("service: a Redis client is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("service: the prefix %q must not hold '{' or '}'", opts.Prefix)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxOverrides <= 0 {
		opts.MaxOverrides = DefaultMaxOverrides
	}
	if opts.MaxRuleLabels <= 0 {
		opts.MaxRuleLabels = DefaultMaxRuleLabels
	}
	if opts.MaxDescriptors <= 0 {
		opts.MaxDescriptors = DefaultMaxDescriptors
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.Instances < 0 || opts.MaxKeys < 0 || opts.SyncInterval < 0 {
		return nil, errors.New("service: Instances, MaxKeys and SyncInterval must not be negative")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := opts.Compat.init(); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	s := &Service{opts: opts, log: opts.Logger, now: opts.Clock, pool: map[signature]*entry{}, closing: map[*entry]bool{}, stop: make(chan struct{})}
	s.m = newMetrics(s)
	if opts.Client != nil {
		opts.Client.AddHook(&s.sent)
	}
	s.backend = opts.Backend
	if s.backend == nil {
		var err error
		s.backend, err = NewRedisBackend(RedisOptions{
			Client: opts.Client, Addrs: opts.RedisAddrs, Prefix: opts.Prefix, Timeout: opts.Timeout,
			SyncInterval: opts.SyncInterval, Instances: opts.Instances, MaxKeys: opts.MaxKeys,
			EnvoyExpirationJitter: opts.Compat.ExpirationJitterMaxSeconds, Logger: opts.Logger,
		})
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Registry returns the Prometheus registry of the service's metrics.
func (s *Service) Registry() *prometheus.Registry { return s.m.reg }

// RoundTrips returns the Redis round trips made on the service's client
// since New (a command or a pipeline each).
func (s *Service) RoundTrips() uint64 { return uint64(s.sent.RoundTrips()) }

// Loaded reports whether rules are in force.
func (s *Service) Loaded() bool { return s.snap.Load() != nil }

// Ready reports why the service cannot answer as it should, or nil: rules
// must be loaded and the backend must serve (for Redis: answer a PING and
// take a write within the timeout).
func (s *Service) Ready(ctx context.Context) error {
	if !s.Loaded() {
		return errors.New("no configuration loaded")
	}
	return s.backend.Ready(ctx)
}

// Apply puts cfg in force (see the package documentation). It fails, with
// the rules in force unchanged, only if a limiter cannot be made.
func (s *Service) Apply(cfg *config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ratelimit.ErrClosed
	}
	old := s.snap.Load()
	snap := &snapshot{cfg: cfg, rules: make([]ruleState, len(cfg.Rules)), static: make(map[labelKey]bool, len(cfg.Rules))}
	used := map[signature]bool{}
	var made []*entry
	for i, r := range cfg.Rules {
		rs := &snap.rules[i]
		rs.rule = r
		snap.static[labelKey{r.Domain, r.Path}] = true
		if !r.ValuesInLabel && !r.Unlimited { // unlimited rules are not measured
			for res := range nResults {
				rs.ctr[res] = s.m.decisions.WithLabelValues(r.Domain, r.Path, resultNames[res])
			}
			rs.hits = s.m.hits.WithLabelValues(r.Domain, r.Path)
		}
		if r.Unlimited {
			continue
		}
		rs.limit = &pb.RateLimitResponse_RateLimit{
			Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(r.Unit),
		}
		for i, l := range r.Limits {
			pl := rs.limit
			if i > 0 {
				pl = &pb.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(l.Unit)}
			}
			rs.limits = append(rs.limits, pl)
		}
		if r.RequestsPerUnit == 0 {
			continue
		}
		sig := signatureOf(r)
		e := s.pool[sig]
		if e == nil {
			var err error
			if e, err = s.newEntry(sig); err != nil {
				for _, m := range made { // no decision has seen them
					delete(s.pool, m.sig)
					s.closing[m] = true
					s.bg.Go(func() { s.closeEntry(m) })
				}
				return fmt.Errorf("%s:%d: %w", r.File, r.Line, err)
			}
			s.pool[sig] = e
			made = append(made, e)
		}
		used[sig] = true
		rs.ent = e
	}
	s.snap.Store(snap)
	s.m.rules.Set(float64(len(cfg.Rules)))

	var retire []*entry
	for sig, e := range s.pool {
		if !used[sig] && !e.pinned {
			delete(s.pool, sig)
			s.closing[e] = true
			retire = append(retire, e)
		}
	}
	if old != nil {
		s.afterReload(old, snap)
		s.retire(old, retire)
	}
	return nil
}

// retire closes the limiters no rule uses any more, once no decision in
// progress can reach them: every decision on old and on the snapshots
// before it (the previous retirement) has finished.
func (s *Service) retire(old *snapshot, ents []*entry) {
	prev, done := s.lastRetire, make(chan struct{})
	s.lastRetire = done
	s.bg.Go(func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		if !old.inflight.waitIdle(drainBound, s.stop) {
			s.log.Warn("decisions still in progress on replaced rules; closing their limiters anyway", "after", drainBound.String())
		}
		for _, e := range ents {
			s.closeEntry(e)
		}
	})
}

// afterReload flushes the limiters still in use that counted rules now gone
// (or counted elsewhere), and drops the metric series of rules gone.
func (s *Service) afterReload(old, cur *snapshot) {
	type placed struct {
		ident string
		ent   *entry
	}
	now := map[placed]bool{}
	labels := map[[2]string]bool{}
	for _, rs := range cur.rules {
		now[placed{rs.rule.Ident, rs.ent}] = true
		labels[[2]string{rs.rule.Domain, rs.rule.Path}] = true
	}
	flush := map[*entry]bool{}
	for _, rs := range old.rules {
		if rs.ent != nil && !now[placed{rs.rule.Ident, rs.ent}] && s.pool[rs.ent.sig] == rs.ent {
			flush[rs.ent] = true
		}
		if !labels[[2]string{rs.rule.Domain, rs.rule.Path}] {
			for _, res := range resultNames {
				s.m.decisions.DeleteLabelValues(rs.rule.Domain, rs.rule.Path, res)
			}
			s.m.hits.DeleteLabelValues(rs.rule.Domain, rs.rule.Path)
		}
	}
	for e := range flush {
		s.bg.Go(func() { s.flushEntry(e) })
	}
	idents := make(map[string]bool, len(cur.rules))
	for _, rs := range cur.rules {
		idents[rs.rule.Ident] = true
	}
	s.m.labels.reloaded(func(id string) bool { return idents[id] }, func(k labelKey) bool { return cur.static[k] })
}

// ReloadResult records the outcome of a configuration load in the metrics:
// err nil for a success.
func (s *Service) ReloadResult(err error) {
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		s.m.reloadOK.Set(0)
		return
	}
	s.m.reloads.WithLabelValues("success").Inc()
	s.m.reloadOK.Set(1)
	s.m.reloadAt.SetToCurrentTime()
}

// Close closes every limiter, giving their leases back, and waits for
// every goroutine the Service started. Decisions after Close fail with
// Unavailable. It returns the first error of a limiter's final flush.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.shut.Store(true)
	ents := make([]*entry, 0, len(s.pool))
	for _, e := range s.pool {
		ents = append(ents, e)
		s.closing[e] = true
	}
	s.pool = map[signature]*entry{}
	s.mu.Unlock()
	// Decisions that entered before shut was set finish first; later ones
	// see it and are refused.
	if snap := s.snap.Load(); snap != nil && !snap.inflight.waitIdle(drainBound, nil) {
		s.log.Warn("decisions still in progress at Close; closing the limiters anyway", "after", drainBound.String())
	}
	close(s.stop)
	s.bg.Wait()
	errs := make([]error, len(ents))
	var wg sync.WaitGroup
	for i, e := range ents {
		wg.Go(func() { errs[i] = s.closeEntry(e) })
	}
	wg.Wait()
	errs = append(errs, s.backend.Close())
	return errors.Join(errs...)
}
