package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
)

func TestMain(m *testing.M) {
	before := goleak.IgnoreCurrent()
	code := m.Run()
	// the HTTP client's idle keep-alive connections are the tests', not leaks
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(before); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// logBuf collects a daemon's JSON logs; they are printed when the test fails.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// daemon is one ratelimitd running in this process, with its own Redis
// client, limiters and listeners on loopback, and a gRPC client to it.
type daemon struct {
	srv    *server.Server
	conn   *grpc.ClientConn
	rls    pb.RateLimitServiceClient
	logs   *logBuf
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// start runs a daemon on the configuration files or directory cfg against
// the Redis at redisAddr; tweak may change its options.
func start(t testing.TB, redisAddr, cfg string, tweak func(*server.Options)) *daemon {
	t.Helper()
	d := &daemon{logs: &logBuf{}, done: make(chan error, 1)}
	o := server.Options{
		ConfigPaths:   []string{cfg},
		RedisAddrs:    []string{redisAddr},
		GRPCAddr:      "127.0.0.1:0",
		HTTPAddr:      "127.0.0.1:0",
		WatchInterval: 50 * time.Millisecond,
		DrainTimeout:  5 * time.Second,
		Logger:        slog.New(slog.NewJSONHandler(d.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&o)
	}
	srv, err := server.New(o)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	d.srv = srv
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() { d.done <- srv.Run(ctx) }()
	d.conn, err = grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	d.rls = pb.NewRateLimitServiceClient(d.conn)
	t.Cleanup(func() {
		if err := d.stop(); err != nil {
			t.Errorf("daemon stopped with %v", err)
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", d.logs.String())
		}
	})
	return d
}

// stop shuts the daemon down as SIGTERM would and returns Run's error.
func (d *daemon) stop() error {
	d.once.Do(func() {
		d.cancel()
		select {
		case d.err = <-d.done:
		case <-time.After(30 * time.Second):
			d.err = fmt.Errorf("Run did not return 30s after the shutdown began")
		}
		d.conn.Close()
	})
	return d.err
}

// call sends req and fails the test on an error.
func (d *daemon) call(t testing.TB, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := d.rls.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func rq(domain string, ds ...*rlcommon.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, Descriptors: ds}
}

const (
	ok   = pb.RateLimitResponse_OK
	over = pb.RateLimitResponse_OVER_LIMIT
)

// codes returns the overall code and each descriptor's.
func codes(r *pb.RateLimitResponse) string {
	s := r.OverallCode.String() + ":"
	for i, st := range r.Statuses {
		if i > 0 {
			s += ","
		}
		s += st.Code.String()
	}
	return s
}

// writeFile writes content to path atomically (a temporary file renamed
// over it), as editors and config management do.
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// configDir writes each file (name -> content) in a new directory.
func configDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		writeFile(t, filepath.Join(dir, name), content)
	}
	return dir
}

var uniqCounter atomic.Int64

// uniq returns a value no other test uses, for keys that must start fresh.
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano(), uniqCounter.Add(1))
}

// soft collects the failures of one attempt of inOneWindow.
type soft struct{ msgs []string }

func (s *soft) Errorf(format string, args ...any) {
	s.msgs = append(s.msgs, fmt.Sprintf(format, args...))
}

// expect records a failure unless got == want.
func (s *soft) expect(what string, got, want any) {
	if got != want {
		s.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// inOneWindow runs f with a fresh suffix until a run starts and ends in the
// same window of length p (this host's clock, which Redis on loopback
// shares), waiting for a fresh window first when less than need is left.
// f must use the suffix in every key it counts, so that a run that
// straddled a window boundary leaves nothing behind for the next. The
// failures f records count only for a run within one window.
func inOneWindow(t *testing.T, p, need time.Duration, f func(s *soft, suffix string)) {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		if left := p - time.Duration(time.Now().UnixNano()%int64(p)); left < need {
			time.Sleep(left + 10*time.Millisecond)
		}
		start := time.Now().UnixNano() / int64(p)
		s := &soft{}
		f(s, uniq("w"))
		if time.Now().UnixNano()/int64(p) == start {
			for _, m := range s.msgs {
				t.Error(m)
			}
			return
		}
		t.Logf("attempt %d straddled a window boundary of %v; again", attempt, p)
	}
	t.Fatalf("5 attempts straddled a window boundary of %v", p)
}

// scrape reads /metrics and parses it with the Prometheus text parser.
func scrape(t testing.TB, d *daemon) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + d.srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// metric returns the value of the sample of family name whose labels
// include every given name=value pair; found is false when none does.
func metric(fams map[string]*dto.MetricFamily, name string, labels ...string) (v float64, found bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			hit := false
			for _, lp := range m.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					hit = true
				}
			}
			if !hit {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

// httpPost posts body to path on the daemon's HTTP server.
func httpPost(t testing.TB, d *daemon, path, body string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Post("http://"+d.srv.HTTPAddr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func httpGet(t testing.TB, d *daemon, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + d.srv.HTTPAddr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventually polls cond every 20ms until it holds or within passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
