package hybrid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hybridlimit/ratelimit/internal/breaker"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// health is what a Limiter knows of Redis and of the fleet: the circuit
// breaker, the last Redis error, how many instances share the quota (by
// heartbeat), and how regularly the syncer ticks.
type health struct {
	pipe      *pipe
	st        *stats
	brk       *breaker.Breaker
	observer  func(Event)
	fixed     int64 // WithInstances; 0: learned by heartbeat
	id        string
	prefix    string
	every     time.Duration // heartbeat period
	timeout   time.Duration
	probeArgs script.LeaseArgs // a lease call that asks for nothing and writes nothing

	lastErr atomic.Pointer[errAt] // the last Redis error, and when
	learned atomic.Bool           // a heartbeat told the fleet size at least once
	live    atomic.Int64          // instances the fleet counts: the most alive at a heartbeat lately (see seen)
	liveAt  atomic.Int64          // mono of the heartbeat that set live
	tickGap atomic.Int64          // smoothed time between ticks, ns
	lastGap atomic.Int64          // time from the tick before to the last one, ns
	// The last outage (see fleet): when the breaker opened, and when it
	// closed after (0 while open), mono ns.
	outageFrom atomic.Int64
	outageTo   atomic.Int64

	// Owned by the syncer goroutine.
	lastTick int64 // mono of the last tick
	nextBeat int64 // mono of the next heartbeat
	beats    int   // heartbeats the syncer made
}

// beatGap is the time from the syncer's heartbeat number beats (from 0) to
// the next: every, but shorter while the instance has just joined, from
// every / 2^joinRamp doubling up to every. A fleet starts together: each
// instance's first heartbeat (in New) counts only the instances that had
// joined before it, and the first to join would take itself for alone, and
// lease up to the whole of a window it cannot use while the others are
// refused, until its next heartbeat. The ramp has it learn the fleet's
// size within a few tens of milliseconds of the last join instead, for
// joinRamp heartbeats more in an instance's life.
func beatGap(every time.Duration, beats int) int64 {
	return int64(every) >> max(0, joinRamp-beats)
}

// joinRamp is how many times the heartbeat period halves right after an
// instance joins (see beatGap).
const joinRamp = 4

func (hl *health) init(h *Limiter, cfg config) {
	hl.pipe, hl.st, hl.observer = &h.pipe, &h.st, cfg.observer
	hl.fixed, hl.id, hl.prefix, hl.every, hl.timeout = int64(cfg.instances), cfg.instanceID, cfg.prefix, cfg.heartbeatEvery, cfg.timeout
	base, _ := script.KeyBase(cfg.prefix, "probe:"+cfg.instanceID)
	hl.probeArgs = script.LeaseArgs{Base: base, Kind: h.p.kind, Limit: h.p.limit, Instances: 1, Min: 1}
	hl.live.Store(1)
	hl.tickGap.Store(int64(cfg.syncInterval))
	hl.brk = breaker.New(breaker.Config{FailureThreshold: cfg.breakerFailures, OpenTimeout: cfg.breakerOpenFor})
	hl.brk.OnStateChange(func(from, to breaker.State) {
		switch to {
		case breaker.Open:
			hl.troubled()
			if from == breaker.Closed {
				e := Event{Kind: EventDegraded}
				if last := hl.lastErr.Load(); last != nil {
					e.Err = last.err
				}
				hl.emit(e)
			}
		case breaker.Closed:
			hl.healed()
			hl.emit(Event{Kind: EventRecovered})
		}
	})
}

// troubled records that Redis failed the instance (an error, or no reply
// within a call's deadline): an outage begins, unless one is on.
func (hl *health) troubled() {
	if hl.outageFrom.Load() == 0 || hl.outageTo.Load() != 0 {
		hl.outageTo.Store(0)
		hl.outageFrom.Store(max(1, hl.pipe.mono()))
	}
}

// healed records that Redis serves the instance again, the breaker
// closed: the outage ends.
func (hl *health) healed() {
	if hl.outageFrom.Load() != 0 && hl.outageTo.Load() == 0 && hl.brk.State() == breaker.Closed {
		hl.outageTo.Store(max(1, hl.pipe.mono()))
	}
}

// seen records that n instances were alive at a heartbeat. The fleet's
// size shrinks only when none larger was seen for fleetMemory heartbeats:
// after an outage the instances' heartbeats come back one by one, and a
// fleet that looked smaller meanwhile would give each instance a larger
// share of what it admits without Redis.
func (hl *health) seen(n int64) {
	now := hl.pipe.mono()
	if n >= hl.live.Load() || now-hl.liveAt.Load() > fleetMemory*int64(hl.every) {
		hl.live.Store(n)
		hl.liveAt.Store(now)
	}
}

// fleetMemory is how many heartbeats the fleet's size is remembered.
const fleetMemory = 10

// instances is how many instances share the quota: as configured, or
// learned by heartbeat.
func (hl *health) instances() int64 {
	if hl.fixed > 0 {
		return hl.fixed
	}
	if !hl.learned.Load() {
		// No heartbeat ever reached Redis: the fleet's size is unknown, and
		// taking it for one would let a fleet of N admit N times the limit
		// while Redis is away. Assume unknownFleet.
		return unknownFleet
	}
	return max(1, hl.live.Load())
}

