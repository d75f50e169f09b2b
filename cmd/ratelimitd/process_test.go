package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// syncBuffer is a bytes.Buffer safe for a process writing and a test
// reading.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a ratelimitd process of a test.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan error
}

// startProc runs the binary with args (and env added to the test's); the
// process is killed at the end of the test if still running, and its
// stderr printed if the test failed.
func startProc(t *testing.T, args []string, env ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary(t), args...), stderr: &syncBuffer{}, exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// waitExit waits for the process to exit within d and returns its error.
func (p *proc) waitExit(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err // for the cleanup
		return err
	case <-time.After(d):
		t.Fatalf("still running after %v", d)
		return nil
	}
}

// waitReady polls /readyz until it answers 200.
func waitReady(t *testing.T, httpAddr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// jsonLogs parses every line of a process's stderr as a JSON log record,
// failing the test on a line that is not one.
func jsonLogs(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Errorf("a log line that is not JSON: %q", sc.Text())
			continue
		}
		out = append(out, rec)
	}
	return out
}

// bomb is a YAML alias bomb: levels anchored lists of width descriptors,
// each aliasing the list before; 8 and 8 make 16.8 million rules.
func bomb(levels, width int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for l := 1; l <= levels; l++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &L%d\n", l, l)
		for w := range width {
			if l == 1 {
				fmt.Fprintf(&b, "      - {key: k%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", w)
			} else {
				fmt.Fprintf(&b, "      - {key: k%d, descriptors: *L%d}\n", w, l-1)
			}
		}
	}
	return b.String()
}

// H2: SIGTERM while a huge configuration is read, at startup or in a hot
// reload, ends the process at once, exit 0. Before: the parse ran to its
// end (348s for the bomb) with SIGTERM ignored. --max-rules is raised
// here so that the parse is long; by default the bomb is refused within
// a second.
func TestSIGTERMDuringParse(t *testing.T) {
	t.Run("startup", func(t *testing.T) {
		p := startProc(t, []string{"--config", writeConfig(t, bomb(8, 8)), "--max-rules", "1000000000",
			"--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"})
		time.Sleep(time.Second) // well into the parse
		must(t, p.cmd.Process.Signal(syscall.SIGTERM))
		if err := p.waitExit(t, 10*time.Second); err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
		if !strings.Contains(p.stderr.String(), `"msg":"stopped before serving"`) {
			t.Errorf("no log of the stop:\n%s", p.stderr.String())
		}
		jsonLogs(t, p.stderr.String())
	})
	t.Run("reload", func(t *testing.T) {
		cfg := writeConfig(t, goodConfig)
		httpAddr := freeAddr(t)
		p := startProc(t, []string{"--config", cfg, "--max-rules", "1000000000", "--watch-interval", "50ms",
			"--grpc", "127.0.0.1:0", "--http", httpAddr})
		waitReady(t, httpAddr)
		must(t, os.WriteFile(cfg, []byte(bomb(8, 8)), 0o644))
		time.Sleep(time.Second) // the watcher is well into the parse
		must(t, p.cmd.Process.Signal(syscall.SIGTERM))
		if err := p.waitExit(t, 10*time.Second); err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
		if !strings.Contains(p.stderr.String(), `"msg":"stopped"`) {
			t.Errorf("no log of the stop:\n%s", p.stderr.String())
		}
		jsonLogs(t, p.stderr.String())
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// H3: slow clients on the HTTP port, more than it may hold, in a process
// of 256 file descriptors: gRPC still answers, Redis still gets its
// connections, the metrics listener still answers, and the slow clients
// are cut after --http-timeout. Before: about 20,000 slow connections
// exhausted the descriptors (accept4: too many open files) and both HTTP
// and gRPC stopped accepting; 3,000 slowloris connections were none
// closed after 40s.
func TestSlowClients(t *testing.T) {
	redis := redistest.Standalone(t)
	cfg := writeConfig(t, "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: minute, requests_per_unit: 1000000, mode: exact, failure_mode: closed}\n")
	grpcAddr, httpAddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	p := startProcLimited(t, 256, []string{"--config", cfg, "--redis", redis.Addr(), "--redis-pool-size", "16",
		"--grpc", grpcAddr, "--http", httpAddr, "--metrics", metricsAddr, "--http-timeout", "1s", "--prefix", "slow"})
	waitReady(t, metricsAddr)
	// (256 - 16 for Redis - 64 spare) / 3 listeners = 58 connections each
	if !strings.Contains(p.stderr.String(), `"max_conns_per_listener":58`) {
		t.Fatalf("connection bound not derived from RLIMIT_NOFILE 256:\n%s", p.stderr.String())
	}
	const slow = 300
	conns := make([]net.Conn, 0, slow)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range slow {
		c, err := net.DialTimeout("tcp", httpAddr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		// headers, then a body that never comes
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
		conns = append(conns, c)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	defer conn.Close()
	rls := pb.NewRateLimitServiceClient(conn)
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := range 32 { // exact rules on new keys, concurrently: Redis needs its connections
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := rls.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "x", Value: fmt.Sprint("k", i, time.Now().UnixNano())}}}}})
			switch {
			case err != nil:
				t.Errorf("gRPC with the HTTP port full of slow clients: %v", err)
			case r.OverallCode != pb.RateLimitResponse_OK:
				t.Errorf("an exact rule failing closed answered %v: Redis unreachable", r.OverallCode)
			default:
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	resp, err := http.Get("http://" + metricsAddr + "/readyz")
	if err != nil {
		t.Fatalf("/readyz on the metrics listener: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz on the metrics listener: %s", resp.Status)
	}
	// every slow client is cut: the server answers or closes
	start := time.Now()
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("slow client %d not cut after %v: %v", i, time.Since(start), err)
		}
	}
	t.Logf("%d of 32 gRPC calls answered; the %d slow clients cut within %v", answered.Load(), slow, time.Since(start))
	body := `{"domain":"d","descriptors":[{"entries":[{"key":"x","value":"after"}]}]}`
	resp, err = http.Post("http://"+httpAddr+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("/v1/check after the slow clients: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/v1/check after the slow clients: %s", resp.Status)
	}
	must(t, p.cmd.Process.Signal(syscall.SIGTERM))
	if err := p.waitExit(t, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	logs := p.stderr.String()
	if strings.Contains(logs, "too many open files") {
		t.Errorf("ran out of file descriptors:\n%s", logs)
	}
	jsonLogs(t, logs)
}

