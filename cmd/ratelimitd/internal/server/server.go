package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/service"
)

// Defaults of Options.
const (
	DefaultGRPCAddr      = ":8081"
	DefaultHTTPAddr      = ":8080"
	DefaultWatchInterval = 500 * time.Millisecond
	DefaultDrainTimeout  = 10 * time.Second
	DefaultDenyStatus    = http.StatusTooManyRequests
)

// Options configure a Server. ConfigPaths is required; the zero value of
// every other field is its default.
type Options struct {
	// ConfigPaths are the configuration files, or directories of *.yaml
	// and *.yml files.
	ConfigPaths []string
	// RedisAddrs are host:port of a standalone Redis, of Sentinels (with
	// RedisMaster) or of Cluster nodes (more than one address). None: an
	// embedded in-process Redis, for one process only.
	RedisAddrs                   []string
	RedisMaster                  string
	RedisCluster                 bool // one address is a Cluster's (REDIS_TYPE=CLUSTER with one URL)
	RedisUsername, RedisPassword string
	RedisPoolSize                int

	GRPCAddr string // default ":8081"
	HTTPAddr string // default ":8080"
	// MetricsAddr, when set, serves /metrics (and /healthz, /readyz) on
	// a listener of its own, and no longer on HTTPAddr.
	MetricsAddr string
	// GRPCReflection registers gRPC server reflection (for grpcurl).
	GRPCReflection bool

	// Defaults are the mode, algorithm and failure mode of rules that do not
	// name theirs (zero: strict, fixed_window, local).
	Defaults config.Defaults
	// StrictConfig refuses what envoyproxy/ratelimit loads with a silent
	// meaning (config.Options.Strict); MergeDomains lets several files
	// define one domain (MERGE_DOMAIN_CONFIG).
	StrictConfig, MergeDomains bool
	// Compat are the envoyproxy/ratelimit behaviours asked for.
	Compat service.Compat
	// TLS configures TLS to Redis and on the gRPC server (tls.go).
	TLS TLSOptions
	// XDS, with a server address, takes the configuration from an xDS
	// management server instead of files (xds.go).
	XDS XDSOptions

	Prefix          string        // Redis key prefix (default "ratelimitd")
	Timeout         time.Duration // bound of every wait on Redis (default 500ms, the hybrid's)
	SyncInterval    time.Duration // hybrid sync interval (0: the library's)
	Instances       int           // fleet size; 0: learned
	MaxKeys         int           // keys per hybrid limiter (0: the library's)
	ResponseHeaders bool          // add RateLimit-* headers to responses
	ShadowMode      bool          // answer OK whatever the decisions
	DenyStatus      int           // HTTP status of an OVER_LIMIT /v1/check (default 429)
	WatchInterval   time.Duration // how often the files are checked for changes (default 500ms; < 0: never)
	DrainTimeout    time.Duration // bound on finishing in-flight calls at shutdown (default 10s)
	Logger          *slog.Logger  // default slog.Default()
	Bounds                        // what a client, a call or a configuration may cost
}

// Server is one ratelimitd. Make it with New, then call Run once.
type Server struct {
	opts     Options
	log      *slog.Logger
	svc      *service.Service
	client   redis.UniversalClient
	mini     *miniredis.Miniredis
	grpcLis  net.Listener
	httpLis  net.Listener
	grpc     *grpc.Server
	health   *health.Server
	http     *http.Server
	draining atomic.Bool

	// the metrics listener and server; nil unless MetricsAddr is set
	metricsLis net.Listener
	metrics    *http.Server

	// owned by the watcher goroutine
	lastHash [32]byte
	lastErr  string
}

// New loads the configuration, connects to Redis and binds both listeners.
// A configuration error is returned as is (every *config.Error in it names
// the file, line and field). It is NewContext without a deadline.
func New(opts Options) (*Server, error) { return NewContext(context.Background(), opts) }

