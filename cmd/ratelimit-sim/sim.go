package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/faultproxy"
	"github.com/hybridlimit/ratelimit/internal/rtcount"
)

// run parses args, runs the hybrid phase and the global phase, and prints
// their results side by side to stdout. It returns flag.ErrHelp for -h, an
// error for bad flags or an unreachable Redis, and ctx's error when ctx is
// cancelled (Ctrl-C) before both phases are done.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseArgs(args, stdout)
	if err != nil {
		return err
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	switch {
	case cfg.sweep:
		return sweep(ctx, cfg, stdout, commandLine(args))
	case cfg.multiRegion:
		return multiRegion(ctx, cfg, stdout, commandLine(args))
	}
	res, err := simulate(ctx, cfg, stdout)
	if err != nil {
		return err
	}
	printReport(stdout, cfg, res)
	if cfg.plotDir != "" {
		files, err := writeFigures(cfg.plotDir, runFigures(cfg, res, commandLine(args)))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "figures (with .svg and .json beside each): %s\n", strings.Join(files, " "))
	}
	return nil
}

// results are what simulate measured.
type results struct {
	backend  string
	embedded bool // the embedded miniredis, not a real Redis
	hybrid   phaseResult
	global   phaseResult
}

// epoch is the base of mono, the monotonic clock every measurement uses.
var epoch = time.Now()

func mono() int64 { return int64(time.Since(epoch)) }

// backend is the Redis the phases run against: the embedded miniredis or
// the --redis addresses, behind a fault proxy adding --redis-latency when
// asked.
type backend struct {
	addrs    []string // what the clients dial
	desc     string
	embedded bool
	baseUS   int64 // Redis server time, in microseconds since the epoch, at mono 0
	closers  []func()
}

func (b *backend) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// openBackend starts the embedded miniredis when no address is given, and
// a delaying proxy in front of Redis when latency > 0, and reads the
// server's time.
func openBackend(ctx context.Context, redisAddrs []string, latency time.Duration) (*backend, error) {
	b := &backend{addrs: redisAddrs}
	switch {
	case len(redisAddrs) == 0:
		mr, err := miniredis.Run()
		if err != nil {
			return nil, fmt.Errorf("embedded miniredis: %w", err)
		}
		b.closers = append(b.closers, mr.Close)
		b.addrs, b.embedded = []string{mr.Addr()}, true
		b.desc = "embedded miniredis (in-process, Lua interpreted in Go)"
	case len(redisAddrs) == 1:
		b.desc = "redis " + redisAddrs[0]
	default:
		b.desc = fmt.Sprintf("redis cluster %v", redisAddrs)
	}
	if latency > 0 {
		// One address (parseArgs refuses a Cluster with a latency: its
		// clients follow the nodes' own addresses, around any proxy).
		px, err := faultproxy.New(b.addrs[0])
		if err != nil {
			b.close()
			return nil, fmt.Errorf("latency proxy: %w", err)
		}
		px.SetDelay(latency / 2)
		b.closers = append(b.closers, func() { px.Close() })
		b.addrs = []string{px.Addr()}
		b.desc += fmt.Sprintf(", %v away (every round trip +%v, through internal/faultproxy)", latency, latency)
	}
	// Server time at mono 0, so that decisions are attributed to the
	// windows Redis counts in whatever this machine's clock says.
	probe, _ := newClient(b.addrs, 1)
	baseUS, err := serverBase(ctx, probe)
	probe.Close()
	if err != nil {
		b.close()
		return nil, fmt.Errorf("redis %v: %w", redisAddrs, err)
	}
	b.baseUS = baseUS
	return b, nil
}

