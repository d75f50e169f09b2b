package service

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/ratelimit"
)

// A call of more descriptors than MaxDescriptors, or a descriptor of more
// entries than MaxEntries, is InvalidArgument, naming the bound; nothing
// of it is counted.
func TestDescriptorBounds(t *testing.T) {
	m := memService(t, decideConfig, func(o *Options) { o.MaxDescriptors, o.MaxEntries = 4, 3 })
	four := req("d", dsc("a", "x"), dsc("a", "x"), dsc("b", "x"), dsc("b", "y"))
	expect(t, "4 descriptors", codesOf(m.call(t, four)), "OK:OK/2,OK/1,OK/1,OK/1")
	five := req("d", dsc("a", "x"), dsc("a", "x"), dsc("a", "x"), dsc("b", "x"), dsc("b", "y"))
	_, err := m.ShouldRateLimit(context.Background(), five)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "5 descriptors in one call: at most 4") {
		t.Errorf("5 descriptors: %v", err)
	}
	deep := req("d", dsc("a", "x"), dsc("parent", "p", "child", "c", "x", "y", "z", "w"))
	_, err = m.ShouldRateLimit(context.Background(), deep)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 1 has 4 entries: at most 3") {
		t.Errorf("4 entries: %v", err)
	}
	expect(t, "nothing of the refused calls counted", codesOf(m.call(t, req("d", dsc("a", "x")))), "OK:OK/0")

	d := memService(t, decideConfig, nil)
	many := make([]*rlcommon.RateLimitDescriptor, DefaultMaxDescriptors+1)
	for i := range many {
		many[i] = dsc("a", fmt.Sprint(i))
	}
	if _, err := d.ShouldRateLimit(context.Background(), req("d", many...)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("%d descriptors by default: %v", len(many), err)
	}
	if _, err := d.ShouldRateLimit(context.Background(), req("d", many[:DefaultMaxDescriptors]...)); err != nil {
		t.Errorf("%d descriptors by default: %v", DefaultMaxDescriptors, err)
	}
}

// stallBackend's limiters never hear from their store: a decision waits
// for its own bound (timeout, as the library's limiters do) and then
// decides as a slow reply does (denied), or ends with its caller's
// context, whichever comes first.
type stallBackend struct {
	*MemoryBackend
	timeout time.Duration
	calls   atomic.Int64
}

func (b *stallBackend) NewLimiter(spec Spec) (Limiter, error) {
	l, err := b.MemoryBackend.NewLimiter(spec)
	return &stallLimiter{Limiter: l, b: b, spec: spec}, err
}

type stallLimiter struct {
	Limiter
	b    *stallBackend
	spec Spec
}

func (l *stallLimiter) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	l.b.calls.Add(1)
	t := time.NewTimer(l.b.timeout)
	defer t.Stop()
	select {
	case <-t.C:
		return ratelimit.Decision{Limit: l.spec.Limits[0], Algorithm: l.spec.Algorithms[0], RetryAfter: time.Second}, nil
	case <-ctx.Done():
		return ratelimit.Decision{}, ctx.Err()
	}
}

// One deadline per call: descriptors counted under one key run one after
// the other, and those still waiting when the call's timeout has passed
// are decided without counting (OK when their rule fails open, else
// OVER_LIMIT), so a call of 64 such descriptors on 2 keys waits about
// one timeout, not 32.
func TestOneDeadlinePerCall(t *testing.T) {
	const timeout = 50 * time.Millisecond
	sb := &stallBackend{MemoryBackend: NewMemoryBackend(nil, 1), timeout: timeout}
	m := memService(t, decideConfig, func(o *Options) { o.Backend, o.Timeout = sb, timeout })
	descs := make([]*rlcommon.RateLimitDescriptor, 64)
	for i := range descs {
		descs[i] = dsc([]string{"local", "open"}[i%2], "same")
	}
	start := time.Now()
	resp := m.call(t, req("d", descs...))
	took := time.Since(start)
	// 32 timeouts one after the other would be 1.6s; one is 50ms. The
	// bound leaves room for a busy host.
	if took > 20*timeout {
		t.Errorf("a call of 64 descriptors on 2 keys took %v, want about one timeout (%v)", took, timeout)
	}
	if got := sb.calls.Load(); got > 4 {
		t.Errorf("%d limiter calls; the deadline should leave room for the first of each key and few more", got)
	}
	for i, st := range resp.Statuses {
		want := pb.RateLimitResponse_OVER_LIMIT // "local": the slow reply's denial, or cut
		if i%2 == 1 && i > 1 {
			want = pb.RateLimitResponse_OK // "open", cut: OK without counting
		}
		if i == 1 {
			continue // the first "open" waited its timeout: denied as a slow reply
		}
		if st.Code != want {
			t.Errorf("descriptor %d (%s): %v, want %v", i, descs[i].Entries[0].Key, st.Code, want)
		}
	}
	if got := counterValue(t, m.Service, "ratelimit_fallback_decisions_total"); got < 60 {
		t.Errorf("ratelimit_fallback_decisions_total %v: the cut decisions (at least 60 of 64) count there", got)
	}
}
