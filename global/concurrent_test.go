package global_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const (
	hammerClients    = 4
	hammerGoroutines = 32
)

// deployment is a Redis to hammer: a way to make independent clients.
type deployment struct {
	name      string
	newClient func() redis.UniversalClient
}

// TestConcurrent hammers one fresh key per algorithm from 4 clients x 32
// goroutines, on a standalone server and on a 6-node Cluster, and checks the
// admitted total: exactly Rate for the window algorithms (all calls inside
// one window), Burst + Rate x elapsed / Period within 2% for the buckets.
func TestConcurrent(t *testing.T) {
	srv := redistest.Standalone(t)
	cl := redistest.NewCluster(t)
	deps := []deployment{
		{"standalone", func() redis.UniversalClient { return srv.Client() }},
		{"cluster", func() redis.UniversalClient { return cl.Client() }},
	}
	for _, dep := range deps {
		t.Run(dep.name, func(t *testing.T) {
			t.Run("group", func(t *testing.T) {
				for _, alg := range ratelimit.Algorithms() {
					t.Run(alg.String(), func(t *testing.T) {
						t.Parallel()
						hammer(t, dep, alg)
					})
				}
			})
			c := dep.newClient()
			defer c.Close()
			requireAllTTL(t, c)
		})
	}
}

func hammer(t *testing.T, dep deployment, alg ratelimit.Algorithm) {
	ctx := context.Background()
	clients := make([]redis.UniversalClient, hammerClients)
	for i := range clients {
		clients[i] = dep.newClient()
		defer clients[i].Close()
	}
	var limit ratelimit.Limit
	if alg.IsWindow() {
		limit = ratelimit.Limit{Rate: 1000, Period: 10 * time.Second}
	} else {
		limit = ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 500}
	}
	prefix := uniquePrefix(t)
	lims := make([]*global.Limiter, hammerClients)
	for i, c := range clients {
		l, err := global.New(c, limit, global.WithAlgorithm(alg), global.WithPrefix(prefix))
		require.NoError(t, err)
		lims[i] = l
	}
	p := int64(limit.Period / time.Microsecond)

	if alg.IsWindow() {
		// Start inside one window with at least 5s of it left, so every
		// call lands in it.
		now := serverMicros(t, clients[0])
		if left := p - now%p; left < 5*sec {
			time.Sleep(time.Duration(left+100*ms) * time.Microsecond)
		}
	}

	var (
		allowed, denied atomic.Int64
		errs            = make(chan error, hammerClients*hammerGoroutines)
		wg              sync.WaitGroup
	)
	start := serverMicros(t, clients[0])
	deadline := time.Now().Add(1500 * time.Millisecond)
	for i := 0; i < hammerClients; i++ {
		for g := 0; g < hammerGoroutines; g++ {
			wg.Add(1)
			go func(l *global.Limiter) {
				defer wg.Done()
				for j := 0; ; j++ {
					if alg.IsWindow() && j >= 20 { // 2560 calls for Rate 1000
						return
					}
					if !alg.IsWindow() && time.Now().After(deadline) {
						return
					}
					d, err := l.Allow(ctx, "hot")
					if err != nil {
						errs <- err
						return
					}
					if d.Remaining < 0 || (d.Allowed && d.RetryAfter != 0) || (!d.Allowed && d.RetryAfter <= 0) {
						errs <- errorf("bad decision %+v", d)
						return
					}
					if d.Allowed {
						allowed.Add(1)
					} else {
						denied.Add(1)
					}
				}
			}(lims[i])
		}
	}
	wg.Wait()
	end := serverMicros(t, clients[0])
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got := allowed.Load()
	t.Logf("%v: %d allowed, %d denied in %v (server time)", alg, got, denied.Load(), time.Duration(end-start)*time.Microsecond)
	if alg.IsWindow() {
		require.Equal(t, start/p, end/p, "the calls crossed a window boundary")
		require.Equal(t, int64(limit.Rate), got)
		return
	}
	want := float64(limit.Burst) + float64(limit.Rate)*float64(end-start)/float64(p)
	require.InDelta(t, want, float64(got), math.Max(0.02*want, 1), "allowed %d, want %.1f", got, want)
	require.Greater(t, denied.Load(), int64(0))
}

type errString string

func (e errString) Error() string { return string(e) }

func errorf(format string, args ...any) error { return errString(sprintf(format, args...)) }
