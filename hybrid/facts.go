package hybrid

import (
	"math"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// params are a Limiter's fixed rules, read by its keys' state machines and
// never written after New.
type params struct {
	limit    ratelimit.Limit
	alg      ratelimit.Algorithm
	mode     Mode
	failure  ratelimit.FailureMode
	openFor  int64 // how long the breaker stays open, ns: a FailClosed denial's RetryAfter
	settle   int64 // ns after its own outage during which the instance stays cautious (see fleet.cautious)
	rate     int64
	capacity int64 // the most one decision can ask: Rate (windows), Burst (buckets)
	bucket   bool  // TokenBucket or GCRA: leases tokens, not a window's quota
	periodNS int64
	periodUS int64
	interval int64 // the sync interval, ns
	useGrain int64 // resolution of counter.lastUse, ns
	kind     string
	head     *[5]any // a bucket call's ARGV[1..5], boxed once (script.BucketHead)
	prefix   string
	holder   string // the Limiter's name in a bucket's records of held tokens
	policy   policy // window or bucket leases
}

func newParams(limit ratelimit.Limit, cfg config) *params {
	p := &params{
		limit:    limit,
		alg:      cfg.algorithm,
		mode:     cfg.mode,
		failure:  cfg.failure,
		openFor:  int64(cfg.breakerOpenFor),
		settle:   int64(cfg.breakerOpenFor + 3*cfg.syncInterval + cfg.timeout),
		rate:     int64(limit.Rate),
		capacity: int64(limit.Capacity(cfg.algorithm)),
		bucket:   isBucket(cfg.algorithm),
		periodNS: int64(limit.Period),
		periodUS: int64(limit.Period / time.Microsecond),
		interval: int64(cfg.syncInterval),
		useGrain: max(int64(time.Millisecond), int64(limit.Period)/32),
		kind:     script.Kind(cfg.algorithm, limit),
		prefix:   cfg.prefix,
		holder:   cfg.holder,
	}
	if p.bucket {
		p.head = script.BucketHead(cfg.algorithm, limit)
		p.policy = buckets{p}
	} else {
		p.policy = windows{p}
	}
	return p
}

// isBucket reports whether a is leased as tokens.
func isBucket(a ratelimit.Algorithm) bool {
	return a == ratelimit.TokenBucket || a == ratelimit.GCRA
}

// fleet is what a transition of a key's state needs to know of the world
// outside the key, taken by value: the state machine reads no clock and no
// shared state of its own accord.
type fleet struct {
	instances int64 // instances sharing the quota: configured, learned, or assumed (unknownFleet)
	tickGap   int64 // smoothed time between the syncer's ticks, ns
	lastGap   int64 // time between the last two ticks, ns
	draining  bool  // Flush or Close in progress: give back, lease nothing
	breaker   breaker.State
	clock     clockView // Redis server time on the monotonic clock
	// The instance's last outage: from when Redis first failed it (an
	// error, or no reply within a call's deadline) until it served it
	// again with the breaker closed (0 until then), mono ns; from is 0
	// when there was none.
	outageFrom, outageTo int64
}

// cautious reports whether the instance's last outage touched the window
// from start to end (mono), or came close enough before it that another
// instance may still be recovering: while Redis was away the instances may
// have admitted in it on credit, some of which Redis has not heard of yet,
// so the instance's grants in it are bounded by its budget (see
// lockedCounter.afterOutage). Another instance recovers (its breaker opens
// for openFor, then its syncer probes at its next tick) and reports what it
// admitted (at its next call, a tick at most) within settle of this one,
// when they share their options.
func (p *params) cautious(f fleet, start, end int64) bool {
	return f.outageFrom != 0 && f.outageFrom < end && (f.outageTo == 0 || f.outageTo+p.settle >= start)
}

// optimisticShare is what an instance may admit per window on credit in
// optimistic mode: Rate / (8 x instances), at least 1.
func (p *params) optimisticShare(f fleet) int64 {
	return max(1, p.rate/(optimisticShareDivisor*f.instances))
}

// localShare is the FailLocal budget per window: Rate / instances, at
// least 1.
func (p *params) localShare(f fleet) int64 { return max(1, p.rate/f.instances) }

// minLease is the least a lease asks for: Rate / (16 x instances), at least 1,
// so that a key without history, or one that went quiet, does not turn its
// next decisions into round trips.
func (p *params) minLease(f fleet) int64 {
	return max(1, min(p.rate, p.capacity)/(16*f.instances))
}

// bucketReset is a decision's ResetAfter for a bucket limiter: until the
// bucket is full again, at Rate per Period, from what remains.
func (p *params) bucketReset(remaining int64) int64 {
	return max(0, p.capacity-remaining) * p.periodNS / p.rate
}

// allowed is an admission's Decision: rem remaining, the lease l ending
// its window.
func (p *params) allowed(rem int64, l *lease, now int64) (d ratelimit.Decision) {
	p.allowedInto(&d, rem, l, now)
	return d
}

// allowedInto writes allowed's Decision to *d, which is the zero
// Decision: field by field, without a temporary (the hot path's).
func (p *params) allowedInto(d *ratelimit.Decision, rem int64, l *lease, now int64) {
	rem = min(rem, p.capacity)
	reset := max(l.end()-now, 0)
	if p.bucket {
		reset = p.bucketReset(rem)
	}
	d.Allowed, d.Limit, d.Algorithm = true, p.limit, p.alg
	d.Remaining, d.ResetAfter = int(rem), time.Duration(reset)
}

// denied is a denial's Decision: retry after retry ns, reset after reset.
func (p *params) denied(retry, reset int64) ratelimit.Decision {
	return ratelimit.Decision{Limit: p.limit, Algorithm: p.alg, RetryAfter: time.Duration(retry), ResetAfter: time.Duration(reset)}
}

// ceilUnits is how many units serve span ns at demand units per period,
// with half again for headroom.
func ceilUnits(demand float64, span, period int64) int64 {
	return int64(math.Ceil(demand * float64(span) / float64(period) * leaseHeadroom))
}

// leaseHeadroom: a lease holds half again the demand it is sized for.
const leaseHeadroom = 1.5
