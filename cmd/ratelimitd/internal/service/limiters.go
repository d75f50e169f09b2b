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
	"github.com/hybridlimit/ratelimit/global"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/local"
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

// entry is one limiter of the pool: of one limit (hyb or glob) or of
// several (hybm or globm).
type entry struct {
	sig    signature
	lim    ratelimit.Limiter
	hyb    *hybrid.Limiter // strict, optimistic
	glob   *global.Limiter // exact
	hybm   *hybrid.Multi   // strict, optimistic, several limits
	globm  *global.Multi   // exact, several limits
	fbm    *countingMulti  // globm's fallback, failure mode local
	envoy  *envoyCounter   // exact, in envoyproxy/ratelimit's keys (Compat.EnvoyKeys)
	pinned bool            // used by request limit overrides: kept until Close (guarded by Service.mu)
	closed atomic.Bool
}

func (s *Service) newEntry(sig signature) (*entry, error) {
	lims := sig.limits()
	limits := make([]ratelimit.Limit, len(lims))
	algs := make([]ratelimit.Algorithm, len(lims))
	for i, l := range lims {
		limits[i], algs[i] = l.limit(), l.alg
	}
	multi := len(lims) > 1
	prefix := sig.prefix(s.opts.Prefix)
	e := &entry{sig: sig}
	if s.envoyEligible(sig) {
		var err error
		if e.envoy, err = s.newEnvoyCounter(sig); err != nil {
			return nil, fmt.Errorf("limiter %v: %w", sig, err)
		}
		return e, nil
	}
	if sig.mode == config.Exact {
		opts := []global.Option{
			global.WithAlgorithms(algs...), global.WithPrefix(prefix),
			global.WithFailureMode(sig.failure), global.WithTimeout(s.opts.Timeout),
		}
		if sig.failure == ratelimit.FailLocal {
			shares := make([]ratelimit.Limit, len(limits))
			for i, l := range limits {
				shares[i] = l
				shares[i].Rate = max(1, l.Rate/max(1, s.opts.Instances))
			}
			var fb ratelimit.Limiter
			var err error
			if multi {
				var lm *local.Multi
				if lm, err = local.NewMulti(shares, local.WithAlgorithms(algs...)); err == nil {
					e.fbm = &countingMulti{Multi: lm}
					fb = e.fbm
				}
			} else {
				fb, err = local.New(shares[0], local.WithAlgorithm(algs[0]))
			}
			if err != nil {
				return nil, fmt.Errorf("limiter %v: local fallback: %w", sig, err)
			}
			opts = append(opts, global.WithFallback(fb))
		}
		var err error
		if multi {
			e.globm, err = global.NewMulti(s.opts.Client, limits, opts...)
			e.lim = e.globm
		} else {
			e.glob, err = global.New(s.opts.Client, limits[0], opts...)
			e.lim = e.glob
		}
		if err != nil {
			return nil, fmt.Errorf("limiter %v: %w", sig, err)
		}
		return e, nil
	}
	mode := hybrid.Strict
	if sig.mode == config.Optimistic {
		mode = hybrid.Optimistic
	}
	opts := []hybrid.Option{
		hybrid.WithMode(mode), hybrid.WithAlgorithms(algs...), hybrid.WithPrefix(prefix),
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
	var err error
	if multi {
		e.hybm, err = hybrid.NewMulti(s.opts.Client, limits, opts...)
		e.lim = e.hybm
	} else {
		e.hyb, err = hybrid.New(s.opts.Client, limits[0], opts...)
		e.lim = e.hyb
	}
	if err != nil {
		return nil, fmt.Errorf("limiter %v: %w", sig, err)
	}
	return e, nil
}

// hybridStats returns the counters of a hybrid entry, summed over the
// limits of a Multi (each limit's decisions, grants and fallbacks count:
// a decision on three limits counts three), its keys as the most any limit
// tracks, and its instances as its first limit learned; ok is false for
// an exact entry.
func (e *entry) hybridStats() (st hybrid.Stats, ok bool) {
	switch {
	case e.hyb != nil:
		return e.hyb.Stats(), true
	case e.hybm != nil:
		for i, x := range e.hybm.Stats() {
			st.Fallback += x.Fallback
			st.LocalDecisions += x.LocalDecisions
			st.Leases += x.Leases
			st.KeysTracked = max(st.KeysTracked, x.KeysTracked)
			st.Degraded = st.Degraded || x.Degraded
			if i == 0 {
				st.Instances = x.Instances
			}
		}
		return st, true
	}
	return st, false
}

// globalState returns the fallback decisions and the breaker state of an
// exact entry. global.Multi reports neither: for a rule of several limits
// the decisions of the local fallback (failure mode local) are counted
// here, the others' are not, and known is false (no breaker state).
func (e *entry) globalState() (fallback uint64, degraded, known bool) {
	if e.envoy != nil {
		return 0, false, false
	}
	if e.globm != nil {
		if e.fbm != nil {
			fallback = e.fbm.n.Load()
		}
		return fallback, false, false
	}
	return e.glob.FallbackDecisions(), e.glob.Degraded(), true
}

// countingMulti is the local fallback of a global.Multi, counting its
// decisions (global.Multi does not count them itself).
type countingMulti struct {
	*local.Multi
	n atomic.Uint64
}

func (c *countingMulti) AllowN(ctx context.Context, key string, n int) (ratelimit.Decision, error) {
	c.n.Add(1)
	return c.Multi.AllowN(ctx, key, n)
}

func (c *countingMulti) AllowNInto(ctx context.Context, key string, n int, states *[]ratelimit.LimitState) (ratelimit.Decision, error) {
	c.n.Add(1)
	return c.Multi.AllowNInto(ctx, key, n, states)
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
	switch {
	case e.hyb != nil:
		err = e.hyb.Close()
	case e.hybm != nil:
		err = e.hybm.Close()
	}
	if st, ok := e.hybridStats(); ok {
		fallback, local, leases = st.Fallback, st.LocalDecisions, st.Leases
	} else {
		fallback, _, _ = e.globalState()
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
	var flush func(context.Context) error
	switch {
	case e.hyb != nil:
		flush = e.hyb.Flush
	case e.hybm != nil:
		flush = e.hybm.Flush
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(2*time.Second, 5*s.opts.Timeout))
	defer cancel()
	if err := flush(ctx); err != nil && !e.closed.Load() {
		s.log.Warn("giving the leases of removed rules back failed (they stay counted until their window ends)",
			"limiter", e.sig.String(), "error", err.Error())
	}
}
