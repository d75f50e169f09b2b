package sync_test

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridlimit/ratelimit"
	bgsync "github.com/hybridlimit/ratelimit/sync"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// never is an interval long enough that no tick fires during a test.
const never = time.Hour

// recorder is a FlushFunc that records every batch.
type recorder[T comparable] struct {
	mu      gosync.Mutex
	batches [][]T
	counts  map[T]int
}

func (r *recorder[T]) flush(_ context.Context, batch []T) ([]T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = make(map[T]int)
	}
	r.batches = append(r.batches, append([]T(nil), batch...))
	for _, it := range batch {
		r.counts[it]++
	}
	return nil, nil
}

func (r *recorder[T]) snapshot() ([][]T, map[T]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := make(map[T]int, len(r.counts))
	for k, v := range r.counts {
		c[k] = v
	}
	return append([][]T(nil), r.batches...), c
}

func newSyncer[T comparable](t *testing.T, f bgsync.FlushFunc[T], opts ...bgsync.Option) *bgsync.Syncer[T] {
	t.Helper()
	s, err := bgsync.New(f, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// waitFor polls cond until it holds; the 5s limit only detects failures.
func waitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, time.Millisecond, msg)
}

func TestNewValidates(t *testing.T) {
	for name, opts := range map[string][]bgsync.Option{
		"interval":   {bgsync.WithInterval(0)},
		"batch":      {bgsync.WithBatchSize(0)},
		"timeout":    {bgsync.WithTimeout(-time.Second)},
		"backoffMin": {bgsync.WithBackoff(0, time.Second)},
		"backoffMax": {bgsync.WithBackoff(time.Second, time.Millisecond)},
	} {
		t.Run(name, func(t *testing.T) {
			var r recorder[int]
			s, err := bgsync.New(r.flush, opts...)
			require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
			require.Nil(t, s)
		})
	}
	_, err := bgsync.New[int](nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
}

// A nil Option is ignored, as in packages local, global and hybrid; the
// options around it still apply, in order, the later winning.
func TestNewIgnoresNilOption(t *testing.T) {
	var r recorder[int]
	s := newSyncer(t, r.flush, nil, bgsync.WithInterval(never), bgsync.WithBatchSize(2), nil, bgsync.WithBatchSize(1), nil)
	s.Mark(1)
	s.Mark(2)
	require.NoError(t, s.Flush(context.Background()))
	batches, _ := r.snapshot()
	require.Equal(t, [][]int{{1}, {2}}, batches, "batches of 1, the last WithBatchSize")

	_, err := bgsync.New(r.flush, nil, bgsync.WithBatchSize(0))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "a bad option after a nil one is still checked")
}

func TestMarkDedup(t *testing.T) {
	var r recorder[string]
	s := newSyncer(t, r.flush, bgsync.WithInterval(never))
	for range 3 {
		s.Mark("a")
	}
	s.Mark("b")
	s.Mark("a")
	require.Equal(t, 2, s.Pending())

	require.NoError(t, s.Flush(context.Background()))
	batches, counts := r.snapshot()
	require.Equal(t, [][]string{{"a", "b"}}, batches, "one batch, in first-marked order")
	require.Equal(t, map[string]int{"a": 1, "b": 1}, counts)
	require.Zero(t, s.Pending())
	st := s.Stats()
	require.EqualValues(t, 1, st.Flushes)
	require.EqualValues(t, 2, st.Items)

	// Nothing marked: Flush makes no call.
	require.NoError(t, s.Flush(context.Background()))
	require.EqualValues(t, 1, s.Stats().Flushes)
}

func TestConcurrentMarkersFlushedExactlyOnce(t *testing.T) {
	const goroutines, perG = 8, 10_000
	var r recorder[int]
	// Ticks run while the markers mark, so marks race with swaps.
	s := newSyncer(t, r.flush, bgsync.WithInterval(time.Millisecond), bgsync.WithBatchSize(100))
	var wg gosync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				s.Mark(g*perG + i)
			}
		})
	}
	wg.Wait()
	require.NoError(t, s.Flush(context.Background()))
	require.Zero(t, s.Pending())

	_, counts := r.snapshot()
	require.Len(t, counts, goroutines*perG)
	for item, n := range counts {
		if n != 1 {
			t.Fatalf("item %d flushed %d times, want 1", item, n)
		}
	}
	require.EqualValues(t, goroutines*perG, s.Stats().Items)
}

