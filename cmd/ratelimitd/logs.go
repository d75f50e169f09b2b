package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/grpclog"
)

// Every log of the process is JSON (log/slog): ratelimitd's own, and
// those go-redis and gRPC print by themselves (net/http's go through the
// servers' ErrorLog). They are routed once per process: both libraries
// keep their logger in a global.
var routeOnce sync.Once

func routeLibraryLogs(log *slog.Logger) {
	routeOnce.Do(func() {
		redis.SetLogger(&redisLog{l: log.With("from", "go-redis")})
		grpclog.SetLoggerV2(grpcLog{log.With("from", "grpc")})
	})
}

// redisLog is go-redis's logger: its messages (a failed dial, a pool
// event) as warnings. A message repeating the last one within
// repeatWindow is counted, not logged: a Redis that is down makes go-redis
// say so at every dial.
type redisLog struct {
	l          *slog.Logger
	mu         sync.Mutex
	last       string
	at         time.Time
	suppressed int
}

const repeatWindow = 10 * time.Second

func (r *redisLog) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	now := time.Now()
	r.mu.Lock()
	if msg == r.last && now.Sub(r.at) < repeatWindow {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	n := r.suppressed
	r.last, r.at, r.suppressed = msg, now, 0
	r.mu.Unlock()
	if n > 0 {
		r.l.WarnContext(ctx, msg, "repeats_not_logged", n)
		return
	}
	r.l.WarnContext(ctx, msg)
}

// grpcLog is gRPC's logger: errors as errors, info and warnings (which
// gRPC's own logger hides by default: a client's dropped connection, say)
// as debug; a fatal error is logged and ends the process, as gRPC's own
// logger does.
type grpcLog struct{ l *slog.Logger }

func (g grpcLog) Info(args ...any)                    { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLog) Infoln(args ...any)                  { g.l.Debug(strings.TrimSpace(fmt.Sprintln(args...))) }
func (g grpcLog) Infof(format string, args ...any)    { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLog) Warning(args ...any)                 { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLog) Warningln(args ...any)               { g.l.Debug(strings.TrimSpace(fmt.Sprintln(args...))) }
func (g grpcLog) Warningf(format string, args ...any) { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLog) Error(args ...any)                   { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLog) Errorln(args ...any)                 { g.l.Error(strings.TrimSpace(fmt.Sprintln(args...))) }
func (g grpcLog) Errorf(format string, args ...any)   { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLog) Fatal(args ...any)                   { g.l.Error(fmt.Sprint(args...)); os.Exit(1) }
func (g grpcLog) Fatalln(args ...any) {
	g.l.Error(strings.TrimSpace(fmt.Sprintln(args...)))
	os.Exit(1)
}
func (g grpcLog) Fatalf(format string, args ...any) {
	g.l.Error(fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether verbosity level l is logged: 0 only, as gRPC's default.
func (g grpcLog) V(l int) bool { return l <= 0 }
