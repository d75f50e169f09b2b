package sync

import (
	"context"
	"time"

	"github.com/hybridlimit/ratelimit/internal/option"
)

// Defaults of the options.
const (
	// DefaultInterval is the time between two ticks when WithInterval is not given.
	DefaultInterval = 100 * time.Millisecond
	// DefaultBatchSize is the most items one FlushFunc call gets when
	// WithBatchSize is not given.
	DefaultBatchSize = 512
	// DefaultTimeout is the deadline of one FlushFunc call when WithTimeout is
	// not given.
	DefaultTimeout = time.Second
	// DefaultMaxBackoff is the largest backoff when WithBackoff is not given.
	// The smallest is the interval.
	DefaultMaxBackoff = 5 * time.Second
)

// An Option configures a Syncer in New; build one with the With functions.
// New ignores a nil Option, as packages local, global and hybrid do, and
// returns the error of the first Option out of range. Options are applied in
// order: a later one overrides an earlier one of the same kind.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	interval   time.Duration
	batchSize  int
	timeout    time.Duration
	backoffMin time.Duration // 0: the interval
	backoffMax time.Duration
	onTick     func(context.Context)
	observer   func(FlushEvent)
}

func defaultConfig() config {
	return config{
		interval:   DefaultInterval,
		batchSize:  DefaultBatchSize,
		timeout:    DefaultTimeout,
		backoffMax: DefaultMaxBackoff,
	}
}

// invalid is the error of an option out of range, its text prefixed by the
// package name.
func invalid(format string, args ...any) error {
	return option.Invalid("sync: "+format, args...)
}

// WithInterval sets the time between two ticks (default 100ms). Every tick
// flushes what was marked since the previous one. d must be > 0.
func WithInterval(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalid("interval must be > 0, got %v", d)
		}
		c.interval = d
		return nil
	})
}

// WithBatchSize sets the most items one FlushFunc call receives (default
// 512). The items of a tick are split into batches of at most n, flushed one
// after the other. n must be > 0.
func WithBatchSize(n int) Option {
	return optionFunc(func(c *config) error {
		if n <= 0 {
			return invalid("batch size must be > 0, got %d", n)
		}
		c.batchSize = n
		return nil
	})
}

// WithTimeout sets the deadline of the context passed to one FlushFunc call
// (default 1s). d must be > 0.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalid("timeout must be > 0, got %v", d)
		}
		c.timeout = d
		return nil
	})
}

// WithBackoff sets the bounds of the backoff after failing ticks (defaults:
// min is the interval, max is 5s). After k consecutive failing passes the
// backoff is min x 2^(k-1), at most max, and the next tick waits a uniformly
// random duration in [0, backoff] (full jitter) instead of the interval. A
// successful pass resets it. min must be > 0 and max >= min.
func WithBackoff(min, max time.Duration) Option {
	return optionFunc(func(c *config) error {
		if min <= 0 || max < min {
			return invalid("backoff needs 0 < min <= max, got min %v, max %v", min, max)
		}
		c.backoffMin, c.backoffMax = min, max
		return nil
	})
}

// WithOnTick sets a hook run at the start of every tick, on the owner
// goroutine, before the flush (the hybrid uses it for housekeeping, such as
// marking idle counters). It may call Mark and Pending; it must not call
// Close. It delays the tick's flush for as long as it runs. Its context is
// canceled when a Close gives up waiting. nil means no hook.
func WithOnTick(f func(ctx context.Context)) Option {
	return optionFunc(func(c *config) error {
		c.onTick = f
		return nil
	})
}

// WithObserver sets a function called after every FlushFunc call, on the
// goroutine that made it (the owner, or the caller of Flush or Close), with
// the batch size, the error and the duration of the call. It must be quick
// and must not call Flush or Close. nil means no observer.
func WithObserver(f func(FlushEvent)) Option {
	return optionFunc(func(c *config) error {
		c.observer = f
		return nil
	})
}
