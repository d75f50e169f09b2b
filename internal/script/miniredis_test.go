package script_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/script"
)

// The scripts the hybrid limiter runs must work on miniredis, the embedded
// Redis the simulator, the surge demo and the examples run on by default:
// TIME, HGET on a string (a WRONGTYPE error caught by pcall), HSET with
// several fields, GET/DEL/PTTL of a string counter being converted,
// PEXPIRE, and the sorted-set commands of the heartbeat.
func TestScriptsOnMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()
	lim := ratelimit.Limit{Rate: 100, Period: time.Hour}
	l := newLeaser(t, c, "mini", ratelimit.FixedWindow, lim)

	r := l.call(script.LeaseArgs{Want: 60, Instances: 2, Nonce: "aaaaaa"})
	require.EqualValues(t, 50, r.Grant, "capped at remainder / instances")
	require.EqualValues(t, 50, r.Count)
	require.InDelta(t, time.Now().UnixMicro(), r.Now, float64(time.Minute.Microseconds()), "server time from TIME")
	require.Equal(t, r.Now/lim.Period.Microseconds(), r.Idx)
	require.Equal(t, (r.Idx+1)*lim.Period.Microseconds()-r.Now, r.Reset)
	key := script.WindowKey(l.base, l.kind, r.Idx)
	require.Positive(t, mr.TTL(key))

	again := l.call(script.LeaseArgs{Want: 60, Instances: 2, Nonce: "aaaaaa", Resent: true})
	require.True(t, again.Replayed)
	require.Equal(t, r.Grant, again.Grant)
	require.EqualValues(t, 50, l.count(r.Idx))

	// a counter a global limiter wrote as a string is converted
	other := newLeaser(t, c, "mini-str", ratelimit.FixedWindow, lim)
	skey := script.WindowKey(other.base, other.kind, r.Idx)
	require.NoError(t, c.Set(ctx, skey, 30, time.Hour).Err())
	r2 := other.call(script.LeaseArgs{Want: 10, Adjust: []script.Adjust{{Idx: r.Idx, Use: 5}}, Nonce: "bbbbbb"})
	require.EqualValues(t, 10, r2.Grant)
	require.EqualValues(t, 45, other.count(r.Idx))
	require.Equal(t, "hash", c.Type(ctx, skey).Val())

	beat := func(id, join string) int64 {
		t.Helper()
		n, err := script.Instances.Run(ctx, c, []string{script.InstancesKey("t")}, id, 3000, join).Int64()
		require.NoError(t, err)
		return n
	}
	require.EqualValues(t, 1, beat("a", "1"))
	require.EqualValues(t, 2, beat("b", "1"))
	require.EqualValues(t, 2, beat("a", "1"))
	require.EqualValues(t, 1, beat("a", "0"))
}
