package service

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Results of one descriptor's decision, the result label of
// ratelimit_decisions_total.
const (
	resultOK        = iota // allowed
	resultOverLimit        // denied
	resultShadow           // over the limit, answered OK because of shadow_mode
	resultUnlimited        // an unlimited rule: answered OK, not counted
	nResults
)

var resultNames = [nResults]string{"ok", "over_limit", "shadow_over_limit", "unlimited"}

type metrics struct {
	reg                    *prometheus.Registry
	decisions              *prometheus.CounterVec // domain, rule, result
	hits                   *prometheus.CounterVec // domain, rule
	requests               *prometheus.CounterVec // code
	reqOK, reqOver, reqErr prometheus.Counter
	latency                prometheus.Histogram
	reloads                *prometheus.CounterVec // result
	reloadOK               prometheus.Gauge
	reloadAt               prometheus.Gauge
	rules                  prometheus.Gauge
	shadowed               prometheus.Counter
	notFound               prometheus.Counter // descriptors of an unknown domain
	giveBackErrs           prometheus.Counter // hits taken to check or to stop, not given back
	labels                 *labels            // rule labels made by requests
}

// retired holds the counters of limiters closed since the start, so that
// the totals exported never go down. Guarded by Service.mu.
type retired struct {
	fallback, local, leases uint64
}

func newMetrics(s *Service) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Descriptor decisions by domain, rule (envoyproxy/ratelimit's statistics key without the domain) and result (ok, over_limit, shadow_over_limit); unlimited rules are not counted.",
		}, []string{"domain", "rule", "result"}),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_hits_total",
			Help: "Hits (hits_addend) counted against each rule, allowed or not.",
		}, []string{"domain", "rule"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_requests_total",
			Help: "ShouldRateLimit calls (gRPC and HTTP) by overall code: ok, over_limit, or error.",
		}, []string{"code"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_decision_duration_seconds",
			Help:    "Time to decide one ShouldRateLimit call, from request to response, transport excluded.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16), // 25us .. 0.8s
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_config_reloads_total",
			Help: "Configuration loads by result: success, or error (the previous rules stay in force).",
		}, []string{"result"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_last_reload_successful",
			Help: "1 when the last configuration load succeeded, 0 when it failed.",
		}),
		reloadAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful configuration load.",
		}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_rules",
			Help: "Rules (rate_limit blocks) in force.",
		}),
		shadowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_shadow_overrides_total",
			Help: "Calls over the limit answered OK because the service runs in shadow mode.",
		}),
	}
	m.notFound = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_domain_not_found_total",
		Help: "Requests for a domain no configuration defines, answered OK with no limit (envoyproxy/ratelimit's domain_not_found).",
	})
	m.giveBackErrs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_give_back_errors_total",
		Help: "Hits taken to check a descriptor (hits_addend 0) or of a request over the limit (--stop-cache-key-increment-when-overlimit) that could not be given back: they stay counted until their window ends.",
	})
	m.labels = &labels{max: s.opts.MaxRuleLabels, decisions: m.decisions, hits: m.hits,
		folded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_rule_labels_folded_total",
			Help: "Decisions counted under rule=\"" + OtherLabel + "\" because as many rule labels made by requests (limit overrides, detailed_metric, value_to_metric) as --max-rule-labels were in use.",
		}, []string{"domain"})}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("error")
	m.reqOK, m.reqOver, m.reqErr = m.requests.WithLabelValues("ok"), m.requests.WithLabelValues("over_limit"), m.requests.WithLabelValues("error")
	m.reg.MustRegister(m.decisions, m.hits, m.requests, m.latency, m.reloads, m.reloadOK, m.reloadAt, m.rules, m.shadowed, m.notFound, m.giveBackErrs, m.labels.folded,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_rule_labels",
			Help: "Rule labels made by requests (limit overrides, detailed_metric, value_to_metric) in use, at most --max-rule-labels.",
		}, func() float64 { return float64(m.labels.count()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimit_redis_round_trips_total",
			Help: "Round trips to Redis of every kind (a command or a pipeline), counted on the service's client.",
		}, func() float64 { return float64(s.RoundTrips()) }),
		&limiterCollector{s: s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

var (
	fallbackDesc = prometheus.NewDesc("ratelimit_fallback_decisions_total",
		"Decisions taken by the failure mode because Redis did not answer in time.", nil, nil)
	localDesc = prometheus.NewDesc("ratelimit_local_decisions_total",
		"Decisions the hybrid limiters took in memory, without waiting on Redis.", nil, nil)
	leasesDesc = prometheus.NewDesc("ratelimit_leases_total",
		"Grants of quota the hybrid limiters received from Redis.", nil, nil)
	keysDesc = prometheus.NewDesc("ratelimit_keys_tracked",
		"Keys a hybrid limiter holds in memory.", []string{"limiter"}, nil)
	instancesDesc = prometheus.NewDesc("ratelimit_instances",
		"Instances sharing a limiter's quota, as it last learned (an exact limiter failing local: the fleet its local budget is shared by).", []string{"limiter"}, nil)
	degradedDesc = prometheus.NewDesc("ratelimit_degraded",
		"1 while a limiter decides without Redis (its circuit breaker is open).", []string{"limiter"}, nil)
	limitersDesc = prometheus.NewDesc("ratelimit_limiters",
		"Limiters in use: one per distinct mode, algorithm, limit and failure mode.", nil, nil)
)

// limiterCollector exports the limiters' own counters at scrape time.
type limiterCollector struct{ s *Service }

func (c *limiterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{fallbackDesc, localDesc, leasesDesc, keysDesc, instancesDesc, degradedDesc, limitersDesc} {
		ch <- d
	}
}

func (c *limiterCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	// Under s.mu, the limiters being closed are either still listed in
	// s.closing or already folded into s.retired, never both or neither.
	s.mu.Lock()
	ents := make([]*entry, 0, len(s.pool)+len(s.closing))
	for _, e := range s.pool {
		ents = append(ents, e)
	}
	for e := range s.closing {
		ents = append(ents, e)
	}
	fallback, local, leases := s.retired.fallback+s.cuts.Load(), s.retired.local, s.retired.leases
	s.mu.Unlock()
	for _, e := range ents {
		name := e.sig.String()
		st := e.lim.Stats()
		fallback += st.Fallback
		local += st.LocalDecisions
		leases += st.Leases
		if st.Tracked {
			ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(st.KeysTracked), name)
		}
		if st.Instances > 0 {
			ch <- prometheus.MustNewConstMetric(instancesDesc, prometheus.GaugeValue, float64(st.Instances), name)
		}
		if st.DegradedKnown {
			ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, b2f(st.Degraded), name)
		}
	}
	ch <- prometheus.MustNewConstMetric(fallbackDesc, prometheus.CounterValue, float64(fallback))
	ch <- prometheus.MustNewConstMetric(localDesc, prometheus.CounterValue, float64(local))
	ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.CounterValue, float64(leases))
	ch <- prometheus.MustNewConstMetric(limitersDesc, prometheus.GaugeValue, float64(len(ents)))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
