// Command ratelimit-surge reproduces the concert surge of the seed
// "Distributed Rate Limiting with Redis and Lua" on one machine: thousands of
// clients hammer an HTTP API whose backend has a capacity ceiling, first
// without a rate limiter, then with httplimit over a hybrid limiter shared by
// every API instance, and it prints the seed's before/after table.
//
//	go run ./cmd/ratelimit-surge                        # embedded miniredis, about a minute
//	go run ./cmd/ratelimit-surge --redis 127.0.0.1:6379
//	go run ./cmd/ratelimit-surge --algorithm sliding
//	go run ./cmd/ratelimit-surge --algorithm token_bucket --burst 2
//	go run ./cmd/ratelimit-surge --plot docs/img        # also draw it: PNG, SVG, JSON
//
// The system: N API instances (real net/http servers on loopback) behind a
// round-robin httputil.ReverseProxy; each instance calls one shared backend,
// a pool of workers with a fixed service time that refuses (503) a request
// left waiting for a worker longer than the queue timeout. Each client sends
// a request, with its X-User-Id, after every think time (exponentially
// distributed), without waiting for the previous answer, the way an app
// polls on a timer: a surge does not slow down because the backend does. With the limiter each instance runs
// httplimit keyed by X-User-Id over its own hybrid.Limiter (FixedWindow
// unless --algorithm says otherwise, strict), and the instances share one
// quota per client in Redis.
//
// Every request a limiter allows is tallied in the window the limiter
// counted it in (for a bucket, which has none, in the period it was
// decided in); the report shows the most one client got in one window
// against the bound: the limit for a window algorithm, and burst + rate x
// window for a bucket (without the limiter, every request reaching an
// instance counts, by its arrival time).
//
// Run with -h for every flag.
package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/internal/chart"
	"github.com/hybridlimit/ratelimit/internal/cli"
)

func main() { cli.Main("ratelimit-surge", run) }

func run(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := parseArgs(args, out)
	if err != nil {
		return err
	}
	res, err := surge(ctx, cfg, out)
	if err != nil {
		return err
	}
	printReport(out, cfg, res)
	if cfg.plotDir != "" {
		var files []string
		for _, f := range figures(cfg, res, commandLine(args)) {
			if err := f.Write(cfg.plotDir); err != nil {
				return err
			}
			p, _, _ := chart.Files(cfg.plotDir, f.Name)
			files = append(files, p)
		}
		fmt.Fprintf(out, "figures (with .svg and .json beside each): %s\n", strings.Join(files, " "))
	}
	return nil
}

type surgeResult struct {
	redis         string // which Redis
	without, with phaseResult
}

// surge runs both phases.
func surge(ctx context.Context, cfg config, out io.Writer) (surgeResult, error) {
	var res surgeResult
	var newClient func() redis.UniversalClient
	if len(cfg.redisAddrs) == 0 {
		mr, err := miniredis.Run()
		if err != nil {
			return res, fmt.Errorf("embedded miniredis: %w", err)
		}
		defer mr.Close()
		addr := mr.Addr()
		newClient = func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		}
		res.redis = "embedded miniredis"
	} else {
		addrs := cfg.redisAddrs
		newClient = func() redis.UniversalClient {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, ContextTimeoutEnabled: true})
		}
		c := newClient()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		c.Close()
		if err != nil {
			return res, fmt.Errorf("--redis %s: %w", strings.Join(addrs, ","), err)
		}
		res.redis = "Redis at " + strings.Join(addrs, ",")
	}
	printSetup(out, cfg, res.redis)

	var err error
	fmt.Fprintf(out, "\nphase 1 of 2: without limiter, %v\n", cfg.duration)
	if res.without, err = runPhase(ctx, cfg, "without", nil, "", out); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "phase 2 of 2: with limiter, %v\n", cfg.duration)
	prefix := fmt.Sprintf("%s:%d", cfg.prefix, time.Now().UnixNano())
	if res.with, err = runPhase(ctx, cfg, "with", newClient, prefix, out); err != nil {
		return res, err
	}
	return res, nil
}
