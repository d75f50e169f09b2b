package hybrid

import (
	"context"
	"errors"
	"strconv"
	"strings"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
)

// The fleet's word that a window is spent.
//
// A FixedWindow or SlidingWindow limit too small to lease (Rate <
// leaseShare x instances: a login limit, a few a minute per user) is
// counted exactly, a call per decision. A client over such a limit lands
// on every instance in turn, and an instance learns that the client's
// window is full only by asking Redis: a round trip, to deny, on each
// instance and in each window (the surge demo, 2,000 clients at 1 per 6s
// over 4 instances: about 40% of its round trips). So the instance whose call fills such a window,
// in Strict mode, tells the fleet: it publishes the key and the window on
// the limiter's channel (prefix + ":spent"), in the next pipeline it
// sends anyway (a note rides it: no round trip of its own, but at a tick
// when nothing else went for a sync interval, or on a client with more
// than one node, a Cluster or a Ring, where notes go at the tick), and
// every instance of the same limit that hears it denies the key in memory
// until the window ends: in the seen record (spend) for a key without a
// counter, by the counter's block for one with (blockSpent). A
// SlidingWindow window is full when its own count reaches the limit (see
// fills): only a plain sliding call reads that count, so only its
// admissions tell (lease.lua's reply tells the bound, which the previous
// window's weight may have brought to the limit for a while).
//
// A word heard only ever denies: nothing is admitted on it, so the limit
// holds whatever is lost, late or wrong. What it may cost is quota: a
// window said spent that has room again. Nothing gives quota of such a
// window back but a reservation settled below its estimate (giveBack),
// which publishes that the window is open again ("o"), and a restart of
// Redis, which drops the subscription: every word heard is forgotten when
// the subscription is made anew (forgetSpent). An instance whose clock
// puts it in another window than the word's ignores it, and one that did
// not hear asks Redis as before. The subscription is made only by a
// limiter that may publish: once a decision finds its limit too small to
// lease.
type spentSignal struct {
	channel string
	client  redis.UniversalClient
	// direct: notes ride the decisions' pipelines (a client of one node:
	// standalone or Sentinel); else they go at the tick.
	direct bool

	on      atomic.Bool  // subscribed, or subscribing
	refused atomic.Bool  // Redis refused a note (NOPERM, no PUBLISH): no more are sent
	pending atomic.Int32 // len(notes), read without the lock

	mu     gosync.Mutex
	notes  []queued
	oldest int64 // mono ns: when the oldest of notes was queued
	cancel context.CancelFunc
	ps     *redis.PubSub
	closed bool
	wg     gosync.WaitGroup

	sent, heard, subscribed atomic.Uint64
}

// Ops of a note.
const (
	opSpent = "s" // the window is full
	opOpen  = "o" // units of it were given back
)

// spentNote is one note to publish: a queued request of the pipe.
type spentNote struct {
	channel, msg string
}

func (n *spentNote) base() string { return n.channel }

func (n *spentNote) request() request {
	return request{cmds: [][]any{{"publish", n.channel, n.msg}}, parse: parseFunc(ignoreReply)}
}

func ignoreReply(any) (reply, error) { return reply{}, nil }

func newSpentSignal(client redis.UniversalClient, prefix string) *spentSignal {
	_, one := client.(*redis.Client)
	return &spentSignal{channel: prefix + ":spent", client: client, direct: one}
}

// spentMsg is the note of op for the window idx of the key kept as k:
// "kind periodUS idx op key", the key last (it may hold spaces).
func spentMsg(p *params, idx int64, op, k string) string {
	b := make([]byte, 0, len(p.kind)+len(k)+32)
	b = append(b, p.kind...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, p.periodUS, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, idx, 10)
	b = append(b, ' ')
	b = append(b, op...)
	b = append(b, ' ')
	b = append(b, k...)
	return string(b)
}

// parseSpent reads a note of p's limit: ok is false for anything else
// (another limit on the same prefix, or not a note at all).
func parseSpent(p *params, msg string) (idx int64, op, k string, ok bool) {
	kind, rest, ok1 := strings.Cut(msg, " ")
	per, rest, ok2 := strings.Cut(rest, " ")
	is, rest, ok3 := strings.Cut(rest, " ")
	op, k, ok4 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !ok3 || !ok4 || kind != p.kind || per != strconv.FormatInt(p.periodUS, 10) || k == "" {
		return 0, "", "", false
	}
	if op != opSpent && op != opOpen {
		return 0, "", "", false
	}
	idx, err := strconv.ParseInt(is, 10, 64)
	if err != nil {
		return 0, "", "", false
	}
	return idx, op, k, true
}

