// Command ratelimit-sim runs a fleet of hybrid limiters against one Redis,
// then the same workload through per-request global limiters, and prints
// the two side by side: how many requests each admitted per key and window
// against the limit, Redis round trips per 1,000 decisions, decision
// latency and throughput. Both phases run one algorithm (FixedWindow
// unless --algorithm says otherwise); a bucket's admissions are tallied
// per period and bounded by its burst plus its refill over the period.
//
//	go run ./cmd/ratelimit-sim                     # embedded miniredis
//	go run ./cmd/ratelimit-sim --redis 127.0.0.1:6379
//	go run ./cmd/ratelimit-sim --redis h1:7000,h2:7001,h3:7002   # Cluster
//	go run ./cmd/ratelimit-sim --plot docs/img     # also draw it: PNG, SVG, JSON
//	go run ./cmd/ratelimit-sim --redis-latency 50ms  # Redis 50ms away (faultproxy)
//	go run ./cmd/ratelimit-sim --algorithm sliding   # both phases SlidingWindow
//	go run ./cmd/ratelimit-sim --algorithm token_bucket --burst 50
//	go run ./cmd/ratelimit-sim --sweep --plot docs/img          # regime sweep
//	go run ./cmd/ratelimit-sim --multi-region --plot docs/img   # near and far
//
// Run with -h for every flag.
package main

import "github.com/hybridlimit/ratelimit/internal/cli"

func main() { cli.Main("ratelimit-sim", run) }
