package global

import (
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// The ledger without Redis: which windows an outage makes cautious, the
// budget of a cautious window, and the window a decision counted in.
func TestLedger(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	instances := 4
	g := newLedger([]ratelimit.Limit{{Rate: 1000, Period: time.Second}}, []ratelimit.Algorithm{ratelimit.FixedWindow}, 500*time.Millisecond, func() int { return instances })
	for w := int64(0); w < 20; w++ {
		if g.cautious(0, w) {
			t.Fatalf("window %d cautious before any outage", w)
		}
	}
	// An outage from 5.3s to 7.2s: windows 5 to 7 are touched; window 8
	// begins 0.8s after it, past the 0.5s settle; windows beginning
	// within the settle would be cautious too.
	g.down(5*sec + 300_000)
	if !g.cautious(0, 5) || !g.cautious(0, 9) || g.cautious(0, 4) {
		t.Error("while the outage lasts, its window and those after it are cautious, not those before")
	}
	g.up(7*sec + 200_000)
	for w, want := range map[int64]bool{4: false, 5: true, 6: true, 7: true, 8: false} {
		if got := g.cautious(0, w); got != want {
			t.Errorf("window %d cautious %v; want %v", w, got, want)
		}
	}
	g.up(9 * sec) // a second answer does not move the end
	if g.cautious(0, 8) {
		t.Error("the outage's end moved with a later answer")
	}
	g.down(20*sec + 900_000)
	g.up(21*sec + 700_000)
	if !g.cautious(0, 22) {
		t.Error("a window beginning within the settle after an outage is not cautious")
	}

	// A window's budget: its last-known remainder shared by the
	// instances, else their share of the limit.
	k := g.lock("k", 5)
	e := &k.w[0]
	e.free = 402
	g.caution(0, e)
	if e.budget != 100 {
		t.Errorf("budget %d; want 402 / 4", e.budget)
	}
	e.used, e.debt = 7, 3
	k.mu.Unlock()
	k = g.lock("k", 6)
	e = &k.w[0]
	if e.win != 6 || e.used != 0 || e.debt != 0 || e.budget != -1 || e.free != -1 {
		t.Errorf("entry %+v; want window 6, fresh", e)
	}
	g.caution(0, e)
	if e.budget != 250 {
		t.Errorf("budget %d of a window begun during the outage; want 1000 / 4", e.budget)
	}
	k.mu.Unlock()
	if k = g.lock("k", 5); k.w[0].win != 6 {
		t.Error("an earlier window replaced a later one")
	}
	k.mu.Unlock()

	// The window a FixedWindow decision counted in, from the time read
	// before it and its ResetAfter.
	for _, c := range []struct {
		t     int64
		reset time.Duration
		want  int64
	}{
		{5*sec + 999_900, 100 * time.Microsecond, 5},     // decided in window 5
		{5*sec + 999_900, 999_950 * time.Microsecond, 6}, // crossed into window 6
		{5*sec + 100_000, 900 * time.Millisecond, 5},     //
		{5*sec + 100_000, 0, 5},                          // no reset: as asked
		{5*sec + 100_000, 100 * time.Millisecond, 5},     // (never before the window asked)
	} {
		if got := g.decidedIn(0, 5, c.t, c.reset); got != c.want {
			t.Errorf("decidedIn(5, %d, %v) = %d; want %d", c.t, c.reset, got, c.want)
		}
	}
}
