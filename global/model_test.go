package global_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/stretchr/testify/require"
)

// model is docs/algorithms.md written out in int64 Go, for one key.
type model struct {
	alg          ratelimit.Algorithm
	r, p, b      int64
	windows      map[int64]int64 // window index -> count
	log          []int64         // SlidingLog timestamps, sorted
	u, ts, tat   int64
	bucketExists bool
}

func floorDiv(a, b int64) int64 { return a / b } // a, b >= 0 here
func ceilDiv(a, b int64) int64  { return (a + b - 1) / b }

// allow returns allowed, remaining, retry and reset in microseconds.
func (m *model) allow(now, n int64) (bool, int64, int64, int64) {
	R, P := m.r, m.p
	switch m.alg {
	case ratelimit.FixedWindow:
		ws := now - now%P
		count := m.windows[ws/P]
		ok := count+n <= R
		if ok {
			count += n
			m.windows[ws/P] = count
		}
		retry := int64(0)
		if !ok {
			retry = ws + P - now
		}
		return ok, max(0, R-count), retry, ws + P - now
	case ratelimit.SlidingWindow:
		ws := now - now%P
		e := now - ws
		curr, prev := m.windows[ws/P], m.windows[ws/P-1]
		est := floorDiv(prev*(P-e), P) + curr
		ok := est+n <= R
		var retry int64
		if ok {
			curr += n
			est += n
			m.windows[ws/P] = curr
		} else {
			first := func(c, room int64) int64 { return max(0, P-ceilDiv((room+1)*P, c)+1) }
			if room := R - curr - n; room >= 0 {
				retry = first(prev, room) - e
			} else {
				retry = (P - e) + first(curr, R-n)
			}
		}
		return ok, max(0, R-est), retry, ws + P - now
	case ratelimit.SlidingLog:
		live := m.log[:0:0]
		for _, t := range m.log {
			if t > now-P {
				live = append(live, t)
			}
		}
		count := int64(len(live))
		ok := count+n <= R
		var retry int64
		if ok {
			m.log = live
			for i := int64(0); i < n; i++ {
				m.log = append(m.log, now)
			}
			sort.Slice(m.log, func(i, j int) bool { return m.log[i] < m.log[j] })
			live = m.log
			count += n
		} else {
			retry = live[count+n-R-1] + P - now
		}
		reset := int64(0)
		if len(live) > 0 {
			reset = live[len(live)-1] + P - now
		}
		return ok, max(0, R-count), retry, reset
	case ratelimit.TokenBucket:
		C := m.b * P
		if !m.bucketExists {
			m.u, m.ts = C, now
		}
		u, ts := m.u, m.ts
		if d := now - ts; d > 0 && d > (C-u)/R {
			u = C
		} else if d > 0 {
			u = min(C, u+d*R)
		}
		u = min(u, C)
		ts = max(ts, now)
		need := n * P
		ok := u >= need
		var retry int64
		if ok {
			u -= need
			m.u, m.ts, m.bucketExists = u, ts, true
		} else {
			retry = ceilDiv(need-u, R)
		}
		return ok, u / P, retry, ceilDiv(C-u, R)
	default: // GCRA
		T := P / R
		tau := m.b * T
		tat := m.tat
		if !m.bucketExists || tat < now {
			tat = now
		}
		ntat := tat + n*T
		ok := ntat-now <= tau
		var retry int64
		if ok {
			tat = ntat
			m.tat, m.bucketExists = tat, true
		} else {
			retry = ntat - tau - now
		}
		return ok, max(0, (tau-(tat-now))/T), retry, tat - now
	}
}

// TestModel drives every algorithm with random requests at random instants
// against the int64 model above, with limits whose products come within a
// hair of 2^53, where a careless double division in Lua would be off by one.
func TestModel(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	limits := []ratelimit.Limit{
		{Rate: 2_501_999, Period: time.Hour},                                                 // R x P = 9.007e15, just under 2^53
		{Rate: 7, Period: time.Duration(1_286_742_750_677_284) * time.Microsecond, Burst: 7}, // ~2^53 / 7
		{Rate: 3, Period: 1_000_001 * time.Microsecond, Burst: 2},
	}
	for li, limit := range limits {
		require.NoError(t, limit.Validate())
		for _, alg := range ratelimit.Algorithms() {
			if alg == ratelimit.SlidingLog && limit.Rate > 1000 {
				continue // a 2.5M-entry log is not what this test is about
			}
			t.Run(fmt.Sprintf("%d/%v", li, alg), func(t *testing.T) {
				clk := &fakeClock{}
				now := int64(1_000_000_123_457)
				lim := newLimiter(t, c, limit, global.WithAlgorithm(alg), global.WithClock(clk.Now))
				P := int64(limit.Period / time.Microsecond)
				m := &model{alg: alg, r: int64(limit.Rate), p: P, b: int64(limit.Capacity(alg)), windows: map[int64]int64{}}
				capacity := limit.Capacity(alg)
				rng := rand.New(rand.NewPCG(uint64(li), uint64(alg)))
				var allowed, denied int
				for i := 0; i < 400; i++ {
					// Steps stay small against P so that now stays below 2^53
					// even for the ~40-year Period.
					switch k := rng.IntN(80); {
					case k < 20:
					case k < 40:
						now += rng.Int64N(P/int64(limit.Rate) + 1)
					case k < 79:
						now += rng.Int64N(P/100 + 1)
					default:
						now += rng.Int64N(P + 1)
					}
					if now >= 1<<53 {
						break // beyond 2^53 even the clock is not exact in Lua
					}
					var n int
					if rng.IntN(2) == 0 {
						n = 1 + rng.IntN(capacity)
					} else {
						n = 1 + rng.IntN(min(capacity, 3))
					}
					clk.Set(now)
					d, err := lim.AllowN(ctx, "k", n)
					require.NoError(t, err)
					ok, rem, retry, reset := m.allow(now, int64(n))
					require.Equal(t, want{ok, int(rem), retry, reset}, want{d.Allowed, d.Remaining,
						int64(d.RetryAfter / time.Microsecond), int64(d.ResetAfter / time.Microsecond)},
						"request %d: now=%d n=%d", i, now, n)
					if ok {
						allowed++
					} else {
						denied++
					}
				}
				require.Positive(t, allowed)
				require.Positive(t, denied)
			})
		}
	}
	requireAllTTL(t, c)
}
