package hybrid

import (
	"context"
	"errors"
	"net"
	"slices"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit/internal/script"
)

// The Redis I/O of a Limiter: pipelines of script calls, NOSCRIPT, and
// replies read into values. It knows nothing of leases: a request is a
// script, its keys and arguments, and how to read its reply.

// rediser is the part of a go-redis client the Limiter uses (as
// go-redis/redis_rate's rediser): scripts, and pipelines of them.
type rediser interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Ping(ctx context.Context) *redis.StatusCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
}

// request is one call the pipe sends: a script call, or (script nil) a
// few plain commands, the first of which gives the request's reply.
type request struct {
	script *redis.Script
	keys   []string
	args   []any
	cmds   [][]any // plain commands, when script is nil
	parse  replyParser
	// fallback makes what is sent instead, in the same exchange, when the
	// plain command met a key of another type (WRONGTYPE: it did not run);
	// nil for none.
	fallback fallbacker
}

// replyParser reads a request's reply. (An interface, not a func: the
// calls implement it with no closure allocated per request.)
type replyParser interface {
	parseReply(v any) (reply, error)
}

// repliesParser is a replyParser of plain commands that reads the replies
// of all of them, not only the first's: once parseReply read the first
// (and it was no error), parseReplies reads the others, as commands
// whose errors it judges (a missing hash field is redis.Nil).
type repliesParser interface {
	replyParser
	parseReplies(first reply, rest []*redis.Cmd) (reply, error)
}

// parseFunc is a replyParser that is a plain function.
type parseFunc func(v any) (reply, error)

func (f parseFunc) parseReply(v any) (reply, error) { return f(v) }

// fallbacker makes a request's fallback (see request). It may be called
// by a pipeline abandoned at its deadline, after the call was handed back
// to its key: it reads nothing the key may change since.
type fallbacker interface {
	fallbackRequest() request
}

// fallbackFunc is a fallbacker that is a function.
type fallbackFunc func() request

func (f fallbackFunc) fallbackRequest() request { return f() }

// reply is a request's reply, read.
type reply struct {
	win  script.Reply       // a lease.lua call's
	bkt  script.BucketReply // a bucket.lua call's
	take script.TakeReply   // a take.lua call's, or a plain increment's (see exactCall)
	// plain: take is a plain increment's, its Idx and Now the caller's
	// estimate (not a sample of Redis time), its units counted admitted or not
	plain bool
	// sw: what a plain sliding call read (see slidingExact)
	sw slidingRead
}

func parseLease(v any) (reply, error) {
	r, err := script.ParseLease(v)
	return reply{win: r}, err
}

func parseBucket(v any) (reply, error) {
	r, err := script.ParseBucket(v)
	return reply{bkt: r}, err
}

// result is what the pipe learned of one request.
type result struct {
	reply
	err error
	// notRun: the request certainly did not run on Redis (see notRun),
	// when err is set.
	notRun bool
}

// exchange is one pipeline's round trip: Redis read its clock between
// before and after (mono ns); ok is false when no reply came in time, and
// err is the error of the pipeline as a whole, if any.
type exchange struct {
	before, after int64
	ok            bool
	err           error
	// own: a decision's own call, given until its decision's wait ended
	// (see Limiter.sendOwn): no reply in time is not taken for an outage
	own bool
}

// pipe sends a Limiter's requests to Redis.
type pipe struct {
	client     rediser
	mono       func() int64
	runners    *runners // the goroutines calls run on when not on the caller's (see bounded)
	roundTrips *atomic.Uint64
	// ctxBound: the client ends a call at its context's deadline
	// (ContextTimeoutEnabled), so a call runs on the caller's goroutine;
	// otherwise on one of its own, abandoned at the deadline (bounded),
	// unless timed can bound it.
	ctxBound bool
	timed    timedClients
}

// timedClients bounds the calls of a *redis.Client that does not end a
// call at its context's deadline (ContextTimeoutEnabled off, go-redis's
// default) by its clones of WithTimeout: a clone shares the client's
// connection pool and the hooks the client had when it was made, and
// reads and writes with the timeout it was given. A call bounded by a
// context with r left runs on a clone whose timeout is at least r (so a
// reply that does not come fails no earlier than the context's deadline,
// when go-redis no longer retries) and at most cloneSlack more (so the
// call is over by then): one of the clones kept for the bounds the
// Limiter's calls use (its timeout, a Redis call's), made at their first
// use, or one made for the call. The zero value bounds nothing.
type timedClients struct {
	client *redis.Client // nil: the client honours deadlines, or is of another kind
	kept   [2]keptClone
}

