package server

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Defaults of the connection bounds.
const (
	DefaultHTTPTimeout = 10 * time.Second
	DefaultIdleTimeout = 2 * time.Minute
	// spareFiles are the file descriptors kept for everything but the
	// listeners' connections and Redis's pool: configuration files, /proc
	// reads of the process metrics, the listeners themselves, DNS.
	spareFiles = 64
)

// connBounds returns the connections each listener may hold at once:
// MaxConns when given, else what RLIMIT_NOFILE leaves once Redis's pool
// and spareFiles are set aside, shared by the listeners. It warns when
// the given bound leaves Redis too few.
func (s *Server) connBounds(listeners int) int {
	nofile, known := openFileLimit()
	pool := s.opts.RedisPoolSize
	if pool <= 0 {
		pool = 10 * runtime.GOMAXPROCS(0) // go-redis's default
	}
	reserve := pool*max(1, len(s.opts.RedisAddrs)) + spareFiles
	if s.opts.MaxConns > 0 {
		if known && s.opts.MaxConns*listeners+reserve > nofile {
			s.log.Warn("--max-conns leaves Redis and the configuration files too few file descriptors under RLIMIT_NOFILE: slow clients could starve them",
				"max_conns", s.opts.MaxConns, "listeners", listeners, "rlimit_nofile", nofile, "reserved", reserve)
		}
		return s.opts.MaxConns
	}
	if !known {
		return 10000
	}
	n := (nofile - reserve) / listeners
	if n < 16 {
		s.log.Warn("RLIMIT_NOFILE is too low for the listeners and Redis's pool; raise it (ulimit -n)", "rlimit_nofile", nofile, "reserved", reserve)
		n = 16
	}
	return n
}

// guard bounds the connections of every listener, sets the HTTP servers'
// timeouts, serves the metrics apart when asked, and warns of endpoints
// reachable from other hosts.
func (s *Server) guard() error {
	o := s.opts
	if o.MetricsAddr != "" {
		var err error
		if s.metricsLis, err = net.Listen("tcp", o.MetricsAddr); err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
	}
	listeners := 2
	if s.metricsLis != nil {
		listeners = 3
	}
	n := s.connBounds(listeners)
	s.grpcLis = netutil.LimitListener(s.grpcLis, n)
	s.httpLis = netutil.LimitListener(s.httpLis, n)
	s.http.Handler = s.routes(s.metricsLis == nil)
	s.setTimeouts(s.http)
	if s.metricsLis != nil {
		s.metricsLis = netutil.LimitListener(s.metricsLis, n)
		s.metrics = &http.Server{Handler: s.opsRoutes()}
		s.setTimeouts(s.metrics)
	}
	s.log.Info("connection bounds", "max_conns_per_listener", n, "http_timeout", s.httpTimeout().String(), "idle_timeout", s.idleTimeout().String())
	if public(s.httpLis.Addr()) {
		what := "/v1/check and /metrics"
		if s.metricsLis != nil {
			what = "/v1/check"
		}
		s.log.Warn(what+" are reachable from other hosts: bind --http to a loopback or private address if that is not meant (and --metrics to serve /metrics apart)", "http", s.httpLis.Addr().String())
	}
	if s.metricsLis != nil && public(s.metricsLis.Addr()) {
		s.log.Warn("/metrics is reachable from other hosts: bind --metrics to a loopback or private address if that is not meant", "metrics", s.metricsLis.Addr().String())
	}
	return nil
}

func (s *Server) httpTimeout() time.Duration {
	if s.opts.HTTPTimeout > 0 {
		return s.opts.HTTPTimeout
	}
	return DefaultHTTPTimeout
}

func (s *Server) idleTimeout() time.Duration {
	if s.opts.IdleTimeout > 0 {
		return s.opts.IdleTimeout
	}
	return DefaultIdleTimeout
}

// setTimeouts bounds how long a client may take to send a request and to
// read its response, and how long a keep-alive connection may idle; the
// server's own errors go to the JSON log.
func (s *Server) setTimeouts(h *http.Server) {
	t := s.httpTimeout()
	h.ReadHeaderTimeout, h.ReadTimeout, h.WriteTimeout, h.IdleTimeout = t, t, t+s.opts.Timeout, s.idleTimeout()
	h.MaxHeaderBytes = 64 << 10
	h.ErrorLog = slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)
}

// grpcBounds are the gRPC server's options of the connection bounds: a
// connection must finish its handshake within the HTTP timeout and is
// closed after idling (no call) for the idle timeout.
func (s *Server) grpcBounds() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(s.httpTimeout()),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.idleTimeout()}),
	}
}

// opsRoutes are the endpoints of the metrics listener.
func (s *Server) opsRoutes() http.Handler {
	mux := http.NewServeMux()
	s.addOps(mux, true)
	return mux
}

// public reports whether a listener's address is reachable from other
// hosts: any address but a loopback one.
func public(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return !strings.HasPrefix(a.String(), "127.")
	}
	return !ta.IP.IsLoopback()
}
