package hybrid_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/hybrid"
	"github.com/hybridlimit/ratelimit/internal/redistest"
)

// outageRun drives one hot key far over its limit from a fleet while
// Redis freezes (SIGSTOP) from freezeAt to thawAt after the start, and
// returns what the fleet admitted per window (from each decision's
// ResetAfter) with the windows the freeze began and ended in.
type outageRun struct {
	instances int
	opts      []hybrid.Option
	limit     ratelimit.Limit
	freezeAt  time.Duration // after the start of a window
	freezeFor time.Duration
	runFor    time.Duration
}

func (o outageRun) run(t *testing.T) (perWin map[int64]int, frozeIn, thawedIn int64) {
	t.Helper()
	srv := redistest.Standalone(t)
	direct := srv.Client()
	defer direct.Close()
	prefix := uniq(t)
	var ls []ratelimit.Limiter
	for i := 0; i < o.instances; i++ {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		h, err := hybrid.New(c, o.limit, append([]hybrid.Option{hybrid.WithPrefix(prefix)}, o.opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		ls = append(ls, h)
	}
	// Start at a window's start.
	_, left := serverWindow(t, direct, o.limit.Period)
	time.Sleep(left + 2*time.Millisecond)
	start := time.Now()
	p := o.limit.Period.Microseconds()
	frozeIn = start.Add(o.freezeAt).UnixMicro() / p
	thawedIn = start.Add(o.freezeAt+o.freezeFor).UnixMicro() / p
	go func() {
		time.Sleep(o.freezeAt)
		require.NoError(t, srv.Freeze())
		time.Sleep(o.freezeFor)
		require.NoError(t, srv.Thaw())
	}()
	tl := newTally(o.limit.Period)
	hammerRandom(t, ls, []string{"k"}, 4, o.runFor, tl)
	_, all := tl.windows("k", start, time.Now())
	var idx []int64
	for i := range all {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
	var b strings.Builder
	for _, i := range idx {
		mark := ""
		switch {
		case i == frozeIn && i == thawedIn:
			mark = " (froze and thawed)"
		case i == frozeIn:
			mark = " (froze)"
		case i == thawedIn:
			mark = " (thawed)"
		case i > frozeIn && i < thawedIn:
			mark = " (frozen)"
		}
		fmt.Fprintf(&b, " w%d:%d%s", i-idx[0], all[i], mark)
	}
	t.Logf("admitted per window:%s", b.String())
	return all, frozeIn, thawedIn
}

func TestOutageRecoveryProbe(t *testing.T) {
	for _, c := range []struct {
		name string
		n    int
		opts []hybrid.Option
	}{
		{"1 instance, learned, 100ms", 1, []hybrid.Option{hybrid.WithTimeout(100 * time.Millisecond)}},
		{"2 instances", 2, []hybrid.Option{hybrid.WithInstances(2)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := outageRun{instances: c.n, opts: c.opts, limit: ratelimit.PerSecond(1000),
				freezeAt: 1500 * time.Millisecond, freezeFor: 3 * time.Second, runFor: 6 * time.Second}
			o.run(t)
		})
	}
}
