package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/httplimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/local"
)

func newLocal(t *testing.T, limit ratelimit.Limit) *counting {
	t.Helper()
	lim, err := local.New(limit, local.WithAlgorithm(ratelimit.FixedWindow))
	require.NoError(t, err)
	return &counting{Limiter: lim}
}

// requireError checks an answer of the default error handler and the event
// the observer got for it.
func requireError(t *testing.T, r response, rec *recorded, status int, code string, is ...error) {
	t.Helper()
	require.Equal(t, status, r.status, "body %q", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.JSONEq(t, `{"error":"`+code+`"}`, r.body)
	require.Empty(t, r.header.Get("X-RateLimit-Remaining"), "no decision, no rate-limit headers")
	ev := rec.last(t)
	require.Equal(t, httplimit.OutcomeError, ev.Outcome)
	require.Equal(t, ratelimit.Decision{}, ev.Decision)
	for _, target := range is {
		require.ErrorIs(t, ev.Err, target)
	}
	require.Zero(t, rec.served.Load(), "a request without a decision must not be served")
}

func TestErrorKey(t *testing.T) {
	lim := newLocal(t, ratelimit.PerMinute(10))
	srv, rec := serve(t, lim, httplimit.WithKey(httplimit.Header("X-API-Key")))
	requireError(t, get(t, srv), rec, http.StatusBadRequest, "rate_limit_key_invalid", httplimit.ErrKey)
	require.ErrorContains(t, rec.last(t).Err, "header X-Api-Key missing or empty")
	require.Zero(t, lim.calls.Load(), "the limiter is not asked without a key")

	// A custom KeyFunc's error (wrapped, still in the chain), and an empty
	// key with no error.
	lookup := errors.New("user store down")
	srv, rec = serve(t, lim, httplimit.WithKey(func(*http.Request) (string, error) { return "", lookup }))
	requireError(t, get(t, srv), rec, http.StatusBadRequest, "rate_limit_key_invalid", httplimit.ErrKey, lookup)
	srv, rec = serve(t, lim, httplimit.WithKey(func(*http.Request) (string, error) { return "", nil }))
	requireError(t, get(t, srv), rec, http.StatusBadRequest, "rate_limit_key_invalid", httplimit.ErrKey)
	require.ErrorContains(t, rec.last(t).Err, "empty key")
	require.Zero(t, lim.calls.Load())
}

// A KeyFunc built from bad arguments is a configuration error: 500.
func TestErrorKeyMisconfigured(t *testing.T) {
	srv, rec := serve(t, newLocal(t, ratelimit.PerMinute(10)), httplimit.WithKey(httplimit.Header("")))
	requireError(t, get(t, srv, "X-API-Key", "k"), rec, http.StatusInternalServerError, "rate_limit_misconfigured",
		httplimit.ErrKey, ratelimit.ErrInvalidOption)
}

// A cost the limiter rejects: 500, the limiter's ErrInvalidN in the chain.
func TestErrorCost(t *testing.T) {
	for _, cost := range []int{0, -1, 11} {
		lim := newLocal(t, ratelimit.PerMinute(10))
		srv, rec := serve(t, lim, httplimit.WithCost(func(*http.Request) int { return cost }))
		requireError(t, get(t, srv), rec, http.StatusInternalServerError, "rate_limit_misconfigured",
			httplimit.ErrLimiter, ratelimit.ErrInvalidN)
		require.Equal(t, cost, rec.last(t).Cost)
	}
}

// A closed limiter (a service shutting down): 503, fail closed.
func TestErrorClosedLimiter(t *testing.T) {
	redis := redistest.Standalone(t)
	client := redis.Client()
	t.Cleanup(func() { client.Close() })
	lim, err := hybrid.New(client, ratelimit.PerMinute(10), hybrid.WithPrefix(uniq(t)))
	require.NoError(t, err)
	require.NoError(t, lim.Close())
	srv, rec := serve(t, lim)
	requireError(t, get(t, srv), rec, http.StatusServiceUnavailable, "rate_limiter_unavailable",
		httplimit.ErrLimiter, ratelimit.ErrClosed)
	require.Equal(t, "127.0.0.1", rec.last(t).Key)
}

// A global limiter without a failure mode returns Redis errors: with Redis
// gone the request is answered 503, not served.
func TestErrorRedisDown(t *testing.T) {
	redis := redistest.Standalone(t)
	client := redis.Client()
	t.Cleanup(func() { client.Close() })
	lim, err := global.New(client, ratelimit.PerMinute(10), global.WithPrefix(uniq(t)))
	require.NoError(t, err)
	srv, rec := serve(t, lim)
	require.Equal(t, http.StatusOK, get(t, srv).status)
	redis.Kill()
	rec.served.Store(0)
	requireError(t, get(t, srv), rec, http.StatusServiceUnavailable, "rate_limiter_unavailable", httplimit.ErrLimiter)
	require.NotErrorIs(t, rec.last(t).Err, httplimit.ErrCanceled)
}

// withContext runs h with the request's context replaced by the one mk
// derives: how a client that went away, or a server-side deadline, looks to
// the middleware.
func withContext(h http.Handler, mk func(context.Context) (context.Context, context.CancelFunc)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := mk(r.Context())
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// A request whose context has ended is not decided (no quota spent) and
// not served.
func TestErrorCanceledBefore(t *testing.T) {
	lim := newLocal(t, ratelimit.PerMinute(10))
	rec := &recorded{}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { rec.served.Add(1) })
	mw := httplimit.New(lim, httplimit.WithObserver(rec.observe))(next)
	srv := httptest.NewServer(withContext(mw, func(ctx context.Context) (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		return ctx, cancel
	}))
	t.Cleanup(srv.Close)
	requireError(t, get(t, srv), rec, http.StatusServiceUnavailable, "request_canceled",
		httplimit.ErrCanceled, context.Canceled)
	require.Zero(t, lim.calls.Load(), "a canceled request spends no quota")
}

// A request whose context ends while the limiter waits on Redis (frozen):
// the limiter's error is reported as ErrCanceled.
func TestErrorCanceledDuring(t *testing.T) {
	redis := redistest.Standalone(t)
	client := redis.Client()
	t.Cleanup(func() { client.Close() })
	lim, err := hybrid.New(client, ratelimit.PerMinute(10), hybrid.WithPrefix(uniq(t)),
		hybrid.WithInstances(1), hybrid.WithTimeout(10*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = lim.Close() })
	require.NoError(t, redis.Freeze())
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			_ = redis.Thaw()
		}
	})

	rec := &recorded{}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { rec.served.Add(1) })
	mw := httplimit.New(lim, httplimit.WithObserver(rec.observe))(next)
	srv := httptest.NewServer(withContext(mw, func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, 200*time.Millisecond)
	}))
	t.Cleanup(srv.Close)
	requireError(t, get(t, srv), rec, http.StatusServiceUnavailable, "request_canceled",
		httplimit.ErrCanceled, context.DeadlineExceeded)
	require.NoError(t, redis.Thaw())
	thawed = true
}

