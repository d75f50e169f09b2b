package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

type entry struct{ k, v string }

func (e entry) GetKey() string   { return e.k }
func (e entry) GetValue() string { return e.v }

// d builds a descriptor from key, value pairs.
func d(kv ...string) []entry {
	var out []entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, entry{kv[i], kv[i+1]})
	}
	return out
}

func parse(t *testing.T, files ...string) *config.Config {
	t.Helper()
	var srcs []config.Source
	for i, f := range files {
		srcs = append(srcs, config.Source{Name: "f" + string(rune('0'+i)) + ".yaml", Data: []byte(f)})
	}
	c, err := config.Parse(config.Defaults{}, srcs...)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

const basic = `
domain: test
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: val*
    rate_limit: {unit: minute, requests_per_unit: 40}
  - key: key2
    value: v*
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
    descriptors:
      - key: sub
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: key4
    rate_limit: {unlimited: true}
  - key: key5
    rate_limit: {unit: second, requests_per_unit: 0}
`

// TestLookup: key and value first, then the first wildcard that matches, then
// the key alone; the request must be exactly as deep as the rule.
func TestLookup(t *testing.T) {
	c := parse(t, basic)
	dom := c.Domain("test")
	if dom == nil {
		t.Fatal("domain test missing")
	}
	cases := []struct {
		name  string
		desc  []entry
		rpu   uint32 // 0: no rule, unless unlimited/zero
		path  string
		unit  config.Unit
		none  bool
		extra func(*config.Rule) bool
	}{
		{"nested key only", d("key1", "value1", "subkey1", "x"), 5, "key1_value1.subkey1", config.Second, false, nil},
		{"nested key and value", d("key1", "value1", "subkey1", "subvalue1"), 10, "key1_value1.subkey1_subvalue1", config.Second, false, nil},
		{"value before wildcard", d("key2", "value2"), 30, "key2_value2", config.Minute, false, nil},
		{"first wildcard wins", d("key2", "value9"), 40, "key2_val*", config.Minute, false, nil},
		{"second wildcard", d("key2", "vx"), 50, "key2_v*", config.Minute, false, nil},
		{"key alone last", d("key2", "other"), 20, "key2", config.Minute, false, nil},
		{"key alone, empty value", d("key2", ""), 20, "key2", config.Minute, false, nil},
		{"placeholder without limit", d("key1", "value1"), 0, "", 0, true, nil},
		{"too deep", d("key2", "value2", "x", "y"), 0, "", 0, true, nil},
		{"unknown key", d("nope", "x"), 0, "", 0, true, nil},
		{"unknown second level", d("key1", "value1", "nope", "x"), 0, "", 0, true, nil},
		{"unknown first level value", d("key1", "value2", "subkey1", "x"), 0, "", 0, true, nil},
		{"limit at a node with children", d("key3", "a"), 1, "key3", config.Hour, false, nil},
		{"its child", d("key3", "a", "sub", "b"), 2, "key3.sub", config.Day, false, nil},
		{"unlimited", d("key4", "a"), 0, "key4", 0, false, func(r *config.Rule) bool { return r.Unlimited }},
		{"zero", d("key5", "a"), 0, "key5", config.Second, false, func(r *config.Rule) bool { return !r.Unlimited }},
		{"no entries", nil, 0, "", 0, true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := config.Lookup(dom, tc.desc)
			if tc.none {
				if m.Rule != nil {
					t.Fatalf("matched %q, want no rule", m.Rule.Path)
				}
				return
			}
			if m.Rule == nil {
				t.Fatal("no rule matched")
			}
			r := m.Rule
			if r.RequestsPerUnit != tc.rpu || r.Path != tc.path || r.Unit != tc.unit || m.Label != tc.path {
				t.Fatalf("got %d per %v at %q (label %q), want %d per %v at %q", r.RequestsPerUnit, r.Unit, r.Path, m.Label, tc.rpu, tc.unit, tc.path)
			}
			if tc.extra != nil && !tc.extra(r) {
				t.Fatalf("rule %+v", r)
			}
			if c.Rules[r.ID] != r || r.Domain != "test" || r.File != "f0.yaml" || r.Line == 0 {
				t.Fatalf("rule bookkeeping: %+v", r)
			}
		})
	}
}

