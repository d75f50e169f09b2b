package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

func pool(t *testing.T, files ...string) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	for _, f := range files {
		b, err := os.ReadFile(f)
		must(t, err)
		if !p.AppendCertsFromPEM(b) {
			t.Fatalf("%s: no certificate", f)
		}
	}
	return p
}

// TestRedisTLS: ratelimitd reaches a redis-server that listens for TLS only
// to clients with a certificate of its CA (REDIS_TLS, REDIS_TLS_CACERT,
// REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY), and counts there.
func TestRedisTLS(t *testing.T) {
	ca := redistest.NewCA(t, "redis")
	scert, skey := ca.Issue("localhost", "127.0.0.1")
	rs := redistest.StandaloneTLS(t, redistest.TLSFiles{Cert: scert, Key: skey, CA: ca.Cert, AuthClients: true})
	ccert, ckey := ca.Issue("ratelimitd")
	dir := configDir(t, map[string]string{"c.yaml": compatConfig})
	for _, exact := range []bool{false, true} {
		prefix := uniq("tls")
		d := start(t, rs.TLSAddr(), dir, func(o *server.Options) {
			o.Prefix = prefix
			o.TLS = server.TLSOptions{Redis: true, RedisCA: ca.Cert, RedisCert: ccert, RedisKey: ckey}
			if exact {
				o.Defaults.Mode = config.Exact
			}
		})
		if code, body := httpGet(t, d, "/readyz"); code != 200 {
			t.Fatalf("readyz over TLS: %d %s", code, body)
		}
		r := d.call(t, rq("compat", desc("min", "a")))
		if codes(r) != "OK:OK" || r.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("exact %v: %s %v", exact, codes(r), r.Statuses)
		}
		plain := rs.Client() // the plain port sees what was counted over TLS
		n, err := plain.Keys(context.Background(), prefix+"*").Result()
		plain.Close()
		must(t, err)
		if len(n) == 0 {
			t.Fatalf("exact %v: nothing counted in Redis under %s", exact, prefix)
		}
	}
	// Without the client certificate the server refuses the connection:
	// not ready, and the decisions fall to the failure mode.
	d := start(t, rs.TLSAddr(), dir, func(o *server.Options) {
		o.Prefix = uniq("tls")
		o.TLS = server.TLSOptions{Redis: true, RedisCA: ca.Cert}
	})
	if code, _ := httpGet(t, d, "/readyz"); code != 503 {
		t.Fatalf("readyz without a client certificate: %d", code)
	}
	// A CA that did not sign the server's certificate: not ready either.
	other := redistest.NewCA(t, "other")
	d = start(t, rs.TLSAddr(), dir, func(o *server.Options) {
		o.Prefix = uniq("tls")
		o.TLS = server.TLSOptions{Redis: true, RedisCA: other.Cert, RedisCert: ccert, RedisKey: ckey}
	})
	if code, _ := httpGet(t, d, "/readyz"); code != 503 {
		t.Fatalf("readyz with a CA that did not sign the server's certificate: %d", code)
	}
	// Files that do not load fail the start.
	for _, tc := range []server.TLSOptions{
		{Redis: true, RedisCA: "/nonexistent"},
		{Redis: true, RedisCert: ccert},
		{RedisCA: ca.Cert},
	} {
		if _, err := server.New(server.Options{ConfigPaths: []string{dir}, RedisAddrs: []string{rs.TLSAddr()}, TLS: tc}); err == nil {
			t.Fatalf("%+v: no error", tc)
		}
	}
}

// TestGRPCServerTLS: the gRPC server over TLS with client certificates
// (GRPC_SERVER_USE_TLS, GRPC_CLIENT_TLS_CACERT, GRPC_CLIENT_TLS_SAN), and a
// renewed certificate served without a restart.
func TestGRPCServerTLS(t *testing.T) {
	rs := redistest.Standalone(t)
	ca := redistest.NewCA(t, "rls")
	dir := t.TempDir()
	certFile, keyFile := dir+"/server.pem", dir+"/server-key.pem"
	install := func(c *redistest.CA) {
		cert, key := c.Issue("localhost", "127.0.0.1")
		for src, dst := range map[string]string{cert: certFile, key: keyFile} {
			b, err := os.ReadFile(src)
			must(t, err)
			writeFile(t, dst, string(b))
		}
	}
	install(ca)
	d := start(t, rs.Addr(), configDir(t, map[string]string{"c.yaml": compatConfig}), func(o *server.Options) {
		o.Prefix = uniq("gtls")
		o.TLS = server.TLSOptions{GRPC: true, GRPCCert: certFile, GRPCKey: keyFile, GRPCClientCA: ca.Cert,
			GRPCClientSAN: "envoy.internal", ReloadEvery: 10 * time.Millisecond}
	})
	good, goodKey := ca.Issue("envoy.internal")
	wrong, wrongKey := ca.Issue("someone.else")
	call := func(roots *x509.CertPool, cert, key string) error {
		c := &tls.Config{RootCAs: roots}
		if cert != "" {
			kp, err := tls.LoadX509KeyPair(cert, key)
			must(t, err)
			c.Certificates = []tls.Certificate{kp}
		}
		conn, err := grpc.NewClient(d.srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(c)))
		must(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, rq("compat", desc("min", "x")))
		return err
	}
	if err := call(pool(t, ca.Cert), good, goodKey); err != nil {
		t.Fatalf("a client with the SAN asked for: %v", err)
	}
	if err := call(pool(t, ca.Cert), wrong, wrongKey); err == nil {
		t.Fatal("a client certificate without the SAN got in")
	}
	if err := call(pool(t, ca.Cert), "", ""); err == nil {
		t.Fatal("a client without a certificate got in")
	}
	if _, err := d.rls.ShouldRateLimit(context.Background(), rq("compat", desc("min", "x"))); err == nil {
		t.Fatal("a plaintext client got in")
	}
	// A renewed certificate, from another CA, is served without a restart;
	// a broken file keeps the one served.
	ca2 := redistest.NewCA(t, "rls2")
	if err := call(pool(t, ca2.Cert), good, goodKey); err == nil {
		t.Fatal("WithNewCertFail: a client trusting only the next CA got in before the renewal")
	}
	install(ca2)
	deadline := time.Now().Add(5 * time.Second)
	for call(pool(t, ca2.Cert), good, goodKey) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate was not served")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := call(pool(t, ca.Cert), good, goodKey); err == nil {
		t.Fatal("WithInitialCertFail: the replaced certificate is still served")
	}
	writeFile(t, certFile, "not a certificate")
	time.Sleep(50 * time.Millisecond)
	if err := call(pool(t, ca2.Cert), good, goodKey); err != nil {
		t.Fatalf("a broken certificate file must keep the one served: %v", err)
	}
}
