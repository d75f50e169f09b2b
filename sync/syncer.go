package sync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/option"
)

// FlushFunc flushes one batch. It returns the items that must be offered
// again at the next tick (those that failed, or that still need attention),
// and an error if the batch failed as a whole. Items in again are re-marked;
// err counts as a flush error, triggers backoff, and re-marks every item of
// the batch (again is then ignored).
//
// The syncer never runs two FlushFunc calls at once. ctx carries the deadline
// set by WithTimeout; a FlushFunc should return when it is done. batch is
// owned by the callee for the duration of the call only: it may be reordered
// or overwritten, but must not be retained after the call returns. again may
// alias batch. A FlushFunc may call Mark, but must not call Flush or Close
// (they would wait for it).
type FlushFunc[T comparable] func(ctx context.Context, batch []T) (again []T, err error)

// FlushEvent describes one FlushFunc call, for the observer set by
// WithObserver.
type FlushEvent struct {
	Items    int           // items in the batch
	Err      error         // the error the FlushFunc returned, nil on success
	Duration time.Duration // how long the call took
}

// Stats are a Syncer's counters since New. All counts are cumulative.
type Stats struct {
	Ticks   uint64 // ticks of the owner goroutine (not Flush or Close)
	Flushes uint64 // FlushFunc calls
	Items   uint64 // items in FlushFunc calls that returned no error (again items included)
	Errors  uint64 // FlushFunc calls that returned an error
	Retried uint64 // items marked again: returned in again, or in a batch that failed
	// LastError is the error of the most recent failed FlushFunc call, nil
	// if none ever failed. It is not cleared by later successes.
	LastError error
	// Backoff is the current backoff ceiling: 0 while the last pass
	// succeeded, otherwise min x 2^(failing passes - 1) bounded by max. The
	// next tick waits a random duration in [0, Backoff].
	Backoff time.Duration
}

// Syncer is a dirty set flushed in the background: items marked with Mark
// are handed, in batches, to a FlushFunc by an owner goroutine at every tick,
// and on demand by Flush and Close.
//
// The zero Syncer is not usable; build one with New, and stop it with Close.
// All methods are safe for concurrent use.
type Syncer[T comparable] struct {
	flush FlushFunc[T]
	cfg   config

	mu     gosync.Mutex // guards dirty, order, closed; held for one insert or a swap
	dirty  map[T]struct{}
	order  []T // the items of dirty, in the order they were first marked
	closed bool

	// sem serializes flush passes (ticks, Flush, Close): one token.
	sem chan struct{}
	// Owned by the holder of sem.
	spareDirty map[T]struct{}
	spareOrder []T
	scratch    []T
	failures   int // consecutive failing passes

	baseCtx context.Context // of the owner goroutine; canceled when Close gives up waiting
	cancel  context.CancelFunc
	stop    chan struct{} // closed by Close: the owner goroutine stops
	done    chan struct{} // closed by the owner goroutine when it exits

	closeOnce gosync.Once
	closeDone chan struct{} // closed when the first Close returns
	closeErr  error

	ticks, flushes, items, errs, retried atomic.Uint64
	backoff                              atomic.Int64
	lastErr                              atomic.Pointer[error]
}

