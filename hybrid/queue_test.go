package hybrid

import (
	"context"
	"fmt"
	"runtime"
	gosync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// item is a queued call for the queue's tests.
type item string

func (i item) request() request { return request{} }
func (i item) base() string     { return string(i) }

// blockingSends records the queue's batches; each send blocks until the
// test releases it.
type blockingSends struct {
	batches chan []string
	release chan struct{}
}

func newBlockingSends() *blockingSends {
	return &blockingSends{batches: make(chan []string, 16), release: make(chan struct{}, 16)}
}

func (b *blockingSends) send(batch []queued) {
	var names []string
	for _, q := range batch {
		names = append(names, q.base())
	}
	b.batches <- names
	<-b.release
}

// next returns the next batch sent, or fails after a while.
func (b *blockingSends) next(t *testing.T) []string {
	t.Helper()
	select {
	case names := <-b.batches:
		return names
	case <-time.After(5 * time.Second):
		t.Fatal("no batch sent")
		return nil
	}
}

// none checks that no batch is sent for a while.
func (b *blockingSends) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case names := <-b.batches:
		t.Fatalf("batch %v sent while none should be", names)
	case <-time.After(d):
	}
}

func newTestQueue(b *blockingSends, gap time.Duration, maxInFlight int, wg *gosync.WaitGroup) *queue {
	start := time.Now()
	return &queue{maxInFlight: maxInFlight, gap: func() time.Duration { return gap }, mono: func() int64 { return int64(time.Since(start)) },
		wg: wg, send: b.send}
}

// Near Redis (no gap): a lone call goes at once; what comes while a batch
// is out waits for it, and goes together in the next batch.
func TestQueueNearOneBatchOut(t *testing.T) {
	var wg gosync.WaitGroup
	b := newBlockingSends()
	q := newTestQueue(b, 0, 16, &wg)
	q.add(item("a"))
	require.Equal(t, []string{"a"}, b.next(t))
	q.add(item("b"))
	q.add(item("c"))
	b.none(t, 50*time.Millisecond)
	b.release <- struct{}{} // a's round trip ends
	require.Equal(t, []string{"b", "c"}, b.next(t))
	b.release <- struct{}{}
	wg.Wait()
	require.True(t, q.idle())
}

// Far from Redis (a gap): what comes while a batch is out goes beside it
// once the gap has passed, without waiting for it to come back, up to
// maxInFlight batches; beyond that it waits for one to come back.
func TestQueueFarBatchesBeside(t *testing.T) {
	var wg gosync.WaitGroup
	b := newBlockingSends()
	q := newTestQueue(b, 300*time.Millisecond, 2, &wg) // long enough that b and c both come within it
	q.add(item("a"))
	require.Equal(t, []string{"a"}, b.next(t))
	q.add(item("b")) // within the gap: a timer sends it when the gap has passed
	q.add(item("c"))
	require.Equal(t, []string{"b", "c"}, b.next(t), "sent beside a, which has not come back")
	q.add(item("d")) // two out: d waits for one to come back
	b.none(t, 50*time.Millisecond)
	b.release <- struct{}{}
	require.Equal(t, []string{"d"}, b.next(t))
	b.release <- struct{}{}
	b.release <- struct{}{}
	wg.Wait()
	require.True(t, q.idle())
}

func TestGapFor(t *testing.T) {
	require.Zero(t, gapFor(300*time.Microsecond), "near: one batch out at a time")
	require.Zero(t, gapFor(0), "no round trip measured yet")
	require.Equal(t, minGap, gapFor(farRTT))
	require.Equal(t, 100*time.Millisecond/gapDiv, gapFor(100*time.Millisecond))
}

// waiter is a queued call whose caller waits for its answer.
type waiter struct {
	name string
	done chan struct{}
}

func (w *waiter) request() request { return request{} }
func (w *waiter) base() string     { return w.name }