func simulate(ctx context.Context, cfg config, out io.Writer) (*results, error) {
	be, err := openBackend(ctx, cfg.redisAddrs, cfg.redisLatency)
	if err != nil {
		return nil, err
	}
	defer be.close()
	res := &results{backend: be.desc, embedded: be.embedded}
	wl := newWorkload(cfg.keys, cfg.zipf)
	runID := fmt.Sprintf("%x", uint32(time.Now().UnixNano()))
	printHeader(out, cfg, res.backend, wl)

	// Phase 1: the hybrid fleet. Each phase's goroutines carry the label
	// phase (hybrid, global) in --cpuprofile: go tool pprof -tagfocus.
	pprof.Do(ctx, pprof.Labels("phase", "hybrid"), func(ctx context.Context) {
		res.hybrid, err = hybridPhase(ctx, out, cfg, be, wl, runID, "hybrid")
	})
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Phase 2: the same workload, one global (per-request) decision each.
	pprof.Do(ctx, pprof.Labels("phase", "global"), func(ctx context.Context) {
		res.global, err = globalPhase(ctx, out, cfg, be, wl, runID, "global")
	})
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// hybridPhase runs cfg.instances hybrid limiters (mode cfg.mode) through
// the workload; name labels the progress lines and the Redis prefix.
func hybridPhase(ctx context.Context, out io.Writer, cfg config, be *backend, wl *workload, runID, name string) (phaseResult, error) {
	limit := cfg.rateLimit()
	prefix := cfg.prefix + ":" + runID + ":" + name
	var (
		lims []ratelimit.Limiter
		hs   []*hybrid.Limiter
		rts  []*rtcount.Hook
		cls  []redis.UniversalClient
	)
	closeAll := func() error {
		// In parallel, as separate processes would shut down.
		errs := make([]error, len(hs))
		var wg sync.WaitGroup
		for i, h := range hs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = h.Close()
			}()
		}
		wg.Wait()
		for _, c := range cls {
			c.Close()
		}
		return errors.Join(errs...)
	}
	opts := []hybrid.Option{
		hybrid.WithPrefix(prefix),
		hybrid.WithAlgorithm(cfg.algorithm),
		hybrid.WithSyncInterval(cfg.sync),
		hybrid.WithMode(cfg.mode),
		hybrid.WithTimeout(cfg.timeout),
	}
	if cfg.fixInstances {
		opts = append(opts, hybrid.WithInstances(cfg.instances))
	}
	for i := 0; i < cfg.instances; i++ {
		c, rt := newClient(be.addrs, cfg.workers)
		warmPool(ctx, c, cfg.workers)
		cls, rts = append(cls, c), append(rts, rt)
		h, err := hybrid.New(c, limit, append(opts, hybrid.WithInstanceID(fmt.Sprintf("sim-%s-%s-%d", runID, name, i)))...)
		if err != nil {
			closeAll()
			return phaseResult{}, fmt.Errorf("hybrid.New: %w", err)
		}
		hs, lims = append(hs, h), append(lims, h)
	}
	instLo, instHi := math.MaxInt, 0
	cpu0, own0 := serverCPU(ctx, be, cls[0]), processCPU()
	r := runPhase(ctx, out, name, cfg, wl, lims, rts, be.baseUS, func() hybrid.Stats {
		var s hybrid.Stats
		for _, h := range hs {
			x := h.Stats()
			addStats(&s, x)
			instLo, instHi = min(instLo, x.Instances), max(instHi, x.Instances)
		}
		return s
	})
	r.redisCPU, r.ownCPU = cpuDelta(cpu0, serverCPU(ctx, be, cls[0])), cpuDelta(own0, processCPU())
	if err := closeAll(); err != nil && r.firstErr == nil {
		r.firstErr = fmt.Errorf("close: %w", err)
	}
	r.instLo, r.instHi = instLo, instHi
	return r, nil
}

