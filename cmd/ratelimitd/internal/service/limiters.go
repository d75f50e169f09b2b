package service

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// signature is what makes two rules need distinct limiters: the mode, the
// failure mode, and each limit with its algorithm (one, or the limits of a
// rate_limits list in order).
type signature struct {
	mode    config.Mode
	failure ratelimit.FailureMode
	n       int
	lims    [ratelimit.MaxLimits]limitSig
}

type limitSig struct {
	alg    ratelimit.Algorithm
	rate   int
	period time.Duration
}

func (l limitSig) limit() ratelimit.Limit { return ratelimit.Limit{Rate: l.rate, Period: l.period} }

func signatureOf(r *config.Rule) signature {
	sig := signature{mode: r.Mode, failure: r.FailureMode}
	if r.Limits == nil {
		l := r.Limit()
		sig.n, sig.lims[0] = 1, limitSig{alg: r.Algorithm, rate: l.Rate, period: l.Period}
		return sig
	}
	for i, rl := range r.Limits {
		l := rl.Limit()
		sig.lims[i] = limitSig{alg: rl.Algorithm, rate: l.Rate, period: l.Period}
	}
	sig.n = len(r.Limits)
	return sig
}

func (s signature) limits() []limitSig { return s.lims[:s.n] }

// String names the limiter in logs and metrics, e.g.
// "strict fixed_window 100/60s local", or for several limits
// "strict token_bucket 20/1s + fixed_window 600/60s local".
func (s signature) String() string {
	var b strings.Builder
	b.WriteString(s.mode.String())
	for i, l := range s.limits() {
		if i > 0 {
			b.WriteString(" +")
		}
		b.WriteString(" " + config.AlgorithmName(l.alg) + " " + strconv.Itoa(l.rate) + "/" +
			strconv.FormatInt(int64(l.period/time.Second), 10) + "s")
	}
	b.WriteString(" " + s.failure.String())
	return b.String()
}

// prefix is the Redis key prefix of the limiter of s under base. Strict and
// exact share one, so that a rule moved between them keeps its counts. The
// limits of a rule of several are joined by '+' (each is counted in keys
// of its own under the prefix, named by its algorithm and limit).
func (s signature) prefix(base string) string {
	m := "s"
	if s.mode == config.Optimistic {
		m = "o"
	}
	var b strings.Builder
	b.WriteString(base + ":")
	for i, l := range s.limits() {
		if i > 0 {
			b.WriteByte('+')
		}
		b.WriteString(config.AlgorithmName(l.alg) + ":" + strconv.Itoa(l.rate) + ":" +
			strconv.FormatInt(int64(l.period/time.Millisecond), 10) + "ms")
	}
	b.WriteString(":" + m + "-" + s.failure.String())
	return b.String()
}

// spec is the Spec of the limiter of s, counting under base's prefix.
func (s signature) spec(base string) Spec {
	lims := s.limits()
	sp := Spec{Mode: s.mode, FailureMode: s.failure, Prefix: s.prefix(base), Name: s.String(),
		Limits: make([]ratelimit.Limit, len(lims)), Algorithms: make([]ratelimit.Algorithm, len(lims))}
	for i, l := range lims {
		sp.Limits[i], sp.Algorithms[i] = l.limit(), l.alg
	}
	return sp
}

// entry is one limiter of the pool.
type entry struct {
	sig    signature
	lim    Limiter
	layout KeyLayout // how the Service makes the keys it gives lim
	pinned bool      // used by request limit overrides: kept until Close (guarded by Service.mu)
	closed atomic.Bool
}

func (s *Service) newEntry(sig signature) (*entry, error) {
	spec := sig.spec(s.opts.Prefix)
	if s.envoyEligible(sig) {
		spec.Layout = LayoutEnvoy
	}
	lim, err := s.backend.NewLimiter(spec)
	if err != nil {
		return nil, fmt.Errorf("limiter %v: %w", sig, err)
	}
	return &entry{sig: sig, lim: lim, layout: spec.Layout}, nil
}

// envoyEligible reports whether the limiter of sig counts in
// envoyproxy/ratelimit's keys (LayoutEnvoy) under Compat.EnvoyKeys: an
// exact fixed window of one limit, as envoyproxy/ratelimit counts every
// limit.
func (s *Service) envoyEligible(sig signature) bool {
	return s.opts.Compat.EnvoyKeys && sig.mode == config.Exact && sig.n == 1 && sig.lims[0].alg == ratelimit.FixedWindow
}

// closeEntry gives the limiter's leases back and stops its goroutines. It
// folds the limiter's counters into the service's retired totals.
func (s *Service) closeEntry(e *entry) error {
	if e.closed.Swap(true) {
		return nil
	}
	err := e.lim.Close()
	st := e.lim.Stats()
	s.mu.Lock()
	s.retired.fallback += st.Fallback
	s.retired.local += st.LocalDecisions
	s.retired.leases += st.Leases
	delete(s.closing, e)
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("closing a limiter could not give every lease back (they stay counted until their window ends)",
			"limiter", e.sig.String(), "error", err.Error())
	}
	return err
}

// flushEntry gives back every lease of e; the next decisions lease again.
func (s *Service) flushEntry(e *entry) {
	ctx, cancel := context.WithTimeout(context.Background(), max(2*time.Second, 5*s.opts.Timeout))
	defer cancel()
	if err := e.lim.Flush(ctx); err != nil && !e.closed.Load() {
		s.log.Warn("giving the leases of removed rules back failed (they stay counted until their window ends)",
			"limiter", e.sig.String(), "error", err.Error())
	}
}
