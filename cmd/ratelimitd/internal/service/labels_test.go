package service

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

const labelsConfig = `
domain: d
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user_x
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// series counts the samples of ratelimit_decisions_total and
// ratelimit_hits_total.
func series(t *testing.T, s *Service) int {
	return len(gather(t, s, "ratelimit_decisions_total")) + len(gather(t, s, "ratelimit_hits_total"))
}

// The rule labels requests make are bounded: a limit override's label is
// envoyproxy/ratelimit's statistics key (key_value, here "k0_v"); beyond
// MaxRuleLabels the
// decisions count under rule="_other" and in the folded counter; a label
// unused for labelIdle is dropped, with its series, making room; a reload
// drops those of rules gone.
func TestRuleLabelsBounded(t *testing.T) {
	m := memService(t, labelsConfig, func(o *Options) { o.MaxRuleLabels = 10 })
	override := func(key string) *rlcommon.RateLimitDescriptor {
		d := dsc(key, "v")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	for i := range 6 {
		m.call(t, req("d", override(fmt.Sprint("k", i)), dsc("user", fmt.Sprint("u", i))))
	}
	if got := gaugeValue(t, m.Service, "ratelimit_rule_labels"); got != 10 {
		t.Fatalf("ratelimit_rule_labels %v, want 10 (6 overrides and 4 users made before the bound)", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_rule_labels_folded_total", "domain", "d"); got != 2 {
		t.Errorf("folded %v, want 2", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", OtherLabel, "result", "ok"); got != 2 {
		t.Errorf("decisions under %s: %v, want 2", OtherLabel, got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "user_u0", "result", "ok"); got != 1 {
		t.Errorf("user_u0: %v", got)
	}
	// a request's label equal to a rule's own path is the rule's, not made
	m.call(t, req("d", dsc("user_x", "a")))
	m.call(t, req("d", dsc("user", "x")))
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "user_x", "result", "ok"); got != 2 {
		t.Errorf("user_x, the rule's own label: %v, want 2", got)
	}
	before := series(t, m.Service)
	for i := range 1000 {
		m.call(t, req("d", override(fmt.Sprint("z", i)), dsc("user", fmt.Sprint("w", i))))
	}
	if got := series(t, m.Service); got != before {
		t.Errorf("2,000 more labels asked: %d series, was %d", got, before)
	}
	if got := vecValue(t, m.Service, "ratelimit_rule_labels_folded_total", "domain", "d"); got != 2002 {
		t.Errorf("folded %v, want 2002", got)
	}

	// released: idle labels go, making room for new ones
	m.clock.Advance(labelIdle - time.Minute)
	m.call(t, req("d", override("k0"))) // k0 stays in use
	m.clock.Advance(time.Minute)
	m.call(t, req("d", override("fresh")))
	if got := gaugeValue(t, m.Service, "ratelimit_rule_labels"); got != 2 {
		t.Errorf("after %v idle: %v labels, want 2 (k0, in use, and fresh)", labelIdle, got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "k1_v", "result", "ok"); got != 0 {
		t.Error("the series of an idle label was not deleted")
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "k0_v", "result", "ok"); got != 2 {
		t.Errorf("k0, in use, counted %v, want 2", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "fresh_v", "result", "ok"); got != 1 {
		t.Errorf("fresh counted %v", got)
	}
	m.call(t, req("d", dsc("user", "again")))
	apply(t, m.Service, "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	if got := gaugeValue(t, m.Service, "ratelimit_rule_labels"); got != 2 {
		t.Errorf("after a reload without the detailed rule: %v labels, want the 2 overrides", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "user_again", "result", "ok"); got != 0 {
		t.Error("a label of a rule gone is left")
	}
}

// A limit override's label holds the request's values (envoyproxy/ratelimit's
// statistics key, key_value), so one key with ever new values makes ever
// new labels: they are bounded as every label requests make.
func TestOverrideLabelValuesBounded(t *testing.T) {
	m := memService(t, labelsConfig, func(o *Options) { o.MaxRuleLabels = 10 })
	override := func(value string) *rlcommon.RateLimitDescriptor {
		d := dsc("user", value)
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	before := series(t, m.Service) // the configuration's own
	for i := range 100 {
		m.call(t, req("d", override(fmt.Sprint("u", i))))
	}
	if got := gaugeValue(t, m.Service, "ratelimit_rule_labels"); got != 10 {
		t.Fatalf("ratelimit_rule_labels %v, want 10", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_rule_labels_folded_total", "domain", "d"); got != 90 {
		t.Errorf("folded %v, want 90", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "user_u0", "result", "ok"); got != 1 {
		t.Errorf("user_u0: %v, want 1", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", "user_u99", "result", "ok"); got != 0 {
		t.Errorf("user_u99, past the bound, has a series: %v", got)
	}
	if got := vecValue(t, m.Service, "ratelimit_decisions_total", "rule", OtherLabel, "result", "ok"); got != 90 {
		t.Errorf("decisions under %s: %v, want 90", OtherLabel, got)
	}
	// 11 labels made (10 and _other), each of one result and its hits
	if got := series(t, m.Service) - before; got != 22 {
		t.Errorf("%d series made, want 22", got)
	}
}

// A label made by requests is at most MaxLabelBytes long, whatever the
// size of the values it holds, valid UTF-8, and distinct values keep
// distinct labels.
func TestRuleLabelBytesBounded(t *testing.T) {
	m := memService(t, labelsConfig, nil)
	huge := strings.Repeat("é", 50_000) // 100 KB
	for _, v := range []string{huge + "a", huge + "b"} {
		o := dsc("user", v)
		o.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
		m.call(t, req("d", o))              // an override: key_value
		m.call(t, req("d", dsc("user", v))) // detailed_metric: user_<value>
	}
	long := 0
	for _, x := range gather(t, m.Service, "ratelimit_decisions_total") {
		for _, l := range x.Label {
			if l.GetName() != "rule" {
				continue
			}
			v := l.GetValue()
			if len(v) > MaxLabelBytes || !utf8.ValidString(v) {
				t.Errorf("a label of %d bytes (valid UTF-8: %v)", len(v), utf8.ValidString(v))
			}
			if strings.HasPrefix(v, "user_é") {
				long++
				if x.GetCounter().GetValue() != 2 {
					t.Errorf("%s...: %v decisions, want 2 (an override and a detailed one of one value)", v[:20], x.GetCounter().GetValue())
				}
			}
		}
	}
	if long != 2 {
		t.Errorf("%d labels for two long values, want 2", long)
	}
	if got := gaugeValue(t, m.Service, "ratelimit_rule_labels"); got != 2 {
		t.Errorf("ratelimit_rule_labels %v, want 2", got)
	}
	if s := "user_short"; boundLabel(s) != s {
		t.Errorf("a short label changed: %q", boundLabel(s))
	}
}