func TestBatchSplitting(t *testing.T) {
	const n, size = 100, 7
	var r recorder[int]
	s := newSyncer(t, r.flush, bgsync.WithInterval(never), bgsync.WithBatchSize(size))
	for i := range n {
		s.Mark(i)
	}
	require.NoError(t, s.Flush(context.Background()))

	batches, _ := r.snapshot()
	require.Len(t, batches, (n+size-1)/size)
	var all []int
	for _, b := range batches {
		require.LessOrEqual(t, len(b), size)
		require.NotEmpty(t, b)
		all = append(all, b...)
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, all, "every item once, in first-marked order")
	require.EqualValues(t, len(batches), s.Stats().Flushes)
}

func TestAgainReofferedOnFlush(t *testing.T) {
	var mu gosync.Mutex
	var calls [][]string
	flush := func(_ context.Context, batch []string) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, append([]string(nil), batch...))
		if len(calls) == 1 {
			// Keep b and d, reusing the batch's storage.
			return append(batch[:0], "b", "d"), nil
		}
		return nil, nil
	}
	s := newSyncer(t, flush, bgsync.WithInterval(never))
	for _, k := range []string{"a", "b", "c", "d"} {
		s.Mark(k)
	}
	require.NoError(t, s.Flush(context.Background()))
	require.Equal(t, 2, s.Pending())
	st := s.Stats()
	require.EqualValues(t, 2, st.Retried)
	require.Zero(t, st.Errors)
	require.Zero(t, st.Backoff, "again is not an error")

	require.NoError(t, s.Flush(context.Background()))
	require.Zero(t, s.Pending())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [][]string{{"a", "b", "c", "d"}, {"b", "d"}}, calls)
}

func TestAgainReofferedOnTick(t *testing.T) {
	var calls atomic.Int32
	seen := make(chan []int, 16)
	flush := func(_ context.Context, batch []int) ([]int, error) {
		seen <- append([]int(nil), batch...)
		if calls.Add(1) == 1 {
			return []int{batch[0]}, nil
		}
		return nil, nil
	}
	s := newSyncer(t, flush, bgsync.WithInterval(time.Millisecond))
	s.Mark(42)
	timeout := time.After(5 * time.Second)
	for _, want := range [][]int{{42}, {42}} {
		select {
		case got := <-seen:
			require.Equal(t, want, got)
		case <-timeout:
			t.Fatal("item not re-offered by the ticker")
		}
	}
	waitFor(t, func() bool { return s.Pending() == 0 }, "pending drained")
	require.EqualValues(t, 1, s.Stats().Retried)
}

func TestFailingFlushBackoffGrowsAndNothingIsLost(t *testing.T) {
	errDown := errors.New("redis down")
	var failing atomic.Bool
	failing.Store(true)
	var r recorder[int]
	flush := func(ctx context.Context, batch []int) ([]int, error) {
		if failing.Load() {
			return nil, errDown
		}
		return r.flush(ctx, batch)
	}
	const minB, maxB = 10 * time.Millisecond, 50 * time.Millisecond
	s := newSyncer(t, flush, bgsync.WithInterval(never), bgsync.WithBatchSize(3),
		bgsync.WithBackoff(minB, maxB))
	for i := range 10 {
		s.Mark(i)
	}

	want := []time.Duration{10, 20, 40, 50, 50, 50}
	for i, w := range want {
		err := s.Flush(context.Background())
		require.ErrorIs(t, err, errDown)
		st := s.Stats()
		require.Equal(t, w*time.Millisecond, st.Backoff, "after %d failing passes", i+1)
		require.LessOrEqual(t, st.Backoff, maxB)
		require.EqualValues(t, i+1, st.Errors, "a pass stops at its first failed batch")
		require.ErrorIs(t, st.LastError, errDown)
		require.Equal(t, 10, s.Pending(), "no item dropped")
	}
	require.EqualValues(t, 6*3, s.Stats().Retried)

	failing.Store(false)
	require.NoError(t, s.Flush(context.Background()))
	st := s.Stats()
	require.Zero(t, st.Backoff, "reset on success")
	require.ErrorIs(t, st.LastError, errDown, "LastError is kept")
	require.Zero(t, s.Pending())
	_, counts := r.snapshot()
	require.Len(t, counts, 10)
	for item, n := range counts {
		require.Equal(t, 1, n, "item %d", item)
	}
}

