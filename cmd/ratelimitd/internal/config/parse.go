package config

import (
	"bytes"
	"context"
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
	descriptorFields = set("key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "quota_mode",
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
// found (up to 20), joined; each is an *Error. It is ParseWith with
// Options{Defaults: d}: what envoyproxy/ratelimit loads with a silent
// meaning is read with that meaning and listed in Config.Warnings, within
// the default Limits.
func Parse(d Defaults, srcs ...Source) (*Config, error) {
	return ParseWith(Options{Defaults: d}, srcs...)
}

// ParseWith is Parse with the options o (see Options), with no deadline.
func ParseWith(o Options, srcs ...Source) (*Config, error) {
	return ParseContext(context.Background(), o, srcs...)
}

// ParseContext is ParseWith stopping when ctx ends. Past a bound of
// o.Limits it returns that one *Error; when ctx ends, an error wrapping
// ctx's.
func ParseContext(ctx context.Context, o Options, srcs ...Source) (*Config, error) {
	d := o.Defaults
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
	b := newBudget(ctx, o.Limits)
	for _, src := range srcs {
		p := &parser{file: src.Name, defaults: d, strict: o.Strict, budget: b}
		dom := p.file1(src.Data)
		if b.spent() {
			return nil, b.err
		}
		errs = append(errs, p.errs...)
		slices.SortStableFunc(p.warns, func(a, b *Error) int { return a.Line - b.Line })
		c.Warnings = append(c.Warnings, p.warns...)
		if dom == nil {
			continue
		}
		if prev, ok := c.domains[dom.Name]; ok {
			if !o.MergeDomains {
				errs = append(errs, &Error{File: src.Name, Line: dom.line, Field: "domain",
					Msg: fmt.Sprintf("domain %q is already defined in %s:%d (MERGE_DOMAIN_CONFIG, --merge-domain-config, merges them)", dom.Name, prev.File, prev.line)})
				continue
			}
			if err := prev.merge(dom); err != nil {
				errs = append(errs, err)
				continue
			}
			for _, r := range p.rules {
				r.ID = len(c.Rules)
				c.Rules = append(c.Rules, r)
			}
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
	strict   bool     // Options.Strict: warnings are errors
	warns    []*Error // what was read with envoyproxy/ratelimit's silent meaning
	errs     []error
	rules    []*Rule
	domain   string
	budget   *budget
	aliases  []*yaml.Node // the aliases being expanded, outermost first
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
		if !p.warn(&more, "", "a second YAML document is ignored, as envoyproxy/ratelimit ignores it: put each domain in a file of its own") {
			return nil
		}
	} else if !errors.Is(err, io.EOF) {
		if p.strict {
			p.yamlError(err)
			return nil
		}
		p.warn(nil, "", "what follows the first YAML document is ignored, as envoyproxy/ratelimit ignores it (it does not parse: %v)", err)
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
	alias    *yaml.Node // the alias val came through, if it did
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
			if peerFields[name] && !p.strict {
				p.warn(k, name, "not a field of this block: ignored, as envoyproxy/ratelimit ignores it (fields here: %s)", names(allowed))
				continue
			}
			p.fail(k, name, "unknown field (want one of %s)", names(allowed))
			continue
		}
		if line, dup := seen[name]; dup {
			p.fail(k, name, "repeated field (first on line %d)", line)
			continue
		}
		seen[name] = k.Line
		out = append(out, field{name: name, key: k, val: v, alias: aliasOf(n.Content[i+1])})
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

func aliasOf(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode {
		return n
	}
	return nil
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
	for _, raw := range n.Content {
		item := deref(raw)
		if item.Kind != yaml.MappingNode {
			p.fail(item, "descriptors", "a descriptor must be a mapping with at least a key, got %s", kind(item))
			continue
		}
		p.expanding(aliasOf(raw), func() { p.descriptor(parent, item, path, ident, v2m, seen) })
	}
}

func (p *parser) descriptor(parent *node, n *yaml.Node, path, ident string, v2m bool, seen map[pair]int) {
	if !p.countDescriptor(n) {
		return
	}
	d := &node{line: n.Line}
	d.init()
	var rl, rls, rlsKey, children, childAlias, keyNode, shareNode *yaml.Node
	for _, f := range p.fields(n, descriptorFields) {
		switch f.name {
		case "rate_limits":
			rls, rlsKey = f.val, f.key
		case "key":
			d.key, _ = p.str(f.val, "key")
			keyNode = f.key
		case "value":
			d.value, _ = p.str(f.val, "value")
		case "rate_limit":
			rl = f.val
		case "descriptors":
			children, childAlias = f.val, f.alias
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
			d.metadata = p.metadata(f.val)
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
	switch {
	case rl != nil && !isNull(rl) && rls != nil && !isNull(rls):
		p.fail(rlsKey, "rate_limits", "a descriptor takes rate_limit or rate_limits, not both")
	case rl != nil && !isNull(rl):
		d.rule = p.rateLimit(rl, d, path, ident)
	case rls != nil && !isNull(rls):
		d.rule = p.rateLimits(rls, d, path, ident)
	}
	if d.rule != nil {
		d.rule.ValuesInLabel = d.detailed || v2m
		d.rule.Metadata = d.metadata
	}
	p.expanding(childAlias, func() { p.descriptors(d, children, path, ident, v2m) })
	parent.add(d)
}

// limitNodes are where the fields of one rate_limit block, or of one item
// of a rate_limits list, are, for errors; nil when absent.
type limitNodes struct {
	block                                  *yaml.Node
	unit, rpu, alg, mode, failure, replace *yaml.Node
}

// readLimit reads the fields of a rate_limit block or a rate_limits item
// into r, which holds the defaults.
func (p *parser) readLimit(n *yaml.Node, r *Rule) limitNodes {
	at := limitNodes{block: n}
	for _, f := range p.fields(n, rateLimitFields) {
		switch f.name {
		case "unit":
			at.unit = f.key
			if s, ok := p.str(f.val, "unit"); ok {
				u, valid := ParseUnit(s)
				if !valid {
					p.fail(f.val, "unit", "unknown unit %q (want second, minute, hour, day, week, month or year)", s)
				}
				r.Unit = u
			}
		case "requests_per_unit":
			at.rpu = f.key
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
			at.replace = f.key
			r.Replaces = p.replaces(f.val)
		case "algorithm":
			at.alg = f.val
			if s, ok := p.str(f.val, "algorithm"); ok {
				a, err := ParseAlgorithm(s)
				if err != nil {
					p.fail(f.val, "algorithm", "%v", err)
				}
				r.Algorithm = a
			}
		case "mode":
			at.mode = f.val
			if s, ok := p.str(f.val, "mode"); ok {
				m, err := ParseMode(s)
				if err != nil {
					p.fail(f.val, "mode", "%v", err)
				}
				r.Mode = m
			}
		case "failure_mode":
			at.failure = f.val
			if s, ok := p.str(f.val, "failure_mode"); ok {
				fm, err := ParseFailureMode(s)
				if err != nil {
					p.fail(f.val, "failure_mode", "%v", err)
				}
				r.FailureMode = fm
			}
		}
	}
	return at
}

// checkLimit reports whether r's limit (RequestsPerUnit per Unit, counted
// with Algorithm in Mode) can be enforced, failing with the field at fault
// when not.
func (p *parser) checkLimit(r *Rule, at limitNodes) bool {
	if r.Mode != Exact && !hybridAlgorithm(r.Algorithm) {
		n, fieldName := at.alg, "algorithm"
		if n == nil {
			n, fieldName = at.mode, "mode"
		}
		if n == nil {
			n = at.block
		}
		p.fail(n, fieldName, "algorithm %s needs mode exact (strict and optimistic lease fixed_window, sliding_window, token_bucket or gcra)", AlgorithmName(r.Algorithm))
		return false
	}
	if r.Unlimited || r.RequestsPerUnit == 0 {
		return true
	}
	l := r.Limit()
	// A fixed window takes any uint32 per any unit, in every mode, as
	// envoyproxy/ratelimit does; the algorithms that weigh microseconds
	// of the period need Rate x Period within 2^53 us.
	if err := l.ValidateFor(r.Algorithm); err != nil {
		p.fail(at.rpu, "requests_per_unit", "%d per %s cannot be enforced: %v", r.RequestsPerUnit, strings.ToLower(r.Unit.String()), err)
		return false
	}
	if r.Algorithm == ratelimit.GCRA && int64(l.Period/time.Microsecond) < int64(l.Rate) {
		p.fail(at.rpu, "requests_per_unit", "gcra needs at most one request per microsecond, got %d per %s", r.RequestsPerUnit, strings.ToLower(r.Unit.String()))
		return false
	}
	return true
}

func (p *parser) newRule(n *yaml.Node, d *node, path, ident string) *Rule {
	return &Rule{
		Domain: p.domain, Path: path, Ident: ident, File: p.file, Line: n.Line,
		ShadowMode: d.shadow, QuotaMode: d.quota, DetailedMetric: d.detailed,
		Mode: p.defaults.Mode, Algorithm: p.defaults.Algorithm, FailureMode: p.defaults.FailureMode,
	}
}

func (p *parser) rateLimit(n *yaml.Node, d *node, path, ident string) *Rule {
	if n.Kind != yaml.MappingNode {
		p.fail(n, "rate_limit", "want a mapping, got %s", kind(n))
		return nil
	}
	r := p.newRule(n, d, path, ident)
	before := len(p.errs)
	at := p.readLimit(n, r)
	for _, name := range r.Replaces {
		if name == r.Name {
			p.fail(at.replace, "replaces", "a rule cannot replace itself (name %q)", name)
		}
	}
	switch {
	case r.Unlimited:
		if at.unit != nil && r.Unit != UnitUnknown {
			p.fail(at.unit, "unit", "an unlimited rule takes no unit")
		}
	case at.unit == nil:
		p.fail(n, "unit", "missing (want second, minute, hour, day, week, month or year)")
	case at.rpu == nil:
		p.warn(n, "requests_per_unit", "missing: read as 0, which denies every request, as envoyproxy/ratelimit reads it (write 0 to say so; unlimited: true allows every request)")
	}
	if len(p.errs) > before || !p.checkLimit(r, at) || !p.countRule(n, "rate_limit") {
		return nil
	}
	p.rules = append(p.rules, r)
	return r
}

// rateLimits reads a rate_limits list: several limits on one descriptor,
// decided together by one limiter, so they share one mode and one failure
// mode (given on any item, the same wherever given).
func (p *parser) rateLimits(n *yaml.Node, d *node, path, ident string) *Rule {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		p.fail(n, "rate_limits", "want a list of limits {unit, requests_per_unit, ...}, got %s", kind(n))
		return nil
	}
	if len(n.Content) > ratelimit.MaxLimits {
		p.fail(n, "rate_limits", "%d limits: at most %d on one descriptor", len(n.Content), ratelimit.MaxLimits)
		return nil
	}
	r := p.newRule(n, d, path, ident)
	before := len(p.errs)
	items := make([]Rule, len(n.Content))
	nodes := make([]limitNodes, len(n.Content))
	var modeAt, failureAt *yaml.Node // the first item that names each
	for i, item := range n.Content {
		item = deref(item)
		if item.Kind != yaml.MappingNode {
			p.fail(item, "rate_limits", "a limit must be a mapping {unit, requests_per_unit, ...}, got %s", kind(item))
			continue
		}
		it := &items[i]
		*it = Rule{Mode: r.Mode, Algorithm: r.Algorithm, FailureMode: r.FailureMode, Line: item.Line}
		at := p.readLimit(item, it) // unlimited is read, to be refused clearly
		nodes[i] = at
		switch {
		case it.Unlimited:
			p.fail(item, "unlimited", "a limit of rate_limits cannot be unlimited (write rate_limit: {unlimited: true})")
		case at.unit == nil:
			p.fail(item, "unit", "missing (want second, minute, hour, day, week, month or year)")
		case at.rpu == nil:
			p.fail(item, "requests_per_unit", "missing")
		case it.RequestsPerUnit == 0:
			p.fail(at.rpu, "requests_per_unit", "0 in rate_limits (write rate_limit: {requests_per_unit: 0} to deny every request)")
		}
		if at.mode != nil {
			if modeAt == nil {
				modeAt, r.Mode = at.mode, it.Mode
			} else if it.Mode != r.Mode {
				p.fail(at.mode, "mode", "mode %s, but line %d says %s: the limits of one descriptor are decided together, in one mode", it.Mode, modeAt.Line, r.Mode)
			}
		}
		if at.failure != nil {
			if failureAt == nil {
				failureAt, r.FailureMode = at.failure, it.FailureMode
			} else if it.FailureMode != r.FailureMode {
				p.fail(at.failure, "failure_mode", "failure mode %s, but line %d says %s: the limits of one descriptor are decided together, with one failure mode", it.FailureMode, failureAt.Line, r.FailureMode)
			}
		}
		r.Replaces = append(r.Replaces, it.Replaces...)
	}
	if len(p.errs) > before {
		return nil
	}
	for i := range items {
		it, at := &items[i], nodes[i]
		it.Mode = r.Mode
		if !p.checkLimit(it, at) {
			continue
		}
		for j := range i {
			if items[j].Algorithm == it.Algorithm && items[j].Unit == it.Unit {
				p.fail(at.block, "rate_limits", "a second %s limit per %s (first on line %d): merge them into one", AlgorithmName(it.Algorithm), strings.ToLower(it.Unit.String()), items[j].Line)
				break
			}
		}
		for j := range i {
			if it.Name != "" && items[j].Name == it.Name {
				p.fail(at.block, "name", "the name %q is already given on line %d", it.Name, items[j].Line)
				break
			}
		}
		r.Limits = append(r.Limits, RuleLimit{Name: it.Name, RequestsPerUnit: it.RequestsPerUnit, Unit: it.Unit, Algorithm: it.Algorithm, Line: it.Line})
	}
	for i := range items {
		for _, name := range items[i].Replaces {
			if r.Named(name) {
				p.fail(nodes[i].replace, "replaces", "a rule cannot replace itself (name %q)", name)
			}
		}
	}
	if len(p.errs) > before {
		return nil
	}
	first := r.Limits[0]
	r.Name, r.RequestsPerUnit, r.Unit, r.Algorithm = first.Name, first.RequestsPerUnit, first.Unit, first.Algorithm
	if len(r.Limits) == 1 {
		r.Limits = nil // one limit: as a rate_limit block
	}
	if !p.countRule(n, "rate_limits") {
		return nil
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
