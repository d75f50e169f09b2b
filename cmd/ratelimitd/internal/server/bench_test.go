package server_test

// BenchmarkShouldRateLimit measures ShouldRateLimit end to end: a Go gRPC
// client (go-control-plane types) on loopback, a ratelimitd and a real
// redis-server on the same machine.
//
//	go test -run '^$' -bench ShouldRateLimit -benchtime 20000x ./internal/server/
//
// Sub-benchmarks: mode (strict: the hybrid; exact: one Redis call per
// request; strict_multi and exact_multi: the same with three limits per
// descriptor, a rate_limits list) x keys (one hot key; 10,000 keys, used round-robin) x clients
// (concurrent callers sharing 4 connections). Each reports calls/s, p50 and
// p99 latency in microseconds, Redis round trips per 1,000 calls (counted
// by a hook on ratelimitd's Redis client: every command and pipeline of its
// limiters, background sync and heartbeats included), the Redis commands
// per 1,000 calls the server counted (INFO commandstats: comparable with
// a peer), and the process CPU per call (client and server together, as
// both run in this process).
//
// RLBENCH_KEYS lists the key counts instead of 1 and 10,000 (say
// RLBENCH_KEYS=100000 for a long tail). Each also reports p99.9 and the
// slowest call. The window unit is a minute by default; RLBENCH_UNIT=second uses
// per-second rules instead (with 10,000 keys each key then sees a new
// window every second, the hybrid's costliest case).
//
// With 10,000 keys one untimed pass over them comes first: the figures are
// those of a warm service, each key seen before in its window.
//
// A peer RLS v3 server (envoyproxy/ratelimit, or ratelimitd run as a
// process) is measured in the same run with the same clients and keys when
// RLBENCH_PEER=host:port names it; it must serve testdata/bench-peer.yaml
// (testdata/bench.yaml for a ratelimitd). RLBENCH_PEER_NAME labels it
// (default "peer"), RLBENCH_PEER_RULES lists the rules to measure (default
// "exact"; "strict,exact" for a ratelimitd), RLBENCH_PEER_REDIS=host:port
// names its Redis (for the commands per call) and RLBENCH_PEER_PID its
// process (for its CPU per call, read from /proc).

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// benchRun starts the keys of this process's benchmarks.
var benchRun = uniq("run")

// benchTarget is an RLS server under measurement.
type benchTarget struct {
	name       string
	conns      []*grpc.ClientConn
	rls        []pb.RateLimitServiceClient
	redis      *redis.Client  // its Redis, for INFO commandstats
	roundTrips func() uint64  // its Redis round trips, when known
	cpu        func() float64 // CPU seconds of the measured processes
	cpuWhat    string         // which processes cpu covers
	rules      []string       // the rules (keys of testdata/bench.yaml) to measure
}

func dialTarget(b *testing.B, name, addr string) *benchTarget {
	t := &benchTarget{name: name}
	for range 4 {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		t.conns = append(t.conns, c)
		t.rls = append(t.rls, pb.NewRateLimitServiceClient(c))
	}
	return t
}

func selfCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// procCPU reads the CPU seconds of process pid from /proc/pid/stat.
func procCPU(pid int) func() float64 {
	tick := 100.0 // USER_HZ on Linux
	return func() float64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return math.NaN()
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		u, _ := strconv.ParseFloat(f[11], 64)
		k, _ := strconv.ParseFloat(f[12], 64)
		return (u + k) / tick
	}
}

// commands returns the commands Redis has processed.
func commands(c *redis.Client) float64 {
	if c == nil {
		return math.NaN()
	}
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		return math.NaN()
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "total_commands_processed:"); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return math.NaN()
}

