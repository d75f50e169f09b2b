package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// XDSOptions configure the xDS configuration source (CONFIG_TYPE=GRPC_XDS_SOTW
// of envoyproxy/ratelimit): with Server set, the rules come from an xDS
// management server, state of the world over ADS, as
// ratelimit.config.ratelimit.v3.RateLimitConfig resources (one domain
// each), instead of files. Each update is parsed as a whole, as files
// are, ACKed when it is put in force and NACKed with the errors when not
// (the rules in force then stay). Until the first update the service
// answers Unavailable, /readyz and /healthcheck fail; with ForceStart it
// starts with no rules (unknown domains answer OK).
type XDSOptions struct {
	Server       string // host:port of the management server (CONFIG_GRPC_XDS_SERVER_URL)
	NodeID       string // the node id snapshots are kept under (CONFIG_GRPC_XDS_NODE_ID; default "default")
	NodeMetadata string // key=value (or key:value) pairs, comma-separated (CONFIG_GRPC_XDS_NODE_METADATA)
	// RetryInterval is the wait between connection attempts (default 3s).
	RetryInterval time.Duration
	// TLS connects over TLS, trusting TLSCA (the system's roots when
	// empty), presenting TLSCert and TLSKey when given.
	TLS                    bool
	TLSCA, TLSCert, TLSKey string
	ForceStart             bool // FORCE_START_WITHOUT_INITIAL_CONFIG
}

func (o XDSOptions) node() *core.Node {
	md := map[string]*structpb.Value{}
	for _, kv := range strings.Split(o.NodeMetadata, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			k, v, ok = strings.Cut(kv, ":")
		}
		if ok && k != "" {
			md[k] = structpb.NewStringValue(v)
		}
	}
	id := o.NodeID
	if id == "" {
		id = "default"
	}
	return &core.Node{Id: id, Metadata: &structpb.Struct{Fields: md}}
}

func (o XDSOptions) creds() (grpc.DialOption, error) {
	if !o.TLS {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.TLSCA != "" {
		pool := x509.NewCertPool()
		if err := appendPEM(pool, o.TLSCA); err != nil {
			return nil, fmt.Errorf("xDS server CA: %w", err)
		}
		c.RootCAs = pool
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, errors.New("xDS TLS: give both the client certificate and its key, or neither")
	}
	if o.TLSCert != "" {
		kp, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("xDS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(c)), nil
}

// watchXDS follows the management server until ctx ends, reconnecting
// after RetryInterval whenever the stream breaks.
func (s *Server) watchXDS(ctx context.Context) {
	o := s.opts.XDS
	every := o.RetryInterval
	if every <= 0 {
		every = 3 * time.Second
	}
	for {
		err := s.followXDS(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("xDS configuration stream broken; reconnecting", "server", o.Server, "after", every.String(), "error", errString(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// followXDS holds one ADS stream: each response is put in force and ACKed,
// or NACKed with the reason.
func (s *Server) followXDS(ctx context.Context) error {
	creds, err := s.opts.XDS.creds()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(s.opts.XDS.Server, creds)
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ads := sotw.NewADSClient(sctx, s.opts.XDS.node(), resource.RateLimitConfigType)
	if err := ads.InitConnect(conn); err != nil {
		return err
	}
	for {
		resp, err := ads.Fetch()
		if err != nil {
			return err
		}
		if err := s.applyXDS(sctx, resp.Resources); err != nil {
			s.reloadFailed(err)
			if nerr := ads.Nack(err.Error()); nerr != nil {
				return nerr
			}
			continue
		}
		if err := ads.Ack(); err != nil {
			return err
		}
	}
}

// applyXDS puts the configuration of an xDS response in force, within the
// configuration bounds (--max-rules), giving up when ctx ends.
func (s *Server) applyXDS(ctx context.Context, res []*anypb.Any) error {
	srcs, err := xdsSources(res)
	if err != nil {
		return err
	}
	cfg, err := config.ParseContext(ctx, s.parseOptions(), srcs...)
	if err != nil {
		return err
	}
	s.warnings(cfg)
	if err := s.svc.Apply(cfg); err != nil {
		return err
	}
	s.lastErr = ""
	s.svc.ReloadResult(nil)
	s.setServing()
	s.log.Info("configuration received from xDS", "domains", cfg.Domains(), "rules", len(cfg.Rules), "resources", names(srcs))
	return nil
}

// xdsSources turns RateLimitConfig resources into configuration files,
// sorted by name, named "xds:<name>", so that one parser reads files and
// xDS alike (and its errors name the resource).
func xdsSources(res []*anypb.Any) ([]config.Source, error) {
	srcs := make([]config.Source, 0, len(res))
	for _, a := range res {
		var c rlsconf.RateLimitConfig
		if err := a.UnmarshalTo(&c); err != nil {
			return nil, fmt.Errorf("xDS resource %s: %w", a.GetTypeUrl(), err)
		}
		root := map[string]any{"domain": c.GetDomain()}
		if ds := xdsDescriptors(c.GetDescriptors()); len(ds) > 0 {
			root["descriptors"] = ds
		}
		b, err := yaml.Marshal(root)
		if err != nil {
			return nil, err
		}
		name := c.GetName()
		if name == "" {
			name = c.GetDomain()
		}
		srcs = append(srcs, config.Source{Name: "xds:" + name, Data: b})
	}
	if len(srcs) == 0 {
		return nil, errors.New("the xDS response holds no RateLimitConfig")
	}
	sort.Slice(srcs, func(i, j int) bool { return srcs[i].Name < srcs[j].Name })
	return srcs, nil
}

func xdsDescriptors(ds []*rlsconf.RateLimitDescriptor) []any {
	out := make([]any, 0, len(ds))
	for _, d := range ds {
		m := map[string]any{"key": d.GetKey()}
		if d.GetValue() != "" {
			m["value"] = d.GetValue()
		}
		if d.GetShadowMode() {
			m["shadow_mode"] = true
		}
		if d.GetDetailedMetric() {
			m["detailed_metric"] = true
		}
		if p := d.GetRateLimit(); p != nil {
			rl := map[string]any{}
			if p.GetUnlimited() {
				rl["unlimited"] = true
			} else {
				rl["requests_per_unit"] = p.GetRequestsPerUnit()
			}
			if p.GetUnit() != rlsconf.RateLimitUnit_UNKNOWN {
				rl["unit"] = p.GetUnit().String()
			}
			if p.GetName() != "" {
				rl["name"] = p.GetName()
			}
			if len(p.GetReplaces()) > 0 {
				var rs []any
				for _, r := range p.GetReplaces() {
					rs = append(rs, map[string]any{"name": r.GetName()})
				}
				rl["replaces"] = rs
			}
			m["rate_limit"] = rl
		}
		if sub := xdsDescriptors(d.GetDescriptors()); len(sub) > 0 {
			m["descriptors"] = sub
		}
		out = append(out, m)
	}
	return out
}