// New returns a Syncer that flushes through flush, and starts its owner
// goroutine. It returns an error wrapping ratelimit.ErrInvalidOption if flush
// is nil or an option is out of range. Call Close to stop it.
func New[T comparable](flush FlushFunc[T], opts ...Option) (*Syncer[T], error) {
	if flush == nil {
		return nil, invalid("nil FlushFunc")
	}
	cfg := defaultConfig()
	if err := option.Apply(&cfg, opts, Option.apply); err != nil {
		return nil, err
	}
	if cfg.backoffMin == 0 {
		cfg.backoffMin = cfg.interval
		cfg.backoffMax = max(cfg.backoffMax, cfg.backoffMin)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Syncer[T]{
		flush:     flush,
		cfg:       cfg,
		dirty:     make(map[T]struct{}),
		sem:       make(chan struct{}, 1),
		baseCtx:   ctx,
		cancel:    cancel,
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		closeDone: make(chan struct{}),
	}
	go s.run()
	return s, nil
}

// Mark adds item to the dirty set, to be flushed at the next tick. An item
// marked several times before it is flushed is flushed once. Mark never
// blocks on a flush in progress: marks made during a flush go to the next
// one. After Close it does nothing.
func (s *Syncer[T]) Mark(item T) {
	s.mu.Lock()
	if !s.closed {
		s.insertLocked(item)
	}
	s.mu.Unlock()
}

func (s *Syncer[T]) insertLocked(item T) {
	if _, ok := s.dirty[item]; !ok {
		s.dirty[item] = struct{}{}
		s.order = append(s.order, item)
	}
}

// remark puts items back into the dirty set, also while closing.
func (s *Syncer[T]) remark(items []T) {
	if len(items) == 0 {
		return
	}
	s.mu.Lock()
	for _, it := range items {
		s.insertLocked(it)
	}
	s.mu.Unlock()
}

// Pending returns the number of items currently marked. Items in a flush
// in progress are not counted; those that fail are counted again once they
// are re-marked.
func (s *Syncer[T]) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.dirty)
}

// Stats returns a snapshot of the counters.
func (s *Syncer[T]) Stats() Stats {
	st := Stats{
		Ticks:   s.ticks.Load(),
		Flushes: s.flushes.Load(),
		Items:   s.items.Load(),
		Errors:  s.errs.Load(),
		Retried: s.retried.Load(),
		Backoff: time.Duration(s.backoff.Load()),
	}
	if p := s.lastErr.Load(); p != nil {
		st.LastError = *p
	}
	return st
}

// Flush flushes everything marked now, synchronously, and returns the error
// of the failed batch if one failed (the rest of the pass is then left
// marked for the next tick, as are items returned in again). It waits for a
// flush in progress (a tick, another Flush) to end first. If ctx is done
// before every batch was attempted, the rest stays marked and Flush returns
// ctx's error. After Close it returns ratelimit.ErrClosed.
func (s *Syncer[T]) Flush(ctx context.Context) error {
	if s.isClosed() {
		return ratelimit.ErrClosed
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.sem }()
	return s.pass(ctx, ctx, ctx.Done())
}

// Close stops the ticker and the owner goroutine, waits for it, then flushes
// everything still marked. Items that fail or come back in again are retried
// with backoff until all are flushed or ctx is done; the first attempt is
// made even if ctx is already done (each call then bounded by the timeout
// of WithTimeout only). It returns nil if nothing is left marked, otherwise
// an error wrapping ctx's error and the last flush error; what is left stays
// counted by Pending.
//
// If ctx is done while a tick is in progress, the tick's FlushFunc context is
// canceled. Close returns only once the owner goroutine has exited. After
// Close, Mark does nothing and Flush returns ratelimit.ErrClosed. Close is
// idempotent: later calls wait for the first one (or their own ctx) and
// return its result.
//
// With a ctx that is never done, Close waits until every item is flushed: a
// FlushFunc that keeps failing, or keeps returning an item in again, makes it
// wait forever. Give it a deadline.
func (s *Syncer[T]) Close(ctx context.Context) error {
	first := false
	s.closeOnce.Do(func() {
		first = true
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.stop)
		select {
		case <-s.done:
		case <-ctx.Done():
			s.cancel()
			<-s.done
		}
		s.cancel()
		s.closeErr = s.finalFlush(ctx)
		close(s.closeDone)
	})
	if first {
		return s.closeErr
	}
	select {
	case <-s.closeDone:
		return s.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Syncer[T]) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Syncer[T]) finalFlush(ctx context.Context) error {
	s.sem <- struct{}{} // a Flush in progress is bounded by its batches' timeouts
	defer func() { <-s.sem }()

	// The first attempt ignores ctx's cancellation: at least one try.
	err := s.pass(context.WithoutCancel(ctx), ctx, nil)
	ceiling := s.cfg.backoffMin
	for s.Pending() > 0 {
		if ctx.Err() != nil {
			break
		}
		t := time.NewTimer(jitter(ceiling))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		if ctx.Err() != nil {
			break
		}
		ceiling = min(2*ceiling, s.cfg.backoffMax)
		err = s.pass(ctx, ctx, ctx.Done())
	}
	if n := s.Pending(); n > 0 {
		return fmt.Errorf("sync: close: %d items left unflushed: %w", n, errors.Join(ctx.Err(), err))
	}
	return nil
}