// Callers answered by a batch queue their next calls before the next batch
// goes, so the callers of a closed loop share every round trip instead of
// splitting into groups that alternate (awaitReturn). On one processor
// the order is fixed: a batch's round trip (a sleep) lets every caller
// queue; without the yields after it, one caller answered last would
// always miss the next batch and take a round trip of its own.
func TestQueueAnsweredCallersShareNextBatch(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const callers, rounds = 4, 20
	var sizes []int
	var wg gosync.WaitGroup
	start := time.Now()
	q := &queue{maxInFlight: 1, gap: func() time.Duration { return 0 }, mono: func() int64 { return int64(time.Since(start)) },
		wg: &wg, send: func(batch []queued) {
			sizes = append(sizes, len(batch)) // one sender at a time (maxInFlight 1, no gap)
			time.Sleep(time.Millisecond)      // the round trip
			for _, c := range batch {
				close(c.(*waiter).done)
			}
		}}
	var callersWG gosync.WaitGroup
	for i := range callers {
		callersWG.Add(1)
		go func() {
			defer callersWG.Done()
			for r := range rounds {
				w := &waiter{name: fmt.Sprintf("c%d-%d", i, r), done: make(chan struct{})}
				q.add(w)
				<-w.done
			}
		}()
	}
	callersWG.Wait()
	wg.Wait()
	total := 0
	for _, n := range sizes {
		total += n
	}
	require.Equal(t, callers*rounds, total, "every call sent once")
	// The first caller's first call goes alone; from then on each batch
	// carries every caller's call: rounds+1 batches.
	require.LessOrEqual(t, len(sizes), rounds+1, "batch sizes %v", sizes)
	require.True(t, q.idle())
}

// The heartbeat period halves joinRamp times right after an instance joins
// and then stays at its period.
func TestBeatGap(t *testing.T) {
	var gaps []time.Duration
	for beats := 0; beats < 7; beats++ {
		gaps = append(gaps, time.Duration(beatGap(time.Second, beats)))
	}
	require.Equal(t, []time.Duration{62500 * time.Microsecond, 125 * time.Millisecond, 250 * time.Millisecond,
		500 * time.Millisecond, time.Second, time.Second, time.Second}, gaps)
}

// A slow yield (a busy host: every processor runs, and a yield waits for
// a turn of every runnable goroutine) ends the yielding, and the next
// batches go without yields, twice as many after each slow yield in a
// row; a quick yield brings the four yields back.
func TestQueueSlowYieldSkipsYields(t *testing.T) {
	var clock time.Time
	yields, slow := 0, true
	q := &queue{
		now: func() time.Time { return clock },
		yield: func() {
			yields++
			if slow {
				clock = clock.Add(slowYield)
			}
		},
	}
	q.awaitReturn()
	require.Equal(t, 1, yields, "the slow yield is the last")
	for range skipYields {
		q.awaitReturn()
	}
	require.Equal(t, 1, yields, "the next batches go without yields")
	q.awaitReturn()
	require.Equal(t, 2, yields, "a yield again, slow again")
	for range 2 * skipYields {
		q.awaitReturn()
	}
	require.Equal(t, 2, yields, "twice as many batches without yields")
	slow = false
	q.awaitReturn()
	require.Equal(t, 2+returnYields, yields, "quick yields: all of them")
	q.awaitReturn()
	require.Equal(t, 2+2*returnYields, yields)
	slow = true
	q.awaitReturn()
	require.Equal(t, 3+2*returnYields, yields)
	for range skipYields {
		q.awaitReturn()
	}
	require.Equal(t, 3+2*returnYields, yields, "after quick yields, a slow one skips skipYields batches again")

	// Slow yields in a row skip at most maxSkipYields batches.
	for range 20 {
		q.awaitReturn()
		for q.skip.Load() > 0 {
			q.awaitReturn()
		}
	}
	require.Equal(t, int64(maxSkipYields), q.skipNext.Load())
}

// ownSends records the batches a queue's callers send themselves (own);
// each send blocks until the test releases it, or its caller's timeout
// fires first (then the caller goes, and the send ends on its own later,
// as Limiter.sendOwn's does).
type ownSends struct {
	batches chan []string
	release chan struct{}
}

func (o *ownSends) sendOwn(batch []queued, w waitFor, after func()) error {
	var names []string
	for _, q := range batch {
		names = append(names, q.base())
	}
	o.batches <- names
	select {
	case <-o.release:
		after()
		return w.wait()
	case <-w.timeout:
		go func() { <-o.release; after() }()
		return context.DeadlineExceeded
	}
}

func newOwnSends() *ownSends {
	return &ownSends{batches: make(chan []string, 16), release: make(chan struct{}, 16)}
}

