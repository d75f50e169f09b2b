package server_test

// Hostile clients and hostile configurations (issue 18): each case
// against a real server and a real redis-server, as the trial that found
// it ran it.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	grpccodes "google.golang.org/grpc/codes"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

const hostileConfig = `
domain: h
descriptors:
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: exact
    rate_limit: {unit: minute, requests_per_unit: 1000, mode: exact}
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 1000, failure_mode: open}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// H4: a call holds at most --max-descriptors descriptors of at most
// --max-entries entries (InvalidArgument, HTTP 400), and its messages at
// most 1 MB; and it waits on Redis about one --timeout whatever it holds.
// Before: 150,000 descriptors in one gRPC call took 48.5s; 64 descriptors
// on 2 keys with Redis stopped waited about 1s (until the hybrid's call
// deadline, 10 timeouts of 100ms, opened its breaker).
func TestHostileWorkPerCall(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"h.yaml": hostileConfig})
	const timeout = 100 * time.Millisecond
	d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Timeout = timeout })
	call := func(descs ...*rlcommon.RateLimitDescriptor) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := d.rls.ShouldRateLimit(ctx, rq("h", descs...))
		return err
	}
	many := func(n int, key string) []*rlcommon.RateLimitDescriptor {
		ds := make([]*rlcommon.RateLimitDescriptor, n)
		for i := range ds {
			ds[i] = desc(key, uniq("v"))
		}
		return ds
	}
	if err := call(many(65, "strict")...); status.Code(err) != grpccodes.InvalidArgument || !strings.Contains(err.Error(), "65 descriptors in one call: at most 64") {
		t.Errorf("65 descriptors: %v", err)
	}
	deep := desc("strict", "x")
	for i := range 16 {
		deep.Entries = append(deep.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: "v"})
	}
	if err := call(deep); status.Code(err) != grpccodes.InvalidArgument || !strings.Contains(err.Error(), "17 entries: at most 16") {
		t.Errorf("17 entries: %v", err)
	}
	if err := call(desc("strict", strings.Repeat("x", 2<<20))); status.Code(err) != grpccodes.ResourceExhausted {
		t.Errorf("a 2 MB message: %v", err)
	}
	body := `{"domain":"h","descriptors":[` + strings.Repeat(`{"entries":[{"key":"strict","value":"x"}]},`, 64) + `{"entries":[{"key":"strict","value":"x"}]}]}`
	if code, resp, _ := httpPost(t, d, "/v1/check", body); code != http.StatusBadRequest || !strings.Contains(resp, "at most 64") {
		t.Errorf("65 descriptors over HTTP: %d %s", code, resp)
	}
	if err := call(many(64, "strict")...); err != nil {
		t.Errorf("64 descriptors: %v", err)
	}

	// Redis stopped: 64 descriptors on 2 keys, each the first time seen
	must(t, redis.Freeze())
	defer redis.Thaw()
	keyA, keyB := uniq("a"), uniq("b")
	descs := make([]*rlcommon.RateLimitDescriptor, 64)
	for i := range descs {
		descs[i] = desc([]string{"strict", "open"}[i%2], []string{keyA, keyB}[i%2])
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	resp, err := d.rls.ShouldRateLimit(ctx, rq("h", descs...))
	cancel()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("64 descriptors with Redis stopped: %v after %v", err, took)
	}
	t.Logf("64 descriptors on 2 keys, Redis stopped, --timeout %v: answered in %v (%s)", timeout, took, codes(resp))
	// Before, the hybrid's call deadline: 1s. The bound leaves a busy host
	// room.
	if took > 5*timeout {
		t.Errorf("took %v, want about one --timeout (%v)", took, timeout)
	}
	for i := 3; i < len(resp.Statuses); i += 2 {
		if resp.Statuses[i].Code.String() != "OK" {
			t.Errorf("descriptor %d of a rule failing open, cut by the deadline: %v", i, resp.Statuses[i].Code)
		}
	}
}

// H1: requests cannot grow the metrics without bound. Before: each limit
// override with a descriptor key never seen made new `rule` series
// (161k calls in 20s made 322k series, a 22 MB /metrics); now at most
// --max-rule-labels (1,000) labels made by requests exist, the rest are
// counted under rule="_other".
func TestHostileMetricLabels(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"h.yaml": hostileConfig})
	d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix = uniq("labels") })
	const calls = 1500
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < calls; i += 8 {
				od := desc(fmt.Sprint("key", i), "v")
				od.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
				dd := desc("detailed", fmt.Sprint("value", i))
				if i%2 == 0 {
					d.call(t, rq("h", od))
				} else {
					d.call(t, rq("h", dd))
				}
			}
		})
	}
	wg.Wait()
	fams := scrape(t, d)
	n := len(fams["ratelimit_decisions_total"].GetMetric())
	folded, _ := metric(fams, "ratelimit_rule_labels_folded_total", "domain", "h")
	labels, _ := metric(fams, "ratelimit_rule_labels")
	other, _ := metric(fams, "ratelimit_decisions_total", "rule", "_other", "result", "ok")
	t.Logf("%d calls, each a new label: %d decision series, %v labels, %v folded", calls, n, labels, folded)
	if labels != 1000 || folded != calls-1000 || other != calls-1000 {
		t.Errorf("labels %v, folded %v, under _other %v; want 1000, %d, %d", labels, folded, other, calls-1000, calls-1000)
	}
	// 4 results per label, the configuration's own 4 rules and _other
	if n > (1000+4+1)*4 {
		t.Errorf("%d decision series for at most 1,005 labels", n)
	}
}

// bomb is a configuration of levels anchored lists of width descriptors,
// each list's descriptors all aliasing the list before: width^levels
// rules in a few lines (8 and 8: 16.8 million in 3 KB).
func bomb(domain string, levels, width int) string {
	var b strings.Builder
	b.WriteString("domain: " + domain + "\ndescriptors:\n")
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

// H2: a YAML alias bomb is refused at once, at startup and through a hot
// reload under load, naming the file and the line of the alias; the rules
// in force stay. Before: 2 KB of anchors loaded as 4.8 million rules in
// 21 GB and 348s (16 lines of it: 74,899 rules, 630 MB, through hot reload
// too).
func TestHostileConfig(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := t.TempDir()
	file := dir + "/h.yaml"
	writeFile(t, file, bomb("h", 8, 8))
	_, err := server.New(server.Options{ConfigPaths: []string{file}, RedisAddrs: []string{redis.Addr()}, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "h.yaml:48: rate_limit: the YAML alias *L4 expands the configuration to more than 20000 rules") {
		t.Fatalf("starting on a bomb: %v", err)
	}

	writeFile(t, file, hostileConfig)
	d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix = uniq("bomb") })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var answered atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if codes(d.call(t, rq("h", desc("strict", uniq("k"))))) == "OK:OK" {
					answered.Add(1)
				}
			}
		})
	}
	writeFile(t, file, bomb("h", 8, 8))
	changed := time.Now()
	eventually(t, 10*time.Second, "the bomb refused", func() bool { return reloads(t, d, "error") == 1 })
	took := time.Since(changed)
	close(stop)
	wg.Wait()
	t.Logf("a bomb written under load: refused within %v; %d calls answered meanwhile", took, answered.Load())
	if !strings.Contains(d.logs.String(), `h.yaml:48: rate_limit: the YAML alias *L4 expands the configuration to more than 20000 rules (--max-rules): refused as an alias bomb`) {
		t.Errorf("the log does not name the alias:\n%s", d.logs.String())
	}
	if v, _ := metric(scrape(t, d), "ratelimit_config_rules"); v != 4 {
		t.Errorf("rules in force after the refused bomb: %v, want the previous 4", v)
	}
	if answered.Load() == 0 {
		t.Error("no call answered while the bomb was refused")
	}
}

// /metrics can be served apart (--metrics), off the HTTP port; an HTTP
// port reachable from other hosts is warned of at startup.
func TestMetricsApart(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"h.yaml": hostileConfig})
	d := start(t, redis.Addr(), dir, func(o *server.Options) { o.MetricsAddr = "127.0.0.1:0" })
	get := func(addr, path string) int {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(d.srv.HTTPAddr(), "/metrics"); got != http.StatusNotFound {
		t.Errorf("/metrics on the HTTP port with --metrics: %d", got)
	}
	for _, p := range []string{"/metrics", "/readyz", "/healthz"} {
		if got := get(d.srv.MetricsAddr(), p); got != http.StatusOK {
			t.Errorf("%s on the metrics port: %d", p, got)
		}
	}
	if got := get(d.srv.HTTPAddr(), "/readyz"); got != http.StatusOK {
		t.Errorf("/readyz on the HTTP port: %d", got)
	}
	if strings.Contains(d.logs.String(), "reachable from other hosts") {
		t.Errorf("a warning for loopback listeners:\n%s", d.logs.String())
	}
	open := start(t, redis.Addr(), dir, func(o *server.Options) { o.HTTPAddr = ":0" })
	if !strings.Contains(open.logs.String(), `"msg":"/v1/check and /metrics are reachable from other hosts`) {
		t.Errorf("no warning for an HTTP port on every interface:\n%s", open.logs.String())
	}
}

