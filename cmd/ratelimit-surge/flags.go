package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/cli"
)

// algorithm is the limiter's algorithm unless --algorithm says otherwise.
// The hybrid limiter serves FixedWindow, SlidingWindow, TokenBucket and GCRA
// (not SlidingLog). The seed's limiter is a token bucket (capacity 20,
// refilled 10 per second per rider: --algorithm token_bucket --limit 10
// --period 1s --burst 20); the default stays the fixed window the report
// was first measured with.
const algorithm = ratelimit.FixedWindow

// config is what the flags set.
type config struct {
	redisAddrs []string // empty: embedded miniredis

	// the fleet
	instances int
	algorithm ratelimit.Algorithm
	limit     int           // requests per client per period
	period    time.Duration // the limit's window (or refill period)
	burst     int           // bucket capacity of TokenBucket and GCRA; 0 means limit
	timeout   time.Duration // hybrid Redis timeout
	prefix    string

	// the backend's capacity ceiling: workers requests at a time, each
	// taking service; a request that waits longer than queueTimeout for a
	// worker is refused with 503
	workers      int
	service      time.Duration
	queueTimeout time.Duration

	// the clients
	clients       int
	think         time.Duration // mean think time between a client's requests (exponential)
	clientTimeout time.Duration

	duration time.Duration // per phase
	progress time.Duration // between progress lines
	seed     uint64
	plotDir  string // where to write the figures ("": none)
}

func defaults() config {
	return config{
		instances: 4,
		algorithm: algorithm,
		limit:     1,
		period:    6 * time.Second,
		// Not hybrid.DefaultTimeout (100ms): on a shared 2-core machine
		// running a thousand clients, four servers, a proxy and Redis in one
		// process, a reply can wait in the run queue for longer, and the
		// failure mode would decide instead of Redis. The Stats line shows
		// how many decisions it took.
		timeout:      time.Second,
		prefix:       "ratelimit-surge",
		workers:      20,
		service:      50 * time.Millisecond,
		queueTimeout: time.Second,
		clients:      2000,
		think:        4 * time.Second,
		// Longer than the backend ever keeps a request (queue timeout plus
		// service): a failure is the backend refusing, not the client
		// giving up.
		clientTimeout: 5 * time.Second,
		duration:      25 * time.Second,
		progress:      5 * time.Second,
		seed:          1,
	}
}

// rateLimit is the limit every instance's limiter enforces per client.
func (c config) rateLimit() ratelimit.Limit {
	return ratelimit.Limit{Rate: c.limit, Period: c.period, Burst: c.burst}
}

// bound is the most one client can be admitted in one window of the
// tally (one period): the limit for the window algorithms; for the
// buckets, what the bucket holds plus what it refills over the window,
// burst + rate x window.
func (c config) bound() int {
	if c.algorithm.IsWindow() {
		return c.limit
	}
	return c.rateLimit().Capacity(c.algorithm) + c.limit
}

// capacity is the most requests per second the backend can serve.
func (c config) capacity() float64 {
	return float64(c.workers) / c.service.Seconds()
}

// offered is the request rate the clients send, whatever the answers.
func (c config) offered() float64 {
	return float64(c.clients) / c.think.Seconds()
}

