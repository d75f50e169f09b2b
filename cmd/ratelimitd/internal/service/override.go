package service

import (
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// A descriptor may carry its own limit (Envoy's limit override, e.g. from
// dynamic metadata); as in envoyproxy/ratelimit it then replaces whatever
// the configuration says for that descriptor. Each distinct override limit
// gets a limiter, made on first use, kept until Close, and shared with the
// configuration's rules of the same kind.

type overrideKey struct {
	rpu  uint32
	unit config.Unit
}

type override struct {
	rule  *config.Rule
	ent   *entry // nil when requests_per_unit is 0
	limit *pb.RateLimitResponse_RateLimit
}

func (s *Service) override(o *rlcommon.RateLimitDescriptor_RateLimitOverride) (*override, error) {
	k := overrideKey{rpu: o.GetRequestsPerUnit(), unit: config.Unit(o.GetUnit())}
	if v, ok := s.overrides.Load(k); ok {
		return v.(*override), nil
	}
	if k.unit.Duration() == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "limit override: unknown unit %v", o.GetUnit())
	}
	d := s.opts.Defaults
	r := &config.Rule{RequestsPerUnit: k.rpu, Unit: k.unit, Mode: d.Mode, Algorithm: d.Algorithm, FailureMode: d.FailureMode}
	if k.rpu > 0 {
		if err := r.Limit().ValidateFor(r.Algorithm); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "limit override %d per %s: %v", k.rpu, strings.ToLower(k.unit.String()), err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.overrides.Load(k); ok {
		return v.(*override), nil
	}
	if s.closed {
		return nil, status.Error(codes.Unavailable, "shutting down")
	}
	if s.nOverride >= s.opts.MaxOverrides {
		return nil, status.Errorf(codes.ResourceExhausted, "limit override: more than %d distinct override limits", s.opts.MaxOverrides)
	}
	ov := &override{rule: r, limit: &pb.RateLimitResponse_RateLimit{RequestsPerUnit: k.rpu, Unit: pb.RateLimitResponse_RateLimit_Unit(k.unit)}}
	if k.rpu > 0 {
		sig := signatureOf(r)
		e := s.pool[sig]
		if e == nil {
			var err error
			if e, err = s.newEntry(sig); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "limit override: %v", err)
			}
			s.pool[sig] = e
		}
		e.pinned = true
		ov.ent = e
	}
	s.nOverride++
	s.overrides.Store(k, ov)
	return ov, nil
}

// overrideLabel names an override decision in metrics as
// envoyproxy/ratelimit names its statistics, without the domain: each entry
// as key_value (key alone for an empty value), joined by dots, e.g.
// "key1_value1.subkey1_something".
func overrideLabel(d *rlcommon.RateLimitDescriptor) string {
	var b strings.Builder
	for i, e := range d.GetEntries() {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.GetKey())
		if v := e.GetValue(); v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}
