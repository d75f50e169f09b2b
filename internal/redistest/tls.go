package redistest

import (
	"context"
	"crypto/tls"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TLSFiles are the PEM files of a TLS redis-server: its certificate chain
// and key, and the CA that signs the clients' certificates. With
// AuthClients, a client must present a certificate signed by CA
// (--tls-auth-clients yes); without it, none is asked for.
type TLSFiles struct {
	Cert, Key, CA string
	AuthClients   bool
}

// TLSServer is a redis-server that also listens for TLS: on TLSPort, beside
// the plain Port it is checked and managed through.
type TLSServer struct {
	*Server
	TLSPort int
}

// TLSAddr returns "127.0.0.1:tlsport".
func (s *TLSServer) TLSAddr() string { return "127.0.0.1:" + strconv.Itoa(s.TLSPort) }

// StartTLSServer starts a redis-server on free loopback ports, plain and
// TLS (Debian's redis-server is built with TLS), and waits until it answers
// PING on both. Stop it with Close.
func StartTLSServer(f TLSFiles, opt Options) (*TLSServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	auth := "no"
	if f.AuthClients {
		auth = "yes"
	}
	opt.Args = append(append([]string{}, opt.Args...), "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", f.Cert, "--tls-key-file", f.Key, "--tls-ca-cert-file", f.CA, "--tls-auth-clients", auth)
	s, err := StartServer(opt)
	if err != nil {
		return nil, err
	}
	return &TLSServer{Server: s, TLSPort: port}, nil
}

// StandaloneTLS starts a TLS redis-server for the test (StartTLSServer)
// and stops it (by PID) in t.Cleanup.
func StandaloneTLS(t testing.TB, f TLSFiles, args ...string) *TLSServer {
	t.Helper()
	s, err := StartTLSServer(f, Options{Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TLSClient returns a new client for the server's TLS port with c; the
// caller closes it.
func (s *TLSServer) TLSClient(c *tls.Config) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.TLSAddr(), TLSConfig: c})
}

// PingTLS pings the TLS port with c, within a second.
func (s *TLSServer) PingTLS(c *tls.Config) error {
	cl := s.TLSClient(c)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return cl.Ping(ctx).Err()
}
