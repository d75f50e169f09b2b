package main

import (
	"errors"
	"flag"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/service"
)

// boundFlags declares the flags of what one client, call or configuration
// may cost ratelimitd (server.Bounds).
func boundFlags(fs *flag.FlagSet, b *server.Bounds) {
	fs.IntVar(&b.MaxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "descriptors one call may hold; more is InvalidArgument (HTTP 400)")
	fs.IntVar(&b.MaxEntries, "max-entries", service.DefaultMaxEntries, "entries one descriptor may hold; more is InvalidArgument (HTTP 400)")
	fs.IntVar(&b.MaxRules, "max-rules", config.DefaultMaxRules, "rules the configuration may hold, YAML aliases expanded (and 5 times as many descriptors); more is refused at load and reload")
	fs.IntVar(&b.MaxRuleLabels, "max-rule-labels", service.DefaultMaxRuleLabels, "rule labels requests may make in the metrics (limit overrides, detailed_metric, value_to_metric); beyond, decisions count under rule=\"_other\"")
}

// checkBounds reports a bound flag out of range.
func checkBounds(b server.Bounds) error {
	if b.MaxDescriptors < 1 || b.MaxEntries < 1 || b.MaxRuleLabels < 1 || b.MaxRules < 1 {
		return errors.New("--max-descriptors, --max-entries, --max-rule-labels and --max-rules must be >= 1")
	}
	return nil
}
