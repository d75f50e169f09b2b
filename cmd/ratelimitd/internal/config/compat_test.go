package config_test

import (
	"strings"
	"testing"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// TestLenientAsEnvoy: what envoyproxy/ratelimit loads with a silent meaning
// loads here with that meaning and a warning naming file, line and field;
// --strict-config (Options.Strict) refuses it (TestErrors).
func TestLenientAsEnvoy(t *testing.T) {
	src := `domain: x
descriptors:
  - key: a
    rate_limit:
      unit: second
  - key: b
    rate_limit:
      unit: minute
      requests_per_unit: 3
      shadow_mode: true
---
domain: y
`
	c, err := config.ParseWith(config.Options{}, config.Source{Name: "f.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"f.yaml:5: requests_per_unit: missing: read as 0",
		"f.yaml:10: shadow_mode: not a field of this block: ignored",
		"f.yaml:11: a second YAML document is ignored",
	}
	if len(c.Warnings) != len(want) {
		t.Fatalf("warnings %v, want %d", c.Warnings, len(want))
	}
	for i, w := range want {
		if got := c.Warnings[i].Error(); !strings.HasPrefix(got, w) {
			t.Errorf("warning %d: %q, want it to start with %q", i, got, w)
		}
	}
	if got := strings.Join(c.Domains(), ","); got != "x" {
		t.Fatalf("domains %s: the second document must be ignored", got)
	}
	a := config.Lookup(c.Domain("x"), d("a", "1")).Rule
	if a == nil || a.RequestsPerUnit != 0 || a.Unlimited {
		t.Fatalf("a rule without requests_per_unit must deny everything: %+v", a)
	}
	b := config.Lookup(c.Domain("x"), d("b", "1")).Rule
	if b == nil || b.ShadowMode || b.RequestsPerUnit != 3 {
		t.Fatalf("shadow_mode inside rate_limit must be ignored: %+v", b)
	}
}

// TestLargeFixedWindow: a fixed-window limit of any uint32 per any unit is
// taken, as envoyproxy/ratelimit takes it, in the mode the rule names (the
// hybrid leases them as the global limiter counts them: Limit.ValidateFor),
// without a warning; in a rate_limits list too.
func TestLargeFixedWindow(t *testing.T) {
	src := `domain: big
descriptors:
  - key: day
    rate_limit: {unit: day, requests_per_unit: 1000000}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 4294967295}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 100000, mode: exact}
  - key: small
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: list
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: day, requests_per_unit: 1000000000}
`
	c, err := config.Parse(config.Defaults{}, config.Source{Name: "big.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	for k, mode := range map[string]config.Mode{"day": config.Strict, "year": config.Strict, "month": config.Exact} {
		r := config.Lookup(c.Domain("big"), d(k, "v")).Rule
		if r == nil || r.Mode != mode || r.Algorithm != ratelimit.FixedWindow {
			t.Fatalf("%s: %+v", k, r)
		}
		if err := r.Limit().ValidateFor(ratelimit.FixedWindow); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if r.Limit().Validate() == nil {
			t.Fatalf("%s: a limit within 2^53 us proves nothing here", k)
		}
	}
	if r := config.Lookup(c.Domain("big"), d("small", "v")).Rule; r.Mode != config.Strict {
		t.Fatalf("a small limit keeps its mode: %v", r.Mode)
	}
	if r := config.Lookup(c.Domain("big"), d("list", "v")).Rule; r == nil || len(r.Limits) != 2 || r.Limits[1].RequestsPerUnit != 1000000000 || r.Mode != config.Strict {
		t.Fatalf("list: %+v", r)
	}
	if len(c.Warnings) != 0 {
		t.Fatalf("warnings %v", c.Warnings)
	}
}

// TestMergeDomains: MERGE_DOMAIN_CONFIG: one domain over several files,
// and the same descriptor in two files an error naming both.
func TestMergeDomains(t *testing.T) {
	a := config.Source{Name: "a.yaml", Data: []byte("domain: m\ndescriptors:\n  - key: k1\n    value: v1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")}
	b := config.Source{Name: "b.yaml", Data: []byte("domain: m\ndescriptors:\n  - key: k2\n    value: v2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: w\n    value: x*\n    rate_limit: {unit: minute, requests_per_unit: 30}\n")}
	if _, err := config.Parse(config.Defaults{}, a, b); err == nil || !strings.Contains(err.Error(), "b.yaml:1: domain: domain \"m\" is already defined in a.yaml:1") {
		t.Fatalf("without merging: %v", err)
	}
	c, err := config.ParseWith(config.Options{MergeDomains: true}, a, b)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]uint32{"k1/v1": 10, "k2/v2": 20, "w/xyz": 30} {
		kv := strings.Split(k, "/")
		r := config.Lookup(c.Domain("m"), d(kv[0], kv[1])).Rule
		if r == nil || r.RequestsPerUnit != want {
			t.Fatalf("%s: %+v", k, r)
		}
	}
	if len(c.Rules) != 3 || c.Rules[2].ID != 2 || c.Rules[2].File != "b.yaml" {
		t.Fatalf("rules %+v", c.Rules)
	}
	_, err = config.ParseWith(config.Options{MergeDomains: true}, a, config.Source{Name: "a2.yaml", Data: a.Data})
	if err == nil || !strings.Contains(err.Error(), `a2.yaml:3: key: duplicate descriptor key "k1" value "v1" (first in a.yaml:3)`) {
		t.Fatalf("a descriptor in two files: %v", err)
	}
}

// TestMetadata: a descriptor's metadata mapping becomes its rule's
// Metadata, nested mappings included.
func TestMetadata(t *testing.T) {
	src := `domain: md
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata:
      name: service_1
      quota: {left: 3, tags: [a, b]}
      1: one
`
	c, err := config.Parse(config.Defaults{}, config.Source{Name: "m.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	r := config.Lookup(c.Domain("md"), d("k", "v")).Rule
	f := r.Metadata.GetFields()
	if f["name"].GetStringValue() != "service_1" || f["quota"].GetStructValue().GetFields()["left"].GetNumberValue() != 3 ||
		len(f["quota"].GetStructValue().GetFields()["tags"].GetListValue().GetValues()) != 2 || f["1"].GetStringValue() != "one" {
		t.Fatalf("metadata %v", r.Metadata)
	}
}
