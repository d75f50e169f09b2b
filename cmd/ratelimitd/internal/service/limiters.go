package service

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/local"
)

// signature is what makes two rules need distinct limiters.
type signature struct {
	mode    config.Mode
	alg     ratelimit.Algorithm
	rate    int
	period  time.Duration
	failure ratelimit.FailureMode
}

func signatureOf(r *config.Rule) signature {
	l := r.Limit()
	return signature{mode: r.Mode, alg: r.Algorithm, rate: l.Rate, period: l.Period, failure: r.FailureMode}
}

// String names the limiter in logs and metrics, e.g.
// "strict fixed_window 100/60s local".
func (s signature) String() string {
	return s.mode.String() + " " + config.AlgorithmName(s.alg) + " " + strconv.Itoa(s.rate) + "/" +
		strconv.FormatInt(int64(s.period/time.Second), 10) + "s " + s.failure.String()
}

// prefix is the Redis key prefix of the limiter of s under base. Strict and
// exact share one, so that a rule moved between them keeps its counts.
func (s signature) prefix(base string) string {
	m := "s"
	if s.mode == config.Optimistic {
		m = "o"
	}
	return base + ":" + config.AlgorithmName(s.alg) + ":" + strconv.Itoa(s.rate) + ":" +
		strconv.FormatInt(int64(s.period/time.Millisecond), 10) + "ms:" + m + "-" + s.failure.String()
}

// entry is one limiter of the pool.
type entry struct {
	sig    signature
	lim    ratelimit.Limiter
	hyb    *hybrid.Limiter // strict, optimistic
	glob   *global.Limiter // exact
	pinned bool            // used by request limit overrides: kept until Close (guarded by Service.mu)
	closed atomic.Bool
}

func (s *Service) newEntry(sig signature) (*entry, error) {
	limit := ratelimit.Limit{Rate: sig.rate, Period: sig.period}
	prefix := sig.prefix(s.opts.Prefix)
	e := &entry{sig: sig}
	if sig.mode == config.Exact {
		opts := []global.Option{
			global.WithAlgorithm(sig.alg), global.WithPrefix(prefix),
			global.WithFailureMode(sig.failure), global.WithTimeout(s.opts.Timeout),
		}
		if sig.failure == ratelimit.FailLocal {
			share := limit
			share.Rate = max(1, limit.Rate/max(1, s.opts.Instances))
			fb, err := local.New(share, local.WithAlgorithm(sig.alg))
			if err != nil {
				return nil, fmt.Errorf("limiter %v: local fallback: %w", sig, err)
			}
			opts = append(opts, global.WithFallback(fb))
		}
		g, err := global.New(s.opts.Client, limit, opts...)
		if err != nil {
			return nil, fmt.Errorf("limiter %v: %w", sig, err)
		}
		e.glob, e.lim = g, g
		return e, nil
	}
	mode := hybrid.Strict
	if sig.mode == config.Optimistic {
		mode = hybrid.Optimistic
	}
	opts := []hybrid.Option{
		hybrid.WithMode(mode), hybrid.WithAlgorithm(sig.alg), hybrid.WithPrefix(prefix),
		hybrid.WithTimeout(s.opts.Timeout), hybrid.WithFailureMode(sig.failure),
		hybrid.WithObserver(func(ev hybrid.Event) { s.observe(sig, ev) }),
	}
	if s.opts.SyncInterval > 0 {
		opts = append(opts, hybrid.WithSyncInterval(s.opts.SyncInterval))
	}
	if s.opts.MaxKeys > 0 {
		opts = append(opts, hybrid.WithMaxKeys(s.opts.MaxKeys))
	}
	if s.opts.Instances > 0 {
		opts = append(opts, hybrid.WithInstances(s.opts.Instances))
	}
	h, err := hybrid.New(s.opts.Client, limit, opts...)
	if err != nil {
		return nil, fmt.Errorf("limiter %v: %w", sig, err)
	}
	e.hyb, e.lim = h, h
	return e, nil
}

func (s *Service) observe(sig signature, ev hybrid.Event) {
	switch ev.Kind {
	case hybrid.EventDegraded:
		s.log.Warn("redis unreachable: deciding by the failure mode", "limiter", sig.String(), "failure_mode", sig.failure.String())
	case hybrid.EventRecovered:
		s.log.Info("redis reachable again", "limiter", sig.String())
	case hybrid.EventFlushError:
		s.log.Warn("background sync failed; it will be retried", "limiter", sig.String(), "error", errString(ev.Err))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// close gives the limiter's leases back and stops its goroutines. It folds
// the limiter's counters into the service's retired totals first.
func (s *Service) closeEntry(e *entry) error {
	if e.closed.Swap(true) {
		return nil
	}
	var (
		err                     error
		fallback, local, leases uint64
	)
	if e.hyb != nil {
		err = e.hyb.Close()
		st := e.hyb.Stats()
		fallback, local, leases = st.Fallback, st.LocalDecisions, st.Leases
	} else {
		fallback = e.glob.FallbackDecisions()
	}
	s.mu.Lock()
	s.retired.fallback += fallback
	s.retired.local += local
	s.retired.leases += leases
	delete(s.closing, e)
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("closing a limiter could not give every lease back (they stay counted until their window ends)",
			"limiter", e.sig.String(), "error", err.Error())
	}
	return err
}

// flush gives back every lease of e; the next decisions lease again.
func (s *Service) flushEntry(e *entry) {
	if e.hyb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(2*time.Second, 5*s.opts.Timeout))
	defer cancel()
	if err := e.hyb.Flush(ctx); err != nil && !e.closed.Load() {
		s.log.Warn("giving the leases of removed rules back failed (they stay counted until their window ends)",
			"limiter", e.sig.String(), "error", err.Error())
	}
}

// countHook counts the round trips of a Redis client: each command and each
// pipeline is one.
type countHook struct{ n *atomic.Uint64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
