package config

import (
	"context"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// DefaultMaxRules is the default of Limits.MaxRules.
const DefaultMaxRules = 20000

// descriptorsPerRule bounds the descriptors of a configuration, with its
// YAML aliases expanded, to this many times Limits.MaxRules.
const descriptorsPerRule = 5

// Limits bound what loading a configuration may cost, whatever its files
// hold: YAML aliases are expanded where they are used, so a few lines of
// anchors nested in anchors can stand for millions of descriptors (an
// alias bomb). The zero value of a field is its default.
type Limits struct {
	// MaxRules bounds the rules (rate_limit blocks and rate_limits lists)
	// of all the files together, aliases expanded (default
	// DefaultMaxRules); the descriptors are bounded to 5 times as many.
	// Past either, Parse stops at once with an error naming the file, the
	// line (that of the alias being expanded, when one is) and the bound.
	MaxRules int
}

// budget is what is left of Limits while a configuration is read, shared
// by the files of one Parse. Once spent (or ctx ends), the walk stops.
type budget struct {
	ctx                context.Context
	maxRules, maxDescs int
	rules, descs       int
	err                error
}

func newBudget(ctx context.Context, l Limits) *budget {
	if l.MaxRules <= 0 {
		l.MaxRules = DefaultMaxRules
	}
	return &budget{ctx: ctx, maxRules: l.MaxRules, maxDescs: descriptorsPerRule * l.MaxRules}
}

// spent reports whether the walk must stop.
func (b *budget) spent() bool { return b.err != nil }

// countDescriptor counts one descriptor at n, failing once there are too many
// or the context ended (looked at every 1,024 descriptors).
func (p *parser) countDescriptor(n *yaml.Node) bool {
	b := p.budget
	if b.err != nil {
		return false
	}
	b.descs++
	if b.descs%1024 == 0 {
		if err := b.ctx.Err(); err != nil {
			b.err = fmt.Errorf("reading the configuration stopped at %s:%d: %w", p.file, n.Line, err)
			return false
		}
	}
	if b.descs > b.maxDescs {
		p.overBudget(n, "descriptors", fmt.Sprintf("more than %d descriptors (5 x --max-rules %d)", b.maxDescs, b.maxRules))
		return false
	}
	return true
}

// countRule counts one rule at n, failing once there are too many.
func (p *parser) countRule(n *yaml.Node, field string) bool {
	b := p.budget
	if b.err != nil {
		return false
	}
	b.rules++
	if b.rules > b.maxRules {
		p.overBudget(n, field, fmt.Sprintf("more than %d rules (--max-rules)", b.maxRules))
		return false
	}
	return true
}

// overBudget records the error that stops the walk, at the outermost alias
// being expanded when there is one.
func (p *parser) overBudget(n *yaml.Node, field, what string) {
	if len(p.aliases) > 0 {
		a := p.aliases[0]
		p.budget.err = &Error{File: p.file, Line: a.Line, Field: field, Msg: fmt.Sprintf(
			"the YAML alias *%s expands the configuration to %s: refused as an alias bomb (expand it by hand, or raise --max-rules if this is meant)", a.Value, what)}
		return
	}
	p.budget.err = &Error{File: p.file, Line: n.Line, Field: field, Msg: what + ": raise --max-rules if this is meant"}
}

// expanding runs walk with alias, when not nil, on the stack of aliases
// being expanded.
func (p *parser) expanding(alias *yaml.Node, walk func()) {
	if alias == nil {
		walk()
		return
	}
	p.aliases = append(p.aliases, alias)
	walk()
	p.aliases = p.aliases[:len(p.aliases)-1]
}