// A full Redis (maxmemory with noeviction) answers PING but refuses every
// write, so it serves no limiter: every limiter is reported degraded,
// /readyz says so with Redis's own error, and the log says it once, not
// "redis reachable again" at every probe. Before: the breaker flapped 16
// times in 16s logging "redis reachable again" while every write failed;
// ratelimit_degraded read 0 and /readyz answered 200 throughout.
func TestFullRedis(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"h.yaml": hostileConfig})
	d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix = uniq("oom"); o.Timeout = 100 * time.Millisecond })
	d.call(t, rq("h", desc("strict", "a"), desc("exact", "a"), desc("open", "a")))
	degraded := func() (n, ones int) {
		f := scrape(t, d)["ratelimit_degraded"]
		for _, m := range f.GetMetric() {
			n++
			if m.GetGauge().GetValue() == 1 {
				ones++
			}
		}
		return n, ones
	}
	if n, ones := degraded(); n != 3 || ones != 0 {
		t.Fatalf("before: %d of %d limiters degraded", ones, n)
	}
	if code, _ := httpGet(t, d, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before: %d", code)
	}
	c := redis.Client()
	defer c.Close()
	ctx := context.Background()
	must(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	must(t, c.ConfigSet(ctx, "maxmemory", "1mb").Err())
	defer c.ConfigSet(ctx, "maxmemory", "0")
	big := strings.Repeat("x", 10<<10)
	for i := 0; ; i++ {
		if err := c.Set(ctx, fmt.Sprint("fill:", i), big, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatalf("filling Redis: %v", err)
			}
			break
		}
	}
	full := len(d.logs.String())
	// decisions go on, by the failure modes
	stop := time.Now().Add(3 * time.Second)
	for time.Now().Before(stop) {
		d.call(t, rq("h", desc("strict", uniq("k")), desc("exact", uniq("k")), desc("open", uniq("k"))))
		time.Sleep(20 * time.Millisecond)
	}
	if n, ones := degraded(); ones != n || n != 3 {
		t.Errorf("Redis full: %d of %d limiters degraded, want all", ones, n)
	}
	code, body := httpGet(t, d, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis refuses writes: OOM") {
		t.Errorf("/readyz with Redis full: %d %q", code, body)
	}
	during := d.logs.String()[full:]
	if n := strings.Count(during, `"msg":"redis refuses writes`); n != 1 {
		t.Errorf("%d logs of the refusal, want 1:\n%s", n, during)
	}
	if strings.Contains(during, `"level":"INFO","msg":"redis reachable again"`) {
		t.Errorf("\"redis reachable again\" logged while Redis refused every write:\n%s", during)
	}
	must(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	eventually(t, 10*time.Second, "/readyz back", func() bool { code, _ := httpGet(t, d, "/readyz"); return code == http.StatusOK })
	eventually(t, 10*time.Second, "no limiter degraded", func() bool {
		d.call(t, rq("h", desc("strict", uniq("k")), desc("exact", uniq("k")), desc("open", uniq("k"))))
		_, ones := degraded()
		return ones == 0
	})
	if !strings.Contains(d.logs.String(), `"msg":"redis serves again"`) {
		t.Error("no log of the recovery")
	}
}