func TestFailingFlushRetriedByTicker(t *testing.T) {
	errDown := errors.New("redis down")
	var calls atomic.Int32
	var r recorder[string]
	flush := func(ctx context.Context, batch []string) ([]string, error) {
		if calls.Add(1) <= 3 {
			return nil, errDown
		}
		return r.flush(ctx, batch)
	}
	var maxSeen atomic.Int64
	s := newSyncer(t, flush, bgsync.WithInterval(time.Millisecond),
		bgsync.WithBackoff(time.Millisecond, 4*time.Millisecond),
		bgsync.WithObserver(func(e bgsync.FlushEvent) {}))
	s.Mark("x")
	s.Mark("y")
	waitFor(t, func() bool {
		if b := int64(s.Stats().Backoff); b > maxSeen.Load() {
			maxSeen.Store(b)
		}
		_, c := r.snapshot()
		return len(c) == 2
	}, "flushed after retries")
	st := s.Stats()
	require.EqualValues(t, 3, st.Errors)
	require.EqualValues(t, 6, st.Retried)
	require.LessOrEqual(t, time.Duration(maxSeen.Load()), 4*time.Millisecond)
	waitFor(t, func() bool { return s.Stats().Backoff == 0 }, "backoff reset")
	_, counts := r.snapshot()
	require.Equal(t, map[string]int{"x": 1, "y": 1}, counts)
}

func TestCloseFinalFlush(t *testing.T) {
	var r recorder[int]
	s, err := bgsync.New(r.flush, bgsync.WithInterval(never), bgsync.WithBatchSize(10))
	require.NoError(t, err)
	for i := range 25 {
		s.Mark(i)
	}
	require.NoError(t, s.Close(context.Background()))
	_, counts := r.snapshot()
	require.Len(t, counts, 25)
	require.Zero(t, s.Pending())
}

func TestCloseRetriesUntilFlushed(t *testing.T) {
	var calls atomic.Int32
	flush := func(_ context.Context, batch []int) ([]int, error) {
		switch calls.Add(1) {
		case 1:
			return nil, errors.New("transient")
		case 2:
			return batch[:1], nil
		}
		return nil, nil
	}
	s, err := bgsync.New(flush, bgsync.WithInterval(never), bgsync.WithBackoff(time.Millisecond, 2*time.Millisecond))
	require.NoError(t, err)
	s.Mark(1)
	s.Mark(2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.Close(ctx))
	require.EqualValues(t, 3, calls.Load())
	require.Zero(t, s.Pending())
}

func TestCloseGivesUpWhenCtxDone(t *testing.T) {
	errDown := errors.New("redis down")
	var calls atomic.Int32
	flush := func(context.Context, []int) ([]int, error) {
		calls.Add(1)
		return nil, errDown
	}
	s, err := bgsync.New(flush, bgsync.WithInterval(never), bgsync.WithBackoff(time.Millisecond, 2*time.Millisecond))
	require.NoError(t, err)
	s.Mark(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err = s.Close(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, errDown)
	require.GreaterOrEqual(t, calls.Load(), int32(1))
	require.Equal(t, 1, s.Pending(), "the item is kept, not dropped")
}

func TestCloseAttemptsOnceWithDoneCtx(t *testing.T) {
	var r recorder[int]
	s, err := bgsync.New(r.flush, bgsync.WithInterval(never))
	require.NoError(t, err)
	s.Mark(7)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, s.Close(ctx))
	_, counts := r.snapshot()
	require.Equal(t, map[int]int{7: 1}, counts)
}

func TestCloseCancelsTickInProgress(t *testing.T) {
	entered := make(chan struct{})
	var calls atomic.Int32
	flush := func(ctx context.Context, batch []int) ([]int, error) {
		if calls.Add(1) == 1 {
			close(entered)
			<-ctx.Done() // a hung backend; only the cancel gets us out
			return nil, ctx.Err()
		}
		return nil, nil
	}
	s, err := bgsync.New(flush, bgsync.WithInterval(time.Millisecond), bgsync.WithTimeout(time.Hour))
	require.NoError(t, err)
	s.Mark(1)
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.NoError(t, s.Close(ctx), "the first final attempt runs even though ctx is done")
	require.EqualValues(t, 2, calls.Load())
	require.Zero(t, s.Pending())
}

