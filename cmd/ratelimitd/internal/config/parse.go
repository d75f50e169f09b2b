package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/hybridlimit/ratelimit"
)

// Error is a configuration error: where it is and what is wrong.
type Error struct {
	File  string
	Line  int    // 1-based; 0 when the error concerns the whole file
	Field string // the YAML field at fault, "" when none
	Msg   string
}

// Error returns "file:line: field: message".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":")
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// maxErrors bounds the errors Parse reports for one set of files.
const maxErrors = 20

var (
	rootFields       = set("domain", "descriptors")
	descriptorFields = set("key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "metadata")
	rateLimitFields = set("unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "mode", "failure_mode")
	replacesFields = set("name")
)

func set(s ...string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, k := range s {
		m[k] = true
	}
	return m
}

// Parse reads the given files, one domain each, into a Config. Rules that do
// not name an algorithm, mode or failure mode get d's. It returns every error
// found (up to 20), joined; each is an *Error.
func Parse(d Defaults, srcs ...Source) (*Config, error) {
	if len(srcs) == 0 {
		return nil, errors.New("no configuration file")
	}
	if !d.Algorithm.Valid() || !d.FailureMode.Valid() || d.Mode < Strict || d.Mode > Exact {
		return nil, fmt.Errorf("invalid defaults %+v", d)
	}
	if d.Mode != Exact && !hybridAlgorithm(d.Algorithm) {
		return nil, fmt.Errorf("default algorithm %s cannot be used with mode %s (only exact mode takes it: the hybrid leases fixed_window, sliding_window, token_bucket and gcra)", AlgorithmName(d.Algorithm), d.Mode)
	}
	c := &Config{domains: map[string]*Domain{}}
	var errs []error
	for _, src := range srcs {
		p := &parser{file: src.Name, defaults: d}
		dom := p.file1(src.Data)
		errs = append(errs, p.errs...)
		if dom == nil {
			continue
		}
		if prev, ok := c.domains[dom.Name]; ok {
			errs = append(errs, &Error{File: src.Name, Line: dom.line, Field: "domain",
				Msg: fmt.Sprintf("domain %q is already defined in %s:%d", dom.Name, prev.File, prev.line)})
			continue
		}
		c.domains[dom.Name] = dom
		for _, r := range p.rules {
			r.ID = len(c.Rules)
			c.Rules = append(c.Rules, r)
		}
	}
	if len(errs) > maxErrors {
		errs = append(errs[:maxErrors], errors.New("... and more errors"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// hybridAlgorithm reports whether the hybrid limiter (modes strict and
// optimistic) serves a: every algorithm but sliding_log, whose log of
// timestamps cannot be leased in slices.
func hybridAlgorithm(a ratelimit.Algorithm) bool {
	return a.Valid() && a != ratelimit.SlidingLog
}

type parser struct {
	file     string
	defaults Defaults
	errs     []error
	rules    []*Rule
	domain   string
}

func (p *parser) fail(n *yaml.Node, field, format string, args ...any) {
	if len(p.errs) > maxErrors {
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

func (p *parser) file1(data []byte) *Domain {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		p.yamlError(err)
		return nil
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		p.fail(nil, "", "empty file: want a mapping with domain and descriptors")
		return nil
	}
	var more yaml.Node
	if err := dec.Decode(&more); err == nil {
		p.fail(&more, "", "a second YAML document: put each domain in a file of its own")
		return nil
	} else if !errors.Is(err, io.EOF) {
		p.yamlError(err)
		return nil
	}
	root := deref(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		p.fail(root, "", "want a mapping with domain and descriptors, got %s", kind(root))
		return nil
	}
	dom := &Domain{File: p.file, line: root.Line}
	var descs *yaml.Node
	for _, f := range p.fields(root, rootFields) {
		switch f.name {
		case "domain":
			dom.Name, _ = p.str(f.val, "domain")
			dom.line = f.key.Line
		case "descriptors":
			descs = f.val
		}
	}
	if dom.Name == "" {
		p.fail(root, "domain", "a configuration file needs a non-empty domain")
		return nil
	}
	p.domain = dom.Name
	dom.root.init()
	p.descriptors(&dom.root, descs, "", "\x00"+dom.Name, false)
	return dom
}

func (p *parser) yamlError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{File: p.file, Msg: msg}
	if m := yamlLine.FindStringSubmatchIndex(msg); m != nil && m[0] == 0 {
		e.Line, _ = strconv.Atoi(msg[m[2]:m[3]])
		e.Msg = strings.TrimPrefix(msg[m[1]:], ": ")
	}
	p.errs = append(p.errs, e)
}

type field struct {
	name     string
	key, val *yaml.Node
}

// fields returns the fields of mapping n, reporting unknown and repeated ones.
func (p *parser) fields(n *yaml.Node, allowed map[string]bool) []field {
	var out []field
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.fail(k, "", "a field name must be a string, got %s", kind(k))
			continue
		}
		name := k.Value
		if !allowed[name] {
			p.fail(k, name, "unknown field (want one of %s)", names(allowed))
			continue
		}
		if line, dup := seen[name]; dup {
			p.fail(k, name, "repeated field (first on line %d)", line)
			continue
		}
		seen[name] = k.Line
		out = append(out, field{name: name, key: k, val: v})
	}
	return out
}

func names(m map[string]bool) string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}

func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func kind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// str reads a scalar as text, as envoyproxy/ratelimit does (a number or a
// boolean is read as written; null is empty).
func (p *parser) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.fail(n, field, "want a string, got %s", kind(n))
		return "", false
	}
	if isNull(n) {
		return "", true
	}
	return n.Value, true
}

func (p *parser) boolean(n *yaml.Node, field string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.fail(n, field, "want true or false, got %s", kind(n))
		return false
	}
	return b
}

