package script_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// globalLimiter is a global limiter of alg and lim under prefix, at the
// fixed instant now (microseconds).
func globalLimiter(c redis.UniversalClient, prefix string, alg ratelimit.Algorithm, lim ratelimit.Limit, now int64) (*global.Limiter, error) {
	return global.New(c, lim, global.WithPrefix(prefix), global.WithAlgorithm(alg),
		global.WithClock(func() time.Time { return time.UnixMicro(now) }))
}

// runBucket runs one Bucket call of a on base, with alg and lim, as one
// instance unless a says more, wanting at least 1 when it wants anything.
func runBucket(t *testing.T, c redis.UniversalClient, base string, alg ratelimit.Algorithm, lim ratelimit.Limit, a script.BucketArgs) script.BucketReply {
	t.Helper()
	a.Base, a.Algorithm, a.Limit = base, alg, lim
	if a.Instances == 0 {
		a.Instances = 1
	}
	if a.Want > 0 && a.Min == 0 {
		a.Min = 1
	}
	v, err := script.Bucket.Run(context.Background(), c, a.Keys(), a.Args()...).Result()
	require.NoError(t, err)
	r, err := script.ParseBucket(v)
	require.NoError(t, err)
	return r
}

// The bucket lease script takes tokens from the state global's TokenBucket
// and GCRA scripts keep, at most a share of what the bucket holds, gives
// unused ones back (never above the capacity), and charges tokens admitted
// on credit even below empty.
func TestBucketLease(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 40} // 10 tokens a second, 40 at most
			base, err := script.KeyBase("bucket-"+alg.String(), "k")
			require.NoError(t, err)
			t0 := int64(1_700_000_000) * sec
			call := func(a script.BucketArgs) script.BucketReply {
				t.Helper()
				return runBucket(t, c, base, alg, lim, a)
			}
			// a full bucket of 40: the first of 4 instances gets 10
			r := call(script.BucketArgs{Now: t0, Want: 100, Instances: 4, Nonce: "aaaaaa"})
			require.EqualValues(t, 10, r.Grant)
			require.EqualValues(t, 30, r.Level)
			// a global limiter of the same limit sees the same bucket
			g, err := globalLimiter(c, "bucket-"+alg.String(), alg, lim, t0+1)
			require.NoError(t, err)
			d, err := g.AllowN(ctx, "k", 30)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			d, err = g.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, d.Allowed, "the hybrid's 10 were taken from it")
			// give 5 back; then 10 more than it could hold: capped at 40
			r = call(script.BucketArgs{Now: t0 + 2, Refund: 5})
			require.EqualValues(t, 5, r.Level)
			r = call(script.BucketArgs{Now: t0 + 3, Refund: 100})
			require.EqualValues(t, 40, r.Level, "never above the capacity")
			// credit taken even below empty: an overdraft, then nothing until
			// it is paid back (10 tokens a second)
			r = call(script.BucketArgs{Now: t0 + 4, Use: 50})
			require.EqualValues(t, -10, r.Level)
			r = call(script.BucketArgs{Now: t0 + 5, Want: 1})
			require.Zero(t, r.Grant)
			require.InDelta(t, 1.1*float64(sec), float64(r.Retry), float64(sec)/100, "11 tokens at 10 a second")
			r = call(script.BucketArgs{Now: t0 + 5 + 2*sec, Want: 100, Instances: 2})
			require.EqualValues(t, 5, r.Grant, "half of the 10 refilled, the last of the capacity's quarter shared")
		})
	}
}

// A resent TokenBucket call is replayed from the record in the bucket's
// hash; a resent call that cannot be told applied gets nothing.
func TestBucketLeaseResend(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	lim := ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 40}
	base, err := script.KeyBase("bucket-resend", "k")
	require.NoError(t, err)
	t0 := int64(1_700_000_000) * sec
	call := func(a script.BucketArgs) script.BucketReply {
		t.Helper()
		a.Base, a.Algorithm, a.Limit, a.Instances = base, ratelimit.TokenBucket, lim, 1
		v, err := script.Bucket.Run(ctx, c, a.Keys(), a.Args()...).Result()
		require.NoError(t, err)
		r, err := script.ParseBucket(v)
		require.NoError(t, err)
		return r
	}
	r := call(script.BucketArgs{Now: t0, Want: 7, Min: 1, Nonce: "nonceA"})
	require.EqualValues(t, 7, r.Grant)
	again := call(script.BucketArgs{Now: t0 + 1, Want: 7, Min: 1, Nonce: "nonceA", Resent: true})
	require.True(t, again.Replayed)
	require.EqualValues(t, 7, again.Grant)
	require.EqualValues(t, 33, again.Level, "nothing taken twice")
	lost := call(script.BucketArgs{Now: t0 + 2, Want: 7, Min: 1, Nonce: "nonceB", Resent: true})
	require.True(t, lost.Unknown)
	require.Zero(t, lost.Grant)
	require.EqualValues(t, 33, lost.Level)
}