// parseArgs reads the command line. It returns flag.ErrHelp (after printing
// the usage to out) for -h, and an error for anything it cannot use; it
// never exits.
func parseArgs(args []string, out io.Writer) (config, error) {
	c := defaults()
	fs := cli.NewFlagSet("ratelimit-surge")
	redisAddr := fs.String("redis", "", cli.RedisFlagUsage)
	fs.IntVar(&c.instances, "instances", c.instances, "API instances behind the round-robin proxy, each with its own hybrid limiter and Redis client")
	alg := fs.String("algorithm", c.algorithm.String(), "the limiter's algorithm: fixed, sliding, token_bucket or gcra (the hybrid does not serve sliding_log)")
	fs.IntVar(&c.limit, "limit", c.limit, "requests allowed per client per period, fleet-wide (for a bucket: its refill per period)")
	fs.DurationVar(&c.period, "period", c.period, "the limit's period")
	fs.IntVar(&c.burst, "burst", c.burst, "token_bucket and gcra: the bucket's capacity (0: --limit)")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "hybrid Redis call timeout (the library's default is 100ms)")
	fs.StringVar(&c.prefix, "prefix", c.prefix, "Redis key prefix (a run id is appended)")
	fs.IntVar(&c.workers, "workers", c.workers, "backend workers: requests served at once")
	fs.DurationVar(&c.service, "service", c.service, "backend service time per request")
	fs.DurationVar(&c.queueTimeout, "queue-timeout", c.queueTimeout, "longest a request waits for a backend worker before a 503")
	fs.IntVar(&c.clients, "clients", c.clients, "clients, each with its own X-User-Id")
	fs.DurationVar(&c.think, "think", c.think, "mean think time between a client's requests (exponentially distributed)")
	fs.DurationVar(&c.clientTimeout, "client-timeout", c.clientTimeout, "a client gives up on a request after this long (a failure)")
	fs.DurationVar(&c.duration, "duration", c.duration, "how long each phase sends requests")
	fs.DurationVar(&c.progress, "progress", c.progress, "interval between progress lines")
	fs.Uint64Var(&c.seed, "seed", c.seed, "seed of the clients' think times")
	fs.StringVar(&c.plotDir, "plot", "", "write the figures (PNG, SVG and their series as JSON) to `dir`")
	if err := cli.Parse(fs, args, out); err != nil {
		return c, err
	}
	var err error
	if c.redisAddrs, err = cli.RedisAddrs(*redisAddr); err != nil {
		return c, err
	}
	a, err := ratelimit.ParseAlgorithm(*alg)
	if err != nil {
		return c, fmt.Errorf("--algorithm: %w", err)
	}
	c.algorithm = a
	switch {
	case c.instances < 1 || c.instances > 64:
		return c, fmt.Errorf("--instances must be in [1, 64], got %d", c.instances)
	case c.limit < 1:
		return c, fmt.Errorf("--limit must be >= 1, got %d", c.limit)
	case c.burst < 0:
		return c, fmt.Errorf("--burst must be >= 0, got %d", c.burst)
	case c.burst > 0 && c.algorithm.IsWindow():
		return c, fmt.Errorf("--burst is the capacity of token_bucket and gcra; %v counts in windows of --limit", c.algorithm)
	case c.period < 10*time.Millisecond:
		return c, fmt.Errorf("--period must be >= 10ms, got %v", c.period)
	case c.timeout <= 0:
		return c, fmt.Errorf("--timeout must be > 0, got %v", c.timeout)
	case c.prefix == "" || strings.ContainsAny(c.prefix, "{}"):
		return c, fmt.Errorf("--prefix %q must be non-empty and hold no braces", c.prefix)
	case c.workers < 1:
		return c, fmt.Errorf("--workers must be >= 1, got %d", c.workers)
	case c.service <= 0:
		return c, fmt.Errorf("--service must be > 0, got %v", c.service)
	case c.queueTimeout <= 0:
		return c, fmt.Errorf("--queue-timeout must be > 0, got %v", c.queueTimeout)
	case c.clients < 1 || c.clients > 100_000:
		return c, fmt.Errorf("--clients must be in [1, 100000], got %d", c.clients)
	case c.think < time.Millisecond:
		return c, fmt.Errorf("--think must be >= 1ms, got %v", c.think)
	case c.clientTimeout <= 0:
		return c, fmt.Errorf("--client-timeout must be > 0, got %v", c.clientTimeout)
	case c.duration <= 0:
		return c, fmt.Errorf("--duration must be > 0, got %v", c.duration)
	case c.progress <= 0:
		return c, fmt.Errorf("--progress must be > 0, got %v", c.progress)
	}
	if w := int64(c.duration/c.period) + 4; w*int64(c.clients) > 1<<26 {
		return c, fmt.Errorf("--clients %d x windows per phase %d is too many to tally; use fewer clients or a longer --period", c.clients, w)
	}
	return c, nil
}
