package server

import (
	"time"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

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
	// MaxConns bounds the connections each listener (gRPC, HTTP, metrics)
	// holds at once; more wait in the kernel's accept queue, using no
	// file descriptor of the process. 0: what RLIMIT_NOFILE leaves once
	// Redis's pool and 64 spare are set aside, shared by the listeners, so
	// that slow clients on one port never starve another port, or Redis,
	// of file descriptors.
	MaxConns int
	// HTTPTimeout bounds the time to read a request (headers and body)
	// and to write its response over HTTP, and a gRPC connection's
	// handshake (default DefaultHTTPTimeout); IdleTimeout how long an
	// HTTP keep-alive or gRPC connection may idle (DefaultIdleTimeout).
	HTTPTimeout, IdleTimeout time.Duration
}

func (b Bounds) parseLimits() config.Limits { return config.Limits{MaxRules: b.MaxRules} }
