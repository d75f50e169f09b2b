package service

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// Names of the response headers added when Options.ResponseHeaders is set.
const (
	HeaderLimit     = "RateLimit-Limit"
	HeaderRemaining = "RateLimit-Remaining"
	HeaderReset     = "RateLimit-Reset"
)

// ShouldRateLimit decides a request: one status per descriptor and the
// overall code. It returns an InvalidArgument status for an empty domain,
// no descriptor, or a descriptor asking for negative hits (refills are not
// supported); Unavailable before the first Apply and after Close; the
// context's status when the caller gives up. An unknown domain is answered
// OK with no limit, as envoyproxy/ratelimit answers it.
// Redis being slow or down is not an error: the rule's failure mode
// decides within the timeout.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req)
	s.m.latency.Observe(time.Since(start).Seconds())
	switch {
	case err != nil:
		s.m.reqErr.Inc()
	case resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT:
		s.m.reqOver.Inc()
	default:
		s.m.reqOK.Inc()
	}
	return resp, err
}

// item is one descriptor of a request on its way to a status.
type item struct {
	desc   *rlcommon.RateLimitDescriptor
	hits   uint64
	rs     *ruleState // the config rule counted against; nil for none
	ovr    *override  // the request's own limit, instead of rs
	label  string     // rule label of a decision (rs's static one when "")
	shared []string   // share_threshold patterns, by entry
	call   bool       // a limiter must decide
	key    string     // the key the limiter counts it under
	dec    ratelimit.Decision
	err    error
	result int
	status *pb.RateLimitResponse_DescriptorStatus

	check bool                   // hits_addend 0 on the descriptor: decide, count nothing
	res   *ratelimit.Reservation // what Compat.StopIncrementWhenOverLimit may give back
}

func (it *item) rule() *config.Rule {
	switch {
	case it.ovr != nil:
		return it.ovr.rule
	case it.rs != nil:
		return it.rs.rule
	}
	return nil
}

func (it *item) ent() *entry {
	if it.ovr != nil {
		return it.ovr.ent
	}
	return it.rs.ent
}

func (it *item) limitPB() *pb.RateLimitResponse_RateLimit {
	if it.ovr != nil {
		return it.ovr.limit
	}
	return it.rs.limitFor(it.dec)
}

func (s *Service) decide(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "the domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "a request needs at least one descriptor")
	}
	if err := s.checkSize(descs); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(s.opts.Timeout)
	snap, shard := s.enter()
	if snap == nil {
		return nil, status.Error(codes.Unavailable, "no configuration loaded")
	}
	defer snap.inflight.leave(shard)
	if s.shut.Load() {
		return nil, status.Error(codes.Unavailable, "shutting down")
	}
	dom := snap.cfg.Domain(req.Domain)
	if dom == nil {
		return s.unknownDomain(req), nil
	}
	items := make([]item, len(descs))
	var replaced []string
	for i, d := range descs {
		it := &items[i]
		it.desc = d
		if d.GetIsNegativeHits() {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: is_negative_hits (giving hits back) is not supported", i)
		}
		it.hits, it.check = hitsOf(req, d)
		if o := d.GetLimit(); o != nil {
			ov, err := s.override(o)
			if err != nil {
				return nil, err
			}
			it.ovr = ov
			continue
		}
		m := config.Lookup(dom, d.GetEntries())
		if m.Rule == nil {
			continue
		}
		it.rs, it.shared = &snap.rules[m.Rule.ID], m.Shared
		if m.Label != m.Rule.Path {
			it.label = m.Label
		}
		replaced = append(replaced, m.Rule.Replaces...)
	}
	if len(replaced) > 0 { // a replaced rule is not evaluated
		for i := range items {
			if r := items[i].rule(); r != nil && items[i].ovr == nil && slices.ContainsFunc(replaced, r.Named) {
				items[i].rs = nil
			}
		}
	}
	calls := 0
	for i := range items {
		if s.prepare(req.Domain, &items[i]) {
			calls++
		}
	}
	if calls > 0 {
		s.count(ctx, items, calls, deadline)
	}
	if s.opts.Compat.StopIncrementWhenOverLimit {
		s.settle(ctx, items)
	}
	return s.respond(snap, req, items)
}

