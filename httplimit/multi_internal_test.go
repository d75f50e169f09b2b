package httplimit

import (
	"testing"

	"github.com/hybridlimit/ratelimit"
)

func TestAlgorithmName(t *testing.T) {
	want := map[ratelimit.Algorithm]string{
		ratelimit.FixedWindow: "fixed_window", ratelimit.SlidingWindow: "sliding_window", ratelimit.SlidingLog: "sliding_log",
		ratelimit.TokenBucket: "token_bucket", ratelimit.GCRA: "gcra", ratelimit.Algorithm(9): "algorithm(9)",
	}
	for a, name := range want {
		if got := algorithmName(a); got != name {
			t.Errorf("algorithmName(%v) = %q, want %q", a, got, name)
		}
	}
}