// startProcLimited is startProc in a shell that first lowers RLIMIT_NOFILE
// (soft and hard) to nofile.
func startProcLimited(t *testing.T, nofile int, args []string, env ...string) *proc {
	t.Helper()
	sh := []string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile), binary(t)}
	p := &proc{cmd: exec.Command("bash", append(sh, args...)...), stderr: &syncBuffer{}, exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// A wrong --redis: the startup says so with the dial error, /readyz gives
// the dial error (not "context deadline exceeded"), decisions follow the
// failure modes, and every log line, go-redis's included, is JSON.
// Before: "serving" with no warning, 25 plain-text "failed to dial" lines
// from go-redis, and /readyz "redis unreachable: context deadline
// exceeded".
func TestWrongRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	dead := l.Addr().String()
	l.Close() // nothing listens there now: connection refused
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	p := startProc(t, []string{"--config", writeConfig(t, goodConfig), "--redis", dead, "--grpc", grpcAddr, "--http", httpAddr, "--timeout", "100ms"})
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %v %q", err, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(body, "redis unreachable: dial tcp "+dead) || !strings.Contains(body, "connection refused") {
		t.Errorf("/readyz says %q, want the dial error", body)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil || len(r.Statuses) != 1 {
		t.Errorf("a decision with Redis unreachable: %v %v", r, err)
	}
	must(t, p.cmd.Process.Signal(syscall.SIGTERM))
	if err := p.waitExit(t, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	var startup, fromRedis bool
	for _, rec := range jsonLogs(t, p.stderr.String()) {
		msg, _ := rec["msg"].(string)
		errText, _ := rec["error"].(string)
		if strings.HasPrefix(msg, "redis does not answer at startup") && strings.Contains(errText, "connection refused") && rec["level"] == "WARN" {
			startup = true
		}
		if rec["from"] == "go-redis" {
			fromRedis = true
		}
	}
	if !startup {
		t.Errorf("no startup warning with the dial error:\n%s", p.stderr.String())
	}
	if !fromRedis {
		t.Logf("go-redis logged nothing this time")
	}
}
