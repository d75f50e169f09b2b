package global_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

func TestLeaseScript(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	lim := ratelimit.Limit{Rate: 100, Period: time.Second}
	const P = int64(1_000_000)
	t0 := int64(1_700_000_000) * P // a window start
	call := func(a global.LeaseArgs) global.Lease {
		t.Helper()
		a.Limit, a.Algorithm = lim, ratelimit.FixedWindow
		if a.Base == "" {
			a.Base, _ = global.KeyBase("leasetest", "k")
		}
		if a.Instances == 0 {
			a.Instances = 1
		}
		v, err := global.LeaseScript.Run(ctx, c, a.Keys(), a.Args()...).Result()
		require.NoError(t, err)
		l, err := global.ParseLease(v)
		require.NoError(t, err)
		return l
	}
	base, _ := global.KeyBase("leasetest", "k")
	wk := global.WindowKey(base, ratelimit.FixedWindow, t0/P)

	// capped at remainder / instances: 100/2 = 50
	l := call(global.LeaseArgs{Now: t0 + 10, Want: 80, Min: 1, Instances: 2})
	require.Equal(t, global.Lease{Grant: 50, Idx: t0 / P, Count: 50, Now: t0 + 10, Reset: P - 10}, l)
	// refund 20 of it, lease 10: 50 - 20 + 10 = 40
	l = call(global.LeaseArgs{Now: t0 + 20, RefundIdx: t0 / P, Refund: 20, Want: 10, Min: 1})
	require.EqualValues(t, 10, l.Grant)
	require.EqualValues(t, 40, l.Count)
	require.Equal(t, "40", c.Get(ctx, wk).Val())
	// credit usage lands even over the limit; leases then stop
	l = call(global.LeaseArgs{Now: t0 + 30, UseIdx: t0 / P, Use: 70})
	require.EqualValues(t, 110, l.Count)
	l = call(global.LeaseArgs{Now: t0 + 40, Want: 5, Min: 1})
	require.EqualValues(t, 0, l.Grant)
	require.EqualValues(t, P-40, l.Retry)
	// a refund never drives the counter below zero nor recreates a gone key
	call(global.LeaseArgs{Now: t0 + 50, RefundIdx: t0 / P, Refund: 1000})
	require.Equal(t, "0", c.Get(ctx, wk).Val())
	require.NoError(t, c.Del(ctx, wk).Err())
	call(global.LeaseArgs{Now: t0 + 60, RefundIdx: t0 / P, Refund: 5})
	require.EqualValues(t, 0, c.Exists(ctx, wk).Val())

	// replay protection: the same seq is applied once and its reply replayed
	b2, _ := global.KeyBase("leasetest", "idem")
	first := call(global.LeaseArgs{Base: b2, Now: t0 + 70, Want: 10, Min: 1, Instance: "i1", Seq: 1})
	again := call(global.LeaseArgs{Base: b2, Now: t0 + 80, Want: 10, Min: 1, Instance: "i1", Seq: 1})
	require.True(t, again.Replayed)
	require.Equal(t, first.Grant, again.Grant)
	require.Equal(t, "10", c.Get(ctx, global.WindowKey(b2, ratelimit.FixedWindow, t0/P)).Val())
	next := call(global.LeaseArgs{Base: b2, Now: t0 + 90, Want: 10, Min: 1, Instance: "i1", Seq: 2})
	require.False(t, next.Replayed)
	require.Equal(t, "20", c.Get(ctx, global.WindowKey(b2, ratelimit.FixedWindow, t0/P)).Val())
	// an older call sent again after a newer one is superseded, never applied
	old := call(global.LeaseArgs{Base: b2, Now: t0 + 95, Want: 10, Min: 1, Instance: "i1", Seq: 1})
	require.True(t, old.Superseded)
	require.False(t, old.Replayed)
	require.Equal(t, "20", c.Get(ctx, global.WindowKey(b2, ratelimit.FixedWindow, t0/P)).Val())
	// other instances have their own sequence
	other := call(global.LeaseArgs{Base: b2, Now: t0 + 99, Want: 10, Min: 1, Instance: "i2", Seq: 1})
	require.False(t, other.Replayed || other.Superseded)
	require.Equal(t, "30", c.Get(ctx, global.WindowKey(b2, ratelimit.FixedWindow, t0/P)).Val())

	bad, err := redistest.KeysWithoutTTL(ctx, c)
	require.NoError(t, err)
	require.Empty(t, bad)
}
