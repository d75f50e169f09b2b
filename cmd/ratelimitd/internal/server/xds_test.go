package server_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// xdsControlPlane is a go-control-plane xDS management server on loopback
// serving RateLimitConfig snapshots, recording the NACKs it receives.
type xdsControlPlane struct {
	addr  string
	cache cachev3.SnapshotCache
	mu    sync.Mutex
	nacks []string
}

func startControlPlane(t *testing.T) *xdsControlPlane {
	t.Helper()
	cp := &xdsControlPlane{cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	srv := xdsserver.NewServer(ctx, cp.cache, xdsserver.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
			if r.ErrorDetail != nil {
				cp.mu.Lock()
				cp.nacks = append(cp.nacks, r.ErrorDetail.Message)
				cp.mu.Unlock()
			}
			return nil
		},
	})
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	cp.addr = lis.Addr().String()
	go gs.Serve(lis)
	t.Cleanup(func() { gs.Stop(); cancel() })
	return cp
}

func (cp *xdsControlPlane) set(t *testing.T, node, version string, cfgs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	must(t, err)
	must(t, cp.cache.SetSnapshot(context.Background(), node, snap))
}

func (cp *xdsControlPlane) nacked() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return len(cp.nacks)
}

func xdsRule(domain, key string, rpu uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: domain + "-config", Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: key, RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu}},
		{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		{Key: "outer", Value: "v", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "inner", ShadowMode: true, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 1, Name: "in"}},
		}},
	}}
}

// TestXDSConfig: CONFIG_TYPE=GRPC_XDS_SOTW: the rules come from a
// go-control-plane management server, updates are put in force and ACKed,
// a configuration that does not parse is NACKed and the rules in force stay.
func TestXDSConfig(t *testing.T) {
	rs := redistest.Standalone(t)
	cp := startControlPlane(t)
	d := start(t, rs.Addr(), "", func(o *server.Options) {
		o.ConfigPaths, o.Prefix = nil, uniq("xds")
		o.XDS = server.XDSOptions{Server: cp.addr, NodeID: "rl-node", RetryInterval: 50 * time.Millisecond}
	})
	// No configuration yet: not ready, not healthy, and Unavailable.
	if code, _ := httpGet(t, d, "/healthcheck"); code != 500 {
		t.Fatalf("/healthcheck before the first xDS update: %d", code)
	}
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		must(t, err)
		return r.Status
	}
	if st := health(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("gRPC health before the first xDS update: %v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := d.rls.ShouldRateLimit(ctx, rq("xds", desc("k", "v")))
	cancel()
	if status.Code(err) != grpccodes.Unavailable {
		t.Fatalf("a decision before the first xDS update: %v", err)
	}
	cp.set(t, "rl-node", "1", xdsRule("xds", "k", 2, rlsconf.RateLimitUnit_MINUTE))
	limitIs := func(n uint32) func() bool {
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			r, err := d.rls.ShouldRateLimit(ctx, rq("xds", desc("k", uniq("v"))))
			return err == nil && r.Statuses[0].CurrentLimit.GetRequestsPerUnit() == n
		}
	}
	eventually(t, 10*time.Second, "the first xDS configuration", limitIs(2))
	if code, body := httpGet(t, d, "/healthcheck"); code != 200 || body != "OK" || health() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("/healthcheck once configured: %d %q", code, body)
	}
	r := d.call(t, rq("xds", desc("free", "x"), desc("outer", "v", "inner", "y")))
	if codes(r) != "OK:OK,OK" || r.Statuses[1].CurrentLimit.GetName() != "in" {
		t.Fatalf("%s %v", codes(r), r.Statuses)
	}
	r = d.call(t, rq("xds", desc("outer", "v", "inner", "y")))
	if codes(r) != "OK:OK" {
		t.Fatalf("shadow_mode from xDS: %s", codes(r))
	}
	// An update is put in force.
	cp.set(t, "rl-node", "2", xdsRule("xds", "k", 7, rlsconf.RateLimitUnit_HOUR), xdsRule("second", "k", 1, rlsconf.RateLimitUnit_SECOND))
	eventually(t, 10*time.Second, "the second xDS configuration", limitIs(7))
	if r := d.call(t, rq("second", desc("k", "a"))); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("second domain: %v", r.Statuses)
	}
	// One that does not parse (a limit without a unit) is NACKed; the
	// rules in force stay.
	bad := xdsRule("xds", "k", 9, rlsconf.RateLimitUnit_UNKNOWN)
	cp.set(t, "rl-node", "3", bad)
	eventually(t, 10*time.Second, "a NACK", func() bool { return cp.nacked() > 0 })
	if !limitIs(7)() {
		t.Fatal("the rules in force changed after a NACKed update")
	}
	if reloads(t, d, "error") < 1 {
		t.Fatal("the failed update is not counted")
	}
}