// Tokens a holder keeps are still the bucket's: the bucket refills only to
// the capacity less what the records hold, a refund counts only as far as
// the holder's record covers it, and a record past its deadline goes, its
// tokens spent: the bucket refills from where it stood then, not as if
// they had never been taken. On Redis, and on miniredis (the embedded
// default of the demos).
func TestBucketHeld(t *testing.T) {
	srv := redistest.Standalone(t)
	rc := srv.Client()
	defer rc.Close()
	mc := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer mc.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		c    *redis.Client
		alg  ratelimit.Algorithm
	}{{"redis", rc, ratelimit.TokenBucket}, {"redis", rc, ratelimit.GCRA}, {"miniredis", mc, ratelimit.TokenBucket}, {"miniredis", mc, ratelimit.GCRA}} {
		c, alg := tc.c, tc.alg
		t.Run(tc.name+"/"+alg.String(), func(t *testing.T) {
			lim := ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 40} // 10 tokens a second, 40 at most
			base, err := script.KeyBase("held-"+alg.String(), "k")
			require.NoError(t, err)
			t0 := int64(1_700_000_000) * sec
			call := func(a script.BucketArgs) script.BucketReply {
				t.Helper()
				if a.Holder != "" && a.HoldUS == 0 {
					a.HoldUS = 2 * sec
				}
				return runBucket(t, c, base, alg, lim, a)
			}
			held := base + script.Kind(alg, lim) // the records: in a TokenBucket's own hash
			if alg == ratelimit.GCRA {
				held += ":held" // (beside the string global's GCRA keeps)
			}
			noRecords := func() bool {
				f, err := c.HMGet(ctx, held, "hA", "eA", "hB", "eB", "s", "d", "x").Result()
				require.NoError(t, err)
				for _, v := range f {
					if v != nil {
						return false
					}
				}
				return true
			}
			// A takes 10 of the full 40 and holds them until t0+2s
			r := call(script.BucketArgs{Now: t0, Want: 100, Min: 1, Instances: 4, Holder: "A"})
			require.EqualValues(t, 10, r.Grant)
			require.EqualValues(t, 30, r.Level)
			require.Zero(t, r.Kept)
			require.Equal(t, []any{"10", strconv.FormatInt(t0+2*sec, 10)}, c.HMGet(ctx, held, "hA", "eA").Val())
			require.Greater(t, c.PTTL(ctx, held).Val(), 2*time.Second, "the records' hash lives past their deadlines")
			// a second on, A keeps its 10 till t0+3s: the bucket refills to
			// 30, not 40, so that it and A's tokens are at most 40
			r = call(script.BucketArgs{Now: t0 + sec, Holder: "A", Keep: 10, HoldUS: 2 * sec})
			require.EqualValues(t, 10, r.Kept)
			require.EqualValues(t, 30, r.Level)
			r = call(script.BucketArgs{Now: t0 + 1*sec + 1, Want: 100, Min: 1, Holder: "B"})
			require.EqualValues(t, 30, r.Grant, "the bucket less A's 10")
			require.EqualValues(t, 0, r.Level)
			// A spent 4, keeps 2 and gives 4 back; a refund beyond its record
			// is dropped
			r = call(script.BucketArgs{Now: t0 + 1*sec + 2, Holder: "A", Keep: 2, Refund: 100})
			require.EqualValues(t, 2, r.Kept)
			require.EqualValues(t, 8, r.Level, "its record covers 10: 2 kept, 8 back")
			// without a holder, a call leaves the records as they are
			r = call(script.BucketArgs{Now: t0 + 1*sec + 3, Want: 1, Min: 1})
			require.EqualValues(t, 1, r.Grant)
			require.EqualValues(t, -1, r.Kept)
			require.Equal(t, []any{"2", strconv.FormatInt(t0+3*sec+2, 10)}, c.HMGet(ctx, held, "hA", "eA").Val())
			// B's 30 (till t0+3s+1) and A's 2 pin the bucket at 8; past both
			// deadlines it refills from 8 at 10 a second: 18 at t0+4s+2, not
			// 40
			r = call(script.BucketArgs{Now: t0 + 3*sec})
			require.EqualValues(t, 8, r.Level, "pinned at 40 - 30 - 2")
			r = call(script.BucketArgs{Now: t0 + 4*sec + 2})
			require.EqualValues(t, 18, r.Level, "refilled from 8 once the records went")
			require.True(t, noRecords(), "the records past their deadlines are gone")
			// A's record is gone: what it says it keeps is not covered, and
			// its refund counts for nothing
			r = call(script.BucketArgs{Now: t0 + 4*sec + 3, Holder: "A", Keep: 2, Refund: 3})
			require.Zero(t, r.Kept)
			require.EqualValues(t, 18, r.Level)
			// a resent call writes no record
			r = call(script.BucketArgs{Now: t0 + 4*sec + 4, Holder: "A", Keep: 0, Want: 5, Min: 1, Resent: true})
			require.EqualValues(t, -1, r.Kept)
			require.True(t, noRecords())
		})
	}
}

