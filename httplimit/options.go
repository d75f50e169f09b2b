package httplimit

import (
	"fmt"
	"net/http"

	"github.com/hybridlimit/ratelimit"
)

// DefaultPolicyName is the policy name of the RateLimit-Policy and RateLimit
// fields unless WithPolicyName sets one.
const DefaultPolicyName = "default"

// HeaderSet selects the response headers the middleware writes.
type HeaderSet uint8

const (
	// XRateLimit: X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset.
	XRateLimit HeaderSet = 1 << iota
	// RetryAfter: Retry-After on a denied response.
	RetryAfter
	// IETF: the RateLimit-Policy and RateLimit fields of
	// draft-ietf-httpapi-ratelimit-headers.
	IETF

	// AllHeaders is the default: every header above.
	AllHeaders = XRateLimit | RetryAfter | IETF
)

type config struct {
	key        KeyFunc
	cost       func(*http.Request) int
	shadow     bool
	name       string
	quotedName string   // name as a structured-field string, set by newMiddleware
	names      []string // WithPolicyNames: one per limit of a MultiLimiter
	quota      int      // 0: the decision's capacity
	headers    HeaderSet
	denied     DeniedHandler
	onError    ErrorHandler
	observer   func(*http.Request, Event)
}

func defaultConfig() config {
	return config{
		key:     ClientIP(),
		name:    DefaultPolicyName,
		headers: AllHeaders,
		denied:  DefaultDenied,
		onError: DefaultError,
	}
}

// An Option configures the middleware in New. Options are applied in order;
// a later one overrides an earlier one of the same kind.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: httplimit: "+format, append([]any{ratelimit.ErrInvalidOption}, args...)...)
}

// WithKey sets how a request is keyed: requests with the same key share one
// quota. The default is ClientIP() (the peer address, forwarding headers
// ignored). Header and Join build other keys.
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error {
		if k == nil {
			return invalid("WithKey(nil)")
		}
		c.key = k
		return nil
	})
}

// WithCost sets how many events a request counts for (the n of AllowN); the
// default is 1. A cost the limiter rejects (n <= 0, or above the limit's
// capacity) is a limiter error wrapping ratelimit.ErrInvalidN.
func WithCost(cost func(*http.Request) int) Option {
	return optionFunc(func(c *config) error {
		if cost == nil {
			return invalid("WithCost(nil)")
		}
		c.cost = cost
		return nil
	})
}

// WithShadow makes the middleware serve every request: it still decides,
// writes the rate-limit headers (but not Retry-After) and reports every
// outcome to the observer, denials as OutcomeShadowDenied and failures as
// OutcomeError, but neither the denied nor the error handler is called.
func WithShadow() Option {
	return optionFunc(func(c *config) error {
		c.shadow = true
		return nil
	})
}

// WithPolicyName names the policy in the RateLimit-Policy and RateLimit
// fields and in observer events (default DefaultPolicyName). With several
// limits it is the stem of each limit's policy name (see WithPolicyNames).
// The name must be 1 to 64 printable ASCII characters.
func WithPolicyName(name string) Option {
	return optionFunc(func(c *config) error {
		if err := checkPolicyName(name); err != nil {
			return err
		}
		c.name = name
		return nil
	})
}

// WithPolicyNames names the policy of each limit, in the limiter's order,
// for a ratelimit.MultiLimiter (or a Limiter whose decisions list several
// limits, Decision.Limits): the names of the RateLimit-Policy and
// RateLimit members. Without it each limit's name is derived from the
// policy name (WithPolicyName) and the limit's period: "default-1s",
// "default-60s", "default-86400s" (see the package documentation). Each
// name must be 1 to 64 printable ASCII characters, and the names distinct.
//
// For a MultiLimiter, the number of names must equal its number of limits,
// or the middleware is misconfigured (New and Validate report it). A
// decision of another Limiter that lists a different number of limits than
// names were given gets the derived names.
func WithPolicyNames(names ...string) Option {
	return optionFunc(func(c *config) error {
		if len(names) == 0 || len(names) > ratelimit.MaxLimits {
			return invalid("WithPolicyNames: want 1 to %d names, got %d", ratelimit.MaxLimits, len(names))
		}
		for i, n := range names {
			if err := checkPolicyName(n); err != nil {
				return err
			}
			for _, prev := range names[:i] {
				if prev == n {
					return invalid("WithPolicyNames: the name %q is given twice", n)
				}
			}
		}
		c.names = append([]string(nil), names...)
		return nil
	})
}

func checkPolicyName(name string) error {
	if name == "" || len(name) > 64 {
		return invalid("policy name %q must be 1 to 64 characters", name)
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 0x20 || name[i] > 0x7e {
			return invalid("policy name %q holds a character that is not printable ASCII", name)
		}
	}
	return nil
}

// WithQuota sets the quota advertised in X-RateLimit-Limit and in the q
// parameter of RateLimit-Policy instead of the default, the capacity of each
// decision, Decision.Limit.Capacity(Decision.Algorithm): Rate for the window
// algorithms, Burst (or Rate when Burst is 0) for TokenBucket and GCRA. It is
// for a Limiter that does not fill Decision.Algorithm, or a policy that
// advertises another number than the one Remaining counts down from.
//
// It is for a limiter of one limit: with a ratelimit.MultiLimiter of
// several limits the middleware is misconfigured (New and Validate report
// it), and a decision of another Limiter that lists several limits
// advertises each limit's own capacity, ignoring it.
func WithQuota(q int) Option {
	return optionFunc(func(c *config) error {
		if q <= 0 {
			return invalid("WithQuota(%d): the quota must be > 0", q)
		}
		c.quota = q
		return nil
	})
}

// WithHeaders selects the header sets written (default AllHeaders); 0 writes
// none.
func WithHeaders(s HeaderSet) Option {
	return optionFunc(func(c *config) error {
		if s&^AllHeaders != 0 {
			return invalid("WithHeaders(%#x): unknown header set", uint8(s))
		}
		c.headers = s
		return nil
	})
}

// WithDeniedHandler replaces DefaultDenied, the answer to a denied request.
func WithDeniedHandler(h DeniedHandler) Option {
	return optionFunc(func(c *config) error {
		if h == nil {
			return invalid("WithDeniedHandler(nil)")
		}
		c.denied = h
		return nil
	})
}

// WithErrorHandler replaces DefaultError, the answer to a request for which
// no decision could be taken.
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(c *config) error {
		if h == nil {
			return invalid("WithErrorHandler(nil)")
		}
		c.onError = h
		return nil
	})
}

// WithObserver registers fn to learn the outcome of every request: allowed,
// denied, shadow-denied or error, with the key and the decision; a metrics
// exporter counts them. fn runs on the request's goroutine, before the
// request is served or answered, and should return quickly.
func WithObserver(fn func(r *http.Request, e Event)) Option {
	return optionFunc(func(c *config) error {
		if fn == nil {
			return invalid("WithObserver(nil)")
		}
		c.observer = fn
		return nil
	})
}
