package sync_test

import (
	"context"
	"sync/atomic"
	"testing"

	bgsync "github.com/hybridlimit/ratelimit/sync"
)

func noopFlush(context.Context, []uint64) ([]uint64, error) { return nil, nil }

func benchSyncer(b *testing.B) *bgsync.Syncer[uint64] {
	b.Helper()
	// Ticks run during the benchmark, as in production: marks race with swaps.
	s, err := bgsync.New(noopFlush, bgsync.WithInterval(bgsync.DefaultInterval))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func BenchmarkMarkSameItem(b *testing.B) {
	s := benchSyncer(b)
	b.ReportAllocs()
	for b.Loop() {
		s.Mark(1)
	}
}

func BenchmarkMarkDistinctItems(b *testing.B) {
	s := benchSyncer(b)
	b.ReportAllocs()
	var i uint64
	for b.Loop() {
		i++
		s.Mark(i & (1<<16 - 1))
	}
}

func BenchmarkMarkParallelSameItem(b *testing.B) {
	s := benchSyncer(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Mark(1)
		}
	})
}

func BenchmarkMarkParallelDistinctItems(b *testing.B) {
	s := benchSyncer(b)
	var next atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		base := next.Add(1) << 32
		var i uint64
		for pb.Next() {
			i++
			s.Mark(base | i&(1<<16-1))
		}
	})
}