func (p *parser) descriptors(parent *node, n *yaml.Node, path, ident string, v2m bool) {
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, "descriptors", "want a list of descriptors, got %s", kind(n))
		return
	}
	seen := map[pair]int{}
	for _, item := range n.Content {
		item = deref(item)
		if item.Kind != yaml.MappingNode {
			p.fail(item, "descriptors", "a descriptor must be a mapping with at least a key, got %s", kind(item))
			continue
		}
		p.descriptor(parent, item, path, ident, v2m, seen)
	}
}

func (p *parser) descriptor(parent *node, n *yaml.Node, path, ident string, v2m bool, seen map[pair]int) {
	d := &node{line: n.Line}
	d.init()
	var rl, children, keyNode, shareNode *yaml.Node
	for _, f := range p.fields(n, descriptorFields) {
		switch f.name {
		case "key":
			d.key, _ = p.str(f.val, "key")
			keyNode = f.key
		case "value":
			d.value, _ = p.str(f.val, "value")
		case "rate_limit":
			rl = f.val
		case "descriptors":
			children = f.val
		case "shadow_mode":
			d.shadow = p.boolean(f.val, f.name)
		case "quota_mode":
			d.quota = p.boolean(f.val, f.name)
		case "detailed_metric":
			d.detailed = p.boolean(f.val, f.name)
		case "value_to_metric":
			d.valueToMetric = p.boolean(f.val, f.name)
		case "share_threshold":
			d.shareThreshold = p.boolean(f.val, f.name)
			shareNode = f.key
		case "metadata":
			if !isNull(f.val) && f.val.Kind != yaml.MappingNode {
				p.fail(f.val, "metadata", "want a mapping, got %s", kind(f.val))
			}
		}
	}
	if d.shareThreshold && !strings.Contains(d.value, "*") {
		p.fail(shareNode, "share_threshold", "only a wildcard value (holding '*') can share its threshold, got value %q", d.value)
	}
	if d.key == "" {
		at := n
		if keyNode != nil {
			at = keyNode
		}
		p.fail(at, "key", "a descriptor needs a non-empty key")
		return
	}
	k := pair{d.key, d.value}
	if line, dup := seen[k]; dup {
		p.fail(n, "key", "duplicate descriptor key %q value %q (first on line %d)", d.key, d.value, line)
		return
	}
	seen[k] = n.Line
	seg := d.key
	if d.value != "" {
		seg += "_" + d.value
	}
	if path != "" {
		path += "."
	}
	path += seg
	ident += "\x00" + d.key + "\x01" + d.value
	v2m = v2m || d.valueToMetric
	if rl != nil && !isNull(rl) {
		d.rule = p.rateLimit(rl, d, path, ident)
		if d.rule != nil {
			d.rule.ValuesInLabel = d.detailed || v2m
		}
	}
	p.descriptors(d, children, path, ident, v2m)
	parent.add(d)
}