func TestWildcards(t *testing.T) {
	c := parse(t, `
domain: w
descriptors:
  - {key: trailing, value: "value*", rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: middle, value: "/api/*/action", rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: multi, value: "/api/*/resource/*/action", rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: star, value: "*", rate_limit: {unit: minute, requests_per_unit: 4}}
  - {key: overlap, value: "ab*ba", rate_limit: {unit: minute, requests_per_unit: 5}}
`)
	dom := c.Domain("w")
	cases := []struct {
		key, value string
		want       uint32 // 0: no match
	}{
		{"trailing", "value", 1}, {"trailing", "value1", 1}, {"trailing", "valueXYZ", 1}, {"trailing", "valu", 0},
		{"middle", "/api/123/action", 2}, {"middle", "/api/user-id/action", 2}, {"middle", "/api//action", 2},
		{"middle", "/api/123/other", 0}, {"middle", "/api/action", 0},
		{"multi", "/api/v1/resource/123/action", 3}, {"multi", "/api/v2/resource/456/action", 3},
		{"multi", "/api/v1/resource/action", 0}, {"multi", "/api/v1/other/123/action", 0},
		{"star", "", 4}, {"star", "anything", 4},
		{"overlap", "aba", 0}, {"overlap", "abba", 5}, {"overlap", "abxba", 5},
	}
	for _, tc := range cases {
		m := config.Lookup(dom, d(tc.key, tc.value))
		got := uint32(0)
		if m.Rule != nil {
			got = m.Rule.RequestsPerUnit
		}
		if got != tc.want {
			t.Errorf("%s=%q: matched %d, want %d", tc.key, tc.value, got, tc.want)
		}
	}
}

// TestLabels: detailed_metric and value_to_metric put the request's values in
// the metric label; share_threshold makes every value a wildcard matches
// count under the wildcard.
func TestLabels(t *testing.T) {
	c := parse(t, `
domain: m
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: nofiles
    value: nofiles/*
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	dom := c.Domain("m")
	cases := []struct {
		desc   []entry
		label  string
		shared []string
	}{
		{d("key1", "unspecified_value"), "key1_unspecified_value", nil},
		{d("key1", "value1"), "key1_value1", nil},
		{d("route", "api", "http_method", "GET", "subject_id", "123"), "route_api.http_method_GET.subject_id", nil},
		{d("route", "web", "http_method", "POST", "subject_id", "456"), "route_web.http_method_POST.subject_id", nil},
		{d("user", "alice", "action", "readfile", "resource", "documents"), "user_alice.action_readfile.resource", nil},
		{d("files", "files/a.pdf"), "files_files/*", []string{"files/*"}},
		{d("nofiles", "nofiles/a.pdf"), "nofiles_nofiles/*", nil},
	}
	for _, tc := range cases {
		m := config.Lookup(dom, tc.desc)
		if m.Rule == nil {
			t.Fatalf("%v: no rule", tc.desc)
		}
		if m.Label != tc.label || strings.Join(m.Shared, ",") != strings.Join(tc.shared, ",") {
			t.Errorf("%v: label %q shared %q, want %q %q", tc.desc, m.Label, m.Shared, tc.label, tc.shared)
		}
	}
}

func TestExtensionsAndDefaults(t *testing.T) {
	src := `
domain: x
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5, mode: exact, algorithm: gcra, failure_mode: closed}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 5, mode: optimistic, algorithm: sliding_window}
  - key: d
    rate_limit: {unit: day, requests_per_unit: 5, mode: strict, failure_mode: open}
