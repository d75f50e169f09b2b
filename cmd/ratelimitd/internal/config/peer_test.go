package config_test

// envoyproxy/ratelimit's configuration test cases (its test/config files
// and config_test.go, read at f2fb157), written again in our own words:
// the same configurations and requests, the peer's expectations. A
// statistics key of the peer ("domain.key1_value1.subkey1") is our rule
// label without the domain ("key1_value1.subkey1"). Where we differ on
// purpose, the case says so (docs/ratelimitd.md lists the differences).

import (
	"strings"
	"testing"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// lookupCase is one GetLimit of the peer's tests: the entries of a request
// descriptor and the rule it must find (rpu 0 and unit "" with none: no
// rule), with the statistics key the peer gives it.
type lookupCase struct {
	entries   []string
	none      bool
	rpu       uint32
	unit      string
	label     string
	name      string
	shadow    bool
	unlimited bool
	shared    []string
}

func checkLookups(t *testing.T, c *config.Config, domain string, cases []lookupCase) {
	t.Helper()
	for _, tc := range cases {
		m := config.Lookup(c.Domain(domain), d(tc.entries...))
		what := strings.Join(tc.entries, ",")
		if tc.none {
			if m.Rule != nil {
				t.Errorf("%s: found %s, want no limit", what, m.Rule.Path)
			}
			continue
		}
		if m.Rule == nil {
			t.Errorf("%s: no limit, want %d/%s", what, tc.rpu, tc.unit)
			continue
		}
		r := m.Rule
		if tc.unlimited != r.Unlimited || (!tc.unlimited && (r.RequestsPerUnit != tc.rpu || r.Unit.String() != tc.unit)) {
			t.Errorf("%s: %d/%s unlimited %v, want %d/%s unlimited %v", what, r.RequestsPerUnit, r.Unit, r.Unlimited, tc.rpu, tc.unit, tc.unlimited)
		}
		if m.Label != tc.label {
			t.Errorf("%s: statistics key %q, want %q", what, m.Label, tc.label)
		}
		if r.Name != tc.name || r.ShadowMode != tc.shadow {
			t.Errorf("%s: name %q shadow %v, want %q %v", what, r.Name, r.ShadowMode, tc.name, tc.shadow)
		}
		if tc.shared != nil && strings.Join(m.Shared, "|") != strings.Join(tc.shared, "|") {
			t.Errorf("%s: shared %q, want %q", what, m.Shared, tc.shared)
		}
		if tc.shared == nil && m.Shared != nil {
			t.Errorf("%s: shared %q, want none", what, m.Shared)
		}
	}
}

func parseWith(t *testing.T, o config.Options, files ...string) *config.Config {
	t.Helper()
	var srcs []config.Source
	for i, f := range files {
		srcs = append(srcs, config.Source{Name: "peer" + string(rune('0'+i)) + ".yaml", Data: []byte(f)})
	}
	c, err := config.ParseWith(o, srcs...)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

// peerBasic is the peer's basic configuration, in our words.
const peerBasic = `
domain: test-domain
descriptors:
  - {key: key1, value: value1, descriptors: [
      {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}},
      {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}}]}
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 30}}
  - {key: key2, value: value3}
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: key4, rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors: [{key: subkey5, value: subvalue5, rate_limit: {unit: day, requests_per_unit: 25}}]
  - {key: key6, rate_limit: {unlimited: true}}
  - {key: key7, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 70}}
`

func TestPeerConfigBasic(t *testing.T) {
	c := parseWith(t, config.Options{}, peerBasic)
	if c.Domain("foo_domain") != nil {
		t.Fatal("an unknown domain")
	}
	checkLookups(t, c, "test-domain", []lookupCase{
		{entries: []string{"key1", "something"}, none: true},
		{entries: []string{"key1", "value1"}, none: true},
		{entries: []string{"key2", "value2", "subkey", "subvalue"}, none: true},
		{entries: []string{"key5", "value5", "subkey5", "subvalue"}, none: true},
		{entries: []string{"key1", "value1", "subkey1", "something"}, rpu: 5, unit: "SECOND", label: "key1_value1.subkey1"},
		{entries: []string{"key1", "value1", "subkey1", "subvalue1"}, rpu: 10, unit: "SECOND", label: "key1_value1.subkey1_subvalue1"},
		{entries: []string{"key2", "something"}, rpu: 20, unit: "MINUTE", label: "key2"},
		{entries: []string{"key2", "value2"}, rpu: 30, unit: "MINUTE", label: "key2_value2"},
		{entries: []string{"key2", "value3"}, none: true},
		{entries: []string{"key3", "foo"}, rpu: 1, unit: "HOUR", label: "key3"},
		{entries: []string{"key4", "foo"}, rpu: 1, unit: "DAY", label: "key4", name: "key4_rate_limit"},
		{entries: []string{"key6", "foo"}, unlimited: true, label: "key6"},
		{entries: []string{"key7", "unspecified_value"}, rpu: 70, unit: "MINUTE", label: "key7_unspecified_value"},
		{entries: []string{"key7", "another_value"}, rpu: 70, unit: "MINUTE", label: "key7_another_value"},
	})
}

func TestPeerConfigDomainMerge(t *testing.T) {
	a := "domain: test-domain\ndescriptors: [{key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 10}}]\n"
	b := "domain: test-domain\ndescriptors: [{key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 20}}]\n"
	c := parseWith(t, config.Options{MergeDomains: true}, a, b)
	checkLookups(t, c, "test-domain", []lookupCase{
		{entries: []string{"key1", "value1"}, rpu: 10, unit: "MINUTE", label: "key1_value1"},
		{entries: []string{"key2", "value2"}, rpu: 20, unit: "MINUTE", label: "key2_value2"},
	})
	// The same file twice: the peer's duplicate composite key.
	_, err := config.ParseWith(config.Options{MergeDomains: true}, config.Source{Name: "a.yaml", Data: []byte(a)}, config.Source{Name: "b.yaml", Data: []byte(a)})
	if err == nil || !strings.Contains(err.Error(), `duplicate descriptor key "key1" value "value1"`) {
		t.Fatalf("TestDuplicateKeyDomainMerge: %v", err)
	}
}

// TestPeerConfigErrors: every file the peer refuses is refused, the error
// naming the file (our texts are our own).
func TestPeerConfigErrors(t *testing.T) {
	for name, src := range map[string]string{
		"TestEmptyDomain":                "descriptors:\n",
		"TestEmptyKey":                   "domain: test-domain\ndescriptors: [{value: value1}]\n",
		"TestDuplicateKey":               "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1}\n  - {key: key1, value: value1}\n",
		"TestBadLimitUnit":               "domain: test-domain\ndescriptors: [{key: key1, value: value1, rate_limit: {unit: foo, requests_per_unit: 5}}]\n",
		"TestReplacesSelf":               "domain: test-domain\ndescriptors: [{key: key1, value: value1, descriptors: [{key: subkey1, rate_limit: {name: self, replaces: [{name: self}], unit: second, requests_per_unit: 5}}]}]\n",
		"TestReplacesEmpty":              "domain: test-domain\ndescriptors: [{key: key1, value: value1, descriptors: [{key: subkey1, rate_limit: {name: self, replaces: [{name: }], unit: second, requests_per_unit: 5}}]}]\n",
		"TestBadYaml":                    "'''\n",
		"TestMisspelledKey":              "domain: test-domain\ndescriptors: [{key: key1, value: value1, ratelimit: {unit: day, requests_per_unit: 5}}]\n",
		"TestMisspelledKey2":             "domain: test-domain\ndescriptors: [{key: key1, value: value1, rate_limit: {unit: day, requestsperunit: 5}}]\n",
		"TestNonStringKey":               "0.25: test-domain\ndescriptors: [{key: key1, value: value1, rate_limit: {unit: day, requests_per_unit: 5}}]\n",
		"TestNonMapList":                 "domain: test-domain\ndescriptors: [a, b, c]\n",
		"TestUnlimitedWithRateLimitUnit": "domain: test-domain\ndescriptors: [{key: foo, rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}}]\n",
	} {
		for _, strict := range []bool{false, true} {
			_, err := config.ParseWith(config.Options{Strict: strict}, config.Source{Name: "bad.yaml", Data: []byte(src)})
			if err == nil || !strings.HasPrefix(err.Error(), "bad.yaml") {
				t.Errorf("%s (strict %v): %v, want an error naming the file", name, strict, err)
			}
		}
	}
	basic := config.Source{Name: "basic.yaml", Data: []byte(peerBasic)}
	dup := config.Source{Name: "dup.yaml", Data: []byte("domain: test-domain\ndescriptors:\n")}
	if _, err := config.Parse(config.Defaults{}, basic, dup); err == nil || !strings.Contains(err.Error(), `dup.yaml:1: domain: domain "test-domain" is already defined`) {
		t.Errorf("TestDuplicateDomain: %v", err)
	}
}

func TestPeerConfigShadowMode(t *testing.T) {
	c := parseWith(t, config.Options{}, `
domain: test-domain
descriptors:
  - {key: key1, value: value1, descriptors: [
      {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}},
      {key: subkey1, value: subvalue1, shadow_mode: true, rate_limit: {unit: second, requests_per_unit: 10}}]}
  - {key: key2, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 30}}
`)
	checkLookups(t, c, "test-domain", []lookupCase{
		{entries: []string{"key1", "value1", "subkey1", "something"}, rpu: 5, unit: "SECOND", label: "key1_value1.subkey1"},
		{entries: []string{"key1", "value1", "subkey1", "subvalue1"}, rpu: 10, unit: "SECOND", label: "key1_value1.subkey1_subvalue1", shadow: true},
		{entries: []string{"key2", "something"}, rpu: 20, unit: "MINUTE", label: "key2", shadow: true},
		{entries: []string{"key2", "value2"}, rpu: 30, unit: "MINUTE", label: "key2_value2"},
	})
}

const peerWildcard = `
domain: test-domain
descriptors:
  - {key: wild, value: foo*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noVal, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: midWild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiWild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: nestedWild, value: val1, descriptors: [{key: wild, value: goo*, rate_limit: {unit: minute, requests_per_unit: 20}}]}
`

func TestPeerConfigWildcard(t *testing.T) {
	c := parseWith(t, config.Options{}, peerWildcard)
	checkLookups(t, c, "test-domain", []lookupCase{
		{entries: []string{"noVal", "foo1"}, rpu: 20, unit: "MINUTE", label: "noVal"},
		{entries: []string{"noVal", "foo2"}, rpu: 20, unit: "MINUTE", label: "noVal"},
		{entries: []string{"wild", "foo1"}, rpu: 20, unit: "MINUTE", label: "wild_foo*"},
		{entries: []string{"wild", "foo2"}, rpu: 20, unit: "MINUTE", label: "wild_foo*"},
		{entries: []string{"nestedWild", "val1", "wild", "goo2"}, rpu: 20, unit: "MINUTE", label: "nestedWild_val1.wild_goo*"},
		{entries: []string{"wild", "bar"}, none: true},
		{entries: []string{"noWild", "foo1"}, none: true},
		{entries: []string{"midWild", "barab"}, rpu: 20, unit: "MINUTE", label: "midWild_bar*b"},
		{entries: []string{"midWild", "bar123b"}, rpu: 20, unit: "MINUTE", label: "midWild_bar*b"},
		{entries: []string{"midWild", "barb"}, rpu: 20, unit: "MINUTE", label: "midWild_bar*b"},
		{entries: []string{"midWild", "bara"}, none: true},
		{entries: []string{"midWild", "xbarb"}, none: true},
		{entries: []string{"multiWild", "foo123bar456baz"}, rpu: 10, unit: "MINUTE", label: "multiWild_foo*bar*baz"},
		{entries: []string{"multiWild", "foobarbaz"}, rpu: 10, unit: "MINUTE", label: "multiWild_foo*bar*baz"},
		{entries: []string{"multiWild", "foo123baz"}, none: true},
		{entries: []string{"multiWild", "bar456baz"}, none: true},
	})
}

func TestPeerConfigDetailedMetric(t *testing.T) {
	realistic := `
domain: nested
descriptors:
  - {key: key_1, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 500}}
  - {key: key_1, value: some-value-for-key-1, rate_limit: {unit: minute, requests_per_unit: 500}}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - {key: key_3, detailed_metric: true}
      - {key: key_3, value: requested-key3-value, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - {key: key_3, detailed_metric: true}
      - {key: key_3, value: requested-key3-value, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 100}}
`
	nested := func(top, leaf bool) string {
		return "domain: nested\ndescriptors:\n  - {key: key-1, detailed_metric: " + bstr(top) +
			", rate_limit: {unit: minute, requests_per_unit: 100}, descriptors: [{key: key-2, detailed_metric: " + bstr(leaf) +
			", rate_limit: {unit: minute, requests_per_unit: 5}}]}\n"
	}
	for _, tc := range []struct {
		name, cfg string
		entries   []string
		rpu       uint32
		label     string
	}{
		{"top-level key only, detailed", nested(true, false), []string{"key-1", "value-1"}, 100, "key-1_value-1"},
		{"top-level key only, not detailed", nested(false, false), []string{"key-1", "value-1"}, 100, "key-1"},
		{"fully nested, detailed", nested(true, true), []string{"key-1", "value-1", "key-2", "value-2"}, 5, "key-1_value-1.key-2_value-2"},
		{"fully nested, not detailed", nested(false, false), []string{"key-1", "value-1", "key-2", "value-2"}, 5, "key-1.key-2"},
		{"realistic, simple request", realistic, []string{"key_1", "value-for-key-1"}, 500, "key_1_value-for-key-1"},
		{"realistic, second descriptor not nested", realistic, []string{"key_2", "key-2-value"}, 5000, "key_2_key-2-value"},
		{"realistic, nested request", realistic, []string{"key_2", "key-2-value", "key_3", "requested-key3-value"}, 5, "key_2_key-2-value.key_3_requested-key3-value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseWith(t, config.Options{MergeDomains: true}, tc.cfg)
			checkLookups(t, c, "nested", []lookupCase{{entries: tc.entries, rpu: tc.rpu, unit: "MINUTE", label: tc.label}})
		})
	}
}

func bstr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func TestPeerConfigValueToMetric(t *testing.T) {
	threeLevels := func(route, method string, leaf string) string {
		return "domain: domain\ndescriptors:\n  - {key: route, value_to_metric: " + route + ", descriptors: [{key: http_method, value_to_metric: " + method +
			", descriptors: [{key: subject_id" + leaf + ", rate_limit: {unit: minute, requests_per_unit: 60}}]}]}\n"
	}
	for _, tc := range []struct {
		name, cfg, domain string
		entries           []string
		rpu               uint32
		unit, label       string
	}{
		{"UsesRuntimeValuesInStats", threeLevels("true", "true", ""), "domain", []string{"route", "draw", "http_method", "GET", "subject_id", "123"}, 60, "MINUTE", "route_draw.http_method_GET.subject_id"},
		{"DefaultKeyIncludesValueAtThatLevel", "domain: d\ndescriptors: [{key: k1, value_to_metric: true, descriptors: [{key: k2, rate_limit: {unit: second, requests_per_unit: 1}}]}]\n", "d",
			[]string{"k1", "A", "k2", "foo"}, 1, "SECOND", "k1_A.k2"},
		{"MidLevelOnly", "domain: d\ndescriptors: [{key: k1, descriptors: [{key: k2, value_to_metric: true, descriptors: [{key: k3, rate_limit: {unit: second, requests_per_unit: 1}}]}]}]\n", "d",
			[]string{"k1", "X", "k2", "Y", "k3", "Z"}, 1, "SECOND", "k1.k2_Y.k3"},
		{"NoFlag_Unchanged", "domain: d\ndescriptors: [{key: k1, descriptors: [{key: k2, rate_limit: {unit: second, requests_per_unit: 1}}]}]\n", "d",
			[]string{"k1", "X", "k2", "Y"}, 1, "SECOND", "k1.k2"},
		{"DoesNotOverrideDetailedMetric", threeLevels("true", "true", ", detailed_metric: true"), "domain", []string{"route", "draw", "http_method", "GET", "subject_id", "123"}, 60, "MINUTE", "route_draw.http_method_GET.subject_id_123"},
		{"WithEmptyValue route", threeLevels("true", "true", ""), "domain", []string{"route", "", "http_method", "GET", "subject_id", "123"}, 60, "MINUTE", "route.http_method_GET.subject_id"},
		{"WithEmptyValue method", threeLevels("true", "true", ""), "domain", []string{"route", "draw", "http_method", "", "subject_id", "123"}, 60, "MINUTE", "route_draw.http_method.subject_id"},
		{"WithEmptyValue both", threeLevels("true", "true", ""), "domain", []string{"route", "", "http_method", "", "subject_id", "123"}, 60, "MINUTE", "route.http_method.subject_id"},
		{"FullKeyMatchesStatsKey, no flags", threeLevels("false", "false", ""), "domain", []string{"route", "api", "http_method", "GET", "subject_id", "user123"}, 60, "MINUTE", "route.http_method.subject_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseWith(t, config.Options{}, tc.cfg)
			checkLookups(t, c, tc.domain, []lookupCase{{entries: tc.entries, rpu: tc.rpu, unit: tc.unit, label: tc.label}})
		})
	}
	t.Run("WithConfiguredValues", func(t *testing.T) {
		c := parseWith(t, config.Options{}, `
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - {key: http_method, value: GET, value_to_metric: true, descriptors: [{key: subject_id, rate_limit: {unit: minute, requests_per_unit: 60}}]}
      - {key: http_method, value: POST, value_to_metric: true, descriptors: [{key: subject_id, rate_limit: {unit: minute, requests_per_unit: 30}}]}
`)
		checkLookups(t, c, "test-domain", []lookupCase{
			{entries: []string{"route", "api", "http_method", "GET", "subject_id", "user123"}, rpu: 60, unit: "MINUTE", label: "route_api.http_method_GET.subject_id"},
			{entries: []string{"route", "api", "http_method", "POST", "subject_id", "user456"}, rpu: 30, unit: "MINUTE", label: "route_api.http_method_POST.subject_id"},
		})
	})
	t.Run("WithWildcard", func(t *testing.T) {
		c := parseWith(t, config.Options{}, `
domain: domain
descriptors:
  - {key: user, value_to_metric: true, descriptors: [{key: action, value: read*, value_to_metric: true, descriptors: [{key: resource, rate_limit: {unit: minute, requests_per_unit: 100}}]}]}
`)
		checkLookups(t, c, "domain", []lookupCase{
			{entries: []string{"user", "alice", "action", "readfile", "resource", "documents"}, rpu: 100, unit: "MINUTE", label: "user_alice.action_readfile.resource"},
			{entries: []string{"user", "bob", "action", "readdata", "resource", "database"}, rpu: 100, unit: "MINUTE", label: "user_bob.action_readdata.resource"},
		})
	})
}

