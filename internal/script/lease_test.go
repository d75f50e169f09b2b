package script_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

const sec = int64(1_000_000)

// leaser runs Lease calls for one key at explicit instants.
type leaser struct {
	t    *testing.T
	c    redis.UniversalClient
	base string
	kind string
	lim  ratelimit.Limit
}

func newLeaser(t *testing.T, c redis.UniversalClient, key string, alg ratelimit.Algorithm, lim ratelimit.Limit) *leaser {
	base, err := script.KeyBase("leasetest", key)
	require.NoError(t, err)
	return &leaser{t: t, c: c, base: base, kind: script.Kind(alg, lim), lim: lim}
}

func (l *leaser) call(a script.LeaseArgs) script.Reply {
	l.t.Helper()
	a.Base, a.Kind, a.Limit = l.base, l.kind, l.lim
	if a.Instances == 0 {
		a.Instances = 1
	}
	if a.Want > 0 && a.Min == 0 {
		a.Min = 1
	}
	v, err := script.Lease.Run(context.Background(), l.c, a.Keys(), a.Args()...).Result()
	require.NoError(l.t, err)
	r, err := script.ParseLease(v)
	require.NoError(l.t, err)
	return r
}

// count reads window idx's counter, whatever its type.
func (l *leaser) count(idx int64) int64 {
	l.t.Helper()
	k := script.WindowKey(l.base, l.kind, idx)
	ctx := context.Background()
	switch l.c.Type(ctx, k).Val() {
	case "none":
		return -1
	case "string":
		n, err := l.c.Get(ctx, k).Int64()
		require.NoError(l.t, err)
		return n
	}
	s, err := l.c.HGet(ctx, k, "c").Result()
	if err == redis.Nil {
		return 0
	}
	require.NoError(l.t, err)
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(l.t, err)
	return n
}

func TestLeaseGrants(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	lim := ratelimit.Limit{Rate: 100, Period: time.Second}
	l := newLeaser(t, c, "grants", ratelimit.FixedWindow, lim)
	t0 := 1_700_000_000 * sec // a window start
	w := t0 / sec

	// capped at remainder / instances: 100/2 = 50
	r := l.call(script.LeaseArgs{Now: t0 + 10, Want: 80, Instances: 2})
	require.Equal(t, script.Reply{Idx: w, Now: t0 + 10, Reset: sec - 10, Grant: 50, Count: 50, CountNext: -1}, r)
	// refund 20 of it and lease 10 in one call: 50 - 20 + 10 = 40
	r = l.call(script.LeaseArgs{Now: t0 + 20, Adjust: []script.Adjust{{Idx: w, Refund: 20}}, Want: 10})
	require.EqualValues(t, 10, r.Grant)
	require.EqualValues(t, 40, r.Count)
	require.EqualValues(t, 40, l.count(w))
	// credit lands even past the limit; grants then stop, with the time to
	// the window's end as the retry
	r = l.call(script.LeaseArgs{Now: t0 + 30, Adjust: []script.Adjust{{Idx: w, Use: 70}}})
	require.EqualValues(t, 110, r.Count)
	r = l.call(script.LeaseArgs{Now: t0 + 40, Want: 5})
	require.Zero(t, r.Grant)
	require.EqualValues(t, sec-40, r.Retry)
	// a refund never drives the counter below zero nor recreates a gone key
	l.call(script.LeaseArgs{Now: t0 + 50, Adjust: []script.Adjust{{Idx: w, Refund: 1000}}})
	require.EqualValues(t, 0, l.count(w))
	require.NoError(t, c.Del(context.Background(), script.WindowKey(l.base, l.kind, w)).Err())
	l.call(script.LeaseArgs{Now: t0 + 60, Adjust: []script.Adjust{{Idx: w, Refund: 5}}})
	require.EqualValues(t, -1, l.count(w))
	// FixedWindow: an ended window bounds nothing and is left alone
	l.call(script.LeaseArgs{Now: t0 + sec + 1, Adjust: []script.Adjust{{Idx: w, Use: 5}}})
	require.EqualValues(t, -1, l.count(w))

	bad, err := redistest.KeysWithoutTTL(context.Background(), c)
	require.NoError(t, err)
	require.Empty(t, bad)
}