`
	def := config.Defaults{Mode: config.Exact, Algorithm: ratelimit.SlidingLog, FailureMode: ratelimit.FailOpen}
	c, err := config.Parse(def, config.Source{Name: "x.yaml", Data: []byte(src)})
	if err == nil {
		t.Fatalf("rule d takes the default sliding_log with mode strict: want an error, got %d rules", len(c.Rules))
	}
	if want := "x.yaml:11: mode: algorithm sliding_log needs mode exact"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	def.Algorithm = ratelimit.SlidingWindow
	c, err = config.Parse(def, config.Source{Name: "x.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		mode config.Mode
		alg  ratelimit.Algorithm
		fm   ratelimit.FailureMode
		p    time.Duration
	}
	wants := []want{
		{config.Exact, ratelimit.SlidingWindow, ratelimit.FailOpen, time.Second},
		{config.Exact, ratelimit.GCRA, ratelimit.FailClosed, time.Minute},
		{config.Optimistic, ratelimit.SlidingWindow, ratelimit.FailOpen, time.Hour},
		{config.Strict, ratelimit.SlidingWindow, ratelimit.FailOpen, 24 * time.Hour},
	}
	for i, r := range c.Rules {
		got := want{r.Mode, r.Algorithm, r.FailureMode, r.Limit().Period}
		if got != wants[i] || r.Limit().Rate != 5 {
			t.Errorf("rule %s: got %+v, want %+v", r.Path, got, wants[i])
		}
	}
	if _, err := config.Parse(config.Defaults{Algorithm: ratelimit.SlidingLog}, config.Source{Name: "y", Data: []byte(src)}); err == nil {
		t.Error("default sliding_log with default mode strict: want an error")
	}
}

// The hybrid leases the buckets: token_bucket and gcra take every mode, by
// name or as the default.
func TestBucketsInEveryMode(t *testing.T) {
	src := `
domain: x
descriptors:
  - key: tb_strict
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: token_bucket}
  - key: tb_optimistic
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: token_bucket, mode: optimistic}
  - key: gcra_strict
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: gcra, mode: strict}
  - key: gcra_optimistic
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: gcra, mode: optimistic}
  - key: default
    rate_limit: {unit: minute, requests_per_unit: 20}
