package bench

import (
	"context"
	"testing"

	"golang.org/x/time/rate"

	"github.com/hybridlimit/ratelimit"
)

// Every limiter the benchmarks compare constructs and admits a first
// request, so the benchmarks measure admissions, not errors.
func TestPeersAllowOnce(t *testing.T) {
	ctx := context.Background()
	if !rate.NewLimiter(peerRate, peerRate).Allow() {
		t.Fatal("x/time/rate denied its first request")
	}
	s := newMemorystore(t)
	for _, k := range keys10k[:3] {
		_, _, _, ok, err := s.Take(ctx, k)
		if err != nil || !ok {
			t.Fatalf("memorystore Take(%q) = %v, %v", k, ok, err)
		}
	}
	for _, a := range ratelimit.Algorithms() {
		lim := newLocal(t, a)
		for _, k := range append([]string{"hot"}, keys10k[:3]...) {
			d, err := lim.Allow(ctx, k)
			if err != nil || !d.Allowed {
				t.Fatalf("local %v Allow(%q) = %+v, %v", a, k, d, err)
			}
		}
		if lim.Len() != 4 {
			t.Fatalf("local %v tracks %d keys, want 4", a, lim.Len())
		}
	}
}