func TestMisconfigured(t *testing.T) {
	lim := newLocal(t, ratelimit.PerMinute(10))
	for name, c := range map[string]struct {
		lim  ratelimit.Limiter
		opts []httplimit.Option
	}{
		"nil limiter":               {nil, nil},
		"nil option":                {lim, []httplimit.Option{nil}},
		"WithKey(nil)":              {lim, []httplimit.Option{httplimit.WithKey(nil)}},
		"WithCost(nil)":             {lim, []httplimit.Option{httplimit.WithCost(nil)}},
		"WithPolicyName empty":      {lim, []httplimit.Option{httplimit.WithPolicyName("")}},
		"WithPolicyName non-ASCII":  {lim, []httplimit.Option{httplimit.WithPolicyName("café")}},
		"WithPolicyName newline":    {lim, []httplimit.Option{httplimit.WithPolicyName("a\nb")}},
		"WithPolicyName too long":   {lim, []httplimit.Option{httplimit.WithPolicyName(string(make([]byte, 65)))}},
		"WithQuota(0)":              {lim, []httplimit.Option{httplimit.WithQuota(0)}},
		"WithHeaders unknown":       {lim, []httplimit.Option{httplimit.WithHeaders(0x80)}},
		"WithDeniedHandler(nil)":    {lim, []httplimit.Option{httplimit.WithDeniedHandler(nil)}},
		"WithErrorHandler(nil)":     {lim, []httplimit.Option{httplimit.WithErrorHandler(nil)}},
		"WithObserver(nil)":         {lim, []httplimit.Option{httplimit.WithObserver(nil)}},
		"bad option after good one": {lim, []httplimit.Option{httplimit.WithQuota(5), httplimit.WithQuota(-5)}},
	} {
		t.Run(name, func(t *testing.T) {
			err := httplimit.Validate(c.lim, c.opts...)
			require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
			// serve's observer comes first, so it survives a bad option.
			srv, rec := serve(t, c.lim, c.opts...)
			requireError(t, get(t, srv), rec, http.StatusInternalServerError, "rate_limit_misconfigured", ratelimit.ErrInvalidOption)
		})
	}
	require.Zero(t, lim.calls.Load())
	require.NoError(t, httplimit.Validate(lim, httplimit.WithPolicyName(`a"b\c`), httplimit.WithHeaders(0), httplimit.WithQuota(1)))
}