// The last quarter of the limit goes out in chunks of R / (4 x instances),
// never in a cascade of tiny grants; a grant never passes the remainder.
func TestLeaseTail(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	lim := ratelimit.Limit{Rate: 2000, Period: time.Second}
	l := newLeaser(t, c, "tail", ratelimit.FixedWindow, lim)
	t0 := 1_700_000_100 * sec
	var grants []int64
	total := int64(0)
	for i := 0; i < 100; i++ {
		r := l.call(script.LeaseArgs{Now: t0 + int64(i), Want: 1 << 40, Instances: 8})
		if r.Grant == 0 {
			break
		}
		grants = append(grants, r.Grant)
		total += r.Grant
	}
	require.EqualValues(t, lim.Rate, total, "the whole window is granted")
	require.LessOrEqual(t, len(grants), 20, "grants %v", grants)
	require.EqualValues(t, 250, grants[0], "remainder / instances")
	for _, g := range grants[:len(grants)-1] {
		require.GreaterOrEqual(t, g, int64(63), "no grant below R / (4 x instances) but the last: %v", grants)
	}
}

// Near the end of a window, the next one can be leased from: those units
// are counted in the next window's counter, and not before lead allows.
func TestLeaseNext(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	lim := ratelimit.Limit{Rate: 100, Period: time.Second}
	t0 := 1_700_000_200 * sec
	w := t0 / sec
	l := newLeaser(t, c, "next", ratelimit.FixedWindow, lim)

	// too early: the window ends in 0.9s, lead is 0.3s
	r := l.call(script.LeaseArgs{Now: t0 + sec/10, WantNext: 30, Lead: 3 * sec / 10, Instances: 2})
	require.Zero(t, r.GrantNext)
	require.EqualValues(t, -1, l.count(w+1))
	// within lead
	r = l.call(script.LeaseArgs{Now: t0 + 8*sec/10, Want: 10, WantNext: 30, Lead: 3 * sec / 10, Instances: 2})
	require.EqualValues(t, 10, r.Grant)
	require.EqualValues(t, 30, r.GrantNext)
	require.EqualValues(t, 30, r.CountNext)
	require.EqualValues(t, 10, l.count(w))
	require.EqualValues(t, 30, l.count(w+1))
	// the next window is capped like the current one: (100 - 30) / 2
	r = l.call(script.LeaseArgs{Now: t0 + 9*sec/10, WantNext: 90, Lead: sec, Instances: 2})
	require.EqualValues(t, 35, r.GrantNext)
	// in the next window, that counter is the current one and holds 65
	r = l.call(script.LeaseArgs{Now: t0 + sec + 5, Want: 100, Instances: 1})
	require.Equal(t, w+1, r.Idx)
	require.EqualValues(t, 35, r.Grant)
	require.EqualValues(t, 100, r.Count)
	// a refund of the next window (a pre-lease given back before it began)
	l.call(script.LeaseArgs{Now: t0 + sec + 6, Adjust: []script.Adjust{{Idx: w + 1, Refund: 20}}})
	require.EqualValues(t, 80, l.count(w+1))
	ttl := c.PTTL(context.Background(), script.WindowKey(l.base, l.kind, w+1)).Val()
	require.Greater(t, ttl, time.Second, "the next window's counter lives to its end plus grace")
}