// NewContext is New, giving up (with ctx's error) when ctx ends while the
// configuration is read.
func NewContext(ctx context.Context, opts Options) (srv *Server, err error) {
	if len(opts.ConfigPaths) == 0 && opts.XDS.Server == "" {
		return nil, errors.New("no configuration: give --config FILE (or a directory)")
	}
	if opts.GRPCAddr == "" {
		opts.GRPCAddr = DefaultGRPCAddr
	}
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = DefaultHTTPAddr
	}
	if opts.WatchInterval == 0 {
		opts.WatchInterval = DefaultWatchInterval
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.DenyStatus == 0 {
		opts.DenyStatus = DefaultDenyStatus
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{opts: opts, log: opts.Logger}
	defer func() {
		if err != nil {
			s.closeAll()
		}
	}()
	cfg, srcs, err := s.initialConfig(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.connect(); err != nil {
		return nil, err
	}
	s.svc, err = service.New(service.Options{
		Client: s.client, RedisAddrs: opts.RedisAddrs, Prefix: opts.Prefix, Timeout: opts.Timeout, SyncInterval: opts.SyncInterval,
		Instances: opts.Instances, MaxKeys: opts.MaxKeys, ResponseHeaders: opts.ResponseHeaders, ShadowMode: opts.ShadowMode,
		MaxDescriptors: opts.MaxDescriptors, MaxEntries: opts.MaxEntries, MaxRuleLabels: opts.MaxRuleLabels,
		Defaults: opts.Defaults, Compat: opts.Compat, Logger: s.log,
	})
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		if err := s.svc.Apply(cfg); err != nil {
			return nil, err
		}
		s.svc.ReloadResult(nil)
		s.log.Info("configuration loaded", "domains", cfg.Domains(), "rules", len(cfg.Rules), "files", names(srcs))
	}
	if s.grpcLis, err = net.Listen("tcp", opts.GRPCAddr); err != nil {
		return nil, fmt.Errorf("grpc listener: %w", err)
	}
	if s.httpLis, err = net.Listen("tcp", opts.HTTPAddr); err != nil {
		return nil, fmt.Errorf("http listener: %w", err)
	}
	creds, err := opts.TLS.grpcCreds(s.log)
	if err != nil {
		return nil, err
	}
	s.grpc = grpc.NewServer(append(s.grpcOptions(), creds...)...)
	pb.RegisterRateLimitServiceServer(s.grpc, s.svc)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.reflect()
	s.http = &http.Server{Handler: s.routes(true), ReadHeaderTimeout: 10 * time.Second}
	if err := s.guard(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) connect() error {
	o := s.opts
	if len(o.RedisAddrs) == 0 {
		mr, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("embedded redis: %w", err)
		}
		s.mini = mr
		s.log.Warn("no --redis given: using an embedded in-process Redis; limits hold for this process only, not across a fleet",
			"addr", mr.Addr())
		o.RedisAddrs = []string{mr.Addr()}
	}
	tlsConf, err := o.TLS.redisTLS()
	if err != nil {
		return err
	}
	s.client = redis.NewUniversalClient(&redis.UniversalOptions{
		TLSConfig: tlsConf, IsClusterMode: o.RedisCluster,
		Addrs: o.RedisAddrs, MasterName: o.RedisMaster,
		Username: o.RedisUsername, Password: o.RedisPassword,
		PoolSize:              o.RedisPoolSize,
		ContextTimeoutEnabled: true, // the exact limiters' deadlines rely on it
	})
	return nil
}

// GRPCAddr returns the address the gRPC server listens on.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr returns the address the HTTP server listens on.
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// MetricsAddr returns the address of the metrics listener ("" when the
// metrics are served on the HTTP listener).
func (s *Server) MetricsAddr() string {
	if s.metricsLis == nil {
		return ""
	}
	return s.metricsLis.Addr().String()
}

// Service returns the service the servers answer with.
func (s *Server) Service() *service.Service { return s.svc }

// Run serves until ctx ends or a server fails, then drains: readiness
// turns off, no new call is accepted, calls in flight finish (within
// DrainTimeout), and every limiter is closed, giving its leases back.
// It returns nil after a shutdown asked by ctx.
func (s *Server) Run(ctx context.Context) error {
	s.setServing()
	s.log.Info("serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "metrics", s.MetricsAddr())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.grpc.Serve(s.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := s.http.Serve(s.httpLis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	if s.metrics != nil {
		g.Go(func() error {
			if err := s.metrics.Serve(s.metricsLis); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
	}
	if s.opts.XDS.Server != "" {
		g.Go(func() error {
			s.watchXDS(gctx)
			return nil
		})
	} else if s.opts.WatchInterval > 0 {
		g.Go(func() error {
			s.watch(gctx)
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		s.drain()
		return nil
	})
	err := g.Wait()
	closeErr := s.closeAll()
	if err != nil {
		s.log.Error("stopped", "error", err.Error())
		return err
	}
	s.log.Info("stopped", "leases_returned", closeErr == nil)
	return nil
}

func (s *Server) drain() {
	start := time.Now()
	s.draining.Store(true)
	s.health.Shutdown()
	s.log.Info("draining", "timeout", s.opts.DrainTimeout.String())
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.DrainTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	if err := s.http.Shutdown(ctx); err != nil {
		s.log.Warn("http calls still in flight at the drain timeout were cut", "error", err.Error())
		s.http.Close()
	}
	if s.metrics != nil && s.metrics.Shutdown(ctx) != nil {
		s.metrics.Close()
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		s.log.Warn("grpc calls still in flight at the drain timeout were cut")
		s.grpc.Stop()
		<-stopped
	}
	s.log.Info("drained", "took", time.Since(start).String())
}

// closeAll closes the service (every limiter gives its leases back), the
// Redis client and the embedded Redis.
func (s *Server) closeAll() error {
	var err error
	if s.svc != nil {
		err = s.svc.Close()
	}
	for _, l := range []net.Listener{s.grpcLis, s.httpLis, s.metricsLis} {
		if l != nil {
			l.Close()
		}
	}
	if s.client != nil {
		s.client.Close()
	}
	if s.mini != nil {
		s.mini.Close()
	}
	return err
}

// watch reloads the configuration whenever the files' content changes.
// Polling the content (not file events) sees edits in place, atomic
// renames and Kubernetes' symlink swaps alike.
func (s *Server) watch(ctx context.Context) {
	t := time.NewTicker(s.opts.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.reload(ctx)
		}
	}
}

func (s *Server) reload(ctx context.Context) {
	srcs, err := config.ReadSources(s.opts.ConfigPaths)
	if err != nil {
		s.reloadFailed(fmt.Errorf("reading the configuration: %w", err))
		return
	}
	h := hashSources(srcs)
	if h == s.lastHash {
		return
	}
	s.lastHash = h
	cfg, err := config.ParseContext(ctx, s.parseOptions(), srcs...)
	if ctx.Err() != nil {
		return // shutting down: the parse was cut short
	}
	if err == nil {
		s.warnings(cfg)
		err = s.svc.Apply(cfg)
	}
	if err != nil {
		s.reloadFailed(err)
		return
	}
	s.lastErr = ""
	s.svc.ReloadResult(nil)
	s.log.Info("configuration reloaded", "domains", cfg.Domains(), "rules", len(cfg.Rules), "files", names(srcs))
}

// reloadFailed reports a failed reload once per distinct error, so that a
// file left broken is not reported at every poll.
func (s *Server) reloadFailed(err error) {
	msg := err.Error()
	if msg == s.lastErr {
		return
	}
	s.lastErr = msg
	s.svc.ReloadResult(err)
	s.log.Error("configuration reload failed; the previous rules stay in force", "error", msg)
}

func hashSources(srcs []config.Source) [32]byte {
	h := sha256.New()
	for _, s := range srcs {
		fmt.Fprintf(h, "%s\x00%d\x00", s.Name, len(s.Data))
		h.Write(s.Data)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

func names(srcs []config.Source) string {
	n := make([]string, len(srcs))
	for i, s := range srcs {
		n[i] = s.Name
	}
	return strings.Join(n, ",")
}
