package main

import (
	"errors"
	"flag"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/service"
)

// boundFlags declares the flags of what one client, call or configuration
// may cost ratelimitd (server.Bounds).
func boundFlags(fs *flag.FlagSet, b *server.Bounds) {
	fs.IntVar(&b.MaxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "descriptors one call may hold; more is InvalidArgument (HTTP 400)")
	fs.IntVar(&b.MaxEntries, "max-entries", service.DefaultMaxEntries, "entries one descriptor may hold; more is InvalidArgument (HTTP 400)")
	fs.IntVar(&b.MaxRuleLabels, "max-rule-labels", service.DefaultMaxRuleLabels, "rule labels requests may make in the metrics (limit overrides, detailed_metric, value_to_metric); beyond, decisions count under rule=\"_other\"")
}

// checkBounds reports a bound flag out of range.
func checkBounds(b server.Bounds) error {
	if b.MaxDescriptors < 1 || b.MaxEntries < 1 || b.MaxRuleLabels < 1 {
		return errors.New("--max-descriptors, --max-entries and --max-rule-labels must be >= 1")
	}
	return nil
}
