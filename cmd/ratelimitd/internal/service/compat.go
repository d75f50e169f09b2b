package service

import (
	"context"
	"errors"
	"fmt"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hybridlimit/ratelimit"
)

// Compat are the envoyproxy/ratelimit behaviours a deployment moving from it
// may ask for, each named after that service's setting. The zero value is
// ratelimitd's own behaviour, with the default header names.
type Compat struct {
	// HeaderLimit, HeaderRemaining and HeaderReset name the response
	// headers of Options.ResponseHeaders (LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); empty: RateLimit-Limit,
	// RateLimit-Remaining, RateLimit-Reset.
	HeaderLimit, HeaderRemaining, HeaderReset string
	// QuotaMode makes every descriptor a quota_mode one (QUOTA_MODE): a
	// request is OVER_LIMIT only when all its limited descriptors are.
	QuotaMode bool
	// ResponseDynamicMetadata returns, in each response's dynamic_metadata,
	// the domain, the descriptors, the hits_addend and the merged metadata
	// of the descriptors that passed (RESPONSE_DYNAMIC_METADATA), as
	// envoyproxy/ratelimit builds it.
	ResponseDynamicMetadata bool
	// StopIncrementWhenOverLimit counts none of a request's hits when one of
	// its descriptors is over the limit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT):
	// the descriptors that admitted give their hits back. (A descriptor over
	// the limit counts nothing here anyway; see docs/ratelimitd.md.)
	StopIncrementWhenOverLimit bool
	// EnvoyKeys counts exact fixed-window rules of one limit in
	// envoyproxy/ratelimit's Redis keys and its way (the migration mode,
	// --key-layout envoy): <CacheKeyPrefix><domain>_<key>_<value>_..._<window
	// start, Unix seconds of this host's clock>, INCRBY then EXPIRE of the
	// unit plus up to ExpirationJitterMaxSeconds, every hit counted, denied
	// or not, and over the limit when the count passes it. A fleet of both
	// services behind one Redis then shares one count per descriptor. Their
	// limiters are the Redis backend's of Spec.Layout LayoutEnvoy; a
	// Backend that has no such limiters refuses those rules.
	EnvoyKeys bool
	// CacheKeyPrefix starts every key of EnvoyKeys (CACHE_KEY_PREFIX).
	CacheKeyPrefix string
	// ExpirationJitterMaxSeconds adds up to that many seconds to the expiry
	// of the keys of EnvoyKeys (EXPIRATION_JITTER_MAX_SECONDS); 0: none. It
	// is the Redis backend's RedisOptions.EnvoyExpirationJitter.
	ExpirationJitterMaxSeconds int64
}

func (c *Compat) init() error {
	if c.HeaderLimit == "" {
		c.HeaderLimit = HeaderLimit
	}
	if c.HeaderRemaining == "" {
		c.HeaderRemaining = HeaderRemaining
	}
	if c.HeaderReset == "" {
		c.HeaderReset = HeaderReset
	}
	if c.ExpirationJitterMaxSeconds < 0 {
		return errors.New("service: ExpirationJitterMaxSeconds must not be negative")
	}
	return nil
}

// unknownDomain answers a request for a domain no configuration defines:
// every descriptor OK with no limit, as envoyproxy/ratelimit answers it (so
// a route deployed before its configuration is not denied by Envoy's
// failure_mode_deny). ratelimit_domain_not_found_total counts it.
func (s *Service) unknownDomain(req *pb.RateLimitRequest) *pb.RateLimitResponse {
	s.m.notFound.Inc()
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK,
		Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
	}
	if s.opts.Compat.ResponseDynamicMetadata {
		items := make([]item, len(req.Descriptors))
		for i, d := range req.Descriptors {
			items[i] = item{desc: d, status: resp.Statuses[i]}
		}
		resp.DynamicMetadata = dynamicMetadata(req, items)
	}
	return resp
}

// peek decides a descriptor whose hits_addend is 0, counting nothing: by
// the limiter's own Check when it is a Checker (the migration mode's
// INCRBY 0); else OK when one more hit would be admitted now, by reserving
// one hit and giving it back at once (in memory for the hybrid limiter; a
// second script call for an exact rule). When the store does not answer,
// the rule's failure mode decides: closed denies, open and local admit (a
// check spends nothing).
func (s *Service) peek(ctx context.Context, it *item) (ratelimit.Decision, error) {
	lim := it.ent().lim
	if c, ok := lim.(Checker); ok {
		return c.Check(ctx, it.key)
	}
	rv, ok := lim.(ratelimit.Reserver)
	if !ok {
		return ratelimit.Decision{}, status.Error(codes.Internal, "this limiter cannot check without counting")
	}
	r, err := rv.Reserve(ctx, it.key, 1)
	if err != nil {
		if !redisError(err) {
			if errors.Is(err, ratelimit.ErrInvalidAlgorithm) {
				return ratelimit.Decision{}, status.Errorf(codes.InvalidArgument, "hits_addend 0 (check without counting) is not supported on a sliding_log rule: %v", err)
			}
			return ratelimit.Decision{}, err
		}
		return s.failureDecision(it), nil
	}
	d := r.Decision()
	if r.OK() {
		s.giveBack(ctx, it, r)
		d.Remaining = min(d.Remaining+1, d.Limit.Capacity(d.Algorithm))
	}
	return d, nil
}