// A caller whose call finds the queue idle sends it itself (sendOwn, a
// batch of its call alone) and returns once its send is over; what is
// queued meanwhile goes in one batch after it, through a sender, and the
// queue is idle again once that is back. A caller whose call finds a
// batch out queues it, and waits for its answer.
func TestQueueOwnIdleSendsItself(t *testing.T) {
	var wg gosync.WaitGroup
	b, o := newBlockingSends(), newOwnSends()
	q := newTestQueue(b, 0, 16, &wg)
	q.sendOwn = o.sendOwn
	closed := make(chan struct{})
	close(closed)
	owned := make(chan error, 1)
	go func() { owned <- q.own(item("a"), waitFor{ctx: context.Background(), done: closed, alone: true}) }()
	require.Equal(t, []string{"a"}, <-o.batches, "sent by its caller, alone")
	q.add(item("b"))
	done := make(chan struct{})
	go func() { owned <- q.own(item("c"), waitFor{ctx: context.Background(), done: done, alone: true}) }()
	b.none(t, 50*time.Millisecond) // a is out: b and c wait for it
	require.False(t, q.idle())
	o.release <- struct{}{}
	require.NoError(t, <-owned)
	require.Equal(t, []string{"b", "c"}, b.next(t), "what came while a was out, together")
	select {
	case o := <-o.batches:
		t.Fatalf("c, which found a batch out, was sent by its caller: %v", o)
	default:
	}
	b.release <- struct{}{}
	close(done) // (c's answer)
	require.NoError(t, <-owned)
	wg.Wait()
	require.True(t, q.idle())
}

// A caller whose wait ends while it sends its own call (its timeout
// fired) returns at once with why, and the queue stays busy until the
// send is over; what came meanwhile goes out after it.
func TestQueueOwnCallerLeaves(t *testing.T) {
	var wg gosync.WaitGroup
	b, o := newBlockingSends(), newOwnSends()
	q := newTestQueue(b, 0, 16, &wg)
	q.sendOwn = o.sendOwn
	fire := make(chan time.Time, 1)
	owned := make(chan error, 1)
	go func() {
		owned <- q.own(item("a"), waitFor{ctx: context.Background(), done: make(chan struct{}), timeout: fire, alone: true})
	}()
	require.Equal(t, []string{"a"}, <-o.batches)
	q.add(item("b"))
	fire <- time.Now()
	require.ErrorIs(t, <-owned, context.DeadlineExceeded, "the caller went at its timeout")
	require.False(t, q.idle(), "its send is still out")
	b.none(t, 50*time.Millisecond)
	o.release <- struct{}{}
	require.Equal(t, []string{"b"}, b.next(t))
	b.release <- struct{}{}
	wg.Wait()
	require.True(t, q.idle())
}

// A caller that is not alone (another decision waits on Redis) queues its
// call even on an idle queue: a sender sends it.
func TestQueueOwnNotAloneQueues(t *testing.T) {
	var wg gosync.WaitGroup
	b, o := newBlockingSends(), newOwnSends()
	q := newTestQueue(b, 0, 16, &wg)
	q.sendOwn = o.sendOwn
	closed := make(chan struct{})
	close(closed)
	owned := make(chan error, 1)
	go func() { owned <- q.own(item("a"), waitFor{ctx: context.Background(), done: closed}) }()
	require.Equal(t, []string{"a"}, b.next(t), "sent by the queue's sender")
	b.release <- struct{}{}
	require.NoError(t, <-owned)
	wg.Wait()
	require.True(t, q.idle())
	select {
	case o := <-o.batches:
		t.Fatalf("sent by its caller: %v", o)
	default:
	}
}

// A queue's round trips: the mean is trusted after rttSamples of them, and
// is near the floor within rttNear times it; the floor is the least of
// this epoch and the one before, so that one fast round trip long ago
// does not hold it down for good.
func TestRTTTrack(t *testing.T) {
	var r rttTrack
	now := int64(rttEpoch) // (an epoch starts at the first round trip)
	for i := range rttSamples {
		require.False(t, r.atFloor(), "after %d round trips", i)
		r.add(int64(50*time.Microsecond), now)
	}
	require.True(t, r.atFloor(), "every round trip at the floor")
	require.Equal(t, int64(50*time.Microsecond), r.avg)

	r.add(int64(20*time.Microsecond), now) // a fast one: the floor
	require.True(t, r.atFloor(), "mean %d within %d times the floor", r.avg, rttNear)
	for range 8 * rttSmooth {
		r.add(int64(100*time.Microsecond), now)
	}
	require.False(t, r.atFloor(), "mean %d: 5 times the floor", r.avg)

	// The floor ages: an epoch later it still counts, two epochs later not.
	now += rttEpoch
	r.add(int64(100*time.Microsecond), now)
	require.False(t, r.atFloor(), "the floor of the epoch before still holds")
	now += rttEpoch
	r.add(int64(100*time.Microsecond), now)
	require.True(t, r.atFloor(), "the old floor aged out: 100µs is the floor now")

	var z rttTrack
	for range rttSamples {
		z.add(0, now) // (a clock that did not move: still a round trip)
	}
	require.True(t, z.atFloor())
}