// The hooks replace the default answers and get what they need.
func TestHooks(t *testing.T) {
	lim := newLocal(t, ratelimit.PerMinute(1))
	var gotDecision ratelimit.Decision
	var gotErr error
	srv, _ := serve(t, lim,
		httplimit.WithKey(httplimit.Header("X-User")),
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, d ratelimit.Decision) {
			gotDecision = d
			require.NotEmpty(t, w.Header().Get("Retry-After"), "headers are set before the denied handler runs")
			w.WriteHeader(http.StatusServiceUnavailable)
		}),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			gotErr = err
			w.WriteHeader(http.StatusUnauthorized)
		}))
	require.Equal(t, http.StatusOK, get(t, srv, "X-User", "u").status)
	r := get(t, srv, "X-User", "u")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.False(t, gotDecision.Allowed)
	require.Positive(t, gotDecision.RetryAfter)
	require.Equal(t, http.StatusUnauthorized, get(t, srv).status)
	require.ErrorIs(t, gotErr, httplimit.ErrKey)
}

// Shadow mode serves everything, denied or failed, and still reports each
// outcome and writes the headers (but not Retry-After).
func TestShadow(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	lim, err := local.New(ratelimit.PerMinute(2), local.WithAlgorithm(ratelimit.FixedWindow), local.WithClock(func() time.Time { return now }))
	require.NoError(t, err)
	srv, rec := serve(t, lim, httplimit.WithShadow(), httplimit.WithKey(httplimit.Header("X-User")))
	for i := 0; i < 5; i++ {
		r := get(t, srv, "X-User", "u")
		require.Equal(t, http.StatusOK, r.status, "request %d", i)
		require.Equal(t, "served", r.body)
		ev := rec.last(t)
		require.Equal(t, max(1-i, 0), ev.Decision.Remaining)
		require.Equal(t, i >= 2, !ev.Decision.Allowed)
		require.Empty(t, r.header.Get("Retry-After"))
		checkHeaders(t, r, ev.Decision, 2, "default")
	}
	require.Equal(t, 2, rec.count(httplimit.OutcomeAllowed))
	require.Equal(t, 3, rec.count(httplimit.OutcomeShadowDenied))
	require.Zero(t, rec.count(httplimit.OutcomeDenied))

	// Failures are served too, and reported.
	r := get(t, srv) // no X-User
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, httplimit.OutcomeError, rec.last(t).Outcome)
	require.ErrorIs(t, rec.last(t).Err, httplimit.ErrKey)
	require.EqualValues(t, 6, rec.served.Load())

	srv, rec = serve(t, nil, httplimit.WithShadow())
	require.Equal(t, http.StatusOK, get(t, srv).status, "shadow mode never blocks, even misconfigured")
	require.ErrorIs(t, rec.last(t).Err, ratelimit.ErrInvalidOption)
}
