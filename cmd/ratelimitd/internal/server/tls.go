package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TLSOptions configure TLS to Redis and on the gRPC server, with the
// settings of envoyproxy/ratelimit (named in each field's comment).
type TLSOptions struct {
	// Redis connects to Redis (every node, Sentinels included) over TLS
	// (REDIS_TLS). RedisCA is the PEM file of the CA that signed the
	// servers' certificates, added to the system's (REDIS_TLS_CACERT);
	// RedisCert and RedisKey a client certificate for servers that ask for
	// one (REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY);
	// RedisSkipHostnameVerification checks the chain but not the name
	// (REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
	Redis                         bool
	RedisCA, RedisCert, RedisKey  string
	RedisSkipHostnameVerification bool

	// GRPC serves the gRPC API over TLS (GRPC_SERVER_USE_TLS) with the
	// certificate chain and key of GRPCCert and GRPCKey
	// (GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY). They are read again when
	// they change (checked at most once per ReloadEvery, at a handshake),
	// so a renewed certificate is served without a restart; a file that
	// does not load keeps the previous certificate, logged.
	GRPC              bool
	GRPCCert, GRPCKey string
	// GRPCClientCA, when set, requires every client to present a
	// certificate signed by it (mTLS; GRPC_CLIENT_TLS_CACERT), and
	// GRPCClientSAN, when set, a certificate valid for that name
	// (GRPC_CLIENT_TLS_SAN: a DNS name or an IP address).
	GRPCClientCA, GRPCClientSAN string
	// ReloadEvery bounds how often the server certificate files are
	// checked for a change (default 1s).
	ReloadEvery time.Duration
}

// redisTLS returns the TLS configuration of the Redis client, or nil
// without TLS.
func (o TLSOptions) redisTLS() (*tls.Config, error) {
	if !o.Redis {
		if o.RedisCA != "" || o.RedisCert != "" || o.RedisKey != "" {
			return nil, errors.New("TLS files for Redis given without --redis-tls")
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.RedisCA != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if err := appendPEM(pool, o.RedisCA); err != nil {
			return nil, fmt.Errorf("redis TLS CA: %w", err)
		}
		c.RootCAs = pool
	}
	if (o.RedisCert == "") != (o.RedisKey == "") {
		return nil, errors.New("redis TLS: give both the client certificate and its key, or neither")
	}
	if o.RedisCert != "" {
		kp, err := tls.LoadX509KeyPair(o.RedisCert, o.RedisKey)
		if err != nil {
			return nil, fmt.Errorf("redis TLS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	if o.RedisSkipHostnameVerification {
		// Verify the chain against the roots, not the name.
		c.InsecureSkipVerify = true
		roots := c.RootCAs
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("redis TLS: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return c, nil
}

func appendPEM(pool *x509.CertPool, file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if !pool.AppendCertsFromPEM(b) {
		return fmt.Errorf("%s holds no PEM certificate", file)
	}
	return nil
}

// grpcCreds returns the gRPC server options of TLS (none without it).
func (o TLSOptions) grpcCreds(log *slog.Logger) ([]grpc.ServerOption, error) {
	if !o.GRPC {
		if o.GRPCCert != "" || o.GRPCKey != "" || o.GRPCClientCA != "" || o.GRPCClientSAN != "" {
			return nil, errors.New("gRPC TLS files given without --grpc-server-use-tls")
		}
		return nil, nil
	}
	if o.GRPCCert == "" || o.GRPCKey == "" {
		return nil, errors.New("gRPC TLS needs a certificate and its key (--grpc-server-tls-cert, --grpc-server-tls-key)")
	}
	every := o.ReloadEvery
	if every <= 0 {
		every = time.Second
	}
	r := &certReloader{cert: o.GRPCCert, key: o.GRPCKey, every: every, log: log}
	if err := r.load(); err != nil {
		return nil, fmt.Errorf("gRPC TLS certificate: %w", err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.get}
	if o.GRPCClientCA != "" {
		pool := x509.NewCertPool()
		if err := appendPEM(pool, o.GRPCClientCA); err != nil {
			return nil, fmt.Errorf("gRPC client CA: %w", err)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
		if san := o.GRPCClientSAN; san != "" {
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
					return errors.New("no verified client certificate")
				}
				if err := cs.VerifiedChains[0][0].VerifyHostname(san); err != nil {
					return fmt.Errorf("client certificate: %w", err)
				}
				return nil
			}
		}
	} else if o.GRPCClientSAN != "" {
		return nil, errors.New("--grpc-client-tls-san needs --grpc-client-tls-cacert (the SAN is checked on verified client certificates)")
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(c))}, nil
}

// certReloader serves a certificate and its key from files, read again
// when either file changes (checked at most once per every, at a
// handshake: no goroutine to stop).
type certReloader struct {
	cert, key string
	every     time.Duration
	log       *slog.Logger

	mu      sync.Mutex
	current *tls.Certificate
	seen    []byte // the files' content last loaded or tried
	checked time.Time
}

func (r *certReloader) read() ([]byte, []byte, error) {
	c, err := os.ReadFile(r.cert)
	if err != nil {
		return nil, nil, err
	}
	k, err := os.ReadFile(r.key)
	return c, k, err
}

func (r *certReloader) load() error {
	c, k, err := r.read()
	if err != nil {
		return err
	}
	kp, err := tls.X509KeyPair(c, k)
	if err != nil {
		return err
	}
	r.current, r.seen, r.checked = &kp, append(c, k...), time.Now()
	return nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < r.every {
		return r.current, nil
	}
	r.checked = time.Now()
	c, k, err := r.read()
	if err != nil {
		r.log.Error("cannot read the gRPC TLS certificate; serving the previous one", "error", err.Error())
		return r.current, nil
	}
	both := append(c, k...)
	if bytes.Equal(both, r.seen) {
		return r.current, nil
	}
	r.seen = both
	kp, err := tls.X509KeyPair(c, k)
	if err != nil {
		r.log.Error("the gRPC TLS certificate files changed but do not load; serving the previous certificate", "error", err.Error())
		return r.current, nil
	}
	r.current = &kp
	r.log.Info("gRPC TLS certificate reloaded", "cert", r.cert)
	return r.current, nil
}
