package config_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// Bomb returns a configuration of levels lists of width descriptors, each
// list an anchor whose descriptors all alias the list before it: about
// width^levels rules in a few lines (8 and 8: 16.8 million rules in 2 KB),
// the shape of the alias bomb that took 21 GB and 348s to load.
func Bomb(levels, width int) string {
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n")
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

// An alias bomb is refused at once, naming the file, the line of the
// alias being expanded, and the bound, without the memory it asks for.
func TestAliasBomb(t *testing.T) {
	src := Bomb(8, 8)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := config.Parse(config.Defaults{}, config.Source{Name: "bomb.yaml", Data: []byte(src)})
	took := time.Since(start)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	t.Logf("%d bytes: refused in %v, %d MB allocated: %v", len(src), took, (after.TotalAlloc-before.TotalAlloc)>>20, err)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != "bomb.yaml" || !strings.Contains(err.Error(), "the YAML alias *L") ||
		!strings.Contains(err.Error(), "refused as an alias bomb") || !strings.Contains(err.Error(), "--max-rules") {
		t.Fatalf("want an *Error naming the alias and the bound, got %v", err)
	}
	// the line of the outermost alias being expanded when the bound is
	// crossed: 4,680 rules up to L4's list, then 4,096 per alias of L5's,
	// so its fourth, k3
	if line := strings.Split(src, "\n")[ce.Line-1]; line != "      - {key: k3, descriptors: *L4}" {
		t.Errorf("error on line %d, %q; want the alias that crossed the bound", ce.Line, line)
	}
	// before: 348s and 21 GB; 100,000 descriptors walked cost well under 1 GB
	if mb := (after.TotalAlloc - before.TotalAlloc) >> 20; mb > 512 {
		t.Errorf("refusing the bomb allocated %d MB", mb)
	}
	if took > 20*time.Second {
		t.Errorf("refusing the bomb took %v", took)
	}
	// the first 16 lines of the trial's bomb (74,899 rules): refused too
	_, err = config.Parse(config.Defaults{}, config.Source{Name: "bomb.yaml", Data: []byte(Bomb(6, 8))})
	if err == nil || !strings.Contains(err.Error(), "refused as an alias bomb") {
		t.Errorf("6 levels of 8 (299,592 rules): %v", err)
	}
}

// Aliases below the bounds load as before, and the bound on rules holds
// without aliases too; a higher MaxRules lets a large configuration in.
func TestMaxRules(t *testing.T) {
	c, err := config.Parse(config.Defaults{}, config.Source{Name: "ok.yaml", Data: []byte(Bomb(3, 8))})
	if err != nil {
		t.Fatalf("3 levels of 8 (584 rules): %v", err)
	}
	if len(c.Rules) != 8+64+512 {
		t.Errorf("%d rules, want 584", len(c.Rules))
	}
	if r := config.Lookup(c.Domain("bomb"), d("l3", "", "k7", "", "k0", "", "k3", "")).Rule; r == nil || r.RequestsPerUnit != 1 {
		t.Errorf("a rule reached through two aliases: %+v", r)
	}
	var b strings.Builder
	b.WriteString("domain: flat\ndescriptors:\n")
	for i := range 30 {
		fmt.Fprintf(&b, "  - {key: k, value: v%d, rate_limit: {unit: minute, requests_per_unit: 1}}\n", i)
	}
	_, err = config.ParseContext(context.Background(), config.Options{Limits: config.Limits{MaxRules: 25}}, config.Source{Name: "flat.yaml", Data: []byte(b.String())})
	if err == nil || err.Error() != "flat.yaml:28: rate_limit: more than 25 rules (--max-rules): raise --max-rules if this is meant" {
		t.Errorf("30 rules of at most 25: %v", err)
	}
	if _, err := config.ParseContext(context.Background(), config.Options{Limits: config.Limits{MaxRules: 30}}, config.Source{Name: "flat.yaml", Data: []byte(b.String())}); err != nil {
		t.Errorf("30 rules of at most 30: %v", err)
	}
	// the bound covers all the files together
	one := "domain: a\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 1}}\n  - {key: j, rate_limit: {unit: minute, requests_per_unit: 1}}\n"
	_, err = config.ParseContext(context.Background(), config.Options{Limits: config.Limits{MaxRules: 3}},
		config.Source{Name: "a.yaml", Data: []byte(one)}, config.Source{Name: "b.yaml", Data: []byte(strings.Replace(one, "domain: a", "domain: b", 1))})
	if err == nil || !strings.HasPrefix(err.Error(), "b.yaml:4: rate_limit: more than 3 rules") {
		t.Errorf("4 rules in two files, at most 3: %v", err)
	}
}

// A parse stops when its context ends, however much is left.
func TestParseCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := config.ParseContext(ctx, config.Options{Limits: config.Limits{MaxRules: 1 << 30}}, config.Source{Name: "bomb.yaml", Data: []byte(Bomb(8, 8))})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "bomb.yaml:") {
		t.Fatalf("a cancelled parse: %v", err)
	}
}

// FuzzParseBounded: within small limits no input makes ParseContext panic or
// go past them, aliases or not; whatever it accepts can be looked up.
// Seeded with alias bombs and aliases in every place a list or a block
// may be.
func FuzzParseBounded(f *testing.F) {
	f.Add(Bomb(3, 3))
	f.Add(Bomb(8, 8))
	f.Add("domain: x\ndescriptors:\n  - &d {key: a, descriptors: [{key: b, rate_limit: &r {unit: second, requests_per_unit: 1}}]}\n  - {key: c, rate_limit: *r, descriptors: [*d]}\n")
	f.Add("domain: x\ndescriptors: &l\n  - {key: a, descriptors: *l}\n")
	f.Add("domain: x\ndescriptors:\n  - key: a\n    rate_limits: &ls [{unit: second, requests_per_unit: 1, replaces: &rp [{name: n}]}, {unit: day, requests_per_unit: 9}]\n  - {key: b, rate_limits: *ls}\n  - {key: c, rate_limit: {unit: minute, requests_per_unit: 2, replaces: *rp}}\n")
	f.Add("domain: x\ndescriptors:\n  - key: a\n    value: '*'\n    detailed_metric: true\n    value_to_metric: true\n    share_threshold: true\n    metadata: &m {k: v}\n    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: gcra, mode: optimistic, failure_mode: open}\n  - {key: b, metadata: *m}\n")
	f.Fuzz(func(t *testing.T, src string) {
		const maxRules = 40
		c, err := config.ParseContext(context.Background(), config.Options{Limits: config.Limits{MaxRules: maxRules}}, config.Source{Name: "fuzz.yaml", Data: []byte(src)})
		if err != nil {
			var ce *config.Error
			if !errors.As(err, &ce) && !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("an error that names no file: %v", err)
			}
			return
		}
		if len(c.Rules) > maxRules {
			t.Fatalf("%d rules accepted within a bound of %d", len(c.Rules), maxRules)
		}
		for i, r := range c.Rules {
			if r.ID != i || r.File != "fuzz.yaml" || r.Line < 1 || c.Domain(r.Domain) == nil {
				t.Fatalf("rule %d: %+v", i, r)
			}
		}
		for _, name := range c.Domains() {
			config.Lookup(c.Domain(name), d("a", "b", "c", "d"))
			config.Lookup(c.Domain(name), d("l3", "", "k0", "", "k1", ""))
		}
	})
}
