// Command ratelimitd is a rate-limit service for Envoy, Istio and any proxy:
// it answers Envoy's RLS v3 gRPC ShouldRateLimit (and the same request as
// JSON over HTTP) from envoyproxy/ratelimit's YAML configuration, with the
// hybrid limiter of github.com/hybridlimit/ratelimit: almost every decision
// from memory, exact per window in strict mode, and an answer within the
// timeout when Redis is slow or down.
//
//	ratelimitd --config rules.yaml --redis 127.0.0.1:6379
//	ratelimitd --config /etc/ratelimit/config/ --redis h1:7000,h2:7001,h3:7002   # a directory, a Cluster
//
// Without --redis it runs on an embedded in-process Redis (one process
// only). Every flag may also be given as an environment variable:
// RATELIMITD_ and the flag's name in capitals with '_' for '-', e.g.
// RATELIMITD_REDIS=127.0.0.1:6379; a flag on the command line wins.
// Logs are JSON (log/slog) on stderr. SIGTERM or SIGINT drains and exits 0.
// See docs/ratelimitd.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	default:
		// as JSON, as every log: the error may come after others
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("ratelimitd: exiting", "error", err.Error())
		os.Exit(1)
	}
}

// envPrefix starts the environment variable of every flag.
const envPrefix = "RATELIMITD_"

// listFlag is a flag that may be repeated and holds comma-separated lists.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// run parses args (and the environment), then serves until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratelimitd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configs, redisAddrs listFlag
		o                   server.Options
		mode, alg, failure  string
		logLevel            string
	)
	fs.Var(&configs, "config", "configuration `FILE` or directory of *.yaml files (repeat or comma-separate for several)")
	fs.Var(&redisAddrs, "redis", "Redis `host:port[,host:port...]`: one standalone server, Sentinels with --redis-master, or Cluster nodes; absent: an embedded single-process Redis")
	fs.StringVar(&o.RedisMaster, "redis-master", "", "Sentinel master `name` (the --redis addresses are then Sentinels)")
	fs.StringVar(&o.RedisUsername, "redis-username", "", "Redis ACL user name")
	fs.StringVar(&o.RedisPassword, "redis-password", "", "Redis password (prefer the environment variable RATELIMITD_REDIS_PASSWORD)")
	fs.IntVar(&o.RedisPoolSize, "redis-pool-size", 0, "Redis connections per node (0: go-redis's default, 10 per CPU)")
	fs.StringVar(&o.GRPCAddr, "grpc", server.DefaultGRPCAddr, "gRPC listen `address` (Envoy RLS v3)")
	fs.StringVar(&o.HTTPAddr, "http", server.DefaultHTTPAddr, "HTTP listen `address` (/v1/check and /json, /metrics, /healthz, /readyz, /healthcheck)")
	fs.StringVar(&o.Prefix, "prefix", service.DefaultPrefix, "Redis key prefix")
	fs.StringVar(&mode, "mode", "strict", "mode of rules that name none: strict, optimistic or exact")
	fs.StringVar(&alg, "algorithm", "fixed_window", "algorithm of rules that name none: fixed_window, sliding_window, token_bucket or gcra (exact mode also sliding_log)")
	fs.StringVar(&failure, "failure-mode", "local", "what rules that name none decide when Redis does not answer in time: local, open or closed")
	fs.DurationVar(&o.Timeout, "timeout", service.DefaultTimeout, "bound of every wait on Redis; a decision never waits longer")
	fs.DurationVar(&o.SyncInterval, "sync-interval", 0, "how often the hybrid limiters reconcile with Redis (0: the library's default, 100ms)")
	fs.IntVar(&o.Instances, "instances", 0, "number of ratelimitd processes sharing the quota (0: learned from heartbeats in Redis)")
	fs.IntVar(&o.MaxKeys, "max-keys", 0, "keys each hybrid limiter keeps in memory (0: the library's default, 100,000)")
	fs.BoolVar(&o.ResponseHeaders, "response-headers", false, "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to every response")
	fs.BoolVar(&o.ShadowMode, "shadow-mode", false, "answer OK whatever the decisions, counting and measuring everything (like envoyproxy/ratelimit's SHADOW_MODE)")
	fs.IntVar(&o.DenyStatus, "deny-status", server.DefaultDenyStatus, "HTTP status of an OVER_LIMIT answer of /v1/check (e.g. 403 for nginx auth_request)")
	fs.DurationVar(&o.WatchInterval, "watch-interval", server.DefaultWatchInterval, "how often the configuration files are checked for changes (negative: never)")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", server.DefaultDrainTimeout, "at shutdown, how long calls in flight may take to finish")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	boundFlags(fs, &o)
	compat := registerCompat(fs, &o) // envoyproxy/ratelimit's settings (peer.go)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := fromEnv(fs); err != nil {
		return err
	}
	peerNotes, err := fromPeerEnv(fs)
	if err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	routeLibraryLogs(log)
	peerNotes(log)
	if o.Defaults.Mode, err = config.ParseMode(mode); err != nil {
		return fmt.Errorf("--mode: %w", err)
	}
	if o.Defaults.Algorithm, err = config.ParseAlgorithm(alg); err != nil {
		return fmt.Errorf("--algorithm: %w", err)
	}
	if o.Defaults.FailureMode, err = config.ParseFailureMode(failure); err != nil {
		return fmt.Errorf("--failure-mode: %w", err)
	}
	if o.Timeout <= 0 || o.SyncInterval < 0 || o.Instances < 0 || o.MaxKeys < 0 || o.RedisPoolSize < 0 || o.DrainTimeout <= 0 {
		return errors.New("--timeout and --drain-timeout must be > 0; --sync-interval, --instances, --max-keys and --redis-pool-size must not be negative")
	}
	if err := checkBounds(o.Bounds); err != nil {
		return err
	}
	if o.DenyStatus < 400 || o.DenyStatus > 599 {
		return fmt.Errorf("--deny-status %d: want a 4xx or 5xx status", o.DenyStatus)
	}
	if o.WatchInterval == 0 {
		o.WatchInterval = -1
	}
	o.ConfigPaths, o.RedisAddrs, o.Logger = configs, redisAddrs, log
	if err := compat.finish(fs, &o); err != nil {
		return err
	}
	srv, err := server.NewContext(ctx, o)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			log.Info("stopped before serving", "error", err.Error())
			return nil // SIGTERM while starting: as asked
		}
		return err
	}
	return srv.Run(ctx)
}

// fromEnv sets every flag not given on the command line from its
// environment variable, when set.
func fromEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		env := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}