const peerShareThreshold = `
domain: test-domain
descriptors:
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: nested, value: parent, descriptors: [{key: files, value: nested/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 200}}]}
  - {key: files, value: top/*, share_threshold: true, descriptors: [{key: files, value: nested/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 300}}]}
  - {key: route, value: api/*, share_threshold: true, value_to_metric: true, descriptors: [{key: method, rate_limit: {unit: minute, requests_per_unit: 60}}]}
  - {key: service, value: svc/*, share_threshold: true, descriptors: [{key: endpoint, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}]}
  - {key: path, value: path/*, share_threshold: true, descriptors: [{key: file, value: file/*, share_threshold: false, descriptors: [{key: type, rate_limit: {unit: minute, requests_per_unit: 120}}]}]}
  - {key: user, value: user/*, share_threshold: true, descriptors: [{key: resource, value: res/*, share_threshold: true, descriptors: [{key: action, rate_limit: {unit: minute, requests_per_unit: 150}}]}]}
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: file, value: test*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: midpath, value: /api*v1, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: multiroute, value: svc*ep*rpc, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: midroute, value: /api*v2, share_threshold: true, value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}
  - {key: tenant, value: t*prod, share_threshold: true, descriptors: [{key: resource, value: res*v2, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 60}}]}
`

func TestPeerConfigShareThreshold(t *testing.T) {
	c := parseWith(t, config.Options{}, peerShareThreshold)
	for name, cases := range map[string][]lookupCase{
		"Basic share_threshold": {
			{entries: []string{"files", "files/a.pdf"}, rpu: 100, unit: "MINUTE", label: "files_files/*", shared: []string{"files/*"}},
			{entries: []string{"files", "files/b.csv"}, rpu: 100, unit: "MINUTE", label: "files_files/*", shared: []string{"files/*"}},
			{entries: []string{"files", "files/c.txt"}, rpu: 100, unit: "MINUTE", label: "files_files/*", shared: []string{"files/*"}},
		},
		"share_threshold with metrics": {
			{entries: []string{"route", "api/v1", "method", "GET"}, rpu: 60, unit: "MINUTE", label: "route_api/*.method", shared: []string{"api/*", ""}},
			{entries: []string{"service", "svc/user", "endpoint", "get"}, rpu: 80, unit: "MINUTE", label: "service_svc/*.endpoint_get", shared: []string{"svc/*", ""}},
		},
		"Nested wildcards": {
			{entries: []string{"nested", "parent", "files", "nested/file1.txt"}, rpu: 200, unit: "MINUTE", label: "nested_parent.files_nested/*", shared: []string{"", "nested/*"}},
			{entries: []string{"files", "top/file1.txt", "files", "nested/file1.txt"}, rpu: 300, unit: "MINUTE", label: "files_top/*.files_nested/*", shared: []string{"top/*", "nested/*"}},
			{entries: []string{"path", "path/foo", "file", "file/doc1", "type", "pdf"}, rpu: 120, unit: "MINUTE", label: "path_path/*.file_file/*.type", shared: []string{"path/*", "", ""}},
			{entries: []string{"user", "user/alice", "resource", "res/file1", "action", "read"}, rpu: 150, unit: "MINUTE", label: "user_user/*.resource_res/*.action", shared: []string{"user/*", "res/*", ""}},
		},
		"Explicit value precedence over wildcard": {
			{entries: []string{"file", "test1"}, rpu: 50, unit: "MINUTE", label: "file_test1"},
			{entries: []string{"file", "test2"}, rpu: 100, unit: "MINUTE", label: "file_test*", shared: []string{"test*"}},
			{entries: []string{"file", "test23"}, rpu: 100, unit: "MINUTE", label: "file_test*", shared: []string{"test*"}},
			{entries: []string{"file", "test123"}, rpu: 100, unit: "MINUTE", label: "file_test*", shared: []string{"test*"}},
		},
		"share_threshold with middle wildcard": {
			{entries: []string{"midpath", "/api/v1"}, rpu: 100, unit: "MINUTE", label: "midpath_/api*v1", shared: []string{"/api*v1"}},
			{entries: []string{"midpath", "/api-beta-v1"}, rpu: 100, unit: "MINUTE", label: "midpath_/api*v1", shared: []string{"/api*v1"}},
			{entries: []string{"midpath", "/apiXYZv1"}, rpu: 100, unit: "MINUTE", label: "midpath_/api*v1", shared: []string{"/api*v1"}},
			{entries: []string{"midpath", "/api/v2"}, none: true},
		},
		"share_threshold with multi-wildcard": {
			{entries: []string{"multiroute", "svcAepBrpc"}, rpu: 50, unit: "MINUTE", label: "multiroute_svc*ep*rpc", shared: []string{"svc*ep*rpc"}},
			{entries: []string{"multiroute", "svcXXXepYYYrpc"}, rpu: 50, unit: "MINUTE", label: "multiroute_svc*ep*rpc", shared: []string{"svc*ep*rpc"}},
			{entries: []string{"multiroute", "svceprpc"}, rpu: 50, unit: "MINUTE", label: "multiroute_svc*ep*rpc", shared: []string{"svc*ep*rpc"}},
			{entries: []string{"multiroute", "svcABCrpc"}, none: true},
		},
		"share_threshold priority over value_to_metric with middle wildcard": {
			{entries: []string{"midroute", "/api/v2"}, rpu: 80, unit: "MINUTE", label: "midroute_/api*v2", shared: []string{"/api*v2"}},
			{entries: []string{"midroute", "/api-beta-v2"}, rpu: 80, unit: "MINUTE", label: "midroute_/api*v2", shared: []string{"/api*v2"}},
		},
		"share_threshold with nested middle wildcards": {
			{entries: []string{"tenant", "t1prod", "resource", "resAv2"}, rpu: 60, unit: "MINUTE", label: "tenant_t*prod.resource_res*v2", shared: []string{"t*prod", "res*v2"}},
			{entries: []string{"tenant", "t99prod", "resource", "resBBBv2"}, rpu: 60, unit: "MINUTE", label: "tenant_t*prod.resource_res*v2", shared: []string{"t*prod", "res*v2"}},
		},
	} {
		t.Run(name, func(t *testing.T) { checkLookups(t, c, "test-domain", cases) })
	}
}

