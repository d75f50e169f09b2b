package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/ratelimit/internal/redistest"
)

const goodConfig = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunRejects: bad flags, environment variables and configurations stop
// ratelimitd before it serves, with an error that says what is wrong.
func TestRunRejects(t *testing.T) {
	good := writeConfig(t, goodConfig)
	bad := writeConfig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 2}\n")
	for _, c := range []struct {
		name string
		args []string
		env  [2]string
		want string
	}{
		{"no config", nil, [2]string{}, "no configuration"},
		{"bad config", []string{"--config", bad}, [2]string{}, filepath.Base(bad) + `:4: unit: unknown unit "fortnight"`},
		{"missing config", []string{"--config", bad + ".nope"}, [2]string{}, "no such file"},
		{"bad mode", []string{"--config", good, "--mode", "fast"}, [2]string{}, `--mode: unknown mode "fast"`},
		{"bad algorithm", []string{"--config", good, "--algorithm", "leaky"}, [2]string{}, "--algorithm"},
		{"log without exact", []string{"--config", good, "--algorithm", "sliding_log", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"}, [2]string{}, "cannot be used with mode strict"},
		{"bad failure mode", []string{"--config", good, "--failure-mode", "maybe"}, [2]string{}, "--failure-mode"},
		{"bad deny status", []string{"--config", good, "--deny-status", "200"}, [2]string{}, "--deny-status 200"},
		{"bad timeout", []string{"--config", good, "--timeout", "0s"}, [2]string{}, "--timeout"},
		{"stray argument", []string{"--config", good, "extra"}, [2]string{}, "unexpected arguments"},
		{"bad environment", []string{"--config", good}, [2]string{"RATELIMITD_MODE", "fast"}, `--mode: unknown mode "fast"`},
		{"bad environment value", []string{"--config", good}, [2]string{"RATELIMITD_TIMEOUT", "soon"}, `RATELIMITD_TIMEOUT="soon"`},
		{"flag wins over environment", []string{"--config", good, "--mode", "fast"}, [2]string{"RATELIMITD_MODE", "exact"}, `--mode: unknown mode "fast"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env[0] != "" {
				t.Setenv(c.env[0], c.env[1])
			}
			var stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, c.args, &stderr)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run(%q) = %v, want an error containing %q", c.args, err, c.want)
			}
		})
	}
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "--config") && !strings.Contains(stderr.String(), "-config") {
		t.Fatalf("-h: %v\n%s", err, stderr.String())
	}
	// the library's timeout: 100ms denied under load (docs/failure-modes.md)
	if !strings.Contains(stderr.String(), "never waits longer (default 500ms)") {
		t.Errorf("--timeout's default is not the hybrid's 500ms:\n%s", stderr.String())
	}
}

var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// binary builds ratelimitd once for the tests of this package (with the
// race detector when they run with it) and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "ratelimitd-test")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "ratelimitd")
		build := exec.Command("go", "build", "-o", built.bin, ".")
		if raceEnabled {
			build.Args = append(build.Args[:2], append([]string{"-race"}, build.Args[2:]...)...)
		}
		if out, err := build.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestProcess runs the real binary as Envoy would meet it: flags and
// environment, gRPC and HTTP on loopback, JSON logs, and SIGTERM draining
// it to a clean exit.
func TestProcess(t *testing.T) {
	bin := binary(t)
	redis := redistest.Standalone(t)
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "--config", writeConfig(t, goodConfig), "--grpc", grpcAddr, "--http", httpAddr)
	cmd.Env = append(os.Environ(), "RATELIMITD_REDIS="+redis.Addr(), "RATELIMITD_LOG_LEVEL=debug", "RATELIMITD_PREFIX=proc")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr.String())
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := pb.NewRateLimitServiceClient(conn)
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v" + time.Now().Format("150405.000")}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rls.ShouldRateLimit(ctx, req)
	if err != nil || r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
		t.Fatalf("ShouldRateLimit: %v %v", r, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("still running 20s after SIGTERM")
	}
	msgs := map[string]bool{}
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		var line struct {
			Level, Msg string
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("a log line that is not JSON: %q", sc.Text())
		}
		msgs[line.Msg] = true
	}
	for _, m := range []string{"configuration loaded", "serving", "draining", "drained", "stopped"} {
		if !msgs[m] {
			t.Errorf("no %q in the log", m)
		}
	}
}