`
	for _, def := range []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA} {
		c, err := config.Parse(config.Defaults{Algorithm: def}, config.Source{Name: "x.yaml", Data: []byte(src)})
		if err != nil {
			t.Fatalf("default %v: %v", def, err)
		}
		got := map[string]string{}
		for _, r := range c.Rules {
			got[r.Path] = r.Mode.String() + " " + config.AlgorithmName(r.Algorithm)
		}
		want := map[string]string{
			"tb_strict": "strict token_bucket", "tb_optimistic": "optimistic token_bucket",
			"gcra_strict": "strict gcra", "gcra_optimistic": "optimistic gcra",
			"default": "strict " + config.AlgorithmName(def),
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("default %v: got %v, want %v", def, got, want)
		}
	}
}

// TestErrors: every bad input is an error naming file, line and field.
func TestErrors(t *testing.T) {
	cases := []struct {
		name, src, want string
	}{
		{"yaml syntax", "domain: x\ndescriptors:\n  - key: a\n   value: b\n", "f.yaml:2: did not find expected '-' indicator"},
		{"empty file", "", "f.yaml: empty file"},
		{"not a mapping", "- a\n- b\n", "f.yaml:1: want a mapping"},
		{"empty domain", "descriptors: []\n", "f.yaml:1: domain: a configuration file needs a non-empty domain"},
		{"unknown top field", "domain: x\ndescriptor: []\n", "f.yaml:2: descriptor: unknown field"},
		{"misspelled rate field", "domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n", "f.yaml:6: requestsperunit: unknown field"},
		{"unknown descriptor field", "domain: x\ndescriptors:\n  - key: a\n    shadow: true\n", "f.yaml:4: shadow: unknown field"},
		{"descriptors not a list", "domain: x\ndescriptors: {key: a}\n", "f.yaml:2: descriptors: want a list"},
		{"list of strings", "domain: x\ndescriptors:\n  - a\n  - b\n", "f.yaml:3: descriptors: a descriptor must be a mapping"},
		{"empty key", "domain: x\ndescriptors:\n  - value: b\n", "f.yaml:3: key: a descriptor needs a non-empty key"},
		{"key not a string", "domain: x\ndescriptors:\n  - key: [a]\n", "f.yaml:3: key: want a string"},
		{"duplicate key", "domain: x\ndescriptors:\n  - key: a\n  - key: a\n", `f.yaml:4: key: duplicate descriptor key "a" value "" (first on line 3)`},
		{"repeated field", "domain: x\ndomain: y\n", "f.yaml:2: domain: repeated field (first on line 1)"},
		{"bad unit", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", `f.yaml:4: unit: unknown unit "fortnight"`},
		{"missing unit", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n", "f.yaml:4: unit: missing"},
		{"missing rpu, strict", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n", "f.yaml:4: requests_per_unit: missing: read as 0"},
		{"negative rpu", "domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", "f.yaml:6: requests_per_unit: want a whole number"},
		{"rpu text", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: many}\n", "f.yaml:4: requests_per_unit: want a whole number"},
		{"rpu too large for a bucket", "domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: day\n      requests_per_unit: 1000000000\n      algorithm: token_bucket\n", "f.yaml:6: requests_per_unit: 1000000000 per day cannot be enforced"},
		{"rpu too large in a list", "domain: x\ndescriptors:\n  - key: a\n    rate_limits:\n      - unit: day\n        requests_per_unit: 1000000000\n        algorithm: sliding_window\n      - {unit: second, requests_per_unit: 5}\n", "f.yaml:6: requests_per_unit: 1000000000 per day cannot be enforced"},
		{"unlimited with unit", "domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", "f.yaml:6: unit: an unlimited rule takes no unit"},
		{"bool not bool", "domain: x\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n", "f.yaml:4: shadow_mode: want true or false"},
		{"replaces self", "domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      name: me\n      replaces: [{name: me}]\n      unit: second\n      requests_per_unit: 1\n", `f.yaml:6: replaces: a rule cannot replace itself (name "me")`},
		{"replaces empty", "domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      replaces: [{name: ''}]\n      unit: second\n      requests_per_unit: 1\n", "f.yaml:5: replaces: an entry needs a non-empty name"},
		{"share without wildcard", "domain: x\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", "f.yaml:5: share_threshold: only a wildcard value"},
		{"bad mode", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, mode: fast}\n", `f.yaml:4: mode: unknown mode "fast"`},
		{"bad algorithm", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}\n", `f.yaml:4: algorithm: unknown algorithm "leaky"`},
		{"log needs exact", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_log}\n", "f.yaml:4: algorithm: algorithm sliding_log needs mode exact"},
		{"gcra too fast, strict", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2000000, algorithm: gcra}\n", "f.yaml:4: requests_per_unit: gcra needs at most one request per microsecond"},
		{"bad failure mode", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, failure_mode: maybe}\n", `f.yaml:4: failure_mode: unknown failure mode "maybe"`},
		{"metadata not a map", "domain: x\ndescriptors:\n  - key: a\n    metadata: [1]\n", "f.yaml:4: metadata: want a mapping"},
		{"two documents, strict", "domain: x\n---\ndomain: y\n", "f.yaml:2: a second YAML document is ignored"},
		{"a field in the wrong block, strict", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, shadow_mode: true}\n", "f.yaml:4: shadow_mode: unknown field"},
		{"an extension in the wrong block", "domain: x\ndescriptors:\n  - key: a\n    mode: exact\n", "f.yaml:4: mode: unknown field"},
		{"non-string field name", "domain: x\ndescriptors:\n  - {[a]: b, key: c}\n", "f.yaml:3: a field name must be a string"},
		{"gcra too fast", "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 2000000, mode: exact, algorithm: gcra}\n", "f.yaml:4: requests_per_unit: gcra needs at most one request per microsecond"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.HasSuffix(tc.name, ", strict") {
				requireParseError(t, tc.src, tc.want)
			}
			requireParseErrorWith(t, config.Options{Strict: true}, tc.src, tc.want)
		})
	}
}

// requireParseError requires that parsing src as f.yaml fails with a
// *config.Error naming the file, whose text holds want.
func requireParseError(t *testing.T, src, want string) {
	t.Helper()
	requireParseErrorWith(t, config.Options{}, src, want)
}

func requireParseErrorWith(t *testing.T, o config.Options, src, want string) {
	t.Helper()
	_, err := config.ParseWith(o, config.Source{Name: "f.yaml", Data: []byte(src)})
	if err == nil {
		t.Fatalf("no error; want %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q\ndoes not contain %q", err, want)
	}
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != "f.yaml" {
		t.Fatalf("error %v is not a *config.Error naming the file", err)
	}
}

func TestSeveralFilesAndDomains(t *testing.T) {
	a := "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	b := "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
	c := parse(t, a, b)
	if got := strings.Join(c.Domains(), ","); got != "a,b" {
		t.Fatalf("domains %s", got)
	}
	for i, name := range []string{"a", "b"} {
		m := config.Lookup(c.Domain(name), d("k", "v"))
		if m.Rule == nil || m.Rule.RequestsPerUnit != uint32(i+1) || m.Rule.Ident == "" {
			t.Fatalf("domain %s: %+v", name, m.Rule)
		}
	}
	if c.Rules[0].Ident == c.Rules[1].Ident {
		t.Fatal("two rules of two domains share an Ident")
	}
	_, err := config.Parse(config.Defaults{},
		config.Source{Name: "one.yaml", Data: []byte(a)}, config.Source{Name: "two.yaml", Data: []byte("\n" + a)})
	if err == nil || !strings.Contains(err.Error(), `two.yaml:2: domain: domain "a" is already defined in one.yaml:1`) {
		t.Fatalf("duplicate domain: %v", err)
	}
}

// TestReadSources: a directory stands for its *.yaml and *.yml files, dot
// files and other files excluded, symlinks followed (a ConfigMap mount).
func TestReadSources(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_01_01")
	must(t, os.Mkdir(data, 0o755))
	must(t, os.WriteFile(filepath.Join(data, "a.yaml"), []byte("domain: a\n"), 0o644))
	must(t, os.Symlink("..2026_01_01", filepath.Join(dir, "..data")))
	must(t, os.Symlink(filepath.Join("..data", "a.yaml"), filepath.Join(dir, "a.yaml")))
	must(t, os.WriteFile(filepath.Join(dir, "b.yml"), []byte("domain: b\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, ".hidden.yaml"), []byte("x"), 0o644))
	srcs, err := config.ReadSources([]string{dir})
	must(t, err)
	var got []string
	for _, s := range srcs {
		got = append(got, filepath.Base(s.Name)+"="+string(s.Data))
	}
	if strings.Join(got, ";") != "a.yaml=domain: a\n;b.yml=domain: b\n" {
		t.Fatalf("sources %q", got)
	}
	if _, err := config.ReadSources([]string{filepath.Join(dir, "missing.yaml")}); err == nil {
		t.Fatal("a missing file: want an error")
	}
	if _, err := config.ReadSources([]string{t.TempDir()}); err == nil {
		t.Fatal("an empty directory: want an error")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// FuzzParse: no input makes Parse panic, and whatever it accepts can be
// looked up.
func FuzzParse(f *testing.F) {
	f.Add(basic)
	f.Add("domain: x\ndescriptors:\n  - key: a\n    value: '*b*'\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	f.Add("domain: &a x\ndescriptors: *a\n")
	f.Add("domain: x\ndescriptors:\n  - &d {key: a}\n  - *d\n")
	f.Fuzz(func(t *testing.T, src string) {
		c, err := config.Parse(config.Defaults{}, config.Source{Name: "fuzz.yaml", Data: []byte(src)})
		if err != nil {
			return
		}
		for _, name := range c.Domains() {
			config.Lookup(c.Domain(name), d("a", "b", "c", "d"))
			config.Lookup(c.Domain(name), d("key2", "vx"))
		}
	})
}

// A rate_limits list: several limits on one descriptor, in file order, in
// one mode and failure mode given on any item; a list of one is a
// rate_limit block.
func TestRateLimits(t *testing.T) {
	c := parse(t, `
