package hybrid

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// held counts exactly the keys the table holds: after a thousand keys
// through a table of 64 (evictions) and after the syncer dropped idle keys,
// its cells add up to the table's length, and every key held is said to
// be maybe held.
func TestHeldCountsTheTable(t *testing.T) {
	srv := redistest.Standalone(t)
	c := srv.Client()
	defer c.Close()
	h, err := New(c, ratelimit.PerSecond(1000), WithMaxKeys(64), WithInstances(1), WithPrefix(fmt.Sprint("held", t.Name())))
	require.NoError(t, err)
	defer h.Close()
	check := func(when string) {
		t.Helper()
		var sum int32
		for i := range h.held.cells {
			sum += h.held.cells[i].Load()
		}
		n := 0
		h.table.Range(func(k string, _ *counter) bool {
			n++
			if !h.held.may(h.seen.hash(k)) {
				t.Errorf("%s: %q held, its cell at 0", when, k)
			}
			return true
		})
		require.Equal(t, int32(n), sum, "%s: the cells' sum against the keys held", when)
	}
	for i := range 1000 {
		h.lookup(fmt.Sprint("k", i))
	}
	require.Equal(t, 64, h.table.Len())
	check("after evictions")

	later := h.mono() + (idlePeriods+1)*h.p.periodNS
	h.table.Range(func(_ string, c *counter) bool {
		h.plan(c, later)
		return true
	})
	require.Equal(t, 0, h.table.Len(), "every key idle for idlePeriods is dropped")
	check("after idle removal")
	for i := range 10 {
		h.lookup(fmt.Sprint("k", i))
	}
	check("after new counters")
}
