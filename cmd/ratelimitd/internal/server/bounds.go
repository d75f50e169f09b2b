package server

import "github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"

// Bounds are what one client, one call or one configuration may cost
// ratelimitd: each has a flag (see docs/ratelimitd.md) and a default; the
// zero value of a field is its default.
type Bounds struct {
	// MaxDescriptors bounds the descriptors of one call, MaxEntries the
	// entries of one descriptor (service.DefaultMaxDescriptors and
	// service.DefaultMaxEntries): more is InvalidArgument (HTTP 400).
	MaxDescriptors, MaxEntries int
	// MaxRuleLabels bounds the rule labels requests make in the metrics
	// (service.DefaultMaxRuleLabels); beyond, decisions count under
	// rule="_other".
	MaxRuleLabels int
	// MaxRules bounds the rules of the configuration, YAML aliases
	// expanded (config.DefaultMaxRules), and its descriptors to 5 times
	// as many: past either, a load or reload is refused at once.
	MaxRules int
}

func (b Bounds) parseLimits() config.Limits { return config.Limits{MaxRules: b.MaxRules} }