// globalPhase runs the workload through cfg.instances per-request global
// limiters of cfg.algorithm.
func globalPhase(ctx context.Context, out io.Writer, cfg config, be *backend, wl *workload, runID, name string) (phaseResult, error) {
	limit := cfg.rateLimit()
	prefix := cfg.prefix + ":" + runID + ":" + name
	var (
		lims []ratelimit.Limiter
		rts  []*rtcount.Hook
		cls  []redis.UniversalClient
	)
	defer func() {
		for _, c := range cls {
			c.Close()
		}
	}()
	for i := 0; i < cfg.instances; i++ {
		c, rt := newClient(be.addrs, cfg.workers)
		warmPool(ctx, c, cfg.workers)
		cls, rts = append(cls, c), append(rts, rt)
		// A limiter per worker: per-request Redis, a round trip per
		// decision (one global limiter's concurrent decisions would share
		// round trips).
		for w := 0; w < cfg.workers; w++ {
			g, err := global.New(c, limit, global.WithAlgorithm(cfg.algorithm), global.WithPrefix(prefix))
			if err != nil {
				return phaseResult{}, fmt.Errorf("global.New: %w", err)
			}
			lims = append(lims, g)
		}
	}
	cpu0, own0 := serverCPU(ctx, be, cls[0]), processCPU()
	r := runPhase(ctx, out, name, cfg, wl, lims, rts, be.baseUS, nil)
	r.redisCPU, r.ownCPU = cpuDelta(cpu0, serverCPU(ctx, be, cls[0])), cpuDelta(own0, processCPU())
	return r, nil
}

func addStats(s *hybrid.Stats, x hybrid.Stats) {
	s.Decisions += x.Decisions
	s.Allowed += x.Allowed
	s.Denied += x.Denied
	s.LocalDecisions += x.LocalDecisions
	s.ExactDecisions += x.ExactDecisions
	s.RoundTrips += x.RoundTrips
	s.SyncRoundTrips += x.SyncRoundTrips
	s.Leases += x.Leases
	s.LeasedUnits += x.LeasedUnits
	s.LeasedAhead += x.LeasedAhead
	s.Expired += x.Expired
	s.Refunded += x.Refunded
	s.Reported += x.Reported
	s.FlushErrors += x.FlushErrors
	s.Fallback += x.Fallback
	s.NoReply += x.NoReply
	s.KeysTracked += x.KeysTracked
	s.Instances = max(s.Instances, x.Instances)
}

// serverBase returns Redis server time, in microseconds since the epoch, at
// mono 0.
func serverBase(ctx context.Context, c redis.UniversalClient) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t0 := mono()
	t, err := c.Time(ctx).Result()
	t1 := mono()
	if err != nil {
		return 0, err
	}
	return t.UnixMicro() - (t0+t1)/2/1000, nil
}

// newClient makes one Redis client, as one process of the fleet would have,
// with a hook counting its round trips: one per command, one per pipeline.
// For a Cluster the hook sits on every node's client, so a pipeline split
// over three nodes counts three.
//
// The pool holds a connection for every worker and some for the hybrid's
// own calls, so that a far Redis (--redis-latency) does not make workers
// queue for connections as well as for replies.
func newClient(addrs []string, workers int) (redis.UniversalClient, *rtcount.Hook) {
	rt := &rtcount.Hook{}
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, PoolSize: max(workers+8, 10*runtime.GOMAXPROCS(0))})
	rtcount.Attach(c, rt)
	return c, rt
}

// warmPool opens n connections of c (n PINGs at once) before a phase, as a
// running service has its pool open: otherwise the phase's first decisions
// would measure a storm of connection set-ups (at 1,024 workers, p99s of
// hundreds of milliseconds with no latency added). Errors are left to the
// phase.
func warmPool(ctx context.Context, c redis.UniversalClient, n int) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Ping(ctx)
		}()
	}
	wg.Wait()
}

func sumRT(rts []*rtcount.Hook) (trips, cmds uint64) {
	for _, r := range rts {
		trips += uint64(r.RoundTrips())
		cmds += uint64(r.Commands())
	}
	return trips, cmds
}

