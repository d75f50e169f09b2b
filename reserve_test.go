package ratelimit_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
)

// ledger is a Settler that applies each settlement at most once, as the
// contract asks, and can fail a call after applying it (a lost reply) or
// before (never sent).
type ledger struct {
	mu         sync.Mutex
	applied    []int // the actuals applied
	calls      int
	lostReply  bool // the next call is applied, then fails
	notSent    bool // the next call fails without being applied
	settledWas *int
}

var errLost = errors.New("reply lost")

func (l *ledger) Settle(_ context.Context, actual int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.notSent {
		l.notSent = false
		return errLost
	}
	if l.settledWas != nil {
		if *l.settledWas == actual {
			return nil // a replay
		}
		return ratelimit.ErrSettled
	}
	l.applied = append(l.applied, actual)
	l.settledWas = &actual
	if l.lostReply {
		l.lostReply = false
		return errLost
	}
	return nil
}

func admitted(est int, s ratelimit.Settler) *ratelimit.Reservation {
	return ratelimit.NewReservation(ratelimit.Decision{Allowed: true, Limit: ratelimit.PerSecond(10)}, est, s)
}

func TestReservationSettleOnce(t *testing.T) {
	ctx := context.Background()
	l := &ledger{}
	r := admitted(5, l)
	require.True(t, r.OK())
	require.Equal(t, 5, r.Estimate())
	require.NoError(t, r.Settle(ctx, 3))
	require.NoError(t, r.Settle(ctx, 3), "the same actual again is a no-op")
	require.ErrorIs(t, r.Settle(ctx, 4), ratelimit.ErrSettled)
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrSettled)
	require.Equal(t, []int{3}, l.applied)
	require.Equal(t, 1, l.calls, "a settled reservation does not call the limiter again")
	a, ok := r.Settled()
	require.True(t, ok)
	require.Equal(t, 3, a)
}

func TestReservationRetryAfterLostReply(t *testing.T) {
	ctx := context.Background()
	l := &ledger{lostReply: true}
	r := admitted(5, l)
	require.ErrorIs(t, r.Settle(ctx, 8), errLost)
	_, ok := r.Settled()
	require.False(t, ok)
	require.NoError(t, r.Settle(ctx, 8), "the retry finds it applied")
	require.Equal(t, []int{8}, l.applied)

	// A retry with the estimate after a failure still asks the limiter:
	// the failed call may have been applied with another actual.
	l = &ledger{lostReply: true}
	r = admitted(5, l)
	require.ErrorIs(t, r.Settle(ctx, 2), errLost)
	require.ErrorIs(t, r.Settle(ctx, 5), ratelimit.ErrSettled)
	require.Equal(t, []int{2}, l.applied)

	l = &ledger{notSent: true}
	r = admitted(5, l)
	require.ErrorIs(t, r.Cancel(ctx), errLost)
	require.NoError(t, r.Settle(ctx, 1), "nothing was applied: another actual is fine")
	require.Equal(t, []int{1}, l.applied)
}

func TestReservationEstimateNeedsNoCall(t *testing.T) {
	l := &ledger{}
	r := admitted(5, l)
	require.NoError(t, r.Settle(context.Background(), 5))
	require.Zero(t, l.calls)
	require.ErrorIs(t, r.Settle(context.Background(), 6), ratelimit.ErrSettled)
}

func TestReservationDeniedHoldsNothing(t *testing.T) {
	ctx := context.Background()
	for name, r := range map[string]*ratelimit.Reservation{
		"denied": ratelimit.NewReservation(ratelimit.Decision{}, 5, nil),
		"zero":   {},
		"nil":    nil,
	} {
		require.False(t, r.OK(), name)
		require.NoError(t, r.Cancel(ctx), name)
		require.NoError(t, r.Settle(ctx, 0), name)
		require.ErrorIs(t, r.Settle(ctx, 1), ratelimit.ErrNotReserved, name)
	}
	require.ErrorIs(t, admitted(5, nil).Settle(ctx, 1), ratelimit.ErrNotReserved)
}

func TestReservationBadActual(t *testing.T) {
	l := &ledger{}
	r := admitted(5, l)
	require.ErrorIs(t, r.Settle(context.Background(), -1), ratelimit.ErrInvalidN)
	require.ErrorIs(t, r.Settle(context.Background(), 1<<53+1), ratelimit.ErrInvalidN)
	require.Zero(t, l.calls)
}

func TestReservationConcurrentSettle(t *testing.T) {
	l := &ledger{}
	r := admitted(5, l)
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.Settle(context.Background(), 1+i%2)
		}()
	}
	wg.Wait()
	a, ok := r.Settled()
	require.True(t, ok)
	var okCount int
	for _, err := range errs {
		if err == nil {
			okCount++
		} else {
			require.ErrorIs(t, err, ratelimit.ErrSettled)
		}
	}
	require.Equal(t, 8, okCount, "every call with the winning actual succeeds")
	require.Equal(t, []int{a}, l.applied)
	require.Equal(t, 1, l.calls)
}
