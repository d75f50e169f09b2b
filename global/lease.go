package global

import (
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
)

//go:embed lease.lua
var leaseSource string

// LeaseScript is the lease and reconcile primitive of the hybrid limiter: one
// atomic call per key that refunds unused quota to a window counter, reports
// usage admitted on credit, and leases a slice of the current window. It
// works on the same fw:/sw: counters as the FixedWindow and SlidingWindow
// limiters of this package. Its arguments are built by LeaseArgs.Args and its
// reply read by ParseLease.
var LeaseScript = newScript(leaseSource)

// LeaseArgs are the arguments of one LeaseScript call for one key.
type LeaseArgs struct {
	Base      string              // KeyBase of the user key
	Algorithm ratelimit.Algorithm // FixedWindow or SlidingWindow
	Limit     ratelimit.Limit
	Now       int64 // microseconds since the epoch; <= 0 reads Redis TIME

	RefundIdx int64 // window index the refund belongs to
	Refund    int64 // unused leased units to give back (0: none)
	UseIdx    int64 // window index the credit usage belongs to
	Use       int64 // units admitted on credit, to add (0: none)

	Want      int64 // units wanted from the current window (0: none)
	Min       int64 // the least grant worth having (>= 1)
	Instances int64 // instances sharing the quota; caps the grant at remainder / Instances

	Instance string // instance id; "" disables replay protection
	Seq      int64  // per instance and key, increasing; a call with a Seq already applied replays the reply
}

// Keys returns the KEYS of the call.
func (a *LeaseArgs) Keys() []string { return []string{a.Base} }

// Args returns the ARGV of the call.
func (a *LeaseArgs) Args() []any {
	algo := "fw"
	if a.Algorithm == ratelimit.SlidingWindow {
		algo = "sw"
	}
	now := a.Now
	if now <= 0 {
		now = -1
	}
	return []any{algo, int64(a.Limit.Period / time.Microsecond), a.Limit.Rate, now,
		a.RefundIdx, a.Refund, a.UseIdx, a.Use, a.Want, a.Min, a.Instances, a.Instance, a.Seq}
}

// Lease is the reply of one LeaseScript call.
type Lease struct {
	Grant    int64 // units granted from window Idx (0 when fewer than Min were left)
	Idx      int64 // the current window index: the window starts at Idx x Period since the epoch
	Count    int64 // the window's count after the call; for SlidingWindow the weighted estimate
	Now      int64 // the time the script used, microseconds since the epoch
	Retry    int64 // when Grant < Min: microseconds until Min units could fit
	Reset    int64 // microseconds until the end of window Idx
	Replayed bool  // the call repeated one already applied; this is its original reply
	// Superseded: the call was sent again after a later call of the same
	// instance and key was applied. This is the later call's reply; whether
	// this call was applied is unknown, and a grant it got is lost to the
	// caller (counted in Redis, never used: the safe side).
	Superseded bool
}

// ErrBadReply reports a script reply of an unexpected shape.
var ErrBadReply = errors.New("global: unexpected script reply")

// ParseLease reads the reply of a LeaseScript call.
func ParseLease(v any) (Lease, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) != 7 {
		return Lease{}, fmt.Errorf("%w: %v", ErrBadReply, v)
	}
	var f [7]int64
	for i, x := range vals {
		switch t := x.(type) {
		case int64:
			f[i] = t
		case string:
			n, err := strconv.ParseInt(t, 10, 64)
			if err != nil {
				return Lease{}, fmt.Errorf("%w: %v", ErrBadReply, v)
			}
			f[i] = n
		default:
			return Lease{}, fmt.Errorf("%w: %v", ErrBadReply, v)
		}
	}
	return Lease{Grant: f[0], Idx: f[1], Count: f[2], Now: f[3], Retry: f[4], Reset: f[5], Replayed: f[6] == 1, Superseded: f[6] == 2}, nil
}

//go:embed instances.lua
var instancesSource string

// InstancesScript registers or removes a hybrid limiter instance and returns
// how many instances heartbeated within the liveness period. KEYS: the key of
// InstancesKey. ARGV: instance id, liveness in ms, 1 to register or 0 to leave.
var InstancesScript = redis.NewScript(instancesSource)

// InstancesKey returns the Redis key of the instance registry for prefix.
func InstancesKey(prefix string) string { return prefix + ":instances" }
