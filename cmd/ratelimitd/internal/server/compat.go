package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// PeerHealthService is the gRPC health service name envoyproxy/ratelimit
// reports under, which its deployments' health checks ask for; ratelimitd
// answers it as it answers the overall status ("") and
// envoy.service.ratelimit.v3.RateLimitService.
const PeerHealthService = "ratelimit"

// parseOptions are how the configuration is read, from files or xDS: with
// the peer's settings and within the bounds.
func (s *Server) parseOptions() config.Options {
	return config.Options{Defaults: s.opts.Defaults, Strict: s.opts.StrictConfig, MergeDomains: s.opts.MergeDomains,
		Limits: s.opts.parseLimits()}
}

// warnings logs what a configuration load read with envoyproxy/ratelimit's
// silent meaning, or changed to enforce it, one line each naming the file,
// line and field.
func (s *Server) warnings(cfg *config.Config) {
	for _, w := range cfg.Warnings {
		s.log.Warn("configuration warning (--strict-config refuses what envoyproxy/ratelimit reads silently)", "at", w.Error())
	}
}

// setServing sets the gRPC health of the service (the overall status "",
// envoy.service.ratelimit.v3.RateLimitService and PeerHealthService) to
// SERVING once rules are in force (from the start, but with xDS before its
// first update), NOT_SERVING before. A shutdown turns it off for good.
func (s *Server) setServing() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.svc.Loaded() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", pb.RateLimitService_ServiceDesc.ServiceName, PeerHealthService} {
		s.health.SetServingStatus(name, st)
	}
}

// healthcheck is envoyproxy/ratelimit's GET /healthcheck: 200 "OK" while
// the service serves (a configuration is loaded and no shutdown began),
// 500 otherwise. It does not wait on Redis; /readyz does.
func (s *Server) healthcheck(w http.ResponseWriter, _ *http.Request) {
	if s.draining.Load() || !s.svc.Loaded() {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "OK")
}

// initialConfig reads the configuration files, or, from xDS, nothing (the
// first update comes once serving) but with ForceStart no rules at all. It
// gives up with ctx's error when ctx ends while the files are parsed.
func (s *Server) initialConfig(ctx context.Context) (*config.Config, []config.Source, error) {
	if s.opts.XDS.Server != "" {
		if len(s.opts.ConfigPaths) > 0 {
			return nil, nil, errors.New("configuration: from xDS or from files, not both")
		}
		if s.opts.XDS.ForceStart {
			return config.Empty(), nil, nil
		}
		return nil, nil, nil
	}
	srcs, err := config.ReadSources(s.opts.ConfigPaths)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration: %w", err)
	}
	cfg, err := config.ParseContext(ctx, s.parseOptions(), srcs...)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration:\n%w", err)
	}
	s.warnings(cfg)
	s.lastHash = hashSources(srcs)
	return cfg, srcs, nil
}
