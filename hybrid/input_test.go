package hybrid_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
)

// nilClients are the nil clients a configuration mistake produces: a
// variable of each concrete client type left unset, and a nil interface.
// wrapped is a client type of the caller's own: a typed nil of it must be
// caught as well as go-redis' own types.
type wrapped struct{ *redis.Client }

func nilClients() map[string]redis.UniversalClient {
	var (
		c    *redis.Client
		cc   *redis.ClusterClient
		ring *redis.Ring
		w    *wrapped
	)
	return map[string]redis.UniversalClient{"nil": nil, "*redis.Client": c, "*redis.ClusterClient": cc, "*redis.Ring": ring, "*wrapped": w}
}

// A nil client, typed or not, is a clear error from New wrapping
// ratelimit.ErrInvalidOption: no panic, in New or later on a background
// goroutine (with WithInstances New makes no Redis call, so a nil client
// would first be used by the syncer), and no goroutine left behind.
func TestTypedNilClient(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	limit := ratelimit.PerSecond(10)
	for name, c := range nilClients() {
		for _, opts := range [][]hybrid.Option{nil, {hybrid.WithInstances(3)}, {hybrid.WithInstances(1), hybrid.WithMode(hybrid.Optimistic)}} {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("hybrid.New(%s, %d options) panicked: %v", name, len(opts), p)
					}
				}()
				h, err := hybrid.New(c, limit, opts...)
				if err == nil {
					// What a caller would do next: the first decisions and
					// ticks use the client.
					for i := 0; i < 3; i++ {
						h.Allow(context.Background(), "k")
					}
					h.Close()
				}
				require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "hybrid.New(%s, %d options)", name, len(opts))
				require.ErrorContains(t, err, "nil Redis client")
				require.Nil(t, h)
			}()
		}
		_, err := global.New(c, limit)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "global.New(%s)", name)
		require.ErrorContains(t, err, "nil Redis client")
	}
}