// keptClone is a clone of timedClients kept for one bound d.
type keptClone struct {
	d time.Duration
	c atomic.Pointer[redis.Client]
}

// cloneSlack is how much later than its context's deadline a call on a
// kept clone may end at most (by its timeout, when no reply comes).
const cloneSlack = time.Millisecond

// init makes t the timedClients of client, keeping clones for bounds (see
// timedClients): none when client is not a *redis.Client or ends a call
// at its context's deadline itself.
func (t *timedClients) init(client rediser, bounds ...time.Duration) {
	c, ok := client.(*redis.Client)
	if !ok || honorsDeadlines(client) {
		return
	}
	t.client = c
	for i := range t.kept {
		if i < len(bounds) {
			t.kept[i].d = bounds[i]
		}
	}
}

// bound returns the client a call bounded by ctx runs on from the caller's
// goroutine, and false when there is none (ctx has no deadline, or it
// passed, or t bounds nothing).
func (t *timedClients) bound(ctx context.Context) (*redis.Client, bool) {
	if t.client == nil {
		return nil, false
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return nil, false
	}
	r := time.Until(dl)
	if r <= 0 {
		return nil, false
	}
	for i := range t.kept {
		k := &t.kept[i]
		if k.d < r || k.d-r > cloneSlack {
			continue
		}
		if c := k.c.Load(); c != nil {
			return c, true
		}
		k.c.CompareAndSwap(nil, t.client.WithTimeout(k.d))
		return k.c.Load(), true
	}
	return t.client.WithTimeout(r), true
}

// inlines reports whether p runs a call bounded by a context on the
// caller's goroutine, when the context has a deadline yet to come (see
// bounded).
func (p *pipe) inlines() bool { return p.ctxBound || p.timed.client != nil }

// honorsDeadlines reports whether client ends a call at its context's
// deadline: go-redis does with ContextTimeoutEnabled.
func honorsDeadlines(client rediser) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// exec sends reqs in one pipeline (go-redis splits it per Cluster node) and
// reads their replies into res. Requests that met NOSCRIPT (Redis lost its
// scripts: a restart, SCRIPT FLUSH) did not run: the scripts are loaded and
// they are sent again, at once. The pipeline gets until ctx's deadline,
// whatever the client's own timeouts: past it, every request is in doubt
// (ok false) and its replies, should they come, are never read.
func (p *pipe) exec(ctx context.Context, reqs []request, res []result) exchange {
	e := p.newRun(ctx, reqs)
	if !p.bounded(ctx, e) {
		return exchange{}
	}
	return e.read(res)
}

// newRun makes the run of one exchange of reqs, bounded by ctx.
func (p *pipe) newRun(ctx context.Context, reqs []request) *exchangeRun {
	return &exchangeRun{p: p, client: p.client, ctx: ctx, reqs: reqs, sent: reqs}
}

// read reads the replies of e, a run that returned in time, into res
// (one per request), and returns its exchange.
func (e *exchangeRun) read(res []result) exchange {
	x, cmds, sent, rest := e.x, e.cmds, e.sent, e.rest
	x.ok = true
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err == nil && v == nil && x.err != nil {
			err = x.err // the pipeline failed before this call got a reply
		}
		if err == nil {
			res[i].reply, err = sent[i].parse.parseReply(v)
		}
		if rp, ok := sent[i].parse.(repliesParser); ok && err == nil && i < len(rest) && rest[i] != nil {
			res[i].reply, err = rp.parseReplies(res[i].reply, rest[i])
		}
		res[i].err, res[i].notRun = err, err != nil && notRun(err)
	}
	return x
}

// exchangeRun is one exec's round trip as the goroutine that runs it
// sees it (one allocation for all it keeps): what it sends, and what it
// learned, which exec reads only once the run finished in time.
type exchangeRun struct {
	p      *pipe
	client rediser // what it sends on: p's client, or a clone that bounds the call (see pipe.bounded)
	ctx    context.Context
	reqs   []request
	done   chan struct{} // closed when the run is over (bounded, off the caller's goroutine)

	x    exchange
	cmds []*redis.Cmd
	rest [][]*redis.Cmd // the other commands of requests with a repliesParser
	sent []request      // what was sent last for each request (a fallback replaces it)
}

