package hybrid

import (
	gosync "sync"

	"github.com/hybridlimit/ratelimit/internal/script"
)

// leaseCall is one call of a key's lease script, on the window counters
// (win) or on the bucket (bkt): made and sized by the key's state machine,
// sent through the Limiter's pipe, its reply applied by the state machine.
//
// A key has at most one outstanding call (counter.out): a new one is made
// only once the last one's reply was seen. Redis keeps a replay record of
// the last call on a counter, so a call resent after a lost reply finds
// its own record unless another instance's call came between.
type leaseCall struct {
	c      *counter
	win    script.LeaseArgs
	bkt    script.BucketArgs
	bucket bool
	// built: mono ns the call was made at (before any attempt ran); a
	// bucket call's record lasts from a later time (see buckets.hold).
	built int64
	// renew: a bucket call sent for its record's deadline alone
	renew bool
	// notRun: the last attempt certainly did not run (NOSCRIPT, no
	// connection), so the call is sent again as new, not as resent.
	notRun bool
	// flight is the attempt on its way, while it is; guarded by the key's
	// mutex.
	flight *flight
	// plain: sent as a plain increment of one window's counter (see
	// makePlain), made when the key was in window plainIdx, at server time
	// serverUS (microseconds).
	plain    bool
	plainIdx int64
	serverUS int64
	// plainElapsed: a SlidingWindow plain lease of window plainIdx is run
	// by Redis at least this far into it, microseconds (see
	// plainsliding.go)
	plainElapsed int64
}

// flight is one attempt of a lease call on its way: the decisions of the
// key wait for done.
type flight struct {
	done chan struct{}
	err  error // written before done closes
}

// Done returns a channel closed when the attempt is over, or nil for no
// attempt.
func (f *flight) Done() <-chan struct{} {
	if f == nil {
		return nil
	}
	return f.done
}

// callID identifies a new call: the Limiter's sequence number, and the
// nonce Redis' replay record knows it by; now is the time the call counts
// at, microseconds since the epoch (WithClock), or 0 for Redis TIME.
type callID struct {
	seq   int64
	nonce string
	now   int64
}

// newCall starts a lease call for the key, asking for nothing yet.
func (lc *lockedCounter) newCall(p *params, id callID, f fleet) *leaseCall {
	k := new(leaseCall)
	lc.initCall(k, p, id, f)
	k.setBase(lc.base(p))
	return k
}

// initCall makes k a new lease call of the key, asking for nothing yet,
// with no key base (setBase).
func (lc *lockedCounter) initCall(k *leaseCall, p *params, id callID, f fleet) {
	if p.bucket {
		*k = leaseCall{c: lc.counter(), bucket: true, bkt: script.BucketArgs{
			Algorithm: p.alg, Limit: p.limit, Now: id.now,
			Nonce: id.nonce, Seq: id.seq, Instances: f.instances, Min: 1, Head: p.head,
		}}
		return
	}
	*k = leaseCall{c: lc.counter(), win: script.LeaseArgs{
		Kind: p.kind, Limit: p.limit, Now: id.now,
		Nonce: id.nonce, Seq: id.seq, Instances: f.instances, Min: 1,
	}}
}

// base is the Redis key base of the key's calls.
func (lc *lockedCounter) base(p *params) string { return keyBase(p.prefix, lc.key) }

func (k *leaseCall) setBase(base string) {
	if k.bucket {
		k.bkt.Base = base
	} else {
		k.win.Base = base
	}
}

// identify gives k, a call planned at a tick without an identity (seq 0:
// most plans send nothing, and a nonce costs an allocation), the
// identity id.
func (k *leaseCall) identify(id callID) {
	if k.bucket {
		k.bkt.Seq, k.bkt.Nonce = id.seq, id.nonce
	} else {
		k.win.Seq, k.win.Nonce = id.seq, id.nonce
	}
}

// blankCalls recycles the calls a tick planned and found empty: a key
// visited at a tick (to roll its lease, to see whether it leases ahead, to
// leave the table once idle) mostly has nothing to send.
var blankCalls = gosync.Pool{New: func() any { return new(leaseCall) }}

// ask makes the call of a decision of n units that the lease in hand
// cannot serve at now: the key's outstanding call, sent again, or a new
// one (identified by id) that carries what the key owes, credit first, and
// asks for n and more. The key has no flight.
func (lc *lockedCounter) ask(p *params, id callID, n, now int64, f fleet) *leaseCall {
	if k := lc.resend(); k != nil {
		return k
	}
	// The grant adds to the lease in hand: n less what it holds will do.
	var have int64
	if l := lc.cur.Load(); l != nil && l.known && now < l.end() {
		have = max(0, l.avail.Load())
	}
	// What the key owes goes first: credit (an overdraft, say) is counted
	// before anything is granted.
	lc.oweCredit()
	k := lc.newCall(p, id, f)
	p.policy.ask(lc, k, n, have, now, f)
	return k
}

// resend returns the key's outstanding call to send again, or nil: as it
// was when it certainly did not run, else marked resent (Redis replays it,
// or applies only its credit). The key has no flight.
func (lc *lockedCounter) resend() *leaseCall {
	k := lc.out
	if k == nil {
		return nil
	}
	k.plain = false // sent again through lease.lua, which knows no record of a plain call: it grants nothing
	if k.notRun {
		k.notRun = false
	} else if k.bucket {
		k.bkt.Resent = true
	} else {
		k.win.Resent = true
	}
	return k
}

// startFlight makes k the key's outstanding call, on its way.
func (lc *lockedCounter) startFlight(k *leaseCall) *flight {
	k.flight = &flight{done: make(chan struct{})}
	lc.out = k
	return k.flight
}

// inFlight returns the attempt of the key's call on its way, or nil.
func (lc *lockedCounter) inFlight() *flight {
	if lc.out == nil {
		return nil
	}
	return lc.out.flight
}

// endFlight ends attempt f of k: the decisions waiting for it go on. When the
// reply was not seen (err), the call stays outstanding, in doubt, to be
// sent again (as new when notRun).
func (lc *lockedCounter) endFlight(k *leaseCall, f *flight, err error, notRun bool) {
	if err != nil && lc.out == k {
		k.notRun = notRun
	}
	if k.flight == f {
		k.flight = nil
	}
	f.err = err
	close(f.done)
}

// seq is the call's sequence number: the same when it is sent again.
func (k *leaseCall) seq() int64 {
	if k.bucket {
		return k.bkt.Seq
	}
	return k.win.Seq
}

func (k *leaseCall) resent() bool {
	if k.bucket {
		return k.bkt.Resent
	}
	return k.win.Resent
}

// empty reports whether the call carries nothing worth sending.
func (k *leaseCall) empty() bool {
	if k.bucket {
		return k.bkt.Refund == 0 && k.bkt.Use == 0 && k.bkt.Want == 0 && !k.renew
	}
	return len(k.win.Adjust) == 0 && k.win.Want == 0 && k.win.WantNext == 0
}

// base is the Redis key base of the call's key.
func (k *leaseCall) base() string {
	if k.bucket {
		return k.bkt.Base
	}
	return k.win.Base
}

// request returns the call as the pipe sends it.
func (k *leaseCall) request() request {
	if k.plain {
		return k.plainRequest()
	}
	if k.bucket {
		return request{script: script.Bucket, keys: k.bkt.Keys(), args: k.bkt.Args(), parse: parseFunc(parseBucket)}
	}
	return request{script: script.Lease, keys: k.win.Keys(), args: k.win.Args(), parse: parseFunc(parseLease)}
}
