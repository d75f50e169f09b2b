package local_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// benchLimit admits almost everything at benchmark speed, so the benchmarks
// measure the decision, not the denial path only.
var benchLimit = ratelimit.Limit{Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000}

// benchKeys are precomputed so that building key strings is not measured.
var benchKeys = func() []string {
	k := make([]string, 10_000)
	for i := range k {
		k[i] = "user:" + strconv.Itoa(i)
	}
	return k
}()

func benchLimiter(b *testing.B, a ratelimit.Algorithm) *local.Limiter {
	b.Helper()
	l := benchLimit
	switch a {
	case ratelimit.SlidingLog:
		l = ratelimit.Limit{Rate: 1000, Period: time.Second} // the log holds Rate entries per key
	case ratelimit.GCRA:
		l = ratelimit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000} // T = 1µs
	}
	lim, err := local.New(l, local.WithAlgorithm(a), local.WithMaxKeys(2*len(benchKeys)))
	if err != nil {
		b.Fatal(err)
	}
	return lim
}

func BenchmarkAllow(b *testing.B) {
	ctx := context.Background()
	for _, a := range ratelimit.Algorithms() {
		b.Run(a.String()+"/HotKey/Serial", func(b *testing.B) {
			lim := benchLimiter(b, a)
			b.ReportAllocs()
			for b.Loop() {
				lim.Allow(ctx, "hot")
			}
		})
		b.Run(a.String()+"/HotKey/Parallel", func(b *testing.B) {
			lim := benchLimiter(b, a)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					lim.Allow(ctx, "hot")
				}
			})
		})
		b.Run(a.String()+"/10kKeys/Serial", func(b *testing.B) {
			lim := benchLimiter(b, a)
			for _, k := range benchKeys {
				lim.Allow(ctx, k)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				lim.Allow(ctx, benchKeys[i])
				if i++; i == len(benchKeys) {
					i = 0
				}
			}
		})
		b.Run(a.String()+"/10kKeys/Parallel", func(b *testing.B) {
			lim := benchLimiter(b, a)
			for _, k := range benchKeys {
				lim.Allow(ctx, k)
			}
			b.ReportAllocs()
			var seq atomicCounter
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.next()*7919) % len(benchKeys) // spread the goroutines' start
				for pb.Next() {
					lim.Allow(ctx, benchKeys[i])
					if i++; i == len(benchKeys) {
						i = 0
					}
				}
			})
		})
	}
}

func BenchmarkTableGet(b *testing.B) {
	tb := local.NewTable[*int](2*len(benchKeys), nil)
	for _, k := range benchKeys {
		tb.GetOrCreate(k, func() *int { return new(int) })
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tb.Get(benchKeys[i])
		if i++; i == len(benchKeys) {
			i = 0
		}
	}
}

// BenchmarkAllowKeyLength: keys up to 128 bytes are kept as they are; a
// longer one is kept by its SHA-256, which each decision computes.
func BenchmarkAllowKeyLength(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{16, 128, 129, 1 << 10, 10 << 10} {
		key := strings.Repeat("k", n)
		b.Run(strconv.Itoa(n)+"B/Serial", func(b *testing.B) {
			lim := benchLimiter(b, ratelimit.FixedWindow)
			b.ReportAllocs()
			for b.Loop() {
				lim.Allow(ctx, key)
			}
		})
		b.Run(strconv.Itoa(n)+"B/Parallel", func(b *testing.B) {
			lim := benchLimiter(b, ratelimit.FixedWindow)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					lim.Allow(ctx, key)
				}
			})
		})
	}
}
