package redistest_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"

	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// TestStandaloneTLS: a redis-server with a TLS port, certificates made by
// the test: a client trusting the CA and presenting a certificate it signed
// gets in; one without a certificate, or not trusting the CA, does not.
func TestStandaloneTLS(t *testing.T) {
	ca := redistest.NewCA(t, "redis")
	cert, key := ca.Issue("localhost", "127.0.0.1")
	srv := redistest.StandaloneTLS(t, redistest.TLSFiles{Cert: cert, Key: key, CA: ca.Cert, AuthClients: true})
	pool := x509.NewCertPool()
	b, err := os.ReadFile(ca.Cert)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(b)
	ccert, ckey := ca.Issue("client")
	kp, err := tls.LoadX509KeyPair(ccert, ckey)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.PingTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{kp}}); err != nil {
		t.Fatalf("a client with a certificate of the CA: %v", err)
	}
	if err := srv.PingTLS(&tls.Config{RootCAs: pool}); err == nil {
		t.Fatal("a client without a certificate got in")
	}
	if err := srv.PingTLS(&tls.Config{Certificates: []tls.Certificate{kp}}); err == nil {
		t.Fatal("a client that does not trust the CA got in")
	}
}

// TestStandaloneWithPassword: a server started with --requirepass is ready
// when it answers, asking for the password.
func TestStandaloneWithPassword(t *testing.T) {
	srv := redistest.Standalone(t, "--requirepass", "s3cret")
	c := srv.Client()
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Fatalf("a PING without the password: %v", err)
	}
	if err := c.Do(context.Background(), "AUTH", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
}
