package main

import (
	"errors"
	"flag"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/service"
)

// boundFlags declares the flags of what one client, call or configuration
// may cost ratelimitd (server.Bounds), of where the metrics are served,
// and of gRPC reflection.
func boundFlags(fs *flag.FlagSet, o *server.Options) {
	b := &o.Bounds
	fs.StringVar(&o.MetricsAddr, "metrics", "", "serve /metrics (and /healthz, /readyz, /healthcheck) on this `address` instead of --http's")
	fs.BoolVar(&o.GRPCReflection, "grpc-reflection", false, "register gRPC server reflection, so that grpcurl calls the service without its protos")
	fs.IntVar(&b.MaxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "descriptors one call may hold; more is InvalidArgument (HTTP 400)")
	fs.IntVar(&b.MaxEntries, "max-entries", service.DefaultMaxEntries, "entries one descriptor may hold; more is InvalidArgument (HTTP 400)")
	fs.IntVar(&b.MaxRules, "max-rules", config.DefaultMaxRules, "rules the configuration may hold, YAML aliases expanded (and 5 times as many descriptors); more is refused at load and reload")
	fs.IntVar(&b.MaxRuleLabels, "max-rule-labels", service.DefaultMaxRuleLabels, "rule labels requests may make in the metrics (limit overrides, detailed_metric, value_to_metric); beyond, decisions count under rule=\"_other\"")
	fs.IntVar(&b.MaxConns, "max-conns", 0, "connections each listener holds at once, more wait in the kernel's queue (0: what RLIMIT_NOFILE leaves after Redis's pool and 64 spare, shared by the listeners)")
	fs.DurationVar(&b.HTTPTimeout, "http-timeout", server.DefaultHTTPTimeout, "bound on reading an HTTP request and writing its response, and on a gRPC connection's handshake")
	fs.DurationVar(&b.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "how long an HTTP keep-alive or a gRPC connection may idle before it is closed")
}

// checkBounds reports a bound flag out of range.
func checkBounds(b server.Bounds) error {
	if b.MaxDescriptors < 1 || b.MaxEntries < 1 || b.MaxRuleLabels < 1 || b.MaxRules < 1 || b.MaxConns < 0 {
		return errors.New("--max-descriptors, --max-entries, --max-rule-labels and --max-rules must be >= 1, --max-conns >= 0")
	}
	if b.HTTPTimeout <= 0 || b.IdleTimeout <= 0 {
		return errors.New("--http-timeout and --idle-timeout must be > 0")
	}
	return nil
}
