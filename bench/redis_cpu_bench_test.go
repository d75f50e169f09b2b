package bench

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// BenchmarkRedisCPU: what one exact decision costs Redis, as the server
// measures it (INFO cpu, system and user, per decision: redis-µs/op; INFO
// commandstats: commands/op), over 10,000 keys of a fixed window, 8
// goroutines: global's FixedWindow beside the peer's cost model, the
// envoyproxy/ratelimit service's pipelined INCRBY and EXPIRE per
// descriptor (which counts denied requests too, unlike ours).
//
//	cd bench && go test -run '^$' -bench RedisCPU -benchtime 50000x -cpu 8
func BenchmarkRedisCPU(b *testing.B) {
	srv := redistest.Standalone(b)
	ctx := context.Background()
	c := srv.Client()
	defer c.Close()
	limit := ratelimit.Limit{Rate: 1_000_000_000, Period: time.Second}
	b.Run("global-FixedWindow", func(b *testing.B) {
		g, err := global.New(c, limit, global.WithAlgorithm(ratelimit.FixedWindow), global.WithPrefix("cpu"+strconv.FormatInt(time.Now().UnixNano(), 10)))
		if err != nil {
			b.Fatal(err)
		}
		redisCPU(b, c, func(i int) {
			if _, err := g.Allow(ctx, keys10k[i%len(keys10k)]); err != nil {
				b.Error(err)
			}
		})
	})
	b.Run("peer-INCRBY-EXPIRE", func(b *testing.B) {
		redisCPU(b, c, func(i int) {
			k := "peer_" + keys10k[i%len(keys10k)] + "_" + strconv.FormatInt(time.Now().Unix(), 10)
			pl := c.Pipeline()
			incr := pl.IncrBy(ctx, k, 1)
			pl.Expire(ctx, k, time.Second)
			if _, err := pl.Exec(ctx); err != nil || incr.Val() <= 0 {
				b.Error(err)
			}
		})
	})
}

// redisCPU runs decide b.N times over GOMAXPROCS goroutines and reports the Redis server's CPU and commands per decision.
func redisCPU(b *testing.B, c *redis.Client, decide func(i int)) {
	b.Helper()
	ctx := context.Background()
	decide(0) // scripts loaded, connections open
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := serverCPU(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			decide(int(seq.Add(1)))
		}
	})
	b.StopTimer()
	cpu := serverCPU(b, c) - cpu0
	b.ReportMetric(cpu*1e6/float64(b.N), "redis-µs/op")
	b.ReportMetric(float64(commands(b, c))/float64(b.N), "commands/op")
}

func serverCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return total
}

// commands returns the commands Redis ran since CONFIG RESETSTAT, but for
// those the measurement sends (INFO, CONFIG).
func commands(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || strings.HasPrefix(name, "cmdstat_info") || strings.HasPrefix(name, "cmdstat_config") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, _ := strconv.ParseInt(calls, 10, 64)
		total += n
	}
	return total
}
