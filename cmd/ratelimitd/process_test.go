package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