func (p *parser) rateLimit(n *yaml.Node, d *node, path, ident string) *Rule {
	if n.Kind != yaml.MappingNode {
		p.fail(n, "rate_limit", "want a mapping, got %s", kind(n))
		return nil
	}
	r := &Rule{
		Domain: p.domain, Path: path, Ident: ident, File: p.file, Line: n.Line,
		ShadowMode: d.shadow, QuotaMode: d.quota, DetailedMetric: d.detailed,
		Mode: p.defaults.Mode, Algorithm: p.defaults.Algorithm, FailureMode: p.defaults.FailureMode,
	}
	before := len(p.errs)
	var unitNode, rpuNode, algNode, modeNode, replacesNode *yaml.Node
	for _, f := range p.fields(n, rateLimitFields) {
		switch f.name {
		case "unit":
			unitNode = f.key
			if s, ok := p.str(f.val, "unit"); ok {
				u, valid := ParseUnit(s)
				if !valid {
					p.fail(f.val, "unit", "unknown unit %q (want second, minute, hour, day, week, month or year)", s)
				}
				r.Unit = u
			}
		case "requests_per_unit":
			rpuNode = f.key
			var v int64
			if f.val.Kind != yaml.ScalarNode || f.val.Decode(&v) != nil || v < 0 || v > 1<<32-1 {
				p.fail(f.val, "requests_per_unit", "want a whole number from 0 to 4294967295, got %s", kind(f.val))
			}
			r.RequestsPerUnit = uint32(v)
		case "unlimited":
			r.Unlimited = p.boolean(f.val, f.name)
		case "name":
			r.Name, _ = p.str(f.val, "name")
		case "replaces":
			replacesNode = f.key
			r.Replaces = p.replaces(f.val)
		case "algorithm":
			algNode = f.val
			if s, ok := p.str(f.val, "algorithm"); ok {
				a, err := ParseAlgorithm(s)
				if err != nil {
					p.fail(f.val, "algorithm", "%v", err)
				}
				r.Algorithm = a
			}
		case "mode":
			modeNode = f.val
			if s, ok := p.str(f.val, "mode"); ok {
				m, err := ParseMode(s)
				if err != nil {
					p.fail(f.val, "mode", "%v", err)
				}
				r.Mode = m
			}
		case "failure_mode":
			if s, ok := p.str(f.val, "failure_mode"); ok {
				fm, err := ParseFailureMode(s)
				if err != nil {
					p.fail(f.val, "failure_mode", "%v", err)
				}
				r.FailureMode = fm
			}
		}
	}
	for _, name := range r.Replaces {
		if name == r.Name {
			p.fail(replacesNode, "replaces", "a rule cannot replace itself (name %q)", name)
		}
	}
	switch {
	case r.Unlimited:
		if unitNode != nil && r.Unit != UnitUnknown {
			p.fail(unitNode, "unit", "an unlimited rule takes no unit")
		}
	case unitNode == nil:
		p.fail(n, "unit", "missing (want second, minute, hour, day, week, month or year)")
	case rpuNode == nil:
		p.fail(n, "requests_per_unit", "missing (0 denies every request; unlimited: true allows every request)")
	}
	if len(p.errs) > before {
		return nil
	}
	if r.Mode != Exact && !hybridAlgorithm(r.Algorithm) {
		at, fieldName := algNode, "algorithm"
		if at == nil {
			at, fieldName = modeNode, "mode"
		}
		p.fail(at, fieldName, "algorithm %s needs mode exact (strict and optimistic lease fixed_window, sliding_window, token_bucket or gcra)", AlgorithmName(r.Algorithm))
		return nil
	}
	if !r.Unlimited && r.RequestsPerUnit > 0 {
		l := r.Limit()
		if err := l.Validate(); err != nil {
			p.fail(rpuNode, "requests_per_unit", "%d per %s cannot be enforced: %v", r.RequestsPerUnit, strings.ToLower(r.Unit.String()), err)
			return nil
		}
		if r.Algorithm == ratelimit.GCRA && int64(l.Period/time.Microsecond) < int64(l.Rate) {
			p.fail(rpuNode, "requests_per_unit", "gcra needs at most one request per microsecond, got %d per %s", r.RequestsPerUnit, strings.ToLower(r.Unit.String()))
			return nil
		}
	}
	p.rules = append(p.rules, r)
	return r
}

func (p *parser) replaces(n *yaml.Node) []string {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, "replaces", "want a list of {name: ...}, got %s", kind(n))
		return nil
	}
	var out []string
	for _, item := range n.Content {
		item = deref(item)
		if item.Kind != yaml.MappingNode {
			p.fail(item, "replaces", "want {name: ...}, got %s", kind(item))
			continue
		}
		name := ""
		for _, f := range p.fields(item, replacesFields) {
			name, _ = p.str(f.val, "name")
		}
		if name == "" {
			p.fail(item, "replaces", "an entry needs a non-empty name")
			continue
		}
		out = append(out, name)
	}
	return out
}