// reserve decides a descriptor's hits as AllowN does, as a reservation
// that settle may cancel (StopIncrementWhenOverLimit). A limiter that
// cannot reserve, or a Redis error (an exact rule's Reserve does not apply
// the failure mode), falls back to AllowN: those hits stay counted.
func (s *Service) reserve(ctx context.Context, it *item) (ratelimit.Decision, *ratelimit.Reservation, error) {
	lim := it.ent().lim
	if rv, ok := lim.(ratelimit.Reserver); ok {
		r, err := rv.Reserve(ctx, it.key, int(it.hits))
		if err == nil {
			return r.Decision(), r, nil
		}
		if !redisError(err) && !errors.Is(err, ratelimit.ErrInvalidAlgorithm) {
			return ratelimit.Decision{}, nil, err
		}
	}
	d, err := lim.AllowN(ctx, it.key, int(it.hits))
	return d, nil, err
}

// redisError reports whether err is neither bad input nor the caller
// giving up nor a shutdown: a Redis error, which a failure mode decides.
func redisError(err error) bool {
	for _, e := range []error{ratelimit.ErrInvalidN, ratelimit.ErrInvalidKey, ratelimit.ErrInvalidLimit,
		ratelimit.ErrInvalidAlgorithm, ratelimit.ErrInvalidOption, ratelimit.ErrClosed, context.Canceled} {
		if errors.Is(err, e) {
			return false
		}
	}
	return true
}

// failureDecision is what the item's rule decides by its failure mode when
// Redis does not answer a check: closed denies, open and local admit.
func (s *Service) failureDecision(it *item) ratelimit.Decision {
	r := it.rule()
	l := r.Limit()
	d := ratelimit.Decision{Limit: l, Algorithm: r.Algorithm, ResetAfter: untilWindowEnd(l.Period, s.now())}
	if r.FailureMode == ratelimit.FailClosed {
		d.RetryAfter = d.ResetAfter
		return d
	}
	d.Allowed = true
	return d
}

// giveBack cancels a reservation; one that cannot be given back stays
// counted until its window ends (the safe side), and is counted in
// ratelimit_give_back_errors_total.
func (s *Service) giveBack(ctx context.Context, it *item, r *ratelimit.Reservation) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
	defer cancel()
	if err := r.Cancel(ctx); err != nil {
		s.m.giveBackErrs.Inc()
		s.log.Warn("hits taken to decide could not be given back; they stay counted until their window ends",
			"rule", it.rule().Path, "error", err.Error())
	}
}

// settle finishes a request's decisions once the limiters decided, under
// StopIncrementWhenOverLimit: when one of the request's descriptors is
// over the limit, the descriptors that admitted give their hits back.
// The migration mode's limiters take part as the others: theirs go back
// with DECRBY, and a descriptor over the limit keeps its hits, as
// envoyproxy/ratelimit increments only the keys that go over.
func (s *Service) settle(ctx context.Context, items []item) {
	over := false
	for i := range items {
		it := &items[i]
		// A descriptor over the limit, a check included (the peer's GET
		// finds it past the limit too), stops the others' counting.
		if r := it.rule(); r != nil && !r.Unlimited && it.status == nil && it.err == nil && !it.dec.Allowed {
			over = true
			break
		}
	}
	if !over {
		return
	}
	for i := range items {
		it := &items[i]
		if it.res != nil && it.res.OK() {
			s.giveBack(ctx, it, it.res)
			it.dec.Remaining = min(it.dec.Remaining+int(it.hits), it.dec.Limit.Capacity(it.dec.Algorithm))
		}
	}
}

// dynamicMetadata builds the dynamic_metadata of a response as
// envoyproxy/ratelimit does: the domain; each descriptor's entries
// ("key=value"), its limit override and its hits_addend when given; the
// request's hits_addend when not 0; and under "metadata" the metadata of
// the rules of the descriptors that passed, merged, the first value of a
// field winning.
func dynamicMetadata(req *pb.RateLimitRequest, items []item) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		if d == nil {
			continue
		}
		descs = append(descs, structpb.NewStructValue(descriptorStruct(d)))
	}
	f := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.Domain),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if h := req.GetHitsAddend(); h != 0 {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range items {
		it := &items[i]
		r := it.rule()
		if r == nil || r.Unlimited || it.status == nil || it.status.Code == pb.RateLimitResponse_OVER_LIMIT || it.ovr != nil {
			continue
		}
		mergeStruct(passed, r.Metadata)
	}
	if len(passed.Fields) > 0 {
		f["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: f}
}

func descriptorStruct(d *rlcommon.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, 0, len(d.Entries))
	for _, e := range d.Entries {
		entries = append(entries, structpb.NewStringValue(fmt.Sprintf("%s=%s", e.GetKey(), e.GetValue())))
	}
	f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		f["limit"] = structpb.NewStringValue(l.String())
	}
	if h := d.GetHitsAddend(); h != nil {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: f}
}

// mergeStruct adds src's fields to dst: a field dst has keeps its value,
// but for two mappings, merged the same way.
func mergeStruct(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		cur, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if a, b := cur.GetStructValue(), v.GetStructValue(); a != nil && b != nil {
			// a may be a rule's own Metadata: merge into a copy.
			c := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(a.Fields))}
			for k2, v2 := range a.Fields {
				c.Fields[k2] = v2
			}
			mergeStruct(c, b)
			dst.Fields[k] = structpb.NewStructValue(c)
		}
	}
}
