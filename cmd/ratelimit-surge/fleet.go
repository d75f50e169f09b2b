package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/httplimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
)

const userHeader = "X-User-Id"

// fleet is one phase's system under load: API instances (real net/http
// servers on loopback) behind a round-robin reverse proxy, in front of one
// shared backend; with limiters, each instance runs the middleware over its
// own hybrid limiter, all sharing one quota per client in Redis.
type fleet struct {
	backend  *backend
	servers  []*http.Server
	proxyURL string
	limiters []*hybrid.Limiter
	clients  []redis.UniversalClient
	tally    *tally
	proxyTr  *http.Transport
	sent     rtcount.Hook // what the limiters sent Redis

	limiterErrs  atomic.Int64 // requests the middleware could not decide
	firstLimiter atomic.Pointer[string]
}

// startFleet starts the fleet; newClient is nil for the phase without
// limiters.
func startFleet(cfg config, newClient func() redis.UniversalClient, prefix string, t *tally) (f *fleet, err error) {
	f = &fleet{backend: newBackend(cfg.workers, cfg.service, cfg.queueTimeout), tally: t}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := f.backend.do(r.Context()); err != nil {
			// A fixed text: a server's own error strings are not for clients.
			http.Error(w, "service unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, `{"ride":"matched"}`)
	})
	targets := make([]*url.URL, cfg.instances)
	for i := range cfg.instances {
		var h http.Handler
		if newClient == nil {
			h = f.countArrivals(api, cfg.period)
		} else {
			c := newClient()
			rtcount.Attach(c, &f.sent)
			f.clients = append(f.clients, c)
			lim, err := hybrid.New(c, cfg.rateLimit(),
				hybrid.WithAlgorithm(cfg.algorithm),
				hybrid.WithPrefix(prefix),
				hybrid.WithInstances(cfg.instances),
				hybrid.WithTimeout(cfg.timeout),
				hybrid.WithInstanceID(fmt.Sprintf("api-%d", i)))
			if err != nil {
				return f, fmt.Errorf("instance %d: %w", i, err)
			}
			f.limiters = append(f.limiters, lim)
			h = httplimit.New(lim,
				httplimit.WithKey(httplimit.Header(userHeader)),
				httplimit.WithPolicyName("per-rider"),
				httplimit.WithObserver(f.countAllowed(cfg.period, cfg.algorithm.IsWindow())))(api)
		}
		addr, err := f.serve(h)
		if err != nil {
			return f, err
		}
		targets[i] = &url.URL{Scheme: "http", Host: addr}
	}
	f.proxyTr = newTransport()
	var next atomic.Uint64
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(targets[next.Add(1)%uint64(len(targets))])
			pr.SetXForwarded()
		},
		Transport: f.proxyTr,
		ErrorLog:  log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	addr, err := f.serve(proxy)
	if err != nil {
		return f, err
	}
	f.proxyURL = "http://" + addr + "/api/rides"
	return f, nil
}

// serve runs h on a new loopback listener and returns its address.
func (f *fleet) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	f.servers = append(f.servers, srv)
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), nil
}

// newTransport keeps as many idle connections as there can be requests in
// flight: a surge must not churn through ephemeral ports.
func newTransport() *http.Transport {
	return &http.Transport{
		MaxIdleConns:        0, // no limit
		MaxIdleConnsPerHost: 100_000,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

// countArrivals tallies, without limiters, every request reaching an
// instance in the window of its arrival.
func (f *fleet) countArrivals(next http.Handler, period time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := clientIndex(r.Header.Get(userHeader)); ok {
			f.tally.add(id, time.Now().UnixNano()/int64(period))
		}
		next.ServeHTTP(w, r)
	})
}

// countAllowed tallies every request the limiter allowed in the window the
// limiter counted it in: for the window algorithms, the window that ends at
// now + ResetAfter (Redis's clock); for a bucket, which has no windows, the
// period the decision fell in.
func (f *fleet) countAllowed(period time.Duration, windows bool) func(*http.Request, httplimit.Event) {
	p := int64(period)
	return func(_ *http.Request, e httplimit.Event) {
		if e.Outcome == httplimit.OutcomeError {
			f.limiterErrs.Add(1)
			msg := e.Err.Error()
			f.firstLimiter.CompareAndSwap(nil, &msg)
		}
		if e.Outcome != httplimit.OutcomeAllowed {
			return
		}
		if id, ok := clientIndex(e.Key); ok {
			if !windows {
				f.tally.add(id, time.Now().UnixNano()/p)
				return
			}
			end := time.Now().Add(e.Decision.ResetAfter).UnixNano()
			f.tally.add(id, (end+p/2)/p-1)
		}
	}
}

func clientName(i int) string { return "rider-" + strconv.Itoa(i) }

func clientIndex(name string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(name, "rider-"))
	return n, err == nil
}

// stats sums the limiters' counters.
func (f *fleet) stats() hybrid.Stats {
	var s hybrid.Stats
	for _, l := range f.limiters {
		x := l.Stats()
		s.Decisions += x.Decisions
		s.Allowed += x.Allowed
		s.Denied += x.Denied
		s.LocalDecisions += x.LocalDecisions
		s.RoundTrips += x.RoundTrips
		s.SyncRoundTrips += x.SyncRoundTrips
		s.Fallback += x.Fallback
		s.FlushErrors += x.FlushErrors
		s.SpentSent += x.SpentSent
		s.SpentHeard += x.SpentHeard
		s.SpentDenied += x.SpentDenied
	}
	return s
}

// close stops the servers, then the limiters (which give their leases
// back), then the Redis clients.
func (f *fleet) close() error {
	var errs []error
	for _, s := range f.servers {
		errs = append(errs, s.Close())
	}
	if f.proxyTr != nil {
		f.proxyTr.CloseIdleConnections()
	}
	for _, l := range f.limiters {
		errs = append(errs, l.Close())
	}
	for _, c := range f.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
