package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/cli"
)

// config is what the flags set.
type config struct {
	redisAddrs   []string // empty: embedded miniredis
	instances    int
	workers      int // per instance
	keys         int
	zipf         float64 // exponent of the key popularity; 0 = uniform
	rate         float64 // offered decisions/s for the whole fleet; 0 = closed loop
	limit        int     // per key per period (a bucket's refill per period)
	period       time.Duration
	algorithm    ratelimit.Algorithm // both phases'
	burst        int                 // bucket capacity of TokenBucket and GCRA; 0 means limit
	duration     time.Duration       // per phase
	sync         time.Duration
	timeout      time.Duration
	mode         hybrid.Mode
	prefix       string
	seed         uint64
	cpuProfile   string
	fixInstances bool
	redisLatency time.Duration // added to every Redis round trip (0: none)
	plotDir      string        // where to write the figures ("": none)
	align        time.Duration // with aligned, each phase starts this far into a period of Redis time
	aligned      bool          // --align given; else a phase starts at once

	// --sweep: instead of one run, the regime sweep over these key counts
	sweep     bool
	sweepKeys []int
	// --multi-region: instead of one run, the multi-region matrix over
	// these round-trip times
	multiRegion bool
	latencies   []time.Duration
	limitSet    bool // --limit was given
	workersSet  bool // --workers was given
}

func defaults() config {
	return config{
		instances: 8,
		workers:   4,
		keys:      100,
		zipf:      1.0,
		rate:      0,
		limit:     5000,
		period:    time.Second,
		algorithm: ratelimit.FixedWindow,
		duration:  5 * time.Second,
		sync:      hybrid.DefaultSyncInterval,
		timeout:   hybrid.DefaultTimeout,
		mode:      hybrid.Strict,
		prefix:    "ratelimit-sim",
		seed:      1,
	}
}

