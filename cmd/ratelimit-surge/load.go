package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/hybrid"
)

// tally counts requests per client and window (the window index is the
// Unix time divided by the period). Windows outside the phase's range are
// counted apart.
type tally struct {
	clients int
	first   int64 // the first window index held
	windows int
	n       []atomic.Int32
	outside atomic.Int64
}

func newTally(clients int, period time.Duration, from time.Time, span time.Duration) *tally {
	windows := int(span/period) + 4
	return &tally{
		clients: clients,
		first:   from.UnixNano()/int64(period) - 1,
		windows: windows,
		n:       make([]atomic.Int32, clients*windows),
	}
}

func (t *tally) add(client int, window int64) {
	w := window - t.first
	if client < 0 || client >= t.clients || w < 0 || w >= int64(t.windows) {
		t.outside.Add(1)
		return
	}
	t.n[client*t.windows+int(w)].Add(1)
}

// windowSummary is what a tally says about the clients against the limit.
type windowSummary struct {
	total  int64 // requests tallied
	max    int   // the most one client had in one window
	active int   // client-windows with a request
	above  int   // client-windows above the limit
}

func (t *tally) summary(limit int) windowSummary {
	var s windowSummary
	for i := range t.n {
		n := int(t.n[i].Load())
		s.total += int64(n)
		s.max = max(s.max, n)
		if n > 0 {
			s.active++
		}
		if n > limit {
			s.above++
		}
	}
	return s
}

// phaseResult is what one phase measured.
type phaseResult struct {
	name     string
	elapsed  time.Duration // how long the clients sent
	requests int64
	served   int64 // 2xx
	denied   int64 // 429
	failed   int64 // anything else: 503 from the backend, 502, timeouts, errors
	firstErr string

	servedLat []time.Duration // sorted
	deniedLat []time.Duration // sorted
	perSecond []secondCounts  // answers by the second of the phase they came in

	backendServed int64 // requests the backend served while the clients sent

	windows        windowSummary
	outsideWindows int64
	stats          hybrid.Stats
	commands       int64 // Redis commands the limiters sent
	limiterErrs    int64 // requests the middleware could not decide
	firstLimiter   string
}

// recorder collects the answers of one phase.
type recorder struct {
	requests, served, denied, failed atomic.Int64
	start                            time.Time // when the clients began sending

	mu        sync.Mutex
	servedLat []time.Duration
	deniedLat []time.Duration
	perSecond []secondCounts // by the second of the phase the answer came in
	firstErr  string
}

// secondCounts are the answers that came in during one second of a phase.
type secondCounts struct{ served, denied, failed int64 }

// second returns the counts of the second the phase is in now; r.mu held.
func (r *recorder) second() *secondCounts {
	i := max(int(time.Since(r.start)/time.Second), 0)
	for len(r.perSecond) <= i {
		r.perSecond = append(r.perSecond, secondCounts{})
	}
	return &r.perSecond[i]
}

func (r *recorder) record(status int, lat time.Duration, err error) {
	r.requests.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil && status >= 200 && status < 300:
		r.served.Add(1)
		r.servedLat = append(r.servedLat, lat)
		r.second().served++
	case err == nil && status == http.StatusTooManyRequests:
		r.denied.Add(1)
		r.deniedLat = append(r.deniedLat, lat)
		r.second().denied++
	default:
		r.failed.Add(1)
		r.second().failed++
		if err != nil && r.firstErr == "" {
			r.firstErr = err.Error()
		}
	}
}

// runPhase starts a fleet, lets the clients send for cfg.duration, waits
// for every answer, and returns what it measured.
func runPhase(ctx context.Context, cfg config, name string, newClient func() redis.UniversalClient, prefix string, out io.Writer) (res phaseResult, err error) {
	res = phaseResult{name: name}
	start := time.Now()
	t := newTally(cfg.clients, cfg.period, start, cfg.duration+cfg.clientTimeout)
	f, err := startFleet(cfg, newClient, prefix, t)
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := f.close(); cerr != nil && err == nil {
			err = fmt.Errorf("%s: closing the fleet: %w", name, cerr)
		}
	}()

	tr := newTransport()
	defer tr.CloseIdleConnections()
	httpClient := &http.Client{Transport: tr}
	rec := &recorder{start: time.Now()}

	sendCtx, stopSending := context.WithTimeout(ctx, cfg.duration)
	defer stopSending()
	var inflight sync.WaitGroup
	var clients sync.WaitGroup
	start = time.Now()
	rec.mu.Lock()
	rec.start = start
	rec.mu.Unlock()
	for i := range cfg.clients {
		clients.Add(1)
		go func() {
			defer clients.Done()
			runClient(sendCtx, ctx, cfg, i, f.proxyURL, httpClient, rec, &inflight)
		}()
	}

	progress := time.NewTicker(cfg.progress)
	defer progress.Stop()
loop:
	for {
		select {
		case <-progress.C:
			el := time.Since(start)
			fmt.Fprintf(out, "  %-8s %5.0fs  requests %s  served %s  429 %s  failed %s  backend %s/s\n",
				name, el.Seconds(), commas(rec.requests.Load()), commas(rec.served.Load()),
				commas(rec.denied.Load()), commas(rec.failed.Load()),
				commas(int64(float64(f.backend.served.Load())/el.Seconds())))
		case <-sendCtx.Done():
			res.elapsed = time.Since(start)
			res.backendServed = f.backend.served.Load()
			break loop
		}
	}
	clients.Wait()
	inflight.Wait() // every request gets its answer or its timeout
	if err := ctx.Err(); err != nil {
		return res, err
	}

	res.stats = f.stats()
	res.commands = f.sent.Commands()
	res.limiterErrs = f.limiterErrs.Load()
	if p := f.firstLimiter.Load(); p != nil {
		res.firstLimiter = *p
	}
	res.requests, res.served, res.denied, res.failed = rec.requests.Load(), rec.served.Load(), rec.denied.Load(), rec.failed.Load()
	res.firstErr = rec.firstErr
	res.servedLat, res.deniedLat, res.perSecond = rec.servedLat, rec.deniedLat, rec.perSecond
	slices.Sort(res.servedLat)
	slices.Sort(res.deniedLat)
	res.windows = t.summary(cfg.bound())
	res.outsideWindows = t.outside.Load()
	return res, nil
}

// runClient is one client: it sends a request after a think time drawn from
// an exponential distribution of mean cfg.think (so the clients together
// are a Poisson stream), and again, until sendCtx ends. It does not wait for
// an answer before the next request, as an app polling on a timer does not:
// a slow backend does not slow the surge down. Each request gives up after
// clientTimeout, or when ctx (the whole run) ends.
func runClient(sendCtx, ctx context.Context, cfg config, id int, url string, c *http.Client, rec *recorder, inflight *sync.WaitGroup) {
	rng := rand.New(rand.NewPCG(cfg.seed, uint64(id)))
	think := func() time.Duration { return time.Duration(rng.ExpFloat64() * float64(cfg.think)) }
	timer := time.NewTimer(think())
	defer timer.Stop()
	user := clientName(id)
	for {
		select {
		case <-sendCtx.Done():
			return
		case <-timer.C:
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			send(ctx, cfg.clientTimeout, url, user, c, rec)
		}()
		timer.Reset(think())
	}
}

func send(ctx context.Context, timeout time.Duration, url, user string, c *http.Client, rec *recorder) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		rec.record(0, 0, err)
		return
	}
	req.Header.Set(userHeader, user)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		rec.record(0, time.Since(start), err)
		return
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rec.record(resp.StatusCode, time.Since(start), err)
}
