package httplimit_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/httplimit"
)

// recorded keeps every event the middleware reports and counts the requests
// the wrapped handler served.
type recorded struct {
	mu     sync.Mutex
	events []httplimit.Event
	states [][]ratelimit.LimitState // a copy of each event's Decision.Limits
	served atomic.Int64
}

// observe keeps e, and a copy of its Decision.Limits: the middleware reuses
// that buffer once the observer returns.
func (rec *recorded) observe(_ *http.Request, e httplimit.Event) {
	rec.mu.Lock()
	rec.events = append(rec.events, e)
	rec.states = append(rec.states, slices.Clone(e.Decision.Limits()))
	rec.mu.Unlock()
}

// lastStates returns the copy of the last event's Decision.Limits.
func (rec *recorded) lastStates(t *testing.T) []ratelimit.LimitState {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.NotEmpty(t, rec.states, "no event observed")
	return rec.states[len(rec.states)-1]
}

func (rec *recorded) all() []httplimit.Event {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]httplimit.Event(nil), rec.events...)
}

func (rec *recorded) last(t *testing.T) httplimit.Event {
	t.Helper()
	ev := rec.all()
	require.NotEmpty(t, ev, "no event observed")
	return ev[len(ev)-1]
}

func (rec *recorded) count(o httplimit.Outcome) int {
	n := 0
	for _, e := range rec.all() {
		if e.Outcome == o {
			n++
		}
	}
	return n
}

// serve starts a real HTTP server running the middleware over l around a
// handler that answers 200 "served"; the observer records into the returned
// recorded (options given later may override it).
func serve(t *testing.T, l ratelimit.Limiter, opts ...httplimit.Option) (*httptest.Server, *recorded) {
	t.Helper()
	rec := &recorded{}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.served.Add(1)
		_, _ = io.WriteString(w, "served")
	})
	opts = append([]httplimit.Option{httplimit.WithObserver(rec.observe)}, opts...)
	srv := httptest.NewServer(httplimit.New(l, opts...)(next))
	t.Cleanup(srv.Close)
	return srv, rec
}

type response struct {
	status int
	header http.Header
	body   string
	before time.Time // just before the request was sent
	after  time.Time // just after the answer came
}

// get sends GET / with the given header pairs through a real http.Client.
func get(t *testing.T, srv *httptest.Server, headerPairs ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headerPairs); i += 2 {
		req.Header.Add(headerPairs[i], headerPairs[i+1])
	}
	before := time.Now()
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: string(body), before: before, after: time.Now()}
}

func uniq(t *testing.T) string {
	return t.Name() + "-" + time.Now().Format("150405.000000000")
}

// counting wraps a limiter and counts the calls that reach it.
type counting struct {
	ratelimit.Limiter
	calls atomic.Int64
}

func (c *counting) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	c.calls.Add(1)
	return c.Limiter.AllowN(ctx, key, n)
}

// recorder is the cheapest ResponseWriter: it keeps one header map, cleared
// between requests as a server's would be new, so that a benchmark counts what
// the middleware allocates, not what httptest.ResponseRecorder does.
type recorder struct {
	h      http.Header
	status int
}

func (w *recorder) Header() http.Header         { return w.h }
func (w *recorder) Write(p []byte) (int, error) { return len(p), nil }
func (w *recorder) WriteHeader(status int)      { w.status = status }