// ticked records a tick of the syncer at now: the time from one tick to
// the next is the interval, plus what the previous pass took (or the
// backoff), smoothed.
func (hl *health) ticked(now int64) {
	if hl.lastTick > 0 {
		gap := now - hl.lastTick
		hl.tickGap.Store((hl.tickGap.Load() + gap) / 2)
		hl.lastGap.Store(gap)
	}
	hl.lastTick = now
}

// probe asks Redis whether it serves lease calls: when the breaker is
// open (so that it closes even when no decision and no flush asks Redis
// anything), and when a call failed lately (so that an outage opens it
// after a few ticks even when few calls are made, for few keys). The probe
// writes a short-lived key, then runs a lease call that asks for nothing:
// a Redis that refuses writes (out of memory, a read-only replica) refuses
// the first, and one that lost its scripts is taught them by the second.
// (A script that writes nothing runs even out of memory.)
func (hl *health) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, hl.timeout)
	defer cancel()
	err := hl.pipe.call(pctx, hl.runProbe)
	hl.st.roundTrips.Add(2)
	if err == nil {
		hl.brk.Success()
		hl.healed()
	} else {
		hl.noteErr(err)
		hl.troubled()
		hl.brk.Failure()
	}
}

func (hl *health) runProbe(ctx context.Context) error {
	if err := hl.pipe.client.Set(ctx, hl.probeArgs.Base+"w", 1, max(time.Second, hl.timeout)).Err(); err != nil {
		return err
	}
	return script.Lease.Run(ctx, hl.pipe.client, hl.probeArgs.Keys(), hl.probeArgs.Args()...).Err()
}

// heartbeat registers (or, with join false, removes) this instance and
// learns how many instances share the quota.
func (hl *health) heartbeat(ctx context.Context, join bool) {
	live := int64(hl.every.Milliseconds()) * instanceLivenessFactor
	flag := "1"
	if !join {
		flag = "0"
	}
	err := hl.pipe.call(ctx, func(ctx context.Context) error {
		n, err := script.Instances.Run(ctx, hl.pipe.client, []string{script.InstancesKey(hl.prefix)}, hl.id, live, flag).Int64()
		hl.st.roundTrips.Add(1)
		if err == nil && n > 0 {
			hl.seen(n)
			hl.learned.Store(true)
		}
		return err
	})
	hl.noteErr(err)
}

// errAt is an error and when it happened.
type errAt struct {
	err error
	at  time.Time
}

// noteErr keeps err as the last Redis error, and returns it, explained
// where Redis' own words mislead.
func (hl *health) noteErr(err error) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "unauthenticated") {
		// Redis answers a command of many arguments on a connection that
		// did not AUTH with a protocol error, not NOAUTH.
		err = fmt.Errorf("NOAUTH: the Redis server requires authentication (set the client's Password); it answered: %w", err)
	}
	now := time.Now()
	if noAnswer(err) {
		// A timeout or a dropped connection says less than the error that
		// likely caused it (a refused connection retried by the client
		// past the deadline; Redis closing a connection that did not AUTH
		// after its protocol error): it does not replace one less than
		// lastErrKeep old.
		if last := hl.lastErr.Load(); last != nil && !noAnswer(last.err) && now.Sub(last.at) < lastErrKeep {
			return err
		}
	}
	hl.lastErr.Store(&errAt{err: err, at: now})
	return err
}

// noAnswer reports whether err tells only that a call got no answer: a
// deadline, or a connection closed under it.
func noAnswer(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// failed records a failed exchange with Redis.
func (hl *health) failed(err error) {
	err = hl.noteErr(err)
	hl.st.flushErrors.Add(1)
	hl.troubled()
	hl.brk.Failure()
	hl.emit(Event{Kind: EventFlushError, Err: err})
}

func (hl *health) emit(e Event) {
	if hl.observer == nil {
		return
	}
	e.Time = time.Now()
	hl.observer(e)
}

// Ping reports whether Redis serves the limiter: it sends PING, then the
// breaker's probe (a short-lived write, and a lease call that asks for
// nothing), within a call's
// deadline (4 timeouts, at least 1s) or ctx's if sooner, and returns the
// first error Redis or the client gave, as it gave it (NOAUTH, WRONGPASS,
// connection refused, a Cluster client on a standalone server...). Call it
// at startup to fail fast on a wrong address or password: decisions never
// return Redis errors (the failure mode decides), and without it a
// misconfigured limiter is visible only in Stats().LastError and the
// observer's events.
func (h *Limiter) Ping(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, h.cfg.callTimeout())
	defer cancel()
	hl := &h.health
	err := h.pipe.call(pctx, func(ctx context.Context) error { return h.pipe.client.Ping(ctx).Err() })
	if err == nil {
		err = h.pipe.call(pctx, hl.runProbe)
	}
	if err != nil {
		err = hl.noteErr(err)
		return fmt.Errorf("hybrid: Redis does not serve the limiter: %w", err)
	}
	return nil
}
