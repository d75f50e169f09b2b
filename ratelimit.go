package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Limit is a rate: Rate events per Period, with a Burst capacity.
//
// The window algorithms (FixedWindow, SlidingWindow, SlidingLog) admit at most
// Rate events per Period and ignore Burst. The bucket algorithms (TokenBucket,
// GCRA) refill at Rate per Period and hold at most Burst; a Burst of 0 means
// Rate.
//
// The zero Limit is invalid: every constructor in this module rejects it with
// ErrInvalidLimit.
type Limit struct {
	Rate   int           // events per Period; must be > 0
	Period time.Duration // length of the window or refill period; must be >= 1ms
	Burst  int           // bucket capacity for TokenBucket and GCRA; 0 means Rate
}

// PerSecond returns a Limit of n events per second.
func PerSecond(n int) Limit { return Limit{Rate: n, Period: time.Second} }

// PerMinute returns a Limit of n events per minute.
func PerMinute(n int) Limit { return Limit{Rate: n, Period: time.Minute} }

// PerHour returns a Limit of n events per hour.
func PerHour(n int) Limit { return Limit{Rate: n, Period: time.Hour} }

// maxExact bounds the products the limiters compute in integer
// microseconds (see Validate).
const maxExact = 1 << 53

// Capacity returns the most events one key can be admitted at once under
// algorithm a, which is also the largest n an AllowN accepts and the quota
// the rate-limit headers advertise: Rate for the window algorithms
// (FixedWindow, SlidingWindow, SlidingLog), which ignore Burst; Burst for the
// buckets (TokenBucket, GCRA), or Rate when Burst is 0. For an invalid
// Algorithm it returns Rate.
func (l Limit) Capacity(a Algorithm) int {
	if (a == TokenBucket || a == GCRA) && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// Validate reports whether l can be enforced. It returns an error wrapping
// ErrInvalidLimit that says which field is wrong.
//
// Beyond the sign of each field and a Period of whole microseconds, at least
// 1ms, it bounds Rate x Period and Burst x Period (Period in microseconds)
// by 2^53 (9,007,199,254,740,992), so that every implementation, including
// the Lua scripts that run on Redis (whose numbers are IEEE doubles),
// computes them exactly. That admits, for example, 2,500,000 per hour or
// 100,000 per day.
func (l Limit) Validate() error {
	switch {
	case l.Rate <= 0:
		return fmt.Errorf("%w: Rate must be > 0, got %d", ErrInvalidLimit, l.Rate)
	case l.Period < time.Millisecond:
		return fmt.Errorf("%w: Period must be >= 1ms, got %v", ErrInvalidLimit, l.Period)
	case l.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: Period must be a whole number of microseconds, got %v", ErrInvalidLimit, l.Period)
	case l.Burst < 0:
		return fmt.Errorf("%w: Burst must be >= 0, got %d", ErrInvalidLimit, l.Burst)
	}
	p := uint64(l.Period / time.Microsecond)
	if hi, lo := mul64(uint64(l.Rate), p); hi != 0 || lo > maxExact {
		return fmt.Errorf("%w: Rate x Period (%d x %v) is too large to count exactly", ErrInvalidLimit, l.Rate, l.Period)
	}
	if hi, lo := mul64(uint64(l.Burst), p); hi != 0 || lo > maxExact {
		return fmt.Errorf("%w: Burst x Period (%d x %v) is too large to count exactly", ErrInvalidLimit, l.Burst, l.Period)
	}
	return nil
}

// ValidateFor reports whether l can be enforced with algorithm a. It is
// Validate, but for FixedWindow, which counts whole events against Rate and
// never multiplies Rate or Burst by Period: a FixedWindow limit needs only
// Rate at most 2^53 (and ignores Burst beyond its sign), so that, for
// example, 4,294,967,295 per year is valid for it. The other algorithms
// weigh events in microseconds of the period and keep Validate's bounds.
// Every limiter of the module checks its limits with it.
func (l Limit) ValidateFor(a Algorithm) error {
	if a != FixedWindow {
		return l.Validate()
	}
	small := l
	small.Rate, small.Burst = min(l.Rate, 1), min(l.Burst, 0)
	if err := small.Validate(); err != nil {
		return err
	}
	if l.Rate > maxExact {
		return fmt.Errorf("%w: Rate %d is above 2^53", ErrInvalidLimit, l.Rate)
	}
	return nil
}

func mul64(a, b uint64) (hi, lo uint64) {
	if a == 0 || b == 0 {
		return 0, 0
	}
	lo = a * b
	if lo/b != a {
		return 1, lo
	}
	return 0, lo
}

// Every returns the mean time between events at this limit: Period / Rate.
// It returns 0 for an invalid Limit.
func (l Limit) Every() time.Duration {
	if l.Rate <= 0 {
		return 0
	}
	return l.Period / time.Duration(l.Rate)
}

// String returns a human form such as "100/1s" or "100/1m0s burst 20".
func (l Limit) String() string {
	s := strconv.Itoa(l.Rate) + "/" + l.Period.String()
	if l.Burst > 0 {
		s += " burst " + strconv.Itoa(l.Burst)
	}
	return s
}

// Algorithm selects how a limiter counts.
type Algorithm int

const (
	// FixedWindow counts events in windows of Period aligned to multiples of
	// Period since the Unix epoch. Cheap and exact per window; a client may
	// get up to 2 x Rate across a window boundary.
	FixedWindow Algorithm = iota
	// SlidingWindow is the two-window weighted counter: the count of the
	// previous fixed window, weighted by how much of it still overlaps the
	// sliding window, plus the count of the current one. It smooths the
	// boundary burst of FixedWindow with constant memory.
	SlidingWindow
	// SlidingLog keeps the timestamp of every admitted event of the last
	// Period (a sorted set in Redis, a ring in memory): exact at any instant,
	// memory proportional to Rate per key.
	SlidingLog
	// TokenBucket refills Rate tokens per Period into a bucket of Burst
	// tokens; an event takes one token.
	TokenBucket
	// GCRA is the generic cell rate algorithm: a token bucket kept as a
	// single theoretical arrival time, with emission interval Period / Rate
	// and burst tolerance Burst.
	GCRA
)

var algorithmNames = [...]string{"FixedWindow", "SlidingWindow", "SlidingLog", "TokenBucket", "GCRA"}

// Algorithms lists every Algorithm in declaration order.
func Algorithms() []Algorithm {
	return []Algorithm{FixedWindow, SlidingWindow, SlidingLog, TokenBucket, GCRA}
}

// String returns the constant's name, e.g. "SlidingWindow".
func (a Algorithm) String() string {
	if a.Valid() {
		return algorithmNames[a]
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Valid reports whether a is one of the declared algorithms.
func (a Algorithm) Valid() bool { return a >= 0 && int(a) < len(algorithmNames) }

// IsWindow reports whether a counts in windows (FixedWindow, SlidingWindow,
// SlidingLog) rather than in a bucket.
func (a Algorithm) IsWindow() bool { return a == FixedWindow || a == SlidingWindow || a == SlidingLog }

// ParseAlgorithm returns the Algorithm named s, matching String's names
// case-insensitively, and also "fixed", "sliding", "log", "bucket", "gcra".
func ParseAlgorithm(s string) (Algorithm, error) {
	switch lower(s) {
	case "fixedwindow", "fixed", "fixed-window", "fixed_window":
		return FixedWindow, nil
	case "slidingwindow", "sliding", "sliding-window", "sliding_window":
		return SlidingWindow, nil
	case "slidinglog", "log", "sliding-log", "sliding_log":
		return SlidingLog, nil
	case "tokenbucket", "bucket", "token-bucket", "token_bucket":
		return TokenBucket, nil
	case "gcra":
		return GCRA, nil
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q", ErrInvalidAlgorithm, s)
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Decision is the outcome of one AllowN call.
type Decision struct {
	// Allowed reports whether the n events were admitted. Admission is
	// all-or-nothing: a denied decision consumed nothing.
	Allowed bool
	// Limit is the limit the decision was taken against.
	Limit Limit
	// Algorithm is the algorithm the decision was counted with. With Limit
	// it gives the key's capacity, Limit.Capacity(Algorithm): the scale of
	// Remaining and the quota SetHeaders advertises. Every limiter of this
	// module sets it; a Limiter elsewhere that leaves it zero reads as
	// FixedWindow, whose capacity is Rate.
	Algorithm Algorithm
	// Remaining is how many more events the key could take right after this
	// decision (never negative). For the window algorithms it is what is left
	// of Rate in the current window; for the buckets, the whole tokens left.
	Remaining int
	// RetryAfter is zero when Allowed. When denied it is the earliest time
	// after which the same request could be admitted if nothing else
	// happened in between; it is always > 0 for a denied decision.
	RetryAfter time.Duration
	// ResetAfter is, for FixedWindow and SlidingWindow, the time until the
	// end of the window the decision was counted in; for SlidingLog, until
	// the newest logged event leaves the log; for TokenBucket and GCRA, until
	// the bucket is full again.
	ResetAfter time.Duration
	// limits, for a limiter of several limits, is the state of each: see
	// Limits. One word, not a slice: a Decision of nine words is returned
	// in registers, a larger one through memory, which costs every
	// decision of every limiter about 10ns.
	limits *[]LimitState
}

// Limits returns, for a decision of a limiter of several limits (a
// MultiLimiter, or Combine), the state of each limit in the limiter's
// order; the other fields describe the tightest of them, and headers can
// list every policy. It returns nil for a limiter of one limit. The slice
// is the one the limiter filled (a buffer given to AllowNInto, say), not a
// copy.
func (d Decision) Limits() []LimitState {
	if d.limits == nil {
		return nil
	}
	return *d.limits
}

// FailureMode selects what a Redis-backed limiter decides when Redis does
// not answer in time (or the circuit breaker is open).
type FailureMode int

const (
	// FailLocal decides from memory with this instance's share of the limit
	// (Rate / instances) per window; the hybrid limiter reports what it
	// admitted to Redis when Redis is back. The default of the hybrid limiter.
	FailLocal FailureMode = iota
	// FailOpen allows every request.
	FailOpen
	// FailClosed denies every request that quota already held does not cover.
	FailClosed
)

// String returns "local", "open" or "closed".
func (f FailureMode) String() string {
	switch f {
	case FailLocal:
		return "local"
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "FailureMode(" + strconv.Itoa(int(f)) + ")"
}

// Valid reports whether f is one of the declared failure modes.
func (f FailureMode) Valid() bool { return f >= FailLocal && f <= FailClosed }

// Header names written by SetHeaders.
const (
	HeaderLimit      = "X-RateLimit-Limit"
	HeaderRemaining  = "X-RateLimit-Remaining"
	HeaderReset      = "X-RateLimit-Reset"
	HeaderRetryAfter = "Retry-After"
)

// SetHeaders writes d as the conventional rate-limit response headers:
// X-RateLimit-Limit (the key's capacity, d.Limit.Capacity(d.Algorithm): Rate
// for the window algorithms, Burst or Rate for the buckets),
// X-RateLimit-Remaining, X-RateLimit-Reset (seconds until reset, rounded up)
// and, when d is denied, Retry-After (seconds, rounded up, at least 1).
func SetHeaders(h http.Header, d Decision) {
	h.Set(HeaderLimit, strconv.Itoa(d.Limit.Capacity(d.Algorithm)))
	h.Set(HeaderRemaining, strconv.Itoa(max(d.Remaining, 0)))
	h.Set(HeaderReset, strconv.FormatInt(ceilSeconds(d.ResetAfter), 10))
	if !d.Allowed {
		h.Set(HeaderRetryAfter, strconv.FormatInt(max(ceilSeconds(d.RetryAfter), 1), 10))
	} else {
		h.Del(HeaderRetryAfter)
	}
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// Limiter decides whether events may happen now. Every limiter in the
// local, global and hybrid packages implements it.
type Limiter interface {
	// AllowN reports whether n events for key may happen now and, if so,
	// consumes them. It returns an error for invalid input (wrapping
	// ErrInvalidKey or ErrInvalidN), after Close (ErrClosed), or when the
	// limiter cannot decide (for example a Redis error).
	AllowN(ctx context.Context, key string, n int) (Decision, error)
}

// Errors returned by the limiters. Test with errors.Is: returned errors wrap
// these with detail.
var (
	// ErrInvalidLimit: a Limit that cannot be enforced (see Limit.Validate).
	ErrInvalidLimit = errors.New("ratelimit: invalid limit")
	// ErrInvalidAlgorithm: an unknown Algorithm, or one a limiter does not support.
	ErrInvalidAlgorithm = errors.New("ratelimit: invalid algorithm")
	// ErrInvalidKey: an empty key.
	ErrInvalidKey = errors.New("ratelimit: invalid key")
	// ErrInvalidN: n <= 0, or n above the Limit's capacity (Rate for the
	// window algorithms, Burst for the buckets), which could never be admitted.
	ErrInvalidN = errors.New("ratelimit: invalid n")
	// ErrInvalidOption: an option with a value out of range.
	ErrInvalidOption = errors.New("ratelimit: invalid option")
	// ErrClosed: the limiter was closed.
	ErrClosed = errors.New("ratelimit: limiter closed")
)
