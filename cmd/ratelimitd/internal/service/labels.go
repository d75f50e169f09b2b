package service

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Rule labels that requests make: a limit override is labelled by its
// descriptor's keys, and a detailed_metric or value_to_metric rule by the
// request's values. Any client could make as many as it likes, each a set
// of series held forever, so they are bounded: at most MaxRuleLabels at a
// time; beyond, decisions are counted under rule="_other" and in
// ratelimit_rule_labels_folded_total; a label unused for labelIdle is
// dropped (its series deleted, their memory freed), making room; a reload
// drops the labels of rules gone. The configuration's own labels (each
// rule's path) are bounded by the configuration and never dropped but
// with their rule. A label made by requests is at most MaxLabelBytes long.

// Defaults of the rule labels.
const (
	DefaultMaxRuleLabels = 1000
	// MaxLabelBytes bounds the bytes of a rule label requests make (see
	// boundLabel), so that MaxRuleLabels of them hold little memory and a
	// scrape stays small whatever the requests' values.
	MaxLabelBytes = 256
	// OtherLabel is the rule label of decisions folded once MaxRuleLabels
	// labels made by requests exist.
	OtherLabel = "_other"
	labelIdle  = 10 * time.Minute
)

type labelKey struct{ domain, rule string }

// labelSeries is the series of one rule label made by requests; those of
// its results are made on their first decision.
type labelSeries struct {
	key   labelKey
	ctr   [nResults]atomic.Pointer[prometheus.Counter]
	hits  prometheus.Counter
	ident string       // the rule's Ident; "" for a limit override
	used  atomic.Int64 // Unix seconds of the last use
}

// add counts one decision of result res, of hits hits.
func (s *labelSeries) add(l *labels, res int, hits uint64) {
	c := s.ctr[res].Load()
	if c == nil {
		cc := l.decisions.WithLabelValues(s.key.domain, s.key.rule, resultNames[res])
		c = &cc
		s.ctr[res].Store(c)
	}
	(*c).Inc()
	s.hits.Add(float64(hits))
}

// labels are the rule labels made by requests. A hit takes no lock.
type labels struct {
	max       int
	decisions *prometheus.CounterVec
	hits      *prometheus.CounterVec
	folded    *prometheus.CounterVec // domain

	m         sync.Map // labelKey -> *labelSeries
	mu        sync.Mutex
	n         int // labels in m (guarded by mu)
	lastSweep int64
	other     sync.Map // domain -> *labelSeries of OtherLabel
}

func (l *labels) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// series returns the series of rule label rule in domain, made on first
// use, or domain's OtherLabel series (counted as folded) when max labels
// exist and none was unused for labelIdle.
func (l *labels) series(domain, rule, ident string, now time.Time) *labelSeries {
	k := labelKey{domain, rule}
	sec := now.Unix()
	if v, ok := l.m.Load(k); ok {
		s := v.(*labelSeries)
		if s.used.Load() != sec {
			s.used.Store(sec)
		}
		return s
	}
	l.mu.Lock()
	if v, ok := l.m.Load(k); ok {
		l.mu.Unlock()
		return v.(*labelSeries)
	}
	if l.n >= l.max && sec-l.lastSweep >= int64(labelIdle/time.Second)/10 {
		l.lastSweep = sec
		l.sweepLocked(func(s *labelSeries) bool { return sec-s.used.Load() >= int64(labelIdle/time.Second) })
	}
	if l.n >= l.max {
		l.mu.Unlock()
		l.folded.WithLabelValues(domain).Inc()
		if v, ok := l.other.Load(domain); ok {
			return v.(*labelSeries)
		}
		v, _ := l.other.LoadOrStore(domain, l.newSeries(domain, OtherLabel, ""))
		return v.(*labelSeries)
	}
	s := l.newSeries(domain, rule, ident)
	s.used.Store(sec)
	l.m.Store(k, s)
	l.n++
	l.mu.Unlock()
	return s
}

func (l *labels) newSeries(domain, rule, ident string) *labelSeries {
	return &labelSeries{key: labelKey{domain, rule}, ident: ident, hits: l.hits.WithLabelValues(domain, rule)}
}

// reloaded drops the labels of rules gone (keep false for their Ident),
// and stops tracking those that are now a rule's own (static true), whose
// series the rule keeps counting in.
func (l *labels) reloaded(keep func(ident string) bool, static func(k labelKey) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m.Range(func(key, _ any) bool {
		if static(key.(labelKey)) {
			l.m.Delete(key)
			l.n--
		}
		return true
	})
	l.sweepLocked(func(s *labelSeries) bool { return s.ident != "" && !keep(s.ident) })
}

// sweepLocked deletes the labels drop selects, and their series. Caller
// holds l.mu.
func (l *labels) sweepLocked(drop func(*labelSeries) bool) {
	l.m.Range(func(key, v any) bool {
		if s := v.(*labelSeries); drop(s) {
			k := key.(labelKey)
			l.m.Delete(k)
			l.n--
			for _, res := range resultNames {
				l.decisions.DeleteLabelValues(k.domain, k.rule, res)
			}
			l.hits.DeleteLabelValues(k.domain, k.rule)
		}
		return true
	})
}

// boundLabel returns a rule label made by requests as it is when it is at
// most MaxLabelBytes long, else its first bytes (whole UTF-8 characters),
// '~' and 16 hex digits of a SHA-256 of the whole: a request value of a
// megabyte (in a detailed_metric descriptor, or a limit override's
// key_value label) makes a label of 256 bytes, and distinct labels stay
// distinct.
func boundLabel(s string) string {
	if len(s) <= MaxLabelBytes {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	cut := MaxLabelBytes - 1 - 16
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "~" + hex.EncodeToString(sum[:8]) // a new string: s's bytes are not kept
}
