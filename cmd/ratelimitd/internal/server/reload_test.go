package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/server"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

func rule(domain string, kv ...string) string {
	var b strings.Builder
	b.WriteString("domain: " + domain + "\ndescriptors:\n")
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString("  - key: " + kv[i] + "\n    rate_limit: {unit: minute, requests_per_unit: " + kv[i+1] + "}\n")
	}
	return b.String()
}

// currentLimit is the requests_per_unit d answers for key in domain rl.
func currentLimit(t *testing.T, d *daemon, key string) uint32 {
	r := d.call(t, rq("rl", desc(key, "probe")))
	return r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}

func reloads(t *testing.T, d *daemon, result string) float64 {
	v, _ := metric(scrape(t, d), "ratelimit_config_reloads_total", "result", result)
	return v
}

// TestReloadChangedLimit: with the default watch interval an edited limit
// is in force within 2 seconds.
func TestReloadChangedLimit(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "rl.yaml")
	writeFile(t, file, rule("rl", "a", "5"))
	d := start(t, redis.Addr(), file, func(o *server.Options) { o.WatchInterval = server.DefaultWatchInterval })
	if got := currentLimit(t, d, "a"); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	for i, limit := range []string{"7", "9"} {
		writeFile(t, file, rule("rl", "a", limit))
		changed := time.Now()
		eventually(t, 2*time.Second, "the new limit "+limit, func() bool { return uitoa(uint64(currentLimit(t, d, "a"))) == limit })
		t.Logf("limit %s in force after %v", limit, time.Since(changed).Round(time.Millisecond))
		if got := reloads(t, d, "success"); got != float64(i+2) {
			t.Fatalf("ratelimit_config_reloads_total{result=success} = %v, want %d", got, i+2)
		}
	}
}

// TestReloadBrokenFile: a broken file keeps the previous rules in force,
// says why in the log and counts an error; fixing it applies it.
func TestReloadBrokenFile(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "rl.yaml")
	writeFile(t, file, rule("rl", "a", "5"))
	d := start(t, redis.Addr(), dir, nil)
	writeFile(t, file, rule("rl", "a", "5")+"    rate_limt: {}\n")
	eventually(t, 5*time.Second, "a reload error counted", func() bool { return reloads(t, d, "error") == 1 })
	if got := currentLimit(t, d, "a"); got != 5 {
		t.Fatalf("after a broken reload the limit is %d, want the previous 5", got)
	}
	if v, _ := metric(scrape(t, d), "ratelimit_config_last_reload_successful"); v != 0 {
		t.Fatalf("ratelimit_config_last_reload_successful = %v after a failure", v)
	}
	logs := d.logs.String()
	if !strings.Contains(logs, "configuration reload failed") || !strings.Contains(logs, "rl.yaml:5: rate_limt: unknown field") {
		t.Fatalf("the log does not say which file, line and field:\n%s", logs)
	}
	time.Sleep(300 * time.Millisecond) // several polls of the same broken file
	if got := reloads(t, d, "error"); got != 1 {
		t.Fatalf("a file left broken is counted %v times, want once", got)
	}
	writeFile(t, file, rule("rl", "a", "6"))
	eventually(t, 5*time.Second, "the fixed file applied", func() bool { return currentLimit(t, d, "a") == 6 })
	if v, _ := metric(scrape(t, d), "ratelimit_config_last_reload_successful"); v != 1 {
		t.Fatalf("ratelimit_config_last_reload_successful = %v after a success", v)
	}
	os.Remove(file)
	eventually(t, 5*time.Second, "a removed file counted as an error", func() bool { return reloads(t, d, "error") == 2 })
	if got := currentLimit(t, d, "a"); got != 6 {
		t.Fatalf("with no file left the limit is %d, want the previous 6", got)
	}
}

// TestReloadUnderLoad: a stream of requests sees no error and no missing
// answer while the rules change under it again and again.
func TestReloadUnderLoad(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "rl.yaml")
	writeFile(t, file, rule("rl", "a", "1000", "b", "1000"))
	d := start(t, redis.Addr(), dir, func(o *server.Options) { o.WatchInterval = 10 * time.Millisecond })
	var calls, errs atomic.Int64
	seen := sync.Map{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := []string{"a", "b"}[(i+w)%2]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := d.rls.ShouldRateLimit(ctx, rq("rl", desc(key, "x"+uitoa(uint64(i%50)))))
				cancel()
				calls.Add(1)
				if err != nil || len(r.Statuses) != 1 {
					errs.Add(1)
					t.Errorf("during reloads: %v", err)
					continue
				}
				seen.Store(r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(), true)
			}
		})
	}
	// limits change, a rule comes and goes, the mode and the algorithm
	// change: every change replaces limiters under the stream.
	versions := []string{
		rule("rl", "a", "1001", "b", "1000"),
		rule("rl", "a", "1002", "b", "1000", "c", "5"),
		strings.Replace(rule("rl", "a", "1003", "b", "1000"), "requests_per_unit: 1000}", "requests_per_unit: 1000, mode: exact}", 1),
		strings.Replace(rule("rl", "a", "1004", "b", "1000"), "requests_per_unit: 1004}", "requests_per_unit: 1004, algorithm: sliding_window}", 1),
		rule("rl", "a", "1005", "b", "1001"),
	}
	for round := range 4 {
		for _, v := range versions {
			writeFile(t, file, v)
			time.Sleep(60 * time.Millisecond)
		}
		_ = round
	}
	close(stop)
	wg.Wait()
	if errs.Load() > 0 {
		t.Fatalf("%d errors in %d calls", errs.Load(), calls.Load())
	}
	n := 0
	seen.Range(func(_, _ any) bool { n++; return true })
	if got := reloads(t, d, "success"); got < 10 || n < 4 {
		t.Fatalf("%v reloads, %d distinct limits seen in %d calls: the stream did not run through the changes", got, n, calls.Load())
	}
	t.Logf("%d calls across %v reloads, no error", calls.Load(), reloads(t, d, "success"))
}