func (e *exchangeRun) run() {
	if e.done != nil {
		defer close(e.done)
	}
	p, ctx, reqs := e.p, e.ctx, e.reqs
	e.x.before = p.mono()
	e.cmds, e.rest, e.x.err = p.run(ctx, e.client, reqs)
	// Requests that did not run are sent again at once: those that met
	// NOSCRIPT once the scripts are loaded, and plain commands that met
	// WRONGTYPE as their fallback (which may meet NOSCRIPT in turn).
	for pass := 0; pass < 2; pass++ {
		var again []request
		var at []int
		for i, cmd := range e.cmds {
			switch err := cmd.Err(); {
			case script.IsNoScript(err):
			case err != nil && e.sent[i].fallback != nil && redis.HasErrorPrefix(err, "WRONGTYPE"):
				if len(e.sent) > 0 && &e.sent[0] == &reqs[0] {
					e.sent = slices.Clone(reqs)
				}
				e.sent[i] = e.sent[i].fallback.fallbackRequest()
			default:
				continue
			}
			again, at = append(again, e.sent[i]), append(at, i)
		}
		if len(again) == 0 || ctx.Err() != nil || !e.rebound() {
			break
		}
		if anyNoScript(e.cmds) && load(ctx, e.client, again) != nil {
			break
		}
		e.x.before = p.mono()
		var redo []*redis.Cmd
		redo, _, e.x.err = p.run(ctx, e.client, again) // (fallbacks and scripts: no repliesParser)
		for j, i := range at {
			e.cmds[i] = redo[j]
		}
	}
	e.x.after = p.mono()
}

// rebound makes a run on a clone of timedClients send what it sends next
// on a clone for the time its context has left now (a kept clone's
// timeout is the whole bound), and reports false when none is left.
func (e *exchangeRun) rebound() bool {
	if e.client == e.p.client {
		return true
	}
	c, ok := e.p.timed.bound(e.ctx)
	if ok {
		e.client = c
	}
	return ok
}

// run sends reqs in one pipeline on client. It returns each request's first command
// and, for requests whose parse is a repliesParser, their other commands
// (rest is nil when no request has one, else indexed as reqs).
func (p *pipe) run(ctx context.Context, client rediser, reqs []request) (cmds []*redis.Cmd, rest [][]*redis.Cmd, err error) {
	pl := client.Pipeline()
	cmds = make([]*redis.Cmd, len(reqs))
	for i, r := range reqs {
		if r.script == nil {
			cmds[i] = pl.Do(ctx, r.cmds[0]...)
			_, all := r.parse.(repliesParser)
			for j, c := range r.cmds[1:] {
				cmd := pl.Do(ctx, c...)
				if !all {
					continue
				}
				if rest == nil {
					rest = make([][]*redis.Cmd, len(reqs))
				}
				if j == 0 {
					rest[i] = make([]*redis.Cmd, 0, len(r.cmds)-1)
				}
				rest[i] = append(rest[i], cmd)
			}
			continue
		}
		cmds[i] = r.script.EvalSha(ctx, pl, r.keys, r.args...)
	}
	all, err := pl.Exec(ctx)
	p.roundTrips.Add(1)
	if err != nil && rest != nil {
		err = firstErr(all, rest)
	}
	return cmds, rest, err
}

// firstErr is the error of a pipeline of commands all: the first command's
// that failed, but for a WRONGTYPE of a command in rest, which its
// request's parser judges (it read a key of another type: a counter a
// global limiter wrote), not a failure of the pipeline.
func firstErr(all []redis.Cmder, rest [][]*redis.Cmd) error {
	judged := make(map[redis.Cmder]bool)
	for _, r := range rest {
		for _, c := range r {
			judged[c] = true
		}
	}
	for _, c := range all {
		if err := c.Err(); err != nil && !(judged[c] && redis.HasErrorPrefix(err, "WRONGTYPE")) {
			return err
		}
	}
	return nil
}

