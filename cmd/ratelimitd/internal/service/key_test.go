package service

import (
	"math"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

func entries(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
	var out []*rlcommon.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestCounterKey: distinct descriptors never share a counter, however their
// keys and values are spelled; a share_threshold pattern stands for the
// value it matched.
func TestCounterKey(t *testing.T) {
	distinct := [][2]any{
		{"d", entries("a_b", "c")}, {"d", entries("a", "b_c")},
		{"d", entries("a", "b|c=d")}, {"d", entries("a", "b", "c", "d")},
		{"d", entries("a=b", "c")}, {"d", entries("a", "b=c")},
		{"d|a=b", entries()}, {"d", entries("a", "b")},
		{`d\`, entries("a", "b")}, {"d", entries(`\a`, "b")},
		{"d", entries("a", "")}, {"d", entries("a", "", "", "")},
	}
	seen := map[string]int{}
	for i, c := range distinct {
		k := counterKey(c[0].(string), c[1].([]*rlcommon.RateLimitDescriptor_Entry), nil)
		if j, dup := seen[k]; dup {
			t.Fatalf("descriptors %d and %d share the key %q", j, i, k)
		}
		seen[k] = i
	}
	a := counterKey("d", entries("files", "files/a.pdf"), []string{"files/*"})
	b := counterKey("d", entries("files", "files/b.csv"), []string{"files/*"})
	if a != b || a != "d|files=files/*" {
		t.Fatalf("shared threshold keys %q and %q", a, b)
	}
}

// TestSignaturePrefix: one prefix per kind of limiter; strict and exact of
// the same limit share theirs (and so their counts), optimistic does not.
func TestSignaturePrefix(t *testing.T) {
	r := &config.Rule{RequestsPerUnit: 100, Unit: config.Minute, Algorithm: ratelimit.FixedWindow}
	strict := signatureOf(r).prefix("p")
	r.Mode = config.Exact
	exact := signatureOf(r).prefix("p")
	r.Mode = config.Optimistic
	optimistic := signatureOf(r).prefix("p")
	r.Mode, r.RequestsPerUnit = config.Strict, 101
	other := signatureOf(r).prefix("p")
	if strict != exact || strict == optimistic || strict == other || strict != "p:fixed_window:100:60000ms:s-local" {
		t.Fatalf("prefixes strict %q exact %q optimistic %q 101 %q", strict, exact, optimistic, other)
	}
	if got := signatureOf(r).String(); got != "strict fixed_window 101/60s local" {
		t.Fatalf("signature %q", got)
	}
	for _, c := range []struct{ reset, retry, unit, want time.Duration }{
		{1500 * time.Millisecond, 0, time.Minute, 2 * time.Second},
		{0, 0, time.Minute, time.Second},
		{time.Minute, 0, time.Minute, time.Minute},
		{time.Second, 30 * time.Second, time.Minute, 30 * time.Second},
		{time.Duration(math.MaxInt64), 0, time.Minute, time.Minute}, // no overflow into a short reset
		{2 * time.Hour, time.Hour, 24 * time.Hour, 2 * time.Hour},
	} {
		if got := resetOf(c.reset, c.retry, c.unit); got != c.want {
			t.Errorf("resetOf(%v, %v, %v) = %v, want %v", c.reset, c.retry, c.unit, got, c.want)
		}
	}
}

// A rule of several limits has one signature for the whole list, in order:
// its limiter's prefix and name join the limits with '+'; the same list is
// the same limiter, another list (or order, or mode) another.
func TestSignatureSeveralLimits(t *testing.T) {
	r := &config.Rule{Limits: []config.RuleLimit{
		{RequestsPerUnit: 20, Unit: config.Second, Algorithm: ratelimit.TokenBucket},
		{RequestsPerUnit: 600, Unit: config.Minute, Algorithm: ratelimit.FixedWindow},
	}}
	sig := signatureOf(r)
	if got := sig.prefix("p"); got != "p:token_bucket:20:1000ms+fixed_window:600:60000ms:s-local" {
		t.Errorf("prefix %q", got)
	}
	if got := sig.String(); got != "strict token_bucket 20/1s + fixed_window 600/60s local" {
		t.Errorf("name %q", got)
	}
	same := &config.Rule{Limits: append([]config.RuleLimit(nil), r.Limits...)}
	swapped := &config.Rule{Limits: []config.RuleLimit{r.Limits[1], r.Limits[0]}}
	exact := &config.Rule{Limits: r.Limits, Mode: config.Exact}
	single := &config.Rule{RequestsPerUnit: 20, Unit: config.Second, Algorithm: ratelimit.TokenBucket}
	if signatureOf(same) != sig || signatureOf(swapped) == sig || signatureOf(exact) == sig || signatureOf(single) == sig {
		t.Error("signatures of rules of several limits")
	}
	if signatureOf(exact).prefix("p") != sig.prefix("p") {
		t.Error("strict and exact of the same limits must share a prefix")
	}
}
