// Command ratelimit-sim runs a fleet of hybrid limiters against one Redis,
// then the same workload through per-request global limiters, and prints
// the two side by side: how many requests each admitted per key and window
// against the limit, Redis round trips per 1,000 decisions, decision
// latency and throughput.
//
//	go run ./cmd/ratelimit-sim                     # embedded miniredis
//	go run ./cmd/ratelimit-sim --redis 127.0.0.1:6379
//	go run ./cmd/ratelimit-sim --redis h1:7000,h2:7001,h3:7002   # Cluster
//
// Run with -h for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "ratelimit-sim: interrupted")
		os.Exit(130)
	default:
		fmt.Fprintln(os.Stderr, "ratelimit-sim:", err)
		os.Exit(1)
	}
}