// The records live as long as their deadlines say, and the bucket as long
// as it takes to fill, though a call that moves no record's deadline past
// the latest one sets no expiry: the key's time to live, set once a hold,
// covers them.
func TestBucketHeldKeyLives(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			lim := ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 40}
			base, err := script.KeyBase("lives-"+alg.String(), "k")
			require.NoError(t, err)
			state := base + script.Kind(alg, lim)
			held := state
			if alg == ratelimit.GCRA {
				held += ":held"
			}
			t0 := int64(1_700_000_000) * sec
			call := func(a script.BucketArgs) script.BucketReply {
				t.Helper()
				return runBucket(t, c, base, alg, lim, a)
			}
			// A holds 10 until t0+5s: the records' hash lives past t0+5s
			call(script.BucketArgs{Now: t0, Want: 10, Min: 1, Holder: "A", HoldUS: 5 * sec})
			require.Greater(t, c.PTTL(ctx, held).Val(), 5*time.Second)
			// A's calls for the next 4 seconds move its deadline on, to at
			// most t0+9s: the hash still lives past it
			for i := int64(1); i <= 4; i++ {
				r := call(script.BucketArgs{Now: t0 + i*sec, Want: 1, Min: 1, Holder: "A", Keep: 10, HoldUS: 5 * sec})
				require.EqualValues(t, 10, r.Kept)
			}
			require.Greater(t, c.PTTL(ctx, held).Val(), 9*time.Second-4*time.Second,
				"lives past t0+9s, seen from t0+4s")
			// 300 admitted on credit: the bucket takes 30s and more to fill,
			// and lives as long
			call(script.BucketArgs{Now: t0 + 4*sec + 1, Use: 300})
			require.Greater(t, c.PTTL(ctx, state).Val(), 30*time.Second)
			// and a holder's call after that does not cut it short
			call(script.BucketArgs{Now: t0 + 4*sec + 2, Holder: "A", Keep: 10, HoldUS: 5 * sec})
			require.Greater(t, c.PTTL(ctx, state).Val(), 30*time.Second)
			require.Greater(t, c.PTTL(ctx, held).Val(), 5*time.Second)
		})
	}
}

// TestBucketHead: a call's ARGV[1..5] (bucket.lua's algorithm, the
// state's kind and the bucket's three numbers), worked out by hand, are
// the same whether Args boxes them or takes BucketHead's, and the rest
// follows them unchanged.
func TestBucketHead(t *testing.T) {
	const minute = 60_000_000 // µs
	cases := []struct {
		alg  ratelimit.Algorithm
		lim  ratelimit.Limit
		head []any
	}{
		{ratelimit.TokenBucket, ratelimit.Limit{Rate: 2, Period: time.Second}, []any{"tb", "tb:2:1000000:2", int64(2), int64(1_000_000), int64(2_000_000)}},
		{ratelimit.TokenBucket, ratelimit.Limit{Rate: 2000, Period: time.Minute, Burst: 5000}, []any{"tb", "tb:2000:60000000:5000", int64(2000), int64(minute), int64(5000 * minute)}},
		{ratelimit.GCRA, ratelimit.Limit{Rate: 2, Period: time.Second}, []any{"gcra", "gcra:2:1000000:2", int64(500_000), int64(1_000_000), int64(0)}},
		{ratelimit.GCRA, ratelimit.Limit{Rate: 2000, Period: time.Minute, Burst: 5000}, []any{"gcra", "gcra:2000:60000000:5000", int64(30_000), int64(5000 * 30_000), int64(0)}},
	}
	for _, c := range cases {
		for _, a := range []script.BucketArgs{
			{Base: "p:{k}:", Now: 1_700_000_000_123_456, Instances: 1, Want: 1, Min: 1},
			{Base: "p:{k}:", Now: -1, Nonce: "abc", Resent: true, Instances: 4, Want: 9, Min: 1, Refund: 3, Use: 2, Holder: "h1", Keep: 5, HoldUS: 2_000_000, Back: 1},
		} {
			a.Algorithm, a.Limit = c.alg, c.lim
			boxed := a.Args()
			require.Equal(t, c.head, boxed[:5], "%v %v", c.alg, c.lim)
			a.Head = script.BucketHead(c.alg, c.lim)
			require.Equal(t, boxed, a.Args(), "%v %v", c.alg, c.lim)
		}
	}
}

// TestBucketArgsAllocs: with its head boxed once (BucketHead), a cold
// call's ARGV costs two allocations, the slice and the time; working the
// head out per call costs eight or nine more (the kind's string and the
// boxed numbers): 11 for a TokenBucket, 10 for a GCRA.
func TestBucketArgsAllocs(t *testing.T) {
	lim := ratelimit.Limit{Rate: 2000, Period: time.Second}
	for _, alg := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		a := script.BucketArgs{Base: "p:{k}:", Algorithm: alg, Limit: lim, Now: 1_700_000_000_123_456, Instances: 1, Want: 1, Min: 1, Head: script.BucketHead(alg, lim)}
		require.LessOrEqual(t, testing.AllocsPerRun(100, func() { _ = a.Args() }), 2.0, alg)
		a.Head = nil
		require.Greater(t, testing.AllocsPerRun(100, func() { _ = a.Args() }), 2.0, "%v: the head worked out per call", alg)
	}
}
