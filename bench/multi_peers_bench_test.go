package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/local"
)

// multiLimits are a key's per-second burst bucket, per-minute window and
// per-hour sliding window; over 10k keys none fills during a benchmark, so
// every decision is an admission.
var (
	multiLimits = []ratelimit.Limit{
		{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000},
		{Rate: 100_000_000, Period: time.Minute},
		{Rate: 2_500_000, Period: time.Hour},
	}
	multiAlgs = []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow}
)

// multiPeer is one way to decide multiLimits for a key.
type multiPeer struct {
	name  string
	allow func(ctx context.Context, key string) bool
}

// benchMultiPeers runs each peer over keys10k, serial and parallel.
func benchMultiPeers(b *testing.B, peers []multiPeer) {
	ctx := context.Background()
	for _, p := range peers {
		for _, k := range keys10k {
			if !p.allow(ctx, k) {
				b.Fatalf("%s denied %s", p.name, k)
			}
		}
		b.Run(p.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p.allow(ctx, keys10k[i])
				if i++; i == len(keys10k) {
					i = 0
				}
			}
		})
		b.Run(p.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(time.Now().UnixNano() % int64(len(keys10k)))
				for pb.Next() {
					p.allow(ctx, keys10k[i])
					if i++; i == len(keys10k) {
						i = 0
					}
				}
			})
		})
	}
}

// BenchmarkMultiMemory: three limits per key in memory, all or nothing
// with local.Multi, against three local.Limiters and three
// golang.org/x/time/rate Limiters per key asked in turn (where a request
// the third denies was already counted by the first two).
func BenchmarkMultiMemory(b *testing.B) {
	m, err := local.NewMulti(multiLimits, local.WithAlgorithms(multiAlgs...), local.WithMaxKeys(2*len(keys10k)))
	if err != nil {
		b.Fatal(err)
	}
	var three [3]*local.Limiter
	for i, l := range multiLimits {
		if three[i], err = local.New(l, local.WithAlgorithm(multiAlgs[i]), local.WithMaxKeys(2*len(keys10k))); err != nil {
			b.Fatal(err)
		}
	}
	xrate := make(map[string]*[3]*rate.Limiter, len(keys10k)) // read-only once built
	for _, k := range keys10k {
		var ls [3]*rate.Limiter
		for i, l := range multiLimits {
			ls[i] = rate.NewLimiter(rate.Limit(float64(l.Rate)/l.Period.Seconds()), l.Capacity(multiAlgs[i]))
		}
		xrate[k] = &ls
	}
	benchMultiPeers(b, []multiPeer{
		{"local-Multi", func(ctx context.Context, key string) bool {
			var arr [3]ratelimit.LimitState
			buf := arr[:0]
			d, _ := m.AllowNInto(ctx, key, 1, &buf)
			return d.Allowed
		}},
		{"local-3-Limiters", func(ctx context.Context, key string) bool {
			for _, l := range three {
				if d, _ := l.Allow(ctx, key); !d.Allowed {
					return false
				}
			}
			return true
		}},
		{"xtime-rate-3-Limiters", func(_ context.Context, key string) bool {
			for _, l := range xrate[key] {
				if !l.Allow() {
					return false
				}
			}
			return true
		}},
	})
}

// BenchmarkMultiRedis: three limits per key on a local redis-server, all or
// nothing in one script call with global.Multi, against three
// global.Limiters and three go-redis/redis_rate (GCRA) limits per key, one
// round trip each; and hybrid.Multi (leases of each limit, decided in
// memory) against three hybrid.Limiters.
func BenchmarkMultiRedis(b *testing.B) {
	srv := redistest.Standalone(b)
	c := srv.Client()
	defer c.Close()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	m, err := global.NewMulti(c, multiLimits, global.WithAlgorithms(multiAlgs...), global.WithPrefix("bm"+run))
	if err != nil {
		b.Fatal(err)
	}
	var three [3]*global.Limiter
	for i, l := range multiLimits {
		if three[i], err = global.New(c, l, global.WithAlgorithm(multiAlgs[i]), global.WithPrefix("b3"+strconv.Itoa(i)+run)); err != nil {
			b.Fatal(err)
		}
	}
	hm, err := hybrid.NewMulti(c, multiLimits, hybrid.WithAlgorithms(multiAlgs...), hybrid.WithPrefix("hm"+run), hybrid.WithInstances(1))
	if err != nil {
		b.Fatal(err)
	}
	defer hm.Close()
	var hthree [3]*hybrid.Limiter
	for i, l := range multiLimits {
		if hthree[i], err = hybrid.New(c, l, hybrid.WithAlgorithm(multiAlgs[i]), hybrid.WithPrefix("h3"+strconv.Itoa(i)+run), hybrid.WithInstances(1)); err != nil {
			b.Fatal(err)
		}
		defer hthree[i].Close()
	}
	rr := redis_rate.NewLimiter(c)
	rrLimits := [3]redis_rate.Limit{
		{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000},
		{Rate: 100_000_000, Period: time.Minute, Burst: 100_000_000},
		{Rate: 2_500_000, Period: time.Hour, Burst: 2_500_000},
	}
	suffix := [3]string{":s" + run, ":m" + run, ":h" + run}
	benchMultiPeers(b, []multiPeer{
		{"global-Multi", func(ctx context.Context, key string) bool {
			var arr [3]ratelimit.LimitState
			buf := arr[:0]
			d, err := m.AllowNInto(ctx, key, 1, &buf)
			return err == nil && d.Allowed
		}},
		{"global-3-Limiters", func(ctx context.Context, key string) bool {
			for _, l := range three {
				if d, err := l.Allow(ctx, key); err != nil || !d.Allowed {
					return false
				}
			}
			return true
		}},
		{"hybrid-Multi", func(ctx context.Context, key string) bool {
			var arr [3]ratelimit.LimitState
			buf := arr[:0]
			d, err := hm.AllowNInto(ctx, key, 1, &buf)
			return err == nil && d.Allowed
		}},
		{"hybrid-3-Limiters", func(ctx context.Context, key string) bool {
			for _, l := range hthree {
				if d, err := l.Allow(ctx, key); err != nil || !d.Allowed {
					return false
				}
			}
			return true
		}},
		{"redis_rate-3-limits", func(ctx context.Context, key string) bool {
			for i, l := range rrLimits {
				if r, err := rr.Allow(ctx, key+suffix[i], l); err != nil || r.Allowed == 0 {
					return false
				}
			}
			return true
		}},
	})
}