func TestPeerConfigWildcardStatsBehavior(t *testing.T) {
	one := func(value, flags string) string {
		return "domain: test-domain\ndescriptors: [{key: wild, value: '" + value + "'" + flags + ", rate_limit: {unit: minute, requests_per_unit: 20}}]\n"
	}
	for _, tc := range []struct {
		name, cfg string
		entries   []string
		label     string
		shared    []string
	}{
		{"No flags", one("foo*", ""), []string{"wild", "foo1"}, "wild_foo*", nil},
		{"value_to_metric", one("foo*", ", value_to_metric: true"), []string{"wild", "foo1"}, "wild_foo1", nil},
		{"share_threshold", one("foo*", ", share_threshold: true"), []string{"wild", "foo1"}, "wild_foo*", []string{"foo*"}},
		{"share_threshold with value_to_metric", one("foo*", ", share_threshold: true, value_to_metric: true"), []string{"wild", "foo1"}, "wild_foo*", []string{"foo*"}},
		{"value_to_metric in other descriptor", "domain: test-domain\ndescriptors: [{key: wild, value: foo*, descriptors: [{key: other, value_to_metric: true, descriptors: [{key: limit, rate_limit: {unit: minute, requests_per_unit: 20}}]}]}]\n",
			[]string{"wild", "foo1", "other", "bar", "limit", "X"}, "wild_foo*.other_bar.limit", nil},
		{"middle+trailing wildcard, no flags", one("foo*bar*", ""), []string{"wild", "foo123bar456"}, "wild_foo*bar*", nil},
		{"middle+trailing wildcard, no flags, another value", one("foo*bar*", ""), []string{"wild", "fooXbarY"}, "wild_foo*bar*", nil},
		{"middle+trailing wildcard, value_to_metric", one("foo*bar*", ", value_to_metric: true"), []string{"wild", "foo123bar456"}, "wild_foo123bar456", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseWith(t, config.Options{}, tc.cfg)
			checkLookups(t, c, "test-domain", []lookupCase{{entries: tc.entries, rpu: 20, unit: "MINUTE", label: tc.label, shared: tc.shared}})
		})
	}
}

func TestPeerConfigMetadata(t *testing.T) {
	c := parseWith(t, config.Options{}, `
domain: test-domain
descriptors:
  - {key: key1, value: value1, descriptors: [
      {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}, metadata: {name: service_1}},
      {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}}]}
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}, metadata: {service_with_quota: {name: service_2}}}
`)
	dom := c.Domain("test-domain")
	r := config.Lookup(dom, d("key1", "value1", "subkey1", "something")).Rule
	if r.RequestsPerUnit != 5 || r.Metadata.GetFields()["name"].GetStringValue() != "service_1" {
		t.Fatalf("key1_value1.subkey1: %+v", r)
	}
	r = config.Lookup(dom, d("key2", "something")).Rule
	if r.RequestsPerUnit != 20 || r.Metadata.GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue() != "service_2" {
		t.Fatalf("key2: %+v", r)
	}
	if r := config.Lookup(dom, d("key1", "value1", "subkey1", "subvalue1")).Rule; r.Metadata != nil {
		t.Fatalf("no metadata: %v", r.Metadata)
	}
}