domain: x
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 20, algorithm: token_bucket, name: burst}
      - {unit: minute, requests_per_unit: 600, failure_mode: closed}
      - unit: day
        requests_per_unit: 10000
        name: daily
        replaces: [{name: old}]
  - key: logged
    rate_limits:
      - {unit: second, requests_per_unit: 5, algorithm: sliding_log}
      - {unit: hour, requests_per_unit: 100, mode: exact}
  - key: one
    rate_limits:
      - {unit: minute, requests_per_unit: 7, algorithm: gcra}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 1, name: old}
`)
	r := config.Lookup(c.Domain("x"), d("api_key", "k")).Rule
	if r == nil {
		t.Fatal("no rule for api_key")
	}
	want := []config.RuleLimit{
		{Name: "burst", RequestsPerUnit: 20, Unit: config.Second, Algorithm: ratelimit.TokenBucket, Line: 6},
		{RequestsPerUnit: 600, Unit: config.Minute, Algorithm: ratelimit.FixedWindow, Line: 7},
		{Name: "daily", RequestsPerUnit: 10000, Unit: config.Day, Algorithm: ratelimit.FixedWindow, Line: 8},
	}
	if fmt.Sprint(r.Limits) != fmt.Sprint(want) || fmt.Sprint(r.AllLimits()) != fmt.Sprint(want) {
		t.Errorf("limits %+v, want %+v", r.Limits, want)
	}
	if r.Mode != config.Strict || r.FailureMode != ratelimit.FailClosed || r.Line != 6 {
		t.Errorf("mode %v, failure mode %v, line %d", r.Mode, r.FailureMode, r.Line)
	}
	if r.Name != "burst" || r.RequestsPerUnit != 20 || r.Unit != config.Second || r.Algorithm != ratelimit.TokenBucket {
		t.Errorf("the rule's own fields are not its first limit's: %+v", r)
	}
	if !r.Named("daily") || !r.Named("burst") || r.Named("") || r.Named("x") || fmt.Sprint(r.Replaces) != "[old]" {
		t.Errorf("names and replaces: %+v", r)
	}
	r = config.Lookup(c.Domain("x"), d("logged", "k")).Rule
	if len(r.Limits) != 2 || r.Mode != config.Exact || r.Limits[0].Algorithm != ratelimit.SlidingLog {
		t.Errorf("mode exact from the second item applies to the first: %+v", r)
	}
	r = config.Lookup(c.Domain("x"), d("one", "k")).Rule
	if r.Limits != nil || r.RequestsPerUnit != 7 || r.Unit != config.Minute || r.Algorithm != ratelimit.GCRA || len(r.AllLimits()) != 1 {
		t.Errorf("a list of one is a rate_limit block: %+v", r)
	}
}

// Every bad rate_limits list is an error naming file, line and field.
func TestRateLimitsErrors(t *testing.T) {
	head := "domain: x\ndescriptors:\n  - key: a\n"
	items := func(lines ...string) string {
		s := head + "    rate_limits:\n"
		for _, l := range lines {
			s += "      - " + l + "\n"
		}
		return s
	}
	nine := make([]string, 9)
	for i := range nine {
		nine[i] = fmt.Sprintf("{unit: second, requests_per_unit: %d}", i+1)
	}
	for _, tc := range []struct{ name, src, want string }{
		{"both", head + "    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: minute, requests_per_unit: 5}]\n",
			"f.yaml:5: rate_limits: a descriptor takes rate_limit or rate_limits, not both"},
		{"not a list", head + "    rate_limits: {unit: second, requests_per_unit: 1}\n", "f.yaml:4: rate_limits: want a list of limits"},
		{"empty", head + "    rate_limits: []\n", "f.yaml:4: rate_limits: want a list of limits"},
		{"too many", items(nine...), "f.yaml:5: rate_limits: 9 limits: at most 8 on one descriptor"},
		{"item not a mapping", items("5"), "f.yaml:5: rate_limits: a limit must be a mapping"},
		{"missing unit", items("{requests_per_unit: 5}"), "f.yaml:5: unit: missing"},
		{"missing rpu", items("{unit: second}"), "f.yaml:5: requests_per_unit: missing"},
		{"zero", items("{unit: second, requests_per_unit: 1}", "{unit: day, requests_per_unit: 0}"), "f.yaml:6: requests_per_unit: 0 in rate_limits"},
		{"unlimited", items("{unlimited: true}"), "f.yaml:5: unlimited: a limit of rate_limits cannot be unlimited"},
		{"unknown field", items("{unit: second, requests_per_unit: 1, burst: 5}"), "f.yaml:5: burst: unknown field"},
		{"bad unit", items("{unit: fortnight, requests_per_unit: 1}"), `f.yaml:5: unit: unknown unit "fortnight"`},
		{"two modes", items("{unit: second, requests_per_unit: 1, mode: strict}", "{unit: day, requests_per_unit: 5, mode: exact}"),
			"f.yaml:6: mode: mode exact, but line 5 says strict: the limits of one descriptor are decided together"},
		{"two failure modes", items("{unit: second, requests_per_unit: 1, failure_mode: open}", "{unit: day, requests_per_unit: 5, failure_mode: closed}"),
			"f.yaml:6: failure_mode: failure mode closed, but line 5 says open"},
		{"same algorithm and unit", items("{unit: minute, requests_per_unit: 10}", "{unit: day, requests_per_unit: 100}", "{unit: minute, requests_per_unit: 20}"),
			"f.yaml:7: rate_limits: a second fixed_window limit per minute (first on line 5): merge them into one"},
		{"log needs exact", items("{unit: second, requests_per_unit: 1}", "{unit: day, requests_per_unit: 5, algorithm: sliding_log}"),
			"f.yaml:6: algorithm: algorithm sliding_log needs mode exact"},
		{"too large", items("{unit: second, requests_per_unit: 1}", "{unit: day, requests_per_unit: 1000000000, algorithm: sliding_window}"),
			"f.yaml:6: requests_per_unit: 1000000000 per day cannot be enforced"},
		{"gcra too fast", items("{unit: second, requests_per_unit: 2000000, algorithm: gcra}", "{unit: day, requests_per_unit: 5}"),
			"f.yaml:5: requests_per_unit: gcra needs at most one request per microsecond"},
		{"a name twice", items("{unit: second, requests_per_unit: 1, name: n}", "{unit: day, requests_per_unit: 5, name: n}"),
			`f.yaml:6: name: the name "n" is already given on line 5`},
		{"replaces itself", items("{unit: second, requests_per_unit: 1, name: n}", "{unit: day, requests_per_unit: 5, replaces: [{name: n}]}"),
			`f.yaml:6: replaces: a rule cannot replace itself (name "n")`},
	} {
		t.Run(tc.name, func(t *testing.T) { requireParseError(t, tc.src, tc.want) })
	}
}