// load loads the scripts of reqs on client (on every Cluster shard).
func load(ctx context.Context, client rediser, reqs []request) error {
	var done []*redis.Script
	for _, r := range reqs {
		if r.script == nil || slices.Contains(done, r.script) {
			continue
		}
		if err := r.script.Load(ctx, client).Err(); err != nil {
			return err
		}
		done = append(done, r.script)
	}
	return nil
}

// call runs one request on its own, bounded by ctx as exec is.
func (p *pipe) call(ctx context.Context, fn func(ctx context.Context) error) error {
	res := make(chan error, 1)
	p.runners.run(jobFunc(func() { res <- fn(ctx) }))
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// bounded runs e on a goroutine of p.runners and waits for it until ctx
// is done, whatever the Redis client's own timeouts: a call the client
// does not give up on by itself (one without ContextTimeoutEnabled waits its
// ReadTimeout) is abandoned there, and ends on its own later. It reports
// whether e's run returned in time; only then may the caller read what it
// wrote. With a client that honours deadlines, or a *redis.Client whose
// clone bounds the call (timedClients), e runs on the caller's goroutine:
// one hand-off less per pipeline, each way.
func (p *pipe) bounded(ctx context.Context, e *exchangeRun) bool {
	inline := p.ctxBound
	if !inline {
		var c *redis.Client
		if c, inline = p.timed.bound(ctx); inline {
			e.client = c
		}
	}
	if inline {
		e.run()
		return ctx.Err() == nil || !errors.Is(ctx.Err(), context.DeadlineExceeded)
	}
	p.start(e)
	select {
	case <-e.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// start runs e on a goroutine of p.runners: e.done closes once the run is
// over, and only then may e be read.
func (p *pipe) start(e *exchangeRun) {
	e.done = make(chan struct{})
	p.runners.run(e)
}

func anyNoScript(cmds []*redis.Cmd) bool {
	for _, cmd := range cmds {
		if script.IsNoScript(cmd.Err()) {
			return true
		}
	}
	return false
}

// notRun reports whether a call that failed with err certainly did not
// run on Redis: the script was missing, a command met a key of another
// type, the connection was refused its
// authentication, or no connection could be made. Any other failure leaves
// the call in doubt.
func notRun(err error) bool {
	if script.IsNoScript(err) || redis.HasErrorPrefix(err, "NOAUTH") || redis.HasErrorPrefix(err, "WRONGPASS") || redis.HasErrorPrefix(err, "WRONGTYPE") {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed)
}

// runners runs calls on goroutines of their own (see pipe.bounded), kept
// once started: a new goroutine per pipeline would grow its stack through
// go-redis's calls every time, which cost the client about a tenth of its
// CPU per round trip on the sim's cold row. Up to maxIdleRunners wait for
// the next call; stop ends them (Close). Calls run after stop still run,
// each on a goroutine that ends with it. wg counts the goroutines.
type runners struct {
	wg      *gosync.WaitGroup
	mu      gosync.Mutex
	idle    []chan job
	stopped bool
	started int // goroutines started, ever
}

// maxIdleRunners: about the pipelines a Limiter has on their way at once
// near Redis, with the probes and the syncer's calls beside them.
const maxIdleRunners = 4

// job is what a runner runs: an exchange (exchangeRun), or a function
// (jobFunc). (An interface, not a func: an exchange is run with no
// closure allocated for it.)
type job interface{ run() }

// jobFunc is a job that is a function.
type jobFunc func()

func (f jobFunc) run() { f() }

// run runs fn on an idle runner, or on a new one.
func (r *runners) run(fn job) {
	r.mu.Lock()
	if n := len(r.idle); n > 0 {
		work := r.idle[n-1]
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		work <- fn
		return
	}
	r.started++
	r.mu.Unlock()
	work := make(chan job, 1)
	work <- fn
	r.wg.Add(1)
	go r.loop(work)
}

// loop runs what comes on work until it is closed, or until it finds no
// place among the idle runners.
func (r *runners) loop(work chan job) {
	defer r.wg.Done()
	for fn := range work {
		fn.run()
		r.mu.Lock()
		if r.stopped || len(r.idle) >= maxIdleRunners {
			r.mu.Unlock()
			return
		}
		r.idle = append(r.idle, work)
		r.mu.Unlock()
	}
}

// stop ends the idle runners, and every busy one once its call returns.
func (r *runners) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, work := range r.idle {
		close(work)
	}
	r.idle = nil
}