// phaseResult is what one phase measured.
type phaseResult struct {
	name                       string
	elapsed                    time.Duration
	decisions, allowed, denied uint64
	errs                       uint64
	firstErr                   error
	roundTrips                 uint64 // counted by the hook while the workers ran
	commands                   uint64 // commands those round trips carried
	hasStats                   bool
	stats                      hybrid.Stats // hybrid only, summed over the fleet when the workers stopped
	lat                        hist

	fullWindows int         // full windows per key inside the phase
	maxWin      int         // most allowed for one key in one window (any window, the first and last partial ones too)
	maxFull     int         // most allowed for one key in one full window
	minWinSat   int         // least allowed for one key in one full window in which it saw denials; -1: none
	startUS     int64       // Redis time, µs since the epoch, when the workers began
	satWins     int         // full key-windows in which the key saw denials
	overLimit   int         // key-windows above the limit
	lost        uint64      // allowed decisions whose window fell outside the tally
	worst       []keyWindow // the key-windows above the limit, most allowed first (at most 5)
	instLo      int         // instances sharing the quota as the hybrid instances saw it at the end
	instHi      int
	hot         []int // allowed per full window of the hottest key (key 0)
	winMax      []int // the most allowed for one key, per full window

	samples []sample // progress through the phase, about every sampleEvery

	redisCPU float64 // seconds of CPU the Redis server spent during the phase (INFO cpu); < 0: not known
	ownCPU   float64 // seconds of CPU this process spent during the phase (workers, limiters, clients, tally); < 0: not known
}

// cpuDelta is the CPU spent between two readings of serverCPU, or -1 when
// either is not known.
func cpuDelta(from, to float64) float64 {
	if from < 0 || to < 0 {
		return -1
	}
	return to - from
}

// serverCPU returns the CPU seconds (system and user) the Redis server of
// be has spent since it started, from INFO cpu, or -1 when it cannot
// tell: the embedded Redis, a Cluster (several servers), an error.
func serverCPU(ctx context.Context, be *backend, c redis.UniversalClient) float64 {
	if be.embedded || len(be.addrs) != 1 {
		return -1
	}
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return -1
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			total += f
		}
	}
	return total
}

// slowDecision is a decision long enough that publishing the worker's
// progress after it costs nothing in comparison.
const slowDecision = int64(50 * time.Microsecond)

// sample is where a phase stood at a moment: decisions taken (as the
// workers last published them, every 16 decisions) and round trips sent.
type sample struct {
	at         time.Duration // since the phase started
	decisions  uint64
	roundTrips uint64
}

// sampleEvery is the time between two samples of a phase of duration d:
// about 50 per phase, at least 50ms apart.
func sampleEvery(d time.Duration) time.Duration {
	return min(max(d/50, 50*time.Millisecond), time.Second)
}

// keyWindow is what one key admitted in window idx.
type keyWindow struct {
	key     string
	idx     int64
	allowed int
}

// worker is the state of one deciding goroutine; it owns everything but
// progress, which the progress printer reads.
type worker struct {
	progress                         atomic.Uint64
	_                                [56]byte
	lat                              hist
	decisions, allowed, denied, errs uint64
	lastDenied                       []int64 // per key: the last window it was denied in, +1 (0: never)
	firstErr                         error
}

// tally counts allowed decisions per key and window. A decision belongs to
// the window that ends ResetAfter after it was taken (the middle of the
// call, on this side); the server time of that end, rounded to the
// nearest window boundary, names the window (the same attribution the
// hybrid package's tests use).
type tally struct {
	p      int64 // period in microseconds
	first  int64 // window index of slot 0
	n      int   // slots per key
	baseUS int64
	c      []atomic.Uint32
	denied []atomic.Uint32 // 1: the key saw a denial in the window
	lost   atomic.Uint64
}

// deny notes that key was denied at mono time at, in the window Redis was in
// then. Each worker writes the shared flag once per key and window (last
// holds the worker's last window per key), so hot keys cause no contention.
func (t *tally) deny(key int, at int64, last []int64) {
	s := (t.baseUS+at/1000)/t.p - t.first
	if s < 0 || s >= int64(t.n) || last[key] == s+1 {
		return
	}
	last[key] = s + 1
	t.denied[key*t.n+int(s)].Store(1)
}