// signals reports whether the limiter tells the fleet of windows it fills
// (and listens): a FixedWindow or SlidingWindow limit too small to lease,
// in Strict mode, unless Redis refused it.
func (h *Limiter) signals(f fleet) bool {
	return h.spent != nil && !h.spent.refused.Load() && h.p.rate < leaseShare*f.instances
}

// tellSpent queues the note of op for window idx of the key kept as k,
// and makes sure the limiter listens.
func (h *Limiter) tellSpent(idx int64, op, k string) {
	s := h.spent
	h.listen()
	if s.refused.Load() {
		return
	}
	n := &spentNote{channel: s.channel, msg: spentMsg(h.p, idx, op, k)}
	s.mu.Lock()
	if !s.closed {
		if len(s.notes) == 0 {
			s.oldest = h.mono()
		}
		s.notes = append(s.notes, n)
		s.pending.Store(int32(len(s.notes)))
	}
	s.mu.Unlock()
}

// withNotes returns batch with the notes waiting appended (in a new
// array: batch's is the queue's), when they ride it.
func (h *Limiter) withNotes(batch []queued) []queued {
	s := h.spent
	if s == nil || !s.direct || s.pending.Load() == 0 {
		return batch
	}
	return append(batch[:len(batch):len(batch)], s.take()...)
}

// take empties the notes waiting.
func (s *spentSignal) take() []queued {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.notes
	s.notes = nil
	s.pending.Store(0)
	return n
}

// sendNotes sends, at a tick, the notes that waited a sync interval or
// more (on a client of several nodes, all of them) in a pipeline of their
// own.
func (h *Limiter) sendNotes(ctx context.Context) {
	s := h.spent
	if s == nil || s.pending.Load() == 0 {
		return
	}
	s.mu.Lock()
	due := !s.direct || h.mono()-s.oldest >= h.p.interval
	s.mu.Unlock()
	if !due {
		return
	}
	if notes := s.take(); len(notes) > 0 {
		_ = h.send(ctx, notes)
	}
}

// noteSent records what became of a note.
func (h *Limiter) noteSent(err error) {
	s := h.spent
	if err == nil {
		s.sent.Add(1)
		return
	}
	if refusal(err) {
		// Redis answered no (an ACL without PUBLISH, a proxy without
		// pub/sub): the fleet hears nothing from this instance, which asks
		// Redis as it did without notes.
		s.refused.Store(true)
		h.forgetSpent()
	}
}

// refusal reports whether err is Redis refusing PUBLISH or SUBSCRIBE for
// good (NOPERM, an unknown command), not an error of the moment (a
// connection lost, a server loading its data or failing over).
func refusal(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "MOVED", "ASK", "READONLY"} {
		if redis.HasErrorPrefix(err, p) {
			return false
		}
	}
	return true
}

// listen subscribes to the limiter's channel, once, on a goroutine of its
// own (Close stops it).
func (h *Limiter) listen() {
	s := h.spent
	if s == nil || s.on.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.on.Load() {
		return
	}
	s.on.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go h.hear(ctx)
}