// mode exact with failure_mode local and --instances 0: while Redis is
// down each process admits the limit shared by the fleet it learned from
// heartbeats. Before: each of two replicas admitted the whole limit (2,000
// per window for 1,000).
func TestExactLocalFleet(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"x.yaml": "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100, mode: exact}\n"})
	inOneWindow(t, time.Minute, 20*time.Second, func(s *soft, sfx string) {
		tweak := func(o *server.Options) { o.Prefix, o.Timeout = "fleet-"+sfx, 100*time.Millisecond }
		a, b := start(t, redis.Addr(), dir, tweak), start(t, redis.Addr(), dir, tweak)
		const limiter = "exact fixed_window 100/60s local"
		for _, d := range []*daemon{a, b} {
			eventually(t, 10*time.Second, "the fleet of 2 learned", func() bool {
				v, _ := metric(scrape(t, d), "ratelimit_instances", "limiter", limiter)
				return v == 2
			})
		}
		must(t, redis.Freeze())
		defer redis.Thaw()
		admitted := 0
		for _, d := range []*daemon{a, b} {
			n := 0
			for range 120 {
				if codes(d.call(t, rq("x", desc("k", "hot")))) == "OK:OK" {
					n++
				}
			}
			s.expect("one process's share of 100 between 2", n, 50)
			admitted += n
		}
		s.expect("the fleet's window with Redis down", admitted, 100)
		must(t, redis.Thaw())
	})
}

// --grpc-reflection lets grpcurl list and call the service without its
// protos; it is off by default.
func TestGRPCReflection(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := configDir(t, map[string]string{"h.yaml": hostileConfig})
	list := func(d *daemon) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stream, err := reflectionpb.NewServerReflectionClient(d.conn).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return nil, err
		}
		// (io.EOF: the server ended the stream first; its status is
		// Recv's, as grpc.ClientStream.SendMsg documents)
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		return names, nil
	}
	on := start(t, redis.Addr(), dir, func(o *server.Options) { o.GRPCReflection = true })
	names, err := list(on)
	if err != nil || !slices.Contains(names, "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("with --grpc-reflection: %v %v", names, err)
	}
	off := start(t, redis.Addr(), dir, nil)
	if _, err := list(off); status.Code(err) != grpccodes.Unimplemented {
		t.Errorf("without --grpc-reflection: %v", err)
	}
}
