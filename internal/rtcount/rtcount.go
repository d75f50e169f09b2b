// Package rtcount counts what a go-redis client sends: its round trips (a
// command sent alone, a pipeline) and the commands they carry. The tests,
// benchmarks and commands of the project measure the hybrid's cost in
// these units.
package rtcount

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Hook is a go-redis hook that counts. Its zero value is ready to use; it
// is safe for concurrent use, and padded to a cache line of its own.
type Hook struct {
	single, pipelines, commands atomic.Int64
	_                           [40]byte
}

// Single returns the commands sent alone (each a round trip).
func (h *Hook) Single() int64 { return h.single.Load() }

// RoundTrips returns the round trips: commands sent alone and pipelines.
func (h *Hook) RoundTrips() int64 { return h.single.Load() + h.pipelines.Load() }

// Commands returns the commands sent, each command of a pipeline counted.
func (h *Hook) Commands() int64 { return h.commands.Load() }

// DialHook implements redis.Hook.
func (h *Hook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.single.Add(1)
		h.commands.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		h.commands.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// Attach adds h to c. On a Cluster client it sits on every node's client,
// so that a pipeline go-redis splits over n nodes counts n round trips.
func Attach(c redis.UniversalClient, h *Hook) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
		return
	}
	c.AddHook(h)
}