// hear receives the fleet's notes until Close.
func (h *Limiter) hear(ctx context.Context) {
	s := h.spent
	defer s.wg.Done()
	ps := s.client.Subscribe(ctx, s.channel)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ps.Close()
		return
	}
	s.ps = ps
	s.mu.Unlock()
	backoff := 10 * time.Millisecond
	for {
		m, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		switch m := m.(type) {
		case *redis.Message:
			if h.heardSpent(m.Payload) {
				s.heard.Add(1)
			}
		case *redis.Subscription:
			if m.Kind == "subscribe" && s.subscribed.Add(1) > 1 {
				// Subscribed anew: the connection dropped (perhaps Redis
				// restarted, its counts gone), and notes were missed.
				h.forgetSpent()
			}
		}
		if err == nil {
			backoff = 10 * time.Millisecond
			continue
		}
		if refusal(err) {
			// Redis said no (an ACL without channels): no words, heard or
			// told, and no block longer than maxBlock from now on.
			s.refused.Store(true)
			h.forgetSpent()
			return
		}
		// Redis away: go-redis subscribes again at the next Receive.
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// heardSpent applies a note; it reports whether the note was of this
// limit and its current window.
func (h *Limiter) heardSpent(msg string) bool {
	idx, op, k, ok := parseSpent(h.p, msg)
	if !ok {
		return false
	}
	now := h.mono()
	cur, end := h.clk.Window(now)
	if idx != cur {
		return false // (late, or this instance's clock is in another window)
	}
	hk := h.seen.hash(k)
	c := h.index.load(k, hk)
	if c == nil && h.held.may(hk) {
		c, _ = h.table.Peek(k)
	}
	if op == opOpen {
		h.seen.unspend(hk, idx)
		if c != nil {
			c.blockedUntil.Store(0)
		}
		return true
	}
	h.seen.spend(hk, idx)
	if c != nil {
		c.blockSpent(now, end)
	}
	return true
}

// forgetSpent forgets every window heard spent, and every block as long
// as one (longer than maxBlock).
func (h *Limiter) forgetSpent() {
	h.seen.forgetSpent()
	now := h.mono()
	h.table.Range(func(_ string, c *counter) bool {
		if u := c.blockedUntil.Load(); u > now+maxBlock {
			c.blockedUntil.CompareAndSwap(u, 0)
		}
		return true
	})
}

// stopSpent stops listening (Close).
func (h *Limiter) stopSpent(ctx context.Context) {
	s := h.spent
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	if s.cancel != nil {
		s.cancel()
	}
	if s.ps != nil {
		_ = s.ps.Close()
	}
	s.mu.Unlock()
	waitOr(ctx, s.wg.Wait)
}

// fills reports whether admitted exact call e filled its window: nothing
// fits in it until its end. For FixedWindow, the count after it is the
// limit. For SlidingWindow, the window's own count after it is (a plain
// sliding call reads it; lease.lua's reply tells only the bound, which
// the previous window's weight may have brought to the limit, and that
// falls as the window goes on): every bound of the window is at least its
// count, and in Strict mode nothing takes the count down before the
// window ends but a reservation given back, which says so (opOpen).
func (e *exactCall) fills(p *params) bool {
	switch {
	case e.fw:
		return p.rate-e.res.take.Count <= 0
	case e.sw && e.res.plain:
		return e.res.sw.read && e.res.sw.curr >= p.rate
	}
	return false
}

// spentDenial is the decision of n units of a key heard spent at now, its
// window ending at end.
func (p *params) spentDenial(now, end int64) ratelimit.Decision {
	wait := max(end-now, int64(time.Millisecond))
	return p.denied(wait, wait)
}

// blockSpent denies the key's decisions that need Redis until end (the
// window's end, without maxBlock's bound): its window is full, and
// nothing gives it back before then.
func (c *counter) blockSpent(now, end int64) {
	if end <= now {
		return
	}
	c.blockedMin.Store(1)
	c.blockedRetry.Store(end)
	c.blockedUntil.Store(end)
}

// The seen record's word of a window spent: a slot of the window with no
// decision counted and the remainder 0 (seenFree's 1), which a decision
// recorded never writes (its count is 1 or more).
const seenSpent = 1 << 32

// isSpentMark reports whether slot value v is a word of a window spent.
func isSpentMark(v uint64) bool { return v&(seenFree|seenCount) == seenSpent }

// spend records that the fleet said window idx of the key of hash h is
// spent.
func (s *seen) spend(h uint64, idx int64) {
	fp := h & seenFP
	b := s.slots[h&s.mask:][:seenWays]
	b[s.victim(b, h, fp, idx)].Store(fp | seenSpent | uint64(idx)&seenIdx)
}

// unspend takes back the word that window idx of the key of hash h is
// spent.
func (s *seen) unspend(h uint64, idx int64) {
	fp := h & seenFP
	for i, b := 0, s.slots[h&s.mask:][:seenWays]; i < len(b); i++ {
		if v := b[i].Load(); v&seenFP == fp && isSpentMark(v) && seenWindow(v, idx) == 0 {
			b[i].CompareAndSwap(v, 0)
		}
	}
}

// spent reports whether the fleet said window idx of the key of hash h is
// spent.
func (s *seen) spent(h uint64, idx int64) bool {
	fp := h & seenFP
	b := s.slots[h&s.mask:][:seenWays]
	for i := range b {
		if v := b[i].Load(); v&seenFP == fp && isSpentMark(v) && seenWindow(v, idx) == 0 {
			return true
		}
	}
	return false
}

// forgetSpent forgets every window said spent.
func (s *seen) forgetSpent() {
	for i := range s.slots {
		if v := s.slots[i].Load(); isSpentMark(v) {
			s.slots[i].CompareAndSwap(v, 0)
		}
	}
}
