package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"sync/atomic"

	"github.com/hybridlimit/ratelimit"
)

// Errors the middleware passes to the observer and the error handler. Each
// wraps the underlying error too, so errors.Is also matches, for example,
// ratelimit.ErrClosed or context.Canceled.
var (
	// ErrKey: the KeyFunc failed or returned an empty key.
	ErrKey = errors.New("httplimit: cannot key the request")
	// ErrCanceled: the request's context ended before the decision.
	ErrCanceled = errors.New("httplimit: request ended before the decision")
	// ErrLimiter: the limiter returned an error.
	ErrLimiter = errors.New("httplimit: limiter failed")
)

// Outcome is what the middleware did with a request.
type Outcome int

const (
	// OutcomeAllowed: the limiter allowed the request; it was served.
	OutcomeAllowed Outcome = iota + 1
	// OutcomeDenied: the limiter denied the request; it was answered by the
	// denied handler (429 by default).
	OutcomeDenied
	// OutcomeShadowDenied: the limiter denied the request, but in shadow
	// mode it was served.
	OutcomeShadowDenied
	// OutcomeError: no decision could be taken (Event.Err says why). The
	// error handler answered, or in shadow mode the request was served.
	OutcomeError
)

// String returns "allowed", "denied", "shadow-denied" or "error".
func (o Outcome) String() string {
	switch o {
	case OutcomeAllowed:
		return "allowed"
	case OutcomeDenied:
		return "denied"
	case OutcomeShadowDenied:
		return "shadow-denied"
	case OutcomeError:
		return "error"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Event is what the observer registered with WithObserver learns about one
// request.
//
// For a ratelimit.MultiLimiter, Decision.Limits lists the state of every
// limit in a buffer the middleware reuses for a later request once the
// observer (and, for a denied request, the DeniedHandler) has returned: an
// observer that keeps the states past its return copies them
// (slices.Clone(e.Decision.Limits())).
type Event struct {
	Outcome  Outcome
	Policy   string             // the policy name (WithPolicyName)
	Key      string             // the key; empty when it could not be derived
	Cost     int                // the n asked of the limiter; 0 when it was not asked
	Decision ratelimit.Decision // the limiter's decision; zero for OutcomeError
	Err      error              // why no decision was taken, for OutcomeError
}

// A DeniedHandler answers a request the limiter denied. The rate-limit
// headers, Retry-After included, are already set on w when it is called.
// d.Limits, for a ratelimit.MultiLimiter, is valid until it returns (see
// Event).
type DeniedHandler func(w http.ResponseWriter, r *http.Request, d ratelimit.Decision)

// An ErrorHandler answers a request for which no decision could be taken;
// err wraps ErrKey, ErrCanceled, ErrLimiter or ratelimit.ErrInvalidOption
// (see the package documentation for the default answers).
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

// New returns middleware that limits the requests of the handlers it wraps
// with l, configured by opts (see the package documentation for the
// defaults).
//
// New never panics. If l is nil or an option is invalid, the middleware
// answers every request through the error handler with an error wrapping
// ratelimit.ErrInvalidOption (500 by default) and reports it to the observer:
// a misconfigured limit does not silently become no limit. Validate reports
// the same error at start-up.
func New(l ratelimit.Limiter, opts ...Option) func(http.Handler) http.Handler {
	m := newMiddleware(l, opts)
	return func(next http.Handler) http.Handler {
		return &handler{m: m, next: next}
	}
}

// Validate returns the configuration error with which New's middleware would
// answer every request, or nil.
func Validate(l ratelimit.Limiter, opts ...Option) error {
	return newMiddleware(l, opts).err
}

type middleware struct {
	config
	limiter ratelimit.Limiter
	err     error // configuration error, answered to every request

	// multi is limiter when it is a ratelimit.MultiLimiter: its decisions
	// are taken with AllowNInto into a pooled buffer.
	multi ratelimit.MultiLimiter

	// strings derived from the last Limit seen (see policyStrings), and from
	// the last limits of a decision of several (see multiStrings)
	static  atomic.Pointer[policyStrings]
	mstatic atomic.Pointer[multiStrings]
}

func newMiddleware(l ratelimit.Limiter, opts []Option) *middleware {
	m := &middleware{config: defaultConfig(), limiter: l}
	if isNil(l) {
		m.err = fmt.Errorf("%w: httplimit: nil Limiter", ratelimit.ErrInvalidOption)
	}
	for i, o := range opts {
		var err error
		if o == nil {
			err = fmt.Errorf("%w: httplimit: option %d is nil", ratelimit.ErrInvalidOption, i)
		} else {
			err = o.apply(&m.config)
		}
		if err != nil && m.err == nil {
			m.err = err
		}
	}
	m.quotedName = quoteString(m.name)
	if ml, ok := l.(ratelimit.MultiLimiter); ok && m.err == nil {
		m.multi = ml
		n := len(ml.Limits())
		switch {
		case m.names != nil && len(m.names) != n:
			m.err = invalid("WithPolicyNames gives %d names for a MultiLimiter of %d limits", len(m.names), n)
		case m.quota != 0 && n > 1:
			m.err = invalid("WithQuota(%d) with a MultiLimiter of %d limits: each limit's policy advertises its own capacity", m.quota, n)
		}
	}
	return m
}

// isNil reports whether l is nil, or a nil pointer (or map, func, ...) in a
// Limiter, whose methods would panic.
func isNil(l ratelimit.Limiter) bool {
	if l == nil {
		return true
	}
	switch v := reflect.ValueOf(l); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return v.IsNil()
	}
	return false
}

type handler struct {
	m    *middleware
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	ev := Event{Policy: m.name}
	if m.err != nil {
		ev.Err = m.err
		m.fail(h.next, w, r, ev)
		return
	}
	key, err := m.key(r)
	if err == nil && key == "" {
		err = errors.New("the key function returned an empty key")
	}
	if err != nil {
		if !errors.Is(err, ErrKey) {
			err = fmt.Errorf("%w: %w", ErrKey, err)
		}
		ev.Err = err
		m.fail(h.next, w, r, ev)
		return
	}
	ev.Key = key
	ctx := r.Context()
	if err := ctx.Err(); err != nil {
		ev.Err = fmt.Errorf("%w: %w", ErrCanceled, err)
		m.fail(h.next, w, r, ev)
		return
	}
	ev.Cost = 1
	if m.cost != nil {
		ev.Cost = m.cost(r)
	}
	var (
		d      ratelimit.Decision
		states *[]ratelimit.LimitState
	)
	if m.multi != nil {
		states = statesPool.Get().(*[]ratelimit.LimitState)
		d, err = m.multi.AllowNInto(ctx, key, ev.Cost, states)
	} else {
		d, err = m.limiter.AllowN(ctx, key, ev.Cost)
	}
	if err != nil {
		if states != nil {
			statesPool.Put(states)
		}
		if ctx.Err() != nil {
			ev.Err = fmt.Errorf("%w: %w", ErrCanceled, err)
		} else {
			ev.Err = fmt.Errorf("%w: %w", ErrLimiter, err)
		}
		m.fail(h.next, w, r, ev)
		return
	}
	ev.Decision = d
	switch {
	case d.Allowed:
		ev.Outcome = OutcomeAllowed
	case m.shadow:
		ev.Outcome = OutcomeShadowDenied
	default:
		ev.Outcome = OutcomeDenied
	}
	m.writeHeaders(w.Header(), d, ev.Outcome == OutcomeDenied)
	if m.observer != nil {
		m.observer(r, ev)
	}
	if ev.Outcome == OutcomeDenied {
		m.denied(w, r, d)
	}
	if states != nil {
		// Decision.Limits is *states: no one may read it from here on.
		statesPool.Put(states)
	}
	if ev.Outcome != OutcomeDenied {
		h.next.ServeHTTP(w, r)
	}
}

// fail reports a request without a decision and answers it with the error
// handler, or in shadow mode serves it.
func (m *middleware) fail(next http.Handler, w http.ResponseWriter, r *http.Request, ev Event) {
	ev.Outcome = OutcomeError
	if m.observer != nil {
		m.observer(r, ev)
	}
	if m.shadow {
		next.ServeHTTP(w, r)
		return
	}
	m.onError(w, r, ev.Err)
}

// DefaultDenied is the DeniedHandler used unless WithDeniedHandler replaces
// it: 429 Too Many Requests with Content-Type application/json and the body
// {"error":"rate_limit_exceeded","retry_after":N}, N being Retry-After's
// seconds.
func DefaultDenied(w http.ResponseWriter, _ *http.Request, d ratelimit.Decision) {
	var buf [64]byte
	b := append(buf[:0], `{"error":"rate_limit_exceeded","retry_after":`...)
	b = strconv.AppendInt(b, retryAfterSeconds(d.RetryAfter), 10)
	b = append(b, "}\n"...)
	writeJSON(w, http.StatusTooManyRequests, b)
}

// DefaultError is the ErrorHandler used unless WithErrorHandler replaces it.
// It answers with a JSON body {"error":"<code>"} and the status of the
// package documentation's table: 400 rate_limit_key_invalid for ErrKey, 500
// rate_limit_misconfigured for ratelimit.ErrInvalidOption and
// ratelimit.ErrInvalidN, 503 request_canceled for ErrCanceled and 503
// rate_limiter_unavailable for any other error. The body never carries the
// error's text, which may name internal addresses; log it from the observer.
func DefaultError(w http.ResponseWriter, _ *http.Request, err error) {
	status, code := http.StatusServiceUnavailable, "rate_limiter_unavailable"
	switch {
	case errors.Is(err, ratelimit.ErrInvalidOption), errors.Is(err, ratelimit.ErrInvalidN):
		status, code = http.StatusInternalServerError, "rate_limit_misconfigured"
	case errors.Is(err, ErrKey):
		status, code = http.StatusBadRequest, "rate_limit_key_invalid"
	case errors.Is(err, ErrCanceled):
		status, code = http.StatusServiceUnavailable, "request_canceled"
	}
	writeJSON(w, status, []byte(`{"error":"`+code+`"}`+"\n"))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