// run is the owner goroutine.
func (s *Syncer[T]) run() {
	defer close(s.done)
	t := time.NewTimer(s.cfg.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.tick()
		d := s.cfg.interval
		if b := time.Duration(s.backoff.Load()); b > 0 {
			d = jitter(b)
		}
		t.Reset(d)
	}
}

func (s *Syncer[T]) tick() {
	s.ticks.Add(1)
	if s.cfg.onTick != nil {
		s.cfg.onTick(s.baseCtx)
	}
	select {
	case s.sem <- struct{}{}:
	case <-s.stop:
		return
	}
	defer func() { <-s.sem }()
	_ = s.pass(s.baseCtx, s.baseCtx, s.stop)
}

// pass takes the dirty set and flushes it in batches. parent is the parent of
// every FlushFunc context; between batches the pass stops when abort is
// closed or ctx is done, leaving the rest marked. The caller holds sem.
func (s *Syncer[T]) pass(parent, ctx context.Context, abort <-chan struct{}) error {
	items := s.take()
	if len(items) == 0 {
		s.recycle(items)
		return nil
	}
	defer s.recycle(items)

	var failed error
	bs := s.cfg.batchSize
	for i := 0; i < len(items); i += bs {
		if i > 0 {
			select {
			case <-abort:
				s.remark(items[i:])
				if err := ctx.Err(); err != nil {
					return err
				}
				return nil
			default:
			}
		}
		batch := items[i:min(i+bs, len(items))]
		again, err := s.call(parent, batch)
		if err != nil {
			s.remark(batch)
			s.retried.Add(uint64(len(batch)))
			s.remark(items[i+len(batch):])
			failed = err
			break
		}
		s.items.Add(uint64(len(batch)))
		s.remark(again)
		s.retried.Add(uint64(len(again)))
	}
	if failed != nil {
		s.failures++
		b := s.cfg.backoffMin
		for k := 1; k < s.failures && b < s.cfg.backoffMax; k++ {
			b *= 2
		}
		s.backoff.Store(int64(min(b, s.cfg.backoffMax)))
		return failed
	}
	s.failures = 0
	s.backoff.Store(0)
	return nil
}

// call runs the FlushFunc on a copy of batch, so that items stays intact
// whatever the callee does with its argument.
func (s *Syncer[T]) call(parent context.Context, batch []T) ([]T, error) {
	s.scratch = append(s.scratch[:0], batch...)
	ctx, cancel := context.WithTimeout(parent, s.cfg.timeout)
	start := time.Now()
	again, err := s.flush(ctx, s.scratch)
	d := time.Since(start)
	cancel()
	s.flushes.Add(1)
	if err != nil {
		s.errs.Add(1)
		s.lastErr.Store(&err)
		again = nil
	}
	if s.cfg.observer != nil {
		s.cfg.observer(FlushEvent{Items: len(batch), Err: err, Duration: d})
	}
	return again, err
}

// take swaps the dirty set for the spare (empty) one and returns the items
// it held. The caller holds sem.
func (s *Syncer[T]) take() []T {
	m, o := s.spareDirty, s.spareOrder
	if m == nil {
		m = make(map[T]struct{})
	}
	s.spareDirty, s.spareOrder = nil, nil
	s.mu.Lock()
	old, items := s.dirty, s.order
	s.dirty, s.order = m, o[:0]
	s.mu.Unlock()
	s.spareDirty = old // cleared in recycle, once the pass is over
	return items
}

// recycle keeps the buffers of a finished pass as the next spare set.
func (s *Syncer[T]) recycle(items []T) {
	clear(s.spareDirty)
	clear(items) // drop references held by T, if any
	s.spareOrder = items[:0]
}

// jitter returns a uniformly random duration in [0, d] (full jitter).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}