// With the round trips at their floor (nothing queues before Redis), a
// caller whose call finds one batch out and nothing queued sends it
// itself beside it, even when not alone; a third finds two out and
// queues its call, which a sender takes once a send is back. Far round
// trips well above the floor, or too few to tell, keep one batch out:
// the call is queued; a far Redis sends it beside after the gap, through
// a sender, as before.
func TestQueueOwnOverlapsAtFloor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rtts     []time.Duration // the queue's round trips before
		gap      time.Duration
		overlaps bool
	}{
		{name: "at-floor", rtts: []time.Duration{40 * time.Microsecond, 60 * time.Microsecond}, overlaps: true},
		{name: "few-round-trips", rtts: nil},
		{name: "queued-before-redis", rtts: []time.Duration{10 * time.Microsecond, 200 * time.Microsecond}},
		{name: "far-redis", rtts: []time.Duration{40 * time.Microsecond, 60 * time.Microsecond}, gap: time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wg gosync.WaitGroup
			b, o := newBlockingSends(), newOwnSends()
			q := newTestQueue(b, tc.gap, 16, &wg)
			q.sendOwn = o.sendOwn
			if len(tc.rtts) > 0 {
				q.rtt.add(int64(tc.rtts[0]), q.mono()) // the floor
				for range 2 * rttSamples {
					q.rtt.add(int64(tc.rtts[1]), q.mono())
				}
			}
			closed := make(chan struct{})
			close(closed)
			owned := make(chan error, 3)
			go func() { owned <- q.own(item("a"), waitFor{ctx: context.Background(), done: closed, alone: true}) }()
			require.Equal(t, []string{"a"}, <-o.batches, "a lone caller on an idle queue sends its own")
			go func() { owned <- q.own(item("b"), waitFor{ctx: context.Background(), done: closed}) }()
			if tc.gap > 0 {
				// far: b goes beside a once a has been out for the gap,
				// through a sender
				require.Equal(t, []string{"b"}, b.next(t))
				b.release <- struct{}{}
				o.release <- struct{}{}
				require.NoError(t, <-owned)
				require.NoError(t, <-owned)
				wg.Wait()
				require.Empty(t, o.batches, "b sent by its caller")
				return
			}
			if !tc.overlaps {
				b.none(t, 50*time.Millisecond)
				select {
				case x := <-o.batches:
					t.Fatalf("%v sent beside a", x)
				default:
				}
				o.release <- struct{}{}
				require.Equal(t, []string{"b"}, b.next(t), "b went after a, through a sender")
				b.release <- struct{}{}
				require.NoError(t, <-owned)
				require.NoError(t, <-owned)
				wg.Wait()
				require.True(t, q.idle())
				return
			}
			select {
			case x := <-o.batches:
				require.Equal(t, []string{"b"}, x, "b sent by its caller beside a")
			case x := <-b.batches:
				t.Fatalf("%v queued while the round trips run at their floor", x)
			case <-time.After(5 * time.Second):
				t.Fatal("b not sent")
			}
			go func() { owned <- q.own(item("c"), waitFor{ctx: context.Background(), done: closed}) }()
			b.none(t, 50*time.Millisecond)
			select {
			case x := <-o.batches:
				t.Fatalf("%v sent beside two batches", x)
			default:
			}
			o.release <- struct{}{} // one of a and b is back
			require.Equal(t, []string{"c"}, b.next(t), "c went once a send was back")
			o.release <- struct{}{}
			b.release <- struct{}{}
			for range 3 {
				require.NoError(t, <-owned)
			}
			wg.Wait()
			require.True(t, q.idle())
		})
	}
}
