package main

import (
	"fmt"
	"io"
	"strings"
	"time"

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
	limit        int     // per key per period
	period       time.Duration
	duration     time.Duration // per phase
	sync         time.Duration
	timeout      time.Duration
	mode         hybrid.Mode
	prefix       string
	seed         uint64
	cpuProfile   string
	fixInstances bool
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
	fs.DurationVar(&c.period, "period", c.period, "the limit's period (fixed window)")
	fs.DurationVar(&c.duration, "duration", c.duration, "how long each phase runs")
	fs.DurationVar(&c.sync, "sync", c.sync, "hybrid sync interval")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "the most a hybrid decision waits on Redis (hybrid.WithTimeout; the library's default)")
	fs.BoolVar(&c.fixInstances, "fix-instances", false, "tell every hybrid instance the fleet size (WithInstances) instead of letting it learn it by heartbeat")
	mode := fs.String("mode", c.mode.String(), "hybrid mode: strict or optimistic")
	fs.StringVar(&c.prefix, "prefix", c.prefix, "Redis key prefix (a run id and the phase are appended)")
	fs.Uint64Var(&c.seed, "seed", c.seed, "seed of the workload's random key choice")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of both phases to `file`")
	if err := cli.Parse(fs, args, out); err != nil {
		return c, err
	}
	var err error
	if c.redisAddrs, err = cli.RedisAddrs(*redisAddr); err != nil {
		return c, err
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
	case c.period < time.Millisecond:
		return c, fmt.Errorf("--period must be >= 1ms, got %v", c.period)
	case c.duration <= 0:
		return c, fmt.Errorf("--duration must be > 0, got %v", c.duration)
	case c.sync < time.Millisecond:
		return c, fmt.Errorf("--sync must be >= 1ms, got %v", c.sync)
	case c.timeout <= 0:
		return c, fmt.Errorf("--timeout must be > 0, got %v", c.timeout)
	case c.prefix == "" || strings.ContainsAny(c.prefix, "{}"):
		return c, fmt.Errorf("--prefix %q must be non-empty and hold no braces", c.prefix)
	}
	if w := c.duration/c.period + 4; int64(w)*int64(c.keys) > 1<<26 {
		return c, fmt.Errorf("--keys %d x windows per phase %d is too many to tally; use fewer keys or a longer --period", c.keys, w)
	}
	return c, nil
}
