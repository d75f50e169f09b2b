package hybrid

import (
	gosync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Calls one after another run on one goroutine, started once; calls at
// once each get one, and up to maxIdleRunners stay for later; stop ends
// them all, and a call after stop still runs.
func TestRunners(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var wg gosync.WaitGroup
	r := &runners{wg: &wg}
	ran := 0
	for range 100 {
		done := make(chan struct{})
		r.run(jobFunc(func() { ran++; close(done) }))
		<-done
		// The runner puts itself back among the idle after its call: wait
		// for it, as the next call would come later.
		require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.idle) == 1 }, time.Second, time.Millisecond)
	}
	require.Equal(t, 100, ran)
	require.Equal(t, 1, r.started, "one goroutine for calls one after another")

	const busy = maxIdleRunners + 3
	release := make(chan struct{})
	var calls gosync.WaitGroup
	calls.Add(busy)
	for range busy {
		r.run(jobFunc(func() { <-release; calls.Done() }))
	}
	close(release)
	calls.Wait()
	require.Equal(t, busy, r.started, "the idle runner, and a new one for each other call at once")
	require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.idle) == maxIdleRunners }, time.Second, time.Millisecond)

	r.stop()
	wg.Wait() // every runner ended
	done := make(chan struct{})
	r.run(jobFunc(func() { close(done) }))
	<-done
	wg.Wait()
	require.Empty(t, r.idle)
}