// hitsOf is a descriptor's hits: its own hits_addend when set, else the
// request's, 0 meaning 1 for the request's. A descriptor's own hits_addend
// of 0 checks without counting (check).
func hitsOf(req *pb.RateLimitRequest, d *rlcommon.RateLimitDescriptor) (hits uint64, check bool) {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue(), h.GetValue() == 0
	}
	return uint64(max(1, req.GetHitsAddend())), false
}

// prepare answers the items no limiter needs to decide, and reports
// whether it needs one.
func (s *Service) prepare(domain string, it *item) bool {
	r := it.rule()
	switch {
	case r == nil:
		it.status = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		it.result = -1
		return false
	case r.Unlimited:
		it.status = &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		it.result = resultUnlimited
		return false
	case r.RequestsPerUnit == 0 || it.hits > uint64(r.RequestsPerUnit):
		// Nothing can be admitted: requests_per_unit 0 denies everything,
		// and more hits than the limit could never fit in a window.
		it.dec = deniedUncounted(r.Limits, r.RequestsPerUnit, r.Unit, r.Algorithm, it.hits, s.now())
		it.call = false
		return false
	case r.Limits != nil && it.hits > uint64(minRequestsPerUnit(r.Limits)):
		// More hits than one of the rule's limits could ever take.
		it.dec = deniedUncounted(r.Limits, r.RequestsPerUnit, r.Unit, r.Algorithm, it.hits, s.now())
		it.call = false
		return false
	}
	it.call = true
	if it.ent().layout == LayoutEnvoy {
		it.key = envoyKey(s.opts.Compat.CacheKeyPrefix, domain, it)
	} else {
		it.key = counterKey(domain, it.desc.GetEntries(), it.shared)
	}
	return true
}

// deniedUncounted is the decision on hits a rule cannot count: against
// its one limit (requests_per_unit rpu per unit, with alg), or among its
// limits the first that hits exceed, or else (the failure mode's share is
// smaller than the limits) the one of fewest requests per unit.
func deniedUncounted(limits []config.RuleLimit, rpu uint32, unit config.Unit, alg ratelimit.Algorithm, hits uint64, now time.Time) ratelimit.Decision {
	if len(limits) > 0 {
		k := 0
		for i, l := range limits {
			if hits > uint64(l.RequestsPerUnit) {
				k = i
				break
			}
			if l.RequestsPerUnit < limits[k].RequestsPerUnit {
				k = i
			}
		}
		rpu, unit, alg = limits[k].RequestsPerUnit, limits[k].Unit, limits[k].Algorithm
	}
	p := unit.Duration()
	return ratelimit.Decision{Limit: ratelimit.Limit{Rate: int(rpu), Period: p}, Algorithm: alg, ResetAfter: untilWindowEnd(p, now)}
}

func minRequestsPerUnit(limits []config.RuleLimit) uint32 {
	m := limits[0].RequestsPerUnit
	for _, l := range limits[1:] {
		m = min(m, l.RequestsPerUnit)
	}
	return m
}

func untilWindowEnd(p time.Duration, now time.Time) time.Duration {
	if p <= 0 {
		return 0
	}
	t := now.UnixNano()
	return time.Duration(int64(p) - t%int64(p))
}