// TestXDSForceStart: FORCE_START_WITHOUT_INITIAL_CONFIG serves at once,
// every domain unknown (OK, no limit) until the first update.
func TestXDSForceStart(t *testing.T) {
	rs := redistest.Standalone(t)
	cp := startControlPlane(t)
	d := start(t, rs.Addr(), "", func(o *server.Options) {
		o.ConfigPaths, o.Prefix = nil, uniq("xdsf")
		o.XDS = server.XDSOptions{Server: cp.addr, NodeID: "n", ForceStart: true, RetryInterval: 50 * time.Millisecond}
	})
	if r := d.call(t, rq("xds", desc("k", "v"))); codes(r) != "OK:OK" || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("before the first update: %v", r)
	}
	cp.set(t, "n", "1", xdsRule("xds", "k", 1, rlsconf.RateLimitUnit_MINUTE))
	eventually(t, 10*time.Second, "the xDS configuration", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := d.rls.ShouldRateLimit(ctx, rq("xds", desc("k", uniq("v"))))
		return err == nil && r.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 1
	})
}

// TestPeerXDSProvider: the peer's xDS provider cases: an initial
// configuration, an update, several domains, deeper limits, and one domain
// in two resources (refused, NACKed, unless MERGE_DOMAIN_CONFIG).
func TestPeerXDSProvider(t *testing.T) {
	rs := redistest.Standalone(t)
	for _, merge := range []bool{false, true} {
		cp := startControlPlane(t)
		d := start(t, rs.Addr(), "", func(o *server.Options) {
			o.ConfigPaths, o.Prefix, o.MergeDomains = nil, uniq("pxds"), merge
			o.XDS = server.XDSOptions{Server: cp.addr, NodeID: "n", RetryInterval: 50 * time.Millisecond}
		})
		limit := func(domain string, kv ...string) uint32 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			r, err := d.rls.ShouldRateLimit(ctx, rq(domain, desc(kv...)))
			if err != nil {
				return 0
			}
			return r.Statuses[0].CurrentLimit.GetRequestsPerUnit()
		}
		deeper := &rlsconf.RateLimitConfig{Name: "foo", Domain: "foo", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k1", Value: "v1", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 10},
				Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k2"}, {Key: "k2", Value: "v2", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 15}}}},
			{Key: "j1", Value: "v2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "j2"}, {Key: "j2", Value: "v2", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, RequestsPerUnit: 15}}}},
		}}
		bar := &rlsconf.RateLimitConfig{Name: "bar", Domain: "bar", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k1", Value: "v1", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 100}}}}
		cp.set(t, "n", "1", deeper, bar)
		eventually(t, 10*time.Second, "the deeper limits", func() bool { return limit("foo", "k1", "v1", "k2", "v2") == 15 })
		if limit("foo", "k1", "v1") != 10 || limit("foo", "j1", "v2", "j2", "v2") != 15 || limit("bar", "k1", "v1") != 100 || limit("foo", "k1", "v1", "k2", "x") != 0 {
			t.Fatal("limits of the deeper configuration")
		}
		other := &rlsconf.RateLimitConfig{Name: "foo-2", Domain: "foo", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k3", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 7}}}}
		cp.set(t, "n", "2", deeper, other)
		if merge {
			eventually(t, 10*time.Second, "the merged domain", func() bool { return limit("foo", "k3", "x") == 7 })
			if limit("foo", "k1", "v1") != 10 {
				t.Fatal("merging lost the first resource's limits")
			}
			continue
		}
		eventually(t, 10*time.Second, "a NACK of one domain in two resources", func() bool { return cp.nacked() > 0 })
		if limit("bar", "k1", "v1") != 100 || limit("foo", "k3", "x") != 0 {
			t.Fatal("a NACKed update changed the rules in force")
		}
	}
}
