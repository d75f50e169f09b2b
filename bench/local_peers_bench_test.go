// Package bench compares the limiters of this module with well-known peers.
// It is a module of its own so the peers never enter the library's go.mod.
package bench

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// peerRate is high enough that almost every decision is an admission for
// every limiter, so that the same path is measured everywhere.
const peerRate = 1_000_000

var keys10k = func() []string {
	k := make([]string, 10_000)
	for i := range k {
		k[i] = "user:" + strconv.Itoa(i)
	}
	return k
}()

func newLocal(tb testing.TB, a ratelimit.Algorithm) *local.Limiter {
	tb.Helper()
	l := ratelimit.Limit{Rate: peerRate, Period: time.Second, Burst: peerRate}
	if a == ratelimit.SlidingLog {
		l = ratelimit.Limit{Rate: 1000, Period: time.Second} // the log holds Rate entries per key
	}
	lim, err := local.New(l, local.WithAlgorithm(a), local.WithMaxKeys(2*len(keys10k)))
	if err != nil {
		tb.Fatal(err)
	}
	return lim
}

func newMemorystore(tb testing.TB) limiter.Store {
	tb.Helper()
	s, err := memorystore.New(&memorystore.Config{Tokens: peerRate, Interval: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// BenchmarkHotKeySerial: one key, one goroutine. x/time/rate keeps a single
// bucket (no key lookup at all); ours looks the key up in its table.
func BenchmarkHotKeySerial(b *testing.B) {
	ctx := context.Background()
	b.Run("xtime-rate", func(b *testing.B) {
		lim := rate.NewLimiter(peerRate, peerRate)
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
	for _, a := range ratelimit.Algorithms() {
		b.Run("local-"+a.String(), func(b *testing.B) {
			lim := newLocal(b, a)
			b.ReportAllocs()
			for b.Loop() {
				lim.Allow(ctx, "hot")
			}
		})
	}
}

// BenchmarkKeys10kSerial: 10,000 keys round-robin, one goroutine.
func BenchmarkKeys10kSerial(b *testing.B) {
	ctx := context.Background()
	b.Run("go-limiter-memorystore", func(b *testing.B) {
		s := newMemorystore(b)
		for _, k := range keys10k {
			s.Take(ctx, k)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			s.Take(ctx, keys10k[i])
			if i++; i == len(keys10k) {
				i = 0
			}
		}
	})
	for _, a := range ratelimit.Algorithms() {
		b.Run("local-"+a.String(), func(b *testing.B) {
			lim := newLocal(b, a)
			for _, k := range keys10k {
				lim.Allow(ctx, k)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				lim.Allow(ctx, keys10k[i])
				if i++; i == len(keys10k) {
					i = 0
				}
			}
		})
	}
}

// BenchmarkKeys10kParallel: 10,000 keys round-robin from GOMAXPROCS
// goroutines, each starting at a different key.
func BenchmarkKeys10kParallel(b *testing.B) {
	ctx := context.Background()
	parallel := func(b *testing.B, take func(key string)) {
		b.Helper()
		var start int
		var mu = make(chan struct{}, 1)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			mu <- struct{}{}
			start += 7919
			i := start % len(keys10k)
			<-mu
			for pb.Next() {
				take(keys10k[i])
				if i++; i == len(keys10k) {
					i = 0
				}
			}
		})
	}
	b.Run("go-limiter-memorystore", func(b *testing.B) {
		s := newMemorystore(b)
		for _, k := range keys10k {
			s.Take(ctx, k)
		}
		parallel(b, func(k string) { s.Take(ctx, k) })
	})
	for _, a := range ratelimit.Algorithms() {
		b.Run("local-"+a.String(), func(b *testing.B) {
			lim := newLocal(b, a)
			for _, k := range keys10k {
				lim.Allow(ctx, k)
			}
			parallel(b, func(k string) { lim.Allow(ctx, k) })
		})
	}
}