func TestCloseIdempotent(t *testing.T) {
	var r recorder[int]
	s, err := bgsync.New(r.flush, bgsync.WithInterval(never))
	require.NoError(t, err)
	s.Mark(1)
	var wg gosync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Close(context.Background()) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, s.Close(context.Background()))
	_, counts := r.snapshot()
	require.Equal(t, map[int]int{1: 1}, counts)
}

func TestMarkAfterClose(t *testing.T) {
	var r recorder[int]
	s, err := bgsync.New(r.flush, bgsync.WithInterval(time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, s.Close(context.Background()))
	require.NotPanics(t, func() { s.Mark(1) })
	require.Zero(t, s.Pending())
	require.ErrorIs(t, s.Flush(context.Background()), ratelimit.ErrClosed)
	time.Sleep(5 * time.Millisecond) // would be several ticks
	batches, _ := r.snapshot()
	require.Empty(t, batches)
}

func TestMarkNeverBlocksDuringFlush(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once gosync.Once
	flush := func(context.Context, []int) ([]int, error) {
		once.Do(func() { close(entered) })
		<-release
		return nil, nil
	}
	s := newSyncer(t, flush, bgsync.WithInterval(time.Millisecond), bgsync.WithTimeout(time.Hour))
	s.Mark(0)
	<-entered // the owner is now blocked inside the FlushFunc

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= 1000; i++ {
			s.Mark(i)
		}
		_ = s.Pending()
		_ = s.Stats()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("Mark blocked while a FlushFunc was in progress")
	}
	require.Equal(t, 1000, s.Pending())
	close(release)
	require.NoError(t, s.Close(context.Background()))
}

func TestFlushWaitsForCtx(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once gosync.Once
	flush := func(context.Context, []int) ([]int, error) {
		once.Do(func() { close(entered) })
		<-release
		return nil, nil
	}
	s := newSyncer(t, flush, bgsync.WithInterval(time.Millisecond), bgsync.WithTimeout(time.Hour))
	s.Mark(0)
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.Flush(ctx), context.DeadlineExceeded, "Flush waits for the tick in progress, within ctx")
	close(release)
}

func TestNoConcurrentFlushFuncs(t *testing.T) {
	var inFlight atomic.Int32
	var overlaps, calls atomic.Int32
	reoffered := map[int]bool{}
	flush := func(_ context.Context, batch []int) ([]int, error) {
		if !inFlight.CompareAndSwap(0, 1) {
			overlaps.Add(1)
		}
		calls.Add(1)
		time.Sleep(50 * time.Microsecond)
		inFlight.Store(0)
		// Offer every third item once more (calls are serialized: no lock).
		var again []int
		for _, it := range batch {
			if it%3 == 0 && !reoffered[it] {
				reoffered[it] = true
				again = append(again, it)
			}
		}
		return again, nil
	}
	s := newSyncer(t, flush, bgsync.WithInterval(time.Millisecond), bgsync.WithBatchSize(4))
	var wg gosync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				s.Mark(g*1000 + i)
				if i%10 == 0 {
					_ = s.Flush(context.Background())
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, s.Close(context.Background()))
	require.Zero(t, overlaps.Load(), "two FlushFunc calls overlapped")
	require.Positive(t, calls.Load())
}

func TestOnTickAndObserver(t *testing.T) {
	var mu gosync.Mutex
	var log []string
	add := func(s string) {
		mu.Lock()
		log = append(log, s)
		mu.Unlock()
	}
	var sp atomic.Pointer[bgsync.Syncer[string]]
	marked := make(chan struct{})
	var once gosync.Once
	flush := func(_ context.Context, batch []string) ([]string, error) {
		add(fmt.Sprint("flush ", batch))
		return nil, nil
	}
	s := newSyncer(t, flush, bgsync.WithInterval(time.Millisecond),
		bgsync.WithOnTick(func(ctx context.Context) {
			s := sp.Load()
			if s == nil || ctx.Err() != nil {
				return
			}
			once.Do(func() {
				add("tick")
				s.Mark("housekeeping") // flushed by this very tick
				close(marked)
			})
		}),
		bgsync.WithObserver(func(e bgsync.FlushEvent) {
			add(fmt.Sprint("event ", e.Items, " ", e.Err))
		}))
	sp.Store(s)
	<-marked
	waitFor(t, func() bool { return s.Stats().Items == 1 }, "flushed")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"tick", "flush [housekeeping]", "event 1 <nil>"}, log)
	require.Positive(t, s.Stats().Ticks)
}
