// Package script is the Redis plumbing the global and hybrid limiters
// share and users never call: the Lua prelude every script is built with,
// the key layout, the hybrid's lease/reconcile script and fleet heartbeat,
// and small helpers about go-redis clients and errors.
package script

import (
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
)

//go:embed prelude.lua
var prelude string

// New builds a script from the shared prelude and body.
func New(body string) *redis.Script { return redis.NewScript(prelude + body) }

//go:embed lease.lua
var leaseSource string

//go:embed instances.lua
var instancesSource string

// Lease is the lease and reconcile script of the hybrid limiter (lease.lua).
// Its arguments are built by LeaseArgs and its reply read by ParseLease.
var Lease = New(leaseSource)

// Instances registers or removes a hybrid limiter instance and returns how
// many instances heartbeated within the liveness period. KEYS: InstancesKey.
// ARGV: instance id, liveness in ms, 1 to register or 0 to leave.
var Instances = redis.NewScript(instancesSource)

// InstancesKey returns the Redis key of the instance registry for prefix.
func InstancesKey(prefix string) string { return prefix + ":instances" }

// Adjust is what one lease call reconciles for one window: unused leased
// units given back and units admitted on credit reported.
type Adjust struct {
	Idx    int64 // window index: the window starts at Idx x Period since the epoch
	Refund int64 // leased units never used, to give back
	Use    int64 // units admitted on credit, to count
}

// MaxAdjust is the most windows one lease call reconciles: the previous,
// the current and the next.
const MaxAdjust = 3

// LeaseArgs are the arguments of one Lease call for one key.
type LeaseArgs struct {
	Base  string // KeyBase of the user key
	Kind  string // counter kind: Kind of the algorithm and limit
	Limit ratelimit.Limit
	Now   int64 // microseconds since the epoch; <= 0 reads Redis TIME

	// Nonce identifies the call in Redis' replay record: a few random
	// characters, no digit and no ':' (see NewNonce); "" keeps no record.
	Nonce  string
	Seq    int64 // the caller's own sequence number of the call (not sent)
	Resent bool  // sent again after its reply was lost

	Instances int64 // instances sharing the quota; caps a grant at remainder / Instances
	Want      int64 // units wanted from the current window (0: none)
	Min       int64 // the least grant from the current window worth having (>= 1)
	WantNext  int64 // units wanted from the next window (0: none)
	Lead      int64 // microseconds: the next window is leased from only when the current ends within Lead

	Adjust []Adjust // at most MaxAdjust
}

// Keys returns the KEYS of the call.
func (a *LeaseArgs) Keys() []string { return []string{a.Base} }

// Args returns the ARGV of the call.
func (a *LeaseArgs) Args() []any {
	now := a.Now
	if now <= 0 {
		now = -1
	}
	resent := 0
	if a.Resent {
		resent = 1
	}
	out := make([]any, 0, 11+3*len(a.Adjust))
	out = append(out, a.Kind, int64(a.Limit.Period/time.Microsecond), a.Limit.Rate, now,
		a.Nonce, resent, a.Instances, a.Want, a.Min, a.WantNext, a.Lead)
	for _, j := range a.Adjust {
		out = append(out, j.Idx, j.Refund, j.Use)
	}
	return out
}

// Reply is the reply of one Lease call.
type Reply struct {
	Idx   int64 // the current window; for a replay, the window the call was first applied in
	Now   int64 // the time the script used, microseconds since the epoch
	Reset int64 // microseconds from Now to the end of window Idx (<= 0: it has ended)
	Grant int64 // units granted from window Idx
	Count int64 // what bounds further grants from window Idx, as a count: Rate - Count is free
	Retry int64 // when Want > 0 and Grant < Min: microseconds until Min units could fit

	GrantNext int64 // units granted from window Idx + 1
	CountNext int64 // Count for window Idx + 1

	// Replayed: the call was resent and had been applied before; the grants
	// are those of its first application and nothing was applied again.
	Replayed bool
	// Unknown: the call was resent and whether its first attempt was applied
	// cannot be told (another call wrote the key's record since). Only its
	// credit was applied now; its refunds and grants were not.
	Unknown bool
}

// ErrBadReply reports a script reply of an unexpected shape.
var ErrBadReply = errors.New("ratelimit: unexpected script reply")