// add counts an admission of key in the window that ends at mono time
// endMono (a window algorithm's: the decision's time plus its ResetAfter).
func (t *tally) add(key int, endMono int64) {
	us := t.baseUS + endMono/1000
	t.addSlot(key, (us+t.p/2)/t.p-1-t.first)
}

// addAt counts an admission of key in the period that holds mono time at,
// in Redis time: a bucket has no windows, so its admissions are tallied in
// the period they were decided in, and bounded there by burst + rate x
// period (config.bound).
func (t *tally) addAt(key int, at int64) {
	t.addSlot(key, (t.baseUS+at/1000)/t.p-t.first)
}

func (t *tally) addSlot(key int, s int64) {
	if s < 0 || s >= int64(t.n) {
		t.lost.Add(1)
		return
	}
	t.c[key*t.n+int(s)].Add(1)
}

// alignWait is how long to wait from nowUS (Redis time, µs) until offUS
// into a period of pUS: 0 when it is that moment now.
func alignWait(nowUS, pUS, offUS int64) time.Duration {
	return time.Duration(((offUS-nowUS%pUS)%pUS+pUS)%pUS) * time.Microsecond
}

func runPhase(ctx context.Context, out io.Writer, name string, cfg config, wl *workload,
	lims []ratelimit.Limiter, rts []*rtcount.Hook, baseUS int64, stats func() hybrid.Stats) phaseResult {
	r := phaseResult{name: name, minWinSat: -1}
	pUS := cfg.period.Microseconds()
	if cfg.aligned {
		select {
		case <-time.After(alignWait(baseUS+mono()/1000, pUS, cfg.align.Microseconds())):
		case <-ctx.Done():
		}
	}
	start := mono()
	startUS := baseUS + start/1000
	r.startUS = startUS
	t := &tally{p: pUS, first: startUS/pUS - 1, n: int(cfg.duration/cfg.period) + 4, baseUS: baseUS}
	t.c = make([]atomic.Uint32, t.n*cfg.keys)
	t.denied = make([]atomic.Uint32, t.n*cfg.keys)

	windows, bound := cfg.algorithm.IsWindow(), cfg.bound()
	nw := cfg.instances * cfg.workers
	workers := make([]*worker, nw)
	var interval int64 // open loop: ns between two decisions of one worker
	if cfg.rate > 0 {
		interval = int64(float64(nw) / cfg.rate * 1e9)
	}
	var stop atomic.Bool
	rt0, cmd0 := sumRT(rts)
	start = mono()
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{lastDenied: make([]int64, cfg.keys)}
		workers[i] = w
		lim := lims[i/cfg.workers] // an instance's limiter
		if len(lims) == nw {
			lim = lims[i] // a worker's own
		}
		pk := wl.picker(cfg.seed, uint64(i))
		offset := start + interval*int64(i)/int64(nw)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := uint64(0); !stop.Load(); j++ {
				if j&15 == 0 {
					// A request handler does I/O between decisions and so
					// yields; a tight loop would not, and with dozens of
					// them on a few cores the goroutines waiting on Redis
					// replies would sit in the run queue for whole
					// scheduler slices (10ms each).
					runtime.Gosched()
				}
				k := pk.next()
				if interval > 0 {
					if d := offset + int64(j)*interval - mono(); d > 0 {
						time.Sleep(time.Duration(d))
					}
				}
				t0 := mono()
				d, err := lim.AllowN(ctx, wl.keys[k], 1)
				t1 := mono()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					w.errs++
					if w.firstErr == nil {
						w.firstErr = err
					}
					continue
				}
				w.lat.record(time.Duration(t1 - t0))
				w.decisions++
				if j&15 == 0 || t1-t0 > slowDecision {
					// Published every 16 decisions, and after every slow
					// one: with a far Redis 16 decisions may take a
					// second, too coarse for the samples.
					w.progress.Store(w.decisions)
				}
				if d.Allowed {
					w.allowed++
					// Redis decided between t0 and t1: the middle
					// is at most half the wait off, so a far or slow
					// Redis (waits up to a period) does not push the
					// decision into the next window.
					if windows {
						t.add(k, (t0+t1)/2+int64(d.ResetAfter))
					} else {
						t.addAt(k, (t0+t1)/2)
					}
				} else {
					w.denied++
					t.deny(k, t1, w.lastDenied)
				}
			}
		}()
	}

	// Stop at the deadline or on ctx; print progress every second, sample
	// more often.
	deadline := time.NewTimer(cfg.duration)
	tick := time.NewTicker(time.Second)
	samp := time.NewTicker(sampleEvery(cfg.duration))
	defer samp.Stop()
	progress := func() uint64 {
		var n uint64
		for _, w := range workers {
			n += w.progress.Load()
		}
		return n
	}
	r.samples = append(r.samples, sample{})
	var last uint64
	lastAt := start
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-deadline.C:
			break loop
		case <-samp.C:
			rt, _ := sumRT(rts)
			r.samples = append(r.samples, sample{at: time.Duration(mono() - start), decisions: progress(), roundTrips: rt - rt0})
		case <-tick.C:
			var n uint64
			for _, w := range workers {
				n += w.progress.Load()
			}
			now := mono()
			fmt.Fprintf(out, "  %-6s %5.1fs  decisions %12s  %12s/s\n", name,
				float64(now-start)/1e9, commas(n), commas(uint64(float64(n-last)/(float64(now-lastAt)/1e9))))
			last, lastAt = n, now
		}
	}
	stop.Store(true)
	deadline.Stop()
	tick.Stop()
	wg.Wait()
	end := mono()
	r.elapsed = time.Duration(end - start)
	rt1, cmd1 := sumRT(rts)
	r.roundTrips, r.commands = rt1-rt0, cmd1-cmd0
	if stats != nil {
		r.hasStats, r.stats = true, stats()
	}

	for _, w := range workers {
		r.decisions += w.decisions
		r.allowed += w.allowed
		r.denied += w.denied
		r.errs += w.errs
		if r.firstErr == nil && w.firstErr != nil {
			r.firstErr = w.firstErr
		}
		r.lat.merge(&w.lat)
	}
	r.samples = append(r.samples, sample{at: r.elapsed, decisions: r.decisions, roundTrips: r.roundTrips})

	// Windows: the strict bound holds for every window; utilisation is
	// judged on full windows of the keys that were driven past the limit.
	endUS := baseUS + end/1000
	firstFull := (baseUS + start/1000 + pUS - 1) / pUS
	lastFull := endUS/pUS - 1
	r.fullWindows = int(max(0, lastFull-firstFull+1))
	for k := 0; k < cfg.keys; k++ {
		for s := 0; s < t.n; s++ {
			n := int(t.c[k*t.n+s].Load())
			r.maxWin = max(r.maxWin, n)
			if n > bound {
				r.overLimit++
				r.worst = append(r.worst, keyWindow{key: wl.keys[k], idx: t.first + int64(s), allowed: n})
			}
			idx := t.first + int64(s)
			full := idx >= firstFull && idx <= lastFull
			if full {
				r.maxFull = max(r.maxFull, n)
			}
			if full && t.denied[k*t.n+s].Load() != 0 {
				r.satWins++
				if r.minWinSat < 0 || n < r.minWinSat {
					r.minWinSat = n
				}
			}
			if k == 0 && full {
				r.hot = append(r.hot, n)
			}
			if full {
				for len(r.winMax) <= int(idx-firstFull) {
					r.winMax = append(r.winMax, 0)
				}
				r.winMax[idx-firstFull] = max(r.winMax[idx-firstFull], n)
			}
		}
	}
	sort.Slice(r.worst, func(i, j int) bool { return r.worst[i].allowed > r.worst[j].allowed })
	r.worst = r.worst[:min(len(r.worst), 5)]
	r.lost = t.lost.Load()
	return r
}

// commas formats n with thousands separators.
func commas(n uint64) string {
	s := fmt.Sprint(n)
	var b []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	return string(b)
}
