package server_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// outageCounts hammers req through every daemon while Redis freezes from
// freezeAt for freezeFor, and counts the calls answered OK per window of
// period p. A call is counted in the window its start and its answer both
// fall in (the decision was taken between them); a call spanning a
// window's end is left out, and counted apart.
func outageCounts(t *testing.T, ds []*daemon, redis *redistest.Server, req *pb.RateLimitRequest, p, freezeAt, freezeFor, runFor time.Duration) (perWin map[int64]int, spanning int) {
	t.Helper()
	go func() {
		time.Sleep(freezeAt)
		must(t, redis.Freeze())
		time.Sleep(freezeFor)
		must(t, redis.Thaw())
	}()
	var mu sync.Mutex
	perWin = map[int64]int{}
	stop := time.Now().Add(runFor)
	var wg sync.WaitGroup
	for _, d := range ds {
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					resp, err := d.rls.ShouldRateLimit(ctx, req)
					cancel()
					end := time.Now()
					if err != nil {
						t.Errorf("ShouldRateLimit: %v", err)
						return
					}
					if resp.OverallCode != pb.RateLimitResponse_OK {
						continue
					}
					w0, w1 := start.UnixNano()/int64(p), end.UnixNano()/int64(p)
					mu.Lock()
					if w0 == w1 {
						perWin[w0]++
					} else {
						spanning++
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return perWin, spanning
}

// Through ratelimitd's gRPC API, as through the library: a hot key far
// over 1,000 per second, two replicas on one Redis frozen (SIGSTOP) for
// 2.6s across windows: no window admits over the limit, the window where
// Redis comes back included (strict, failure_mode local: the defaults).
func TestOutageRecoveryGRPC(t *testing.T) {
	outageGRPC(t, "")
}

// The same in mode exact (one script call per descriptor, global's
// FailLocal): while Redis is away each replica admits the window's
// last-known remainder shared by the fleet it learned (2 replicas), or
// its share of a window begun during the outage, and what it admitted is
// charged when Redis is back; no window over the limit.
func TestOutageRecoveryGRPCExact(t *testing.T) {
	outageGRPC(t, ", mode: exact")
}

func outageGRPC(t *testing.T, mode string) {
	redis := redistest.Standalone(t)
	cfg := configDir(t, map[string]string{"o.yaml": "domain: o\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000" + mode + "}\n"})
	prefix := uniq("outage")
	var ds []*daemon
	for range 2 {
		ds = append(ds, start(t, redis.Addr(), cfg, func(o *server.Options) {
			o.Prefix, o.Timeout = prefix, 100*time.Millisecond
		}))
	}
	req := rq("o", desc("k", "hot"))
	for _, d := range ds {
		d.call(t, req) // a first lease
	}
	// Start at a second's start.
	time.Sleep(time.Second - time.Duration(time.Now().UnixNano()%int64(time.Second)) + 2*time.Millisecond)
	perWin, spanning := outageCounts(t, ds, redis, req, time.Second, 1400*time.Millisecond, 2600*time.Millisecond, 5*time.Second)
	var idx []int64
	for i := range perWin {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
	var line string
	for _, i := range idx {
		line += fmt.Sprintf(" %d", perWin[i])
	}
	t.Logf("answered OK per second:%s (%d more spanning a second's end)", line, spanning)
	for _, i := range idx {
		if perWin[i] > 1000 {
			t.Errorf("window %d: %d answered OK, over the limit of 1,000", i, perWin[i])
		}
	}
}

// A rule of several limits in mode exact (global.Multi, failure_mode
// local): a nested descriptor of 1,000 per second and 100 per minute, its
// hot key far over both from two replicas, Redis frozen (SIGSTOP) for 2.6s,
// the run within one minute. Every replica knew the minute's remainder
// when Redis froze, and admits at most its share of it (the fleet it
// learned) until the minute ends; before, each replica's fallback admitted
// its 50 on top: 200, every run. The minute admits at most its 100.
func TestOutageRecoveryGRPCExactMulti(t *testing.T) {
	redis := redistest.Standalone(t)
	cfg := configDir(t, map[string]string{"o.yaml": `domain: o
descriptors:
  - key: k
    descriptors:
      - key: sub
        rate_limits:
          - {unit: second, requests_per_unit: 1000, mode: exact}
          - {unit: minute, requests_per_unit: 100}
`})
	prefix := uniq("outage")
	var ds []*daemon
	for range 2 {
		ds = append(ds, start(t, redis.Addr(), cfg, func(o *server.Options) {
			o.Prefix, o.Timeout = prefix, 100*time.Millisecond
		}))
	}
	req := rq("o", desc("k", "hot", "sub", "x"))
	// The whole run within one minute, from a second's start.
	if now := time.Now(); now.Add(8*time.Second).Truncate(time.Minute) != now.Truncate(time.Minute) {
		time.Sleep(time.Until(now.Truncate(time.Minute).Add(time.Minute)))
	}
	admitted := 0
	for _, d := range ds {
		if d.call(t, req).OverallCode == pb.RateLimitResponse_OK {
			admitted++
		}
	}
	time.Sleep(time.Second - time.Duration(time.Now().UnixNano()%int64(time.Second)) + 2*time.Millisecond)
	perWin, spanning := outageCounts(t, ds, redis, req, time.Minute, 1400*time.Millisecond, 2600*time.Millisecond, 5*time.Second)
	for _, n := range perWin {
		admitted += n
	}
	t.Logf("answered OK in the minute: %d (%d of them spanning a minute's end)", admitted+spanning, spanning)
	if len(perWin) > 1 || admitted+spanning > 100 {
		t.Errorf("%d answered OK in one minute (per minute: %v, %d spanning), over the limit of 100", admitted+spanning, perWin, spanning)
	}
}
