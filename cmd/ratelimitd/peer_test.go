package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/ratelimit/internal/redistest"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPeerEnvironment: a deployment of envoyproxy/ratelimit moves over with
// its environment: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY,
// REDIS_URL, HOST/PORT, GRPC_HOST/GRPC_PORT, LIMIT_* and LOG_LEVEL are
// read, RATELIMITD_ variables and flags win, settings ratelimitd does not
// have are named in a warning.
func TestPeerEnvironment(t *testing.T) {
	redis := redistest.Standalone(t)
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "d.yaml"), []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	_, gport, _ := net.SplitHostPort(grpcAddr)
	_, hport, _ := net.SplitHostPort(httpAddr)
	for k, v := range map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit",
		"REDIS_URL": redis.Addr(), "REDIS_TYPE": "SINGLE", "REDIS_POOL_SIZE": "4",
		"GRPC_HOST": "127.0.0.1", "GRPC_PORT": gport,
		"HOST": "127.0.0.1", "PORT": "1", // RATELIMITD_HTTP wins
		"RATELIMITD_HTTP":                "127.0.0.1:" + hport,
		"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-Limit",
		"LOG_LEVEL": "DEBUG", "REDIS_PERSECOND": "true", "CACHE_KEY_PREFIX": "pfx_",
	} {
		t.Setenv(k, v)
	}
	logs := &syncBuf{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--prefix", "peerenv"}, logs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no /healthcheck on %s after 30s: %v", httpAddr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(rctx, &pb.RateLimitRequest{Domain: "d",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil || r.OverallCode != pb.RateLimitResponse_OK || len(r.ResponseHeadersToAdd) != 3 || r.ResponseHeadersToAdd[0].Key != "X-Limit" {
		t.Fatalf("ShouldRateLimit on GRPC_HOST:GRPC_PORT: %v %v", r, err)
	}
	l := logs.String()
	for _, want := range []string{"LOG_LEVEL", "read envoyproxy/ratelimit settings from the environment",
		"CACHE_KEY_PREFIX", "GRPC_PORT", "REDIS_URL", "RUNTIME_ROOT", `"setting":"REDIS_PERSECOND"`} {
		if !strings.Contains(l, want) {
			t.Errorf("no %q in the logs", want)
		}
	}
}

// TestPeerEnvironmentRejects: settings of envoyproxy/ratelimit that cannot
// be honoured stop ratelimitd with an error naming them.
func TestPeerEnvironmentRejects(t *testing.T) {
	good := writeConfig(t, goodConfig)
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"memcache", map[string]string{"BACKEND_TYPE": "memcache"}, nil, `BACKEND_TYPE="memcache": only redis`},
		{"sentinel without sentinels", map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster"}, nil, "REDIS_URL"},
		{"unix socket", map[string]string{"REDIS_URL": "/var/run/redis.sock"}, nil, "unix socket"},
		{"bad redis type", map[string]string{"REDIS_TYPE": "RING", "REDIS_URL": "a:1"}, nil, `REDIS_TYPE "RING"`},
		{"bad key layout", nil, []string{"--key-layout", "memcache"}, "--key-layout"},
		{"bad config type", map[string]string{"CONFIG_TYPE": "CONSUL"}, nil, "--config-type"},
		{"xds with files", map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}, nil, "give no --config"},
		{"bad boolean", map[string]string{"REDIS_TLS": "maybe"}, nil, `REDIS_TLS="maybe"`},
		{"tls file without tls", map[string]string{"REDIS_TLS_CACERT": "/ca.pem"}, nil, "without --redis-tls"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			args := append([]string{"--config", good, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"}, c.args...)
			err := run(ctx, args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestKeyLayoutEnvoyMakesExact: with --key-layout envoy the peer's files,
// which name no mode, count in the peer's keys without --mode exact.
func TestKeyLayoutEnvoyMakesExact(t *testing.T) {
	redis := redistest.Standalone(t)
	grpcAddr := freeAddr(t)
	logs := &syncBuf{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", writeConfig(t, goodConfig), "--redis", redis.Addr(), "--grpc", grpcAddr,
			"--http", "127.0.0.1:0", "--key-layout", "envoy", "--cache-key-prefix", "mig_"}, logs)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		_, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(rctx, req)
		rcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := redis.Client()
	defer c.Close()
	keys, err := c.Keys(context.Background(), "mig_d_k_v_*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("the peer's key: %v %v", keys, err)
	}
}