// count runs the limiters of the items that need one, within one deadline
// for the whole call (Timeout after it began). Items counted under the
// same key run in request order, one after the other, as
// envoyproxy/ratelimit's pipeline would; distinct keys run concurrently.
// The first item of each key waits on Redis as its limiter bounds it (one
// timeout at most); the items after it wait only until the deadline, and
// those it cuts short are decided without counting (see cut). So a call
// waits about one timeout at most, whatever its descriptors.
func (s *Service) count(ctx context.Context, items []item, calls int, deadline time.Time) {
	if calls == 1 {
		for i := range items {
			if items[i].call {
				s.allow(ctx, &items[i])
			}
		}
		return
	}
	// next[i] chains the items of one key: the first of each chain runs
	// the chain.
	next := make([]int, len(items))
	follower := make([]bool, len(items))
	for i := range items {
		next[i] = -1
		if !items[i].call {
			continue
		}
		for j := i - 1; j >= 0; j-- {
			if items[j].call && items[j].ent() == items[i].ent() && items[j].key == items[i].key {
				next[j], follower[i] = i, true
				break
			}
		}
	}
	chain := func(i int) {
		s.allow(ctx, &items[i])
		for i = next[i]; i >= 0; i = next[i] {
			s.allowBy(ctx, &items[i], deadline)
		}
	}
	var wg sync.WaitGroup
	first := -1
	for i := range items {
		if !items[i].call || follower[i] {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		wg.Go(func() { chain(i) })
	}
	chain(first)
	wg.Wait()
}

// allowBy asks the item's limiter as allow does, waiting no later than
// deadline; an item the deadline cuts short is decided by cut.
func (s *Service) allowBy(ctx context.Context, it *item, deadline time.Time) {
	if !time.Now().Before(deadline) {
		s.cut(it)
		return
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	s.allow(dctx, it)
	cancel()
	if it.err != nil && dctx.Err() != nil && ctx.Err() == nil {
		s.cut(it)
	}
}

// cut decides, without counting, an item whose call's deadline passed
// before its limiter could answer: OK when its rule fails open, else
// OVER_LIMIT (what the hybrid answers a decision Redis did not answer in
// time, before its breaker opens: nothing is admitted that no count
// backs). It counts as a failure-mode decision.
func (s *Service) cut(it *item) {
	r := it.rule()
	s.cuts.Add(1)
	p := r.Unit.Duration()
	it.err, it.res = nil, nil
	it.dec = ratelimit.Decision{Limit: r.Limit(), Algorithm: r.Algorithm, ResetAfter: untilWindowEnd(p, s.now())}
	if r.FailureMode == ratelimit.FailOpen {
		it.dec.Allowed, it.dec.Remaining = true, 0
	} else {
		it.dec.RetryAfter = s.opts.Timeout
	}
}

// allow asks the item's limiter: to check without counting (hits_addend
// 0), to reserve what may be given back (StopIncrementWhenOverLimit), or
// to count.
func (s *Service) allow(ctx context.Context, it *item) {
	switch {
	case it.check:
		it.dec, it.err = s.peek(ctx, it)
	case s.opts.Compat.StopIncrementWhenOverLimit:
		it.dec, it.res, it.err = s.reserve(ctx, it)
	default:
		it.dec, it.err = it.ent().lim.AllowN(ctx, it.key, int(it.hits))
	}
}

// counterKey is the key a descriptor is counted under in its rule's
// limiter: the domain and every entry, a share_threshold wildcard standing
// for the value it matched. '|', '=' and '\' are escaped so that distinct
// descriptors never share a key.
func counterKey(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, shared []string) string {
	n := len(domain)
	for _, e := range entries {
		n += 2 + len(e.GetKey()) + len(e.GetValue())
	}
	var b strings.Builder
	b.Grow(n + 8)
	escape(&b, domain)
	for i, e := range entries {
		v := e.GetValue()
		if shared != nil && shared[i] != "" {
			v = shared[i]
		}
		b.WriteByte('|')
		escape(&b, e.GetKey())
		b.WriteByte('=')
		escape(&b, v)
	}
	return b.String()
}

func escape(b *strings.Builder, s string) {
	if !strings.ContainsAny(s, `|=\`) {
		b.WriteString(s)
		return
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '|' || c == '=' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
}

// respond turns the decided items into the response, counts them in the
// metrics, and adds the headers (with Options.ResponseHeaders only) and the
// dynamic metadata (with Compat.ResponseDynamicMetadata).
func (s *Service) respond(snap *snapshot, req *pb.RateLimitRequest, items []item) (*pb.RateLimitResponse, error) {
	domain := req.Domain
	resp := &pb.RateLimitResponse{Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(items))}
	overRate, overQuota, quota := 0, 0, 0
	var closest *pb.RateLimitResponse_DescriptorStatus
	for i := range items {
		it := &items[i]
		if it.status == nil { // counted, or denied without counting
			switch err := it.err; {
			case errors.Is(err, ratelimit.ErrInvalidN):
				// more hits than the fallback's share can ever admit
				r := it.rule()
				it.dec = deniedUncounted(r.Limits, r.RequestsPerUnit, r.Unit, r.Algorithm, it.hits, s.now())
			case err != nil:
				return nil, decisionError(err)
			}
			it.status = s.statusOf(it)
		}
		resp.Statuses[i] = it.status
		r := it.rule()
		if r == nil || r.Unlimited { // neither counted nor measured, as envoyproxy/ratelimit
			continue
		}
		s.record(snap, domain, it)
		quotaMode := r.QuotaMode || s.opts.Compat.QuotaMode
		if quotaMode {
			quota++
		}
		st := it.status
		if s.opts.ResponseHeaders && (closest == nil || st.LimitRemaining < closest.LimitRemaining) {
			closest = st
		}
		if st.Code == pb.RateLimitResponse_OVER_LIMIT {
			if quotaMode {
				overQuota++
			} else {
				overRate++
				closest = st
			}
		}
	}
	// OVER_LIMIT when a rate-limit descriptor is over, or every quota one is.
	resp.OverallCode = pb.RateLimitResponse_OK
	if overRate > 0 || (quota > 0 && overQuota == quota) {
		if s.opts.ShadowMode {
			s.m.shadowed.Inc()
		} else {
			resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		}
	}
	if closest != nil && s.opts.ResponseHeaders {
		c := &s.opts.Compat
		resp.ResponseHeadersToAdd = []*core.HeaderValue{
			{Key: c.HeaderLimit, Value: strconv.FormatUint(uint64(closest.CurrentLimit.GetRequestsPerUnit()), 10)},
			{Key: c.HeaderRemaining, Value: strconv.FormatUint(uint64(closest.LimitRemaining), 10)},
			{Key: c.HeaderReset, Value: strconv.FormatInt(closest.DurationUntilReset.GetSeconds(), 10)},
		}
	}
	if s.opts.Compat.ResponseDynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, items)
	}
	return resp, nil
}

// statusOf is the status of an item a limiter decided, or that was denied
// without one.
func (s *Service) statusOf(it *item) *pb.RateLimitResponse_DescriptorStatus {
	r := it.rule()
	unit := it.dec.Limit.Period // of the limit the decision describes, the tightest of several
	if unit <= 0 {
		unit = r.Unit.Duration()
	}
	st := &pb.RateLimitResponse_DescriptorStatus{
		CurrentLimit:       it.limitPB(),
		DurationUntilReset: durationpb.New(resetOf(it.dec.ResetAfter, it.dec.RetryAfter, unit)),
	}
	switch {
	case it.dec.Allowed:
		st.Code = pb.RateLimitResponse_OK
		st.LimitRemaining = uint32(min(max(it.dec.Remaining, 0), math.MaxUint32))
		it.result = resultOK
	case r.ShadowMode:
		st.Code = pb.RateLimitResponse_OK
		it.result = resultShadow
	default:
		st.Code = pb.RateLimitResponse_OVER_LIMIT
		it.result = resultOverLimit
	}
	return st
}

// resetOf is a status's duration_until_reset: the later of a decision's
// reset and retry, in whole seconds rounded up, as envoyproxy/ratelimit
// reports it (never 0 for a counted limit), and at most the limit's unit:
// a window ends, and a bucket of requests_per_unit refills, within it (a
// longer figure from a limiter is wrong, and must not overflow into a
// short one).
func resetOf(reset, retry, unit time.Duration) time.Duration {
	d := min(max(reset, retry), unit)
	return max(time.Second, (d+time.Second-1)/time.Second*time.Second)
}

func (s *Service) record(snap *snapshot, domain string, it *item) {
	if it.result < 0 {
		return
	}
	if it.label == "" && it.ovr == nil && it.rs.hits != nil {
		it.rs.ctr[it.result].Inc()
		it.rs.hits.Add(float64(it.hits))
		return
	}
	label, ident := it.label, ""
	switch {
	case it.ovr != nil:
		label = overrideLabel(it.desc)
	case label == "":
		label = it.rs.rule.Path
	default:
		ident = it.rs.rule.Ident
	}
	if it.ovr == nil && (label == it.rs.rule.Path || snap.static[labelKey{domain, label}]) {
		// a label of the configuration's own: bounded by it
		s.m.decisions.WithLabelValues(domain, label, resultNames[it.result]).Inc()
		s.m.hits.WithLabelValues(domain, label).Add(float64(it.hits))
		return
	}
	s.m.labels.series(domain, boundLabel(label), ident, s.now()).add(s.m.labels, it.result, it.hits)
}

func decisionError(err error) error {
	switch {
	case errors.Is(err, ratelimit.ErrClosed):
		return status.Error(codes.Unavailable, "shutting down")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Unavailable, "cannot decide: %v", err)
}
