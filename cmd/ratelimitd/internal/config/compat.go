package config

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Options are how ParseWith reads configuration files.
type Options struct {
	// Defaults are what rules get for the extensions they do not name.
	Defaults
	// Limits bound what loading may cost (alias bombs); the zero value is
	// the default bounds.
	Limits Limits
	// Strict refuses what envoyproxy/ratelimit loads with a silent meaning,
	// which is otherwise read with that meaning and listed in
	// Config.Warnings (each naming file, line and field):
	//   - a rate_limit without requests_per_unit: 0, every request denied;
	//   - a field envoyproxy/ratelimit knows, in a block that does not take
	//     it (shadow_mode inside rate_limit, say): ignored;
	//   - a second YAML document in a file: ignored.
	// A field no block takes is an error either way, as it is for
	// envoyproxy/ratelimit.
	Strict bool
	// MergeDomains lets several files define one domain, their descriptors
	// merged into one tree (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); a
	// descriptor defined in two files is an error. Without it a domain
	// defined twice is an error.
	MergeDomains bool
}

// peerFields are the field names envoyproxy/ratelimit accepts anywhere in a
// file (it checks names, not their places).
var peerFields = set("domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit",
	"unlimited", "shadow_mode", "quota_mode", "name", "replaces", "detailed_metric", "value_to_metric",
	"share_threshold", "metadata")

// warn records what envoyproxy/ratelimit reads with a silent meaning: a
// warning, or with Options.Strict an error. It reports whether parsing goes
// on (false: strict).
func (p *parser) warn(n *yaml.Node, field, format string, args ...any) bool {
	if p.strict {
		p.fail(n, field, format+" (refused with --strict-config)", args...)
		return false
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.warns = append(p.warns, &Error{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
	return true
}

// metadata reads a descriptor's metadata mapping as a protobuf Struct (for
// response dynamic metadata): keys as text, numbers, booleans, strings,
// lists and mappings as they are, timestamps in RFC 3339.
func (p *parser) metadata(n *yaml.Node) *structpb.Struct {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.fail(n, "metadata", "want a mapping, got %s", kind(n))
		return nil
	}
	var v map[string]any
	if err := n.Decode(&v); err != nil {
		p.fail(n, "metadata", "%v", err)
		return nil
	}
	st, err := structpb.NewStruct(plain(v).(map[string]any))
	if err != nil {
		p.fail(n, "metadata", "%v", err)
		return nil
	}
	return st
}

// plain turns what YAML decoded into values structpb takes.
func plain(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = plain(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = plain(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plain(e)
		}
		return out
	case time.Time:
		return x.Format(time.RFC3339Nano)
	}
	return v
}

// merge adds the descriptors of o, the same domain read from another file,
// to d (MergeDomains). A top-level descriptor in both is an error naming
// both places.
func (d *Domain) merge(o *Domain) error {
	var dups []string
	for k, c := range o.root.exact {
		if prev := d.root.exact[k]; prev != nil {
			dups = append(dups, fmt.Sprintf("%s:%d: key: duplicate descriptor key %q value %q (first in %s:%d)", o.File, c.line, k.key, k.value, d.File, prev.line))
		}
	}
	for k, c := range o.root.byKey {
		if prev := d.root.byKey[k]; prev != nil {
			dups = append(dups, fmt.Sprintf("%s:%d: key: duplicate descriptor key %q value \"\" (first in %s:%d)", o.File, c.line, k, d.File, prev.line))
		}
	}
	for _, c := range o.root.wild {
		for _, prev := range d.root.wild {
			if prev.key == c.key && prev.value == c.value {
				dups = append(dups, fmt.Sprintf("%s:%d: key: duplicate descriptor key %q value %q (first in %s:%d)", o.File, c.line, c.key, c.value, d.File, prev.line))
			}
		}
	}
	if len(dups) > 0 {
		sort.Strings(dups)
		return &Error{File: o.File, Line: o.line, Field: "domain", Msg: fmt.Sprintf("domain %q merged with %s: %s", o.Name, d.File, strings.Join(dups, "; "))}
	}
	for k, c := range o.root.exact {
		d.root.exact[k] = c
	}
	for k, c := range o.root.byKey {
		d.root.byKey[k] = c
	}
	d.root.wild = append(d.root.wild, o.root.wild...)
	return nil
}

// Empty returns a Config with no domain: every request is of an unknown
// domain (the start of an xDS source told to serve before its first
// update).
func Empty() *Config { return &Config{domains: map[string]*Domain{}} }
