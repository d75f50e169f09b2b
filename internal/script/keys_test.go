package script_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/hybridlimit/ratelimit/internal/script"
)

// WindowKey names a window's counter base + kind + ":" + idx, whatever
// the lengths, in one allocation when the name is short.
func TestWindowKey(t *testing.T) {
	long := "p:{" + strings.Repeat("x", 200) + "}:"
	for _, c := range []struct {
		base, kind string
		idx        int64
	}{
		{"rl:{user-1}:", "fw:100", 1_764_000_000},
		{"rl:{user-1}:", "sw:5", 0},
		{"rl:{#ab}:", "tb:1:1:1", -3},
		{long, "fw:2000", 1 << 62},
	} {
		want := c.base + c.kind + ":" + strconv.FormatInt(c.idx, 10)
		if got := script.WindowKey(c.base, c.kind, c.idx); got != want {
			t.Errorf("WindowKey(%q, %q, %d) = %q, want %q", c.base, c.kind, c.idx, got, want)
		}
	}
	if a := testing.AllocsPerRun(100, func() { script.WindowKey("rl:{user-1}:", "fw:100", 1_764_000_000) }); a > 1 {
		t.Errorf("WindowKey allocates %v times, want 1", a)
	}
}
