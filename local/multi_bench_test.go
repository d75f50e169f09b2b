package local_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// benchLimits are a key's per-second burst bucket, per-minute window and
// per-day sliding window, the usual stack of an API's plan; over 10k keys
// none of them fills during a benchmark, so every decision is an admission.
var (
	benchLimits = []ratelimit.Limit{
		{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000},
		{Rate: 100_000_000, Period: time.Minute},
		{Rate: 100_000, Period: 24 * time.Hour},
	}
	benchAlgs = []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.FixedWindow, ratelimit.SlidingWindow}
)

// decider is one way to decide the three limits of benchLimits.
type decider struct {
	name string
	new  func(b *testing.B) func(ctx context.Context, key string) bool
}

// multiDeciders are a Multi (through AllowN, which allocates the per-limit
// states, and AllowNInto with a buffer) and, for comparison, three
// separate Limiters asked in turn, as before NewMulti (the third's denial
// would already have been counted by the first two).
var multiDeciders = []decider{
	{"Multi/AllowN", func(b *testing.B) func(context.Context, string) bool {
		m := benchMulti(b)
		return func(ctx context.Context, key string) bool {
			d, _ := m.AllowN(ctx, key, 1)
			return d.Allowed
		}
	}},
	{"Multi/AllowNInto", func(b *testing.B) func(context.Context, string) bool {
		m := benchMulti(b)
		return func(ctx context.Context, key string) bool {
			var arr [3]ratelimit.LimitState
			buf := arr[:0]
			d, _ := m.AllowNInto(ctx, key, 1, &buf)
			return d.Allowed
		}
	}},
	{"ThreeLimiters", func(b *testing.B) func(context.Context, string) bool {
		var lims [3]*local.Limiter
		for i, l := range benchLimits {
			lim, err := local.New(l, local.WithAlgorithm(benchAlgs[i]), local.WithMaxKeys(2*len(benchKeys)))
			if err != nil {
				b.Fatal(err)
			}
			lims[i] = lim
		}
		return func(ctx context.Context, key string) bool {
			for _, l := range lims {
				if d, _ := l.Allow(ctx, key); !d.Allowed {
					return false
				}
			}
			return true
		}
	}},
}

func benchMulti(b *testing.B) *local.Multi {
	m, err := local.NewMulti(benchLimits, local.WithAlgorithms(benchAlgs...), local.WithMaxKeys(2*len(benchKeys)))
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkMulti measures one decision on three limits per key: a Multi
// against three Limiters, over 10k keys, serial and parallel.
func BenchmarkMulti(b *testing.B) {
	ctx := context.Background()
	for _, dc := range multiDeciders {
		b.Run(dc.name+"/10kKeys/Serial", func(b *testing.B) {
			allow := dc.new(b)
			for _, k := range benchKeys {
				allow(ctx, k)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if !allow(ctx, benchKeys[i]) {
					b.Fatal("denied")
				}
				if i++; i == len(benchKeys) {
					i = 0
				}
			}
		})
		b.Run(dc.name+"/10kKeys/Parallel", func(b *testing.B) {
			allow := dc.new(b)
			for _, k := range benchKeys {
				allow(ctx, k)
			}
			b.ReportAllocs()
			var seq atomicCounter
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.next()*7919) % len(benchKeys)
				for pb.Next() {
					allow(ctx, benchKeys[i])
					if i++; i == len(benchKeys) {
						i = 0
					}
				}
			})
		})
	}
}