// parseArgs reads the command line. It returns flag.ErrHelp (after printing
// the usage to out) for -h, and an error for anything it cannot use; it
// never exits.
func parseArgs(args []string, out io.Writer) (config, error) {
	c := defaults()
	fs := cli.NewFlagSet("ratelimit-sim")
	redisAddr := fs.String("redis", "", cli.RedisFlagUsage)
	fs.IntVar(&c.instances, "instances", c.instances, "hybrid instances, each with its own Redis client, as separate processes would have")
	fs.IntVar(&c.workers, "workers", c.workers, "goroutines deciding per instance")
	fs.IntVar(&c.keys, "keys", c.keys, "distinct keys")
	fs.Float64Var(&c.zipf, "zipf", c.zipf, "Zipf exponent of key popularity (key i drawn with weight 1/(i+1)^s; 0 = uniform)")
	fs.Float64Var(&c.rate, "rate", c.rate, "offered decisions/s for the whole fleet; 0 = closed loop, every worker as fast as it goes")
	fs.IntVar(&c.limit, "limit", c.limit, "requests allowed per key per period")
	fs.DurationVar(&c.period, "period", c.period, "the limit's period (the window's length, or a bucket's refill period)")
	alg := fs.String("algorithm", c.algorithm.String(), "both phases' algorithm: fixed, sliding, token_bucket or gcra (the hybrid does not serve sliding_log)")
	fs.IntVar(&c.burst, "burst", c.burst, "token_bucket and gcra: the bucket's capacity (0: --limit)")
	fs.DurationVar(&c.duration, "duration", c.duration, "how long each phase runs")
	fs.DurationVar(&c.sync, "sync", c.sync, "hybrid sync interval")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "the most a hybrid decision waits on Redis (hybrid.WithTimeout; the library's default)")
	fs.BoolVar(&c.fixInstances, "fix-instances", false, "tell every hybrid instance the fleet size (WithInstances) instead of letting it learn it by heartbeat")
	mode := fs.String("mode", c.mode.String(), "hybrid mode: strict or optimistic")
	fs.StringVar(&c.prefix, "prefix", c.prefix, "Redis key prefix (a run id and the phase are appended)")
	fs.Uint64Var(&c.seed, "seed", c.seed, "seed of the workload's random key choice")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of both phases to `file`, each phase's samples labelled phase=hybrid or phase=global (go tool pprof -tagfocus phase=hybrid)")
	fs.DurationVar(&c.redisLatency, "redis-latency", 0, "add this round-trip time between every instance and Redis (half each way), through internal/faultproxy: a Redis in another region (one Redis address or the embedded one; not a Cluster)")
	fs.StringVar(&c.plotDir, "plot", "", "write the figures (PNG, SVG and their series as JSON) to `dir`")
	fs.Func("align", "start each phase this `duration` into a period of Redis time (in [0, --period)), so that runs of two builds meet their window boundaries at the same points of the phase (default: start at once)", func(v string) error {
		d, err := time.ParseDuration(v)
		c.align, c.aligned = d, true
		return err
	})
	fs.BoolVar(&c.sweep, "sweep", false, "the regime sweep instead of one run: for each of --sweep-keys, hybrid strict, hybrid optimistic and global, uniform keys, closed loop; prints a table and, with --plot, draws regime.png (the limit defaults to 100,000,000 so that no key is driven past it)")
	sweepKeys := fs.String("sweep-keys", "1,10,100,1000,10000,100000", "the key counts of --sweep")
	fs.BoolVar(&c.multiRegion, "multi-region", false, "the multi-region matrix instead of one run: hot, warm and cold workloads (uniform keys, 1s windows, an open loop of --rate, 2,000/s unless given), each with Redis near (0) and at every --latencies round trip, through hybrid strict, hybrid optimistic and global, every instance told the fleet size; prints a table and, with --plot, draws multi-region-latency.png and multi-region-waits.png (--workers defaults to 64 here)")
	latencies := fs.String("latencies", "20ms,50ms,100ms", "the round-trip times of --multi-region")
	if err := cli.Parse(fs, args, out); err != nil {
		return c, err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "limit":
			c.limitSet = true
		case "workers":
			c.workersSet = true
		}
	})
	var err error
	if c.sweepKeys, err = parseInts(*sweepKeys); err != nil {
		return c, fmt.Errorf("--sweep-keys: %w", err)
	}
	if c.latencies, err = parseDurations(*latencies); err != nil {
		return c, fmt.Errorf("--latencies: %w", err)
	}
	if c.redisAddrs, err = cli.RedisAddrs(*redisAddr); err != nil {
		return c, err
	}
	if c.algorithm, err = ratelimit.ParseAlgorithm(*alg); err != nil {
		return c, fmt.Errorf("--algorithm: %w", err)
	}
	switch strings.ToLower(*mode) {
	case "strict":
		c.mode = hybrid.Strict
	case "optimistic":
		c.mode = hybrid.Optimistic
	default:
		return c, fmt.Errorf("--mode %q: want strict or optimistic", *mode)
	}
	switch {
	case c.instances < 1:
		return c, fmt.Errorf("--instances must be >= 1, got %d", c.instances)
	case c.workers < 1:
		return c, fmt.Errorf("--workers must be >= 1, got %d", c.workers)
	case c.keys < 1 || c.keys > 10_000_000:
		return c, fmt.Errorf("--keys must be in [1, 10000000], got %d", c.keys)
	case c.zipf < 0 || c.zipf > 10:
		return c, fmt.Errorf("--zipf must be in [0, 10], got %v", c.zipf)
	case c.rate < 0:
		return c, fmt.Errorf("--rate must be >= 0, got %v", c.rate)
	case c.limit < 1:
		return c, fmt.Errorf("--limit must be >= 1, got %d", c.limit)
	case c.algorithm == ratelimit.SlidingLog:
		return c, fmt.Errorf("--algorithm %v: the hybrid does not serve it (a log cannot be leased in slices); choose fixed, sliding, token_bucket or gcra", c.algorithm)
	case c.burst < 0:
		return c, fmt.Errorf("--burst must be >= 0, got %d", c.burst)
	case c.burst > 0 && c.algorithm.IsWindow():
		return c, fmt.Errorf("--burst is the capacity of token_bucket and gcra; %v counts in windows of --limit", c.algorithm)
	case c.period < time.Millisecond:
		return c, fmt.Errorf("--period must be >= 1ms, got %v", c.period)
	case c.duration <= 0:
		return c, fmt.Errorf("--duration must be > 0, got %v", c.duration)
	case c.aligned && (c.align < 0 || c.align >= c.period):
		return c, fmt.Errorf("--align must be in [0, --period %v), got %v", c.period, c.align)
	case c.sync < time.Millisecond:
		return c, fmt.Errorf("--sync must be >= 1ms, got %v", c.sync)
	case c.timeout <= 0:
		return c, fmt.Errorf("--timeout must be > 0, got %v", c.timeout)
	case c.prefix == "" || strings.ContainsAny(c.prefix, "{}"):
		return c, fmt.Errorf("--prefix %q must be non-empty and hold no braces", c.prefix)
	case c.redisLatency < 0 || c.redisLatency > 10*time.Second:
		return c, fmt.Errorf("--redis-latency must be in [0, 10s], got %v", c.redisLatency)
	case (c.redisLatency > 0 || c.multiRegion) && len(c.redisAddrs) > 1:
		return c, fmt.Errorf("--redis-latency and --multi-region need one Redis address, not a Cluster (its clients follow the nodes' own addresses, around the proxy)")
	case c.sweep && c.multiRegion:
		return c, fmt.Errorf("--sweep and --multi-region are two runs: choose one")
	}
	for _, k := range c.sweepKeys {
		if k < 1 || k > 10_000_000 {
			return c, fmt.Errorf("--sweep-keys: %d is not in [1, 10000000]", k)
		}
	}
	for _, l := range c.latencies {
		if l <= 0 || l > 10*time.Second {
			return c, fmt.Errorf("--latencies: %v is not in (0, 10s]", l)
		}
	}
	keys := c.keys
	if c.sweep {
		keys = slices.Max(c.sweepKeys)
	}
	if w := c.duration/c.period + 4; int64(w)*int64(keys) > 1<<26 {
		return c, fmt.Errorf("--keys %d x windows per phase %d is too many to tally; use fewer keys or a longer --period", keys, w)
	}
	if c.sweep && !c.limitSet {
		c.limit = sweepLimit
	}
	if c.multiRegion && !c.workersSet {
		c.workers = multiRegionWorkers
	}
	if err := c.rateLimit().ValidateFor(c.algorithm); err != nil {
		return c, fmt.Errorf("--limit %d per --period %v (--burst %d) for %v: %w", c.limit, c.period, c.burst, c.algorithm, err)
	}
	if c.algorithm == ratelimit.GCRA && c.period.Microseconds() < int64(c.limit) {
		// (hybrid.New's own check: GCRA's emission interval is whole microseconds)
		return c, fmt.Errorf("--algorithm gcra needs --period in microseconds >= --limit, got %d per %v", c.limit, c.period)
	}
	return c, nil
}

// rateLimit is the limit both phases enforce per key.
func (c config) rateLimit() ratelimit.Limit {
	return ratelimit.Limit{Rate: c.limit, Period: c.period, Burst: c.burst}
}

// bound is the most one key may be admitted in one window of the tally
// (one period) in strict mode: the limit for the window algorithms (a
// sliding window counts the current window's admissions whole); for the
// buckets, which have no windows, what the bucket holds plus what it
// refills over the window, burst + rate x window.
func (c config) bound() int {
	if c.algorithm.IsWindow() {
		return c.limit
	}
	return c.rateLimit().Capacity(c.algorithm) + c.limit
}

// parseInts reads a comma-separated list of integers.
func parseInts(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// parseDurations reads a comma-separated list of durations.
func parseDurations(v string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}