// TestReloadSymlinkSwap: a Kubernetes ConfigMap volume is updated by
// pointing the "..data" symlink at a new directory, atomically.
func TestReloadSymlinkSwap(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := t.TempDir()
	version := func(name, content string) {
		must(t, os.Mkdir(filepath.Join(dir, name), 0o755))
		writeFile(t, filepath.Join(dir, name, "rl.yaml"), content)
	}
	version("..2026_01_01_v1", rule("rl", "a", "5"))
	must(t, os.Symlink("..2026_01_01_v1", filepath.Join(dir, "..data")))
	must(t, os.Symlink(filepath.Join("..data", "rl.yaml"), filepath.Join(dir, "rl.yaml")))
	d := start(t, redis.Addr(), dir, nil)
	if got := currentLimit(t, d, "a"); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	version("..2026_01_01_v2", rule("rl", "a", "8"))
	must(t, os.Symlink("..2026_01_01_v2", filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	must(t, os.RemoveAll(filepath.Join(dir, "..2026_01_01_v1")))
	eventually(t, 2*time.Second, "the swapped-in limit", func() bool { return currentLimit(t, d, "a") == 8 })
}

// TestReloadKeepsState: the limiters of unchanged rules keep their counts.
func TestReloadKeepsState(t *testing.T) {
	redis := redistest.Standalone(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "rl.yaml")
	writeFile(t, file, rule("rl", "a", "3", "b", "10"))
	inOneWindow(t, time.Minute, 10*time.Second, func(s *soft, sfx string) {
		writeFile(t, file, rule("rl", "a", "3", "b", "10"))
		d := start(t, redis.Addr(), dir, func(o *server.Options) { o.Prefix = sfx })
		s.expect("a's 3", codes(drive(t, d, rq("rl", desc("a", "x")), 3)), "OK:OK")
		writeFile(t, file, rule("rl", "a", "3", "b", "11", "c", "2"))
		eventually(t, 5*time.Second, "the reload", func() bool { return currentLimit(t, d, "b") == 11 })
		s.expect("a, unchanged, is still exhausted", codes(d.call(t, rq("rl", desc("a", "x")))), "OVER_LIMIT:OVER_LIMIT")
	})
}

// TestReloadReturnsLeases: a rule removed from one ratelimitd gives its
// leases back, whether its limiter is closed (no rule left of its kind)
// or still counts other rules: another ratelimitd then finds exactly what
// the first did not use.
func TestReloadReturnsLeases(t *testing.T) {
	redis := redistest.Standalone(t)
	for _, tc := range []struct {
		name, before, after string
	}{
		{"limiter closed", rule("rl", "r", "100", "s", "50"), rule("rl", "s", "50")},
		{"limiter still used", rule("rl", "r", "100", "s", "100"), rule("rl", "s", "100")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inOneWindow(t, time.Minute, 15*time.Second, func(s *soft, sfx string) {
				fileX := filepath.Join(t.TempDir(), "rl.yaml")
				writeFile(t, fileX, tc.before)
				x := start(t, redis.Addr(), fileX, func(o *server.Options) { o.Prefix = sfx })
				y := start(t, redis.Addr(), configDir(t, map[string]string{"rl.yaml": tc.before}), func(o *server.Options) { o.Prefix = sfx })
				s.expect("x takes 1", codes(x.call(t, rq("rl", desc("r", "k")))), "OK:OK")
				writeFile(t, fileX, tc.after)
				eventually(t, 5*time.Second, "x drops rule r", func() bool { return currentLimit(t, x, "r") == 0 })
				time.Sleep(200 * time.Millisecond) // the flush or close runs after the reload
				n := 0
				for ; n <= 100; n++ {
					if codes(y.call(t, rq("rl", desc("r", "k")))) != "OK:OK" {
						break
					}
				}
				s.expect("what y finds after x gave its lease back", n, 99)
			})
		})
	}
}
