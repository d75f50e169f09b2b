package config

import (
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Domain is one domain's tree of descriptors.
type Domain struct {
	Name string
	File string
	line int
	root node
}

type pair struct{ key, value string }

// node is one descriptor of the tree.
type node struct {
	key, value string
	line       int
	rule       *Rule
	exact      map[pair]*node   // children with a literal value
	byKey      map[string]*node // children with no value
	wild       []*node          // children with a wildcard value, in file order
	parts      []string         // this node's value split at '*', when it is a wildcard

	shadow, quota, detailed, valueToMetric, shareThreshold bool
	metadata                                               *structpb.Struct // of a descriptor with a rule: Rule.Metadata
}

func (n *node) init() {
	n.exact = map[pair]*node{}
	n.byKey = map[string]*node{}
}

func (n *node) leaf() bool { return len(n.exact) == 0 && len(n.byKey) == 0 && len(n.wild) == 0 }

func (n *node) add(c *node) {
	switch {
	case strings.Contains(c.value, "*"):
		c.parts = strings.Split(c.value, "*")
		n.wild = append(n.wild, c)
	case c.value == "":
		n.byKey[c.key] = c
	default:
		n.exact[pair{c.key, c.value}] = c
	}
}

type how uint8

const (
	byValue how = iota + 1
	byWildcard
	byKeyOnly
)

// child finds the child an entry matches: key and value first, then the
// first wildcard that matches, then the key alone.
func (n *node) child(key, value string) (*node, how) {
	if c := n.exact[pair{key, value}]; c != nil {
		return c, byValue
	}
	for _, c := range n.wild {
		if c.key == key && wildcardMatch(c.parts, value) {
			return c, byWildcard
		}
	}
	if c := n.byKey[key]; c != nil {
		return c, byKeyOnly
	}
	return nil, 0
}

// wildcardMatch reports whether s matches the pattern whose literal pieces
// (the pattern split at every '*') are parts; each '*' stands for any run
// of characters, the empty one included.
func wildcardMatch(parts []string, s string) bool {
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := len(parts) - 1
	for _, p := range parts[1:last] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, parts[last])
}

// Entry is what Lookup reads of a request's descriptor entry. The entry
// type of Envoy's protos (go-control-plane) satisfies it.
type Entry interface {
	GetKey() string
	GetValue() string
}

// Match is the outcome of Lookup.
type Match struct {
	// Rule is the rule the descriptor is counted against; nil when none
	// applies.
	Rule *Rule
	// Shared holds, for each entry whose value matched a wildcard marked
	// share_threshold, that wildcard: every value it matches shares one
	// counter. It is nil when no entry did (the common case).
	Shared []string
	// Label names the decision in metrics: Rule.Path, or, when the rule is
	// detailed_metric or a descriptor on its path is value_to_metric, the
	// path with the request's values in it.
	Label string
}

// Lookup finds the rule a request descriptor (its entries, in order) is
// counted against in domain d, with envoyproxy/ratelimit's matching.
// It allocates nothing unless share_threshold or a per-value metric label
// asks for it.
func Lookup[E Entry](d *Domain, entries []E) Match {
	if d == nil || len(entries) == 0 {
		return Match{}
	}
	cur := &d.root
	dynamic, shared := false, false
	var rule *Rule
	for i, e := range entries {
		next, h := cur.child(e.GetKey(), e.GetValue())
		if next == nil {
			return Match{}
		}
		if h == byWildcard && next.shareThreshold {
			shared = true
		}
		if next.valueToMetric && h != byValue {
			dynamic = true
		}
		if i == len(entries)-1 {
			rule = next.rule
		} else if next.leaf() {
			return Match{} // the request is deeper than the configuration
		}
		cur = next
	}
	if rule == nil {
		return Match{}
	}
	m := Match{Rule: rule, Label: rule.Path}
	if shared || dynamic || rule.DetailedMetric {
		m.Shared, m.Label = describe(d, entries, rule.DetailedMetric, shared)
	}
	return m
}

// describe walks the matched path again to build Match.Shared and a label
// holding the request's values.
func describe[E Entry](d *Domain, entries []E, detailed, shared bool) ([]string, string) {
	var out []string
	if shared {
		out = make([]string, len(entries))
	}
	var b strings.Builder
	cur := &d.root
	for i, e := range entries {
		key, value := e.GetKey(), e.GetValue()
		next, h := cur.child(key, value)
		pattern := ""
		if h == byWildcard && next.shareThreshold {
			pattern = next.value
			out[i] = pattern
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(key)
		shown := ""
		switch {
		case pattern != "":
			shown = pattern
		case detailed:
			shown = value
		case h == byValue:
			shown = value
		case next.valueToMetric:
			shown = value
		case h == byWildcard:
			shown = next.value
		}
		if shown != "" {
			b.WriteByte('_')
			b.WriteString(shown)
		}
		cur = next
	}
	return out, b.String()
}