// ParseLease reads the reply of a Lease call.
func ParseLease(v any) (Reply, error) {
	f, err := ints(v, 9)
	if err != nil {
		return Reply{}, err
	}
	return Reply{Idx: f[0], Now: f[1], Reset: f[2], Grant: f[3], Count: f[4], Retry: f[5],
		GrantNext: f[6], CountNext: f[7], Replayed: f[8] == 1, Unknown: f[8] == 2}, nil
}

// ints reads a script reply of n integers.
func ints(v any, n int) ([]int64, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) != n {
		return nil, fmt.Errorf("%w: %v", ErrBadReply, v)
	}
	f := make([]int64, n)
	for i, x := range vals {
		switch t := x.(type) {
		case int64:
			f[i] = t
		case string:
			m, err := strconv.ParseInt(t, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrBadReply, v)
			}
			f[i] = m
		default:
			return nil, fmt.Errorf("%w: %v", ErrBadReply, v)
		}
	}
	return f, nil
}

// nonceAlphabet: letters, so that a nonce is safe in a record whatever
// follows it (records know a nonce by its fixed length).
const nonceAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// NonceLen is the length of a nonce: 6 letters, 34.2 bits. A call resent
// after a lost reply is compared with the records of the (at most four)
// counters it may have written, so a false match takes about one chance in
// 5 x 10^9 per resend, and resends follow lost replies only.
const NonceLen = 6

// NewNonce returns the nonce of a call from 64 random bits.
func NewNonce(r uint64) string {
	var b [NonceLen]byte
	for i := range b {
		b[i] = nonceAlphabet[r%uint64(len(nonceAlphabet))]
		r /= uint64(len(nonceAlphabet))
	}
	return string(b[:])
}

// IsNoScript reports whether err is Redis' NOSCRIPT: the script was not
// run (the server lost its script cache).
func IsNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }

// IsNilClient reports whether c is nil, or a nil pointer (or map, slice,
// func, chan or interface) of any type in the interface: a typed nil, which
// would panic on first use, on a background goroutine.
func IsNilClient(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	switch v := reflect.ValueOf(c); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

//go:embed bucket.lua
var bucketSource string

// Bucket is the hybrid's lease script for the buckets (bucket.lua), on the
// state global's TokenBucket and GCRA scripts keep. Its arguments are built
// by BucketArgs and its reply read by ParseBucket.
var Bucket = New(bucketSource)

// BucketArgs are the arguments of one Bucket call for one key.
type BucketArgs struct {
	Base      string
	Algorithm ratelimit.Algorithm // TokenBucket or GCRA
	Limit     ratelimit.Limit
	Now       int64 // microseconds since the epoch; <= 0 reads Redis TIME

	Nonce  string // see LeaseArgs.Nonce; GCRA keeps no record
	Seq    int64  // the caller's own sequence number of the call (not sent)
	Resent bool

	Instances int64 // instances sharing the bucket
	Want      int64 // tokens wanted (0: none)
	Min       int64 // the least grant worth having (>= 1)
	Refund    int64 // unused tokens to give back
	Use       int64 // tokens admitted without a grant, to take even below empty

	// Holder names the caller in the bucket's records of held tokens
	// ("": the call holds nothing, and leaves its caller's record as it
	// is). Its record becomes Keep, the tokens it keeps, plus the grant,
	// until HoldUS microseconds from the call's time; it must not use them
	// after that. See bucket.lua.
	Holder string
	Keep   int64
	HoldUS int64
	// Back: tokens decisions gave back (they used less than they took),
	// whoever held them: unlike Refund, not bounded by a record.
	Back int64

	// Head: ARGV[1..5] as BucketHead returns them for Algorithm and Limit
	// (not sent as such), so that the calls of one limit box them once;
	// nil: Args works them out.
	Head *[5]any
}

// BucketHead returns the arguments of a Bucket call that depend on the
// algorithm and the limit alone (ARGV[1..5]: see bucket.lua), for
// BucketArgs.Head.
func BucketHead(alg ratelimit.Algorithm, l ratelimit.Limit) *[5]any {
	p := int64(l.Period / time.Microsecond)
	b := int64(l.Capacity(alg))
	if alg == ratelimit.GCRA {
		t := p / int64(l.Rate)
		return &[5]any{"gcra", Kind(alg, l), t, b * t, int64(0)}
	}
	return &[5]any{"tb", Kind(alg, l), int64(l.Rate), p, b * p}
}

// Keys returns the KEYS of the call.
func (a *BucketArgs) Keys() []string { return []string{a.Base} }

// Args returns the ARGV of the call.
func (a *BucketArgs) Args() []any {
	head := a.Head
	if head == nil {
		head = BucketHead(a.Algorithm, a.Limit)
	}
	now := a.Now
	if now <= 0 {
		now = -1
	}
	resent := 0
	if a.Resent {
		resent = 1
	}
	args := append(make([]any, 0, 17), head[:]...)
	args = append(args, now, a.Nonce, resent,
		a.Instances, a.Want, a.Min, a.Refund, a.Use, a.Holder, a.Keep, a.HoldUS, a.Back)
	// the arguments from ARGV[12] on default to 0 and "": an exact call
	// sends none of them (each costs Redis about 60ns)
	for len(args) > 11 && isZero(args[len(args)-1]) {
		args = args[:len(args)-1]
	}
	return args
}

// isZero reports whether an argument of Args is its default: 0 or "".
func isZero(v any) bool {
	switch v := v.(type) {
	case int64:
		return v == 0
	case string:
		return v == ""
	}
	return false
}

// BucketReply is the reply of one Bucket call.
type BucketReply struct {
	Grant    int64 // tokens granted
	Level    int64 // whole tokens in the bucket after the call (negative in an overdraft)
	Retry    int64 // when Want > 0 and Grant < Min: microseconds until Min tokens are in it
	Full     int64 // microseconds until the bucket is full
	Replayed bool  // see Reply.Replayed
	Unknown  bool  // see Reply.Unknown
	// Kept is how much of Keep the holder's record covers (less than Keep
	// only when the record was gone: past its deadline), or -1 when no
	// record was written (no Holder, or the call was resent).
	Kept int64
}

// ParseBucket reads the reply of a Bucket call.
func ParseBucket(v any) (BucketReply, error) {
	f, err := ints(v, 6)
	if err != nil {
		return BucketReply{}, err
	}
	return BucketReply{Grant: f[0], Level: f[1], Retry: f[2], Full: f[3], Replayed: f[4] == 1, Unknown: f[4] == 2, Kept: f[5]}, nil
}

//go:embed take.lua
var takeSource string

// Take is the hybrid's exact accounting of one decision on a cold key of a
// FixedWindow limit (take.lua): n units added to the current window's
// counter when they fit, as global's FixedWindow script does. Its
// arguments are built by TakeArgs and its reply read by ParseTake.
var Take = redis.NewScript(takeSource) // standalone: see take.lua

// TakeArgs are the arguments of one Take call.
type TakeArgs struct {
	Base  string // KeyBase of the user key
	Kind  string // counter kind: Kind(FixedWindow, limit)
	Limit ratelimit.Limit
	Now   int64 // microseconds since the epoch; <= 0 reads Redis TIME
	N     int64 // units of the decision

	// What the caller owes window AdjustIdx goes in first when it is the
	// current window: units it gives back (never below zero), and units
	// it admitted on credit.
	AdjustIdx int64
	Refund    int64
	Use       int64
}

// Keys returns the KEYS of the call.
func (a *TakeArgs) Keys() []string { return []string{a.Base} }

// Args returns the ARGV of the call.
func (a *TakeArgs) Args() []any {
	now := a.Now
	if now <= 0 {
		now = -1
	}
	return []any{a.Kind, int64(a.Limit.Period / time.Microsecond), a.Limit.Rate, now, a.N, a.AdjustIdx, a.Refund, a.Use}
}

// TakeReply is the reply of one Take call.
type TakeReply struct {
	Idx      int64 // the window counted in
	Now      int64 // the time the script used, microseconds since the epoch
	Count    int64 // the window's count after the call
	Admitted bool  // the n units were added: they fit under the limit
	Adjusted bool  // the adjustment was applied (its window is Idx)
}

// ParseTake reads the reply of a Take call.
func ParseTake(v any) (TakeReply, error) {
	f, err := ints(v, 5)
	if err != nil {
		return TakeReply{}, err
	}
	return TakeReply{Idx: f[0], Now: f[1], Count: f[2], Admitted: f[3] == 1, Adjusted: f[4] == 1}, nil
}