// SlidingWindow: the next window starts from the current one weighted
// fully, so grants from either keep curr + next <= R, and grants from the
// current one also keep the weighted estimate <= R.
func TestLeaseSlidingWindow(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	lim := ratelimit.Limit{Rate: 100, Period: time.Second}
	t0 := 1_700_000_300 * sec
	w := t0 / sec
	l := newLeaser(t, c, "sw", ratelimit.SlidingWindow, lim)
	r := l.call(script.LeaseArgs{Now: t0 + sec/2, Want: 60})
	require.EqualValues(t, 60, r.Grant)
	// pre-lease: next may take 100 - 60 = 40, less what the current
	// window is on course to count still: 60 in 0.9s, 7 more in its last
	// 0.1s
	r = l.call(script.LeaseArgs{Now: t0 + 9*sec/10, WantNext: 100, Lead: sec})
	require.EqualValues(t, 33, r.GrantNext)
	require.EqualValues(t, 93, r.CountNext)
	// the current window keeps those 7 (curr + next <= 100), and no more
	r = l.call(script.LeaseArgs{Now: t0 + 9*sec/10 + 1, Want: 10})
	require.EqualValues(t, 7, r.Grant)
	r = l.call(script.LeaseArgs{Now: t0 + 9*sec/10 + 2, Want: 1})
	require.Zero(t, r.Grant)
	require.EqualValues(t, 100, r.Count)
	// its retry lies in the next window: when 67 weighted decays to <= 66
	require.Greater(t, t0+9*sec/10+2+r.Retry, t0+sec)
	// in the next window: est = 67 x (P - e) / P + 33
	r = l.call(script.LeaseArgs{Now: t0 + sec + sec/2, Want: 100})
	require.Equal(t, w+1, r.Idx)
	require.EqualValues(t, 34, r.Grant, "100 - (67 x 0.5 + 33), the estimate rounded down")
	// global's SlidingWindow honours the pre-leased counts too
}

// A call resent after its reply was lost is replayed when its record is
// still the key's last; otherwise it is unknown, and only its credit is
// applied: never a refund or a grant twice.
func TestLeaseResend(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	lim := ratelimit.Limit{Rate: 1000, Period: time.Second}
	t0 := 1_700_000_400 * sec
	w := t0 / sec
	l := newLeaser(t, c, "resend", ratelimit.FixedWindow, lim)
	first := l.call(script.LeaseArgs{Now: t0 + 1, Want: 100, WantNext: 7, Lead: sec, Nonce: "aaaaaa"})
	require.EqualValues(t, 100, first.Grant)
	require.EqualValues(t, 7, first.GrantNext)
	again := l.call(script.LeaseArgs{Now: t0 + 2, Want: 100, WantNext: 7, Lead: sec, Nonce: "aaaaaa", Resent: true})
	require.True(t, again.Replayed)
	require.Equal(t, w, again.Idx)
	require.EqualValues(t, 100, again.Grant)
	require.EqualValues(t, 7, again.GrantNext)
	require.EqualValues(t, 100, l.count(w), "a replay applies nothing")
	// replayed from the previous window's record after the roll
	late := l.call(script.LeaseArgs{Now: t0 + sec + 2, Want: 100, Nonce: "aaaaaa", Resent: true})
	require.True(t, late.Replayed)
	require.Equal(t, w, late.Idx)
	require.LessOrEqual(t, late.Reset, int64(0), "its window has ended")
	require.EqualValues(t, 7, late.GrantNext, "the grant from the now current window is usable")

	// a refund and a credit whose reply is lost, then another caller's call
	r := l.call(script.LeaseArgs{Now: t0 + 10, Adjust: []script.Adjust{{Idx: w, Refund: 50, Use: 5}}, Nonce: "aaaaab"})
	require.False(t, r.Replayed || r.Unknown)
	require.EqualValues(t, 55, l.count(w))
	l.call(script.LeaseArgs{Now: t0 + 11, Want: 1, Nonce: "bbbbbb"})
	require.EqualValues(t, 56, l.count(w))
	r = l.call(script.LeaseArgs{Now: t0 + 12, Adjust: []script.Adjust{{Idx: w, Refund: 50, Use: 5}}, Want: 10, Nonce: "aaaaab", Resent: true})
	require.True(t, r.Unknown)
	require.Zero(t, r.Grant, "an unknown call grants nothing")
	require.EqualValues(t, 61, l.count(w), "credit counted again (the safe side), the refund not applied twice")
}