func BenchmarkShouldRateLimit(b *testing.B) {
	unit := os.Getenv("RLBENCH_UNIT")
	suffix := ""
	switch unit {
	case "", "minute":
	case "second":
		suffix = "_second"
	default:
		b.Fatalf("RLBENCH_UNIT=%q: want minute or second", unit)
	}
	rs := redistest.Standalone(b)
	srv := start(b, rs.Addr(), "testdata/bench.yaml", func(o *server.Options) {
		o.Prefix = uniq("bench")
		o.WatchInterval = -1
	})
	ours := dialTarget(b, "ratelimitd", srv.srv.GRPCAddr())
	ours.redis = rs.Client()
	b.Cleanup(func() { ours.redis.Close() })
	ours.roundTrips = srv.srv.Service().RoundTrips
	ours.cpu, ours.cpuWhat = selfCPU, "client+server"
	ours.rules = []string{"strict", "exact", "strict_multi", "exact_multi"}
	targets := []*benchTarget{ours}
	if addr := os.Getenv("RLBENCH_PEER"); addr != "" {
		name := os.Getenv("RLBENCH_PEER_NAME")
		if name == "" {
			name = "peer"
		}
		peer := dialTarget(b, name, addr)
		peer.rules = strings.Split(os.Getenv("RLBENCH_PEER_RULES"), ",")
		if peer.rules[0] == "" {
			peer.rules = []string{"exact"}
		}
		if r := os.Getenv("RLBENCH_PEER_REDIS"); r != "" {
			peer.redis = redis.NewClient(&redis.Options{Addr: r})
			b.Cleanup(func() { peer.redis.Close() })
		}
		if p, err := strconv.Atoi(os.Getenv("RLBENCH_PEER_PID")); err == nil {
			peer.cpu, peer.cpuWhat = procCPU(p), "server"
		}
		targets = append(targets, peer)
	}
	keyCounts := []int{1, 10000}
	if v := os.Getenv("RLBENCH_KEYS"); v != "" {
		keyCounts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				b.Fatalf("RLBENCH_KEYS=%q: want a comma-separated list of key counts", v)
			}
			keyCounts = append(keyCounts, n)
		}
	}
	for _, tg := range targets {
		for _, mode := range tg.rules {
			for _, keys := range keyCounts {
				for _, clients := range []int{16, 64} {
					name := fmt.Sprintf("%s/%s/keys=%d/clients=%d", tg.name, mode, keys, clients)
					b.Run(name, func(b *testing.B) { benchCalls(b, tg, mode+suffix, keys, clients) })
				}
			}
		}
	}
}

// benchCalls makes b.N calls from clients goroutines and reports the
// figures.
func benchCalls(b *testing.B, tg *benchTarget, key string, keys, clients int) {
	// The same keys for every run of a target and rule (the harness runs
	// each sub-benchmark more than once): the figures are those of a warm
	// service.
	names := make([]string, keys)
	for i := range names {
		names[i] = benchRun + "-" + tg.name + "-" + strconv.Itoa(i)
	}
	lat := make([][]time.Duration, clients)
	per := b.N/clients + 1
	for i := range lat {
		lat[i] = make([]time.Duration, 0, per)
	}
	if keys > 1 { // one untimed pass: the figures are those of a warm service
		req := rq("bench", desc(key, ""))
		for _, n := range names {
			req.Descriptors[0].Entries[0].Value = n
			if _, err := tg.rls[0].ShouldRateLimit(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	}
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	trips0, cmds0, cpu0 := uint64(0), commands(tg.redis), tg.cpu()
	if tg.roundTrips != nil {
		trips0 = tg.roundTrips()
	}
	b.ReportAllocs()
	b.ResetTimer()
	begin := time.Now()
	for c := range clients {
		wg.Go(func() {
			rls := tg.rls[c%len(tg.rls)]
			req := rq("bench", desc(key, ""))
			entry := req.Descriptors[0].Entries[0]
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				entry.Value = names[int(i)%keys]
				t0 := time.Now()
				r, err := rls.ShouldRateLimit(context.Background(), req)
				lat[c] = append(lat[c], time.Since(t0))
				if err != nil || r.OverallCode != ok {
					if failed.Add(1) == 1 {
						b.Errorf("call %d: %v %v", i, err, r)
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds())
	}
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "calls/s")
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
	b.ReportMetric(pct(0.999), "p99.9-us")
	b.ReportMetric(float64(all[len(all)-1].Microseconds()), "max-us")
	if tg.roundTrips != nil {
		b.ReportMetric(1000*float64(tg.roundTrips()-trips0)/n, "rtt/1k-calls")
	}
	if cmds := commands(tg.redis) - cmds0; !math.IsNaN(cmds) {
		b.ReportMetric(1000*(cmds-1)/n, "redis-cmds/1k-calls") // minus our INFO
	}
	if cpu := tg.cpu() - cpu0; !math.IsNaN(cpu) {
		b.ReportMetric(1e6*cpu/n, "cpu-us/call("+tg.cpuWhat+")")
	}
	b.ReportMetric(0, "ns/op")
}