// A call the hybrid sent as a plain increment (HINCRBY of a window's
// counter by what it wants, then its record nonce + "!"), resent through
// the script after its reply was lost: the script finds the record, gives
// the increment back, and leases as for a new call; without the record
// (the increment did not run, or another call's record replaced it) it is
// unknown and grants nothing.
func TestLeaseResendPlain(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	lim := ratelimit.Limit{Rate: 1000, Period: time.Second}
	t0 := 1_700_000_450 * sec
	w := t0 / sec
	l := newLeaser(t, c, "resendplain", ratelimit.FixedWindow, lim)
	require.EqualValues(t, 40, l.call(script.LeaseArgs{Now: t0 + 1, Want: 40, Nonce: "bbbbbb"}).Grant)
	plain := func(idx, n int64, nonce string) {
		k := script.WindowKey(l.base, l.kind, idx)
		require.NoError(t, c.HIncrBy(ctx, k, "c", n).Err())
		require.NoError(t, c.HSet(ctx, k, "r", nonce+"!").Err())
	}
	// the current window
	plain(w, 25, "aaaaaa")
	r := l.call(script.LeaseArgs{Now: t0 + 2, Want: 25, Nonce: "aaaaaa", Resent: true})
	require.False(t, r.Replayed || r.Unknown)
	require.EqualValues(t, 25, r.Grant)
	require.EqualValues(t, 65, l.count(w), "the plain increment given back, the grant counted once")
	// the next window, leased ahead
	plain(w+1, 7, "cccccc")
	r = l.call(script.LeaseArgs{Now: t0 + 3, WantNext: 7, Lead: sec, Nonce: "cccccc", Resent: true})
	require.False(t, r.Replayed || r.Unknown)
	require.EqualValues(t, 7, r.GrantNext)
	require.EqualValues(t, 7, l.count(w+1))
	// another caller's record since: unknown, the units stay counted
	plain(w, 10, "dddddd")
	l.call(script.LeaseArgs{Now: t0 + 4, Want: 1, Nonce: "eeeeee"})
	r = l.call(script.LeaseArgs{Now: t0 + 5, Want: 10, Nonce: "dddddd", Resent: true})
	require.True(t, r.Unknown)
	require.Zero(t, r.Grant)
	require.EqualValues(t, 76, l.count(w), "counted once, never given back without the record")
}

// A call that changes nothing (a probe, a lease the window cannot serve)
// writes no record, so it does not make another call's resend unknown.
func TestLeaseNoRecordForNothing(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	lim := ratelimit.Limit{Rate: 100, Period: time.Second}
	t0 := 1_700_000_500 * sec
	l := newLeaser(t, c, "norecord", ratelimit.FixedWindow, lim)
	require.EqualValues(t, 100, l.call(script.LeaseArgs{Now: t0 + 1, Want: 100, Nonce: "aaaaaa"}).Grant)
	l.call(script.LeaseArgs{Now: t0 + 2, Nonce: "bbbbbb"})                    // asks nothing
	denied := l.call(script.LeaseArgs{Now: t0 + 3, Want: 5, Nonce: "cccccc"}) // the window is spent
	require.Zero(t, denied.Grant)
	again := l.call(script.LeaseArgs{Now: t0 + 4, Want: 100, Nonce: "aaaaaa", Resent: true})
	require.True(t, again.Replayed)
	require.EqualValues(t, 100, again.Grant)
	require.EqualValues(t, 100, l.count(t0/sec))
}

// A counter a global limiter wrote as a string becomes a hash with the same
// count and expiry; global limiters count in it as before.
func TestLeaseConvertsStringCounter(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	lim := ratelimit.Limit{Rate: 100, Period: time.Second}
	t0 := 1_700_000_500 * sec
	w := t0 / sec
	l := newLeaser(t, c, "conv", ratelimit.FixedWindow, lim)
	k := script.WindowKey(l.base, l.kind, w)
	require.NoError(t, c.Set(ctx, k, 40, time.Hour).Err())
	l.call(script.LeaseArgs{Now: t0 + 1, Adjust: []script.Adjust{{Idx: w, Refund: 5}}})
	require.Equal(t, "hash", c.Type(ctx, k).Val())
	require.EqualValues(t, 35, l.count(w))
	require.Greater(t, c.PTTL(ctx, k).Val(), 59*time.Minute, "the expiry survives the conversion")
	r := l.call(script.LeaseArgs{Now: t0 + 2, Want: 10, Nonce: "aaaaaa"})
	require.EqualValues(t, 10, r.Grant)
	require.EqualValues(t, 45, l.count(w))
}
