package breaker

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a manually advanced clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type transition struct{ from, to State }

// harness bundles a breaker, its clock and the transitions it reported.
type harness struct {
	t     *testing.T
	b     *Breaker
	clock *fakeClock
	mu    sync.Mutex
	trans []transition
}

func newHarness(t *testing.T, threshold int, timeout time.Duration) *harness {
	h := &harness{t: t, clock: newClock()}
	h.b = New(Config{FailureThreshold: threshold, OpenTimeout: timeout, Now: h.clock.Now})
	h.b.OnStateChange(func(from, to State) {
		h.mu.Lock()
		h.trans = append(h.trans, transition{from, to})
		h.mu.Unlock()
	})
	return h
}

func (h *harness) transitions() []transition {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]transition(nil), h.trans...)
}

// step is one action of a table-driven scenario and what must hold after it.
type step struct {
	do        string // "allow", "success", "failure", "advance", "reset"
	d         time.Duration
	wantAllow bool // for "allow"
	want      State
}

func TestScenarios(t *testing.T) {
	const to = time.Second
	tests := []struct {
		name      string
		threshold int
		steps     []step
		wantTrans []transition
	}{
		{
			name:      "threshold opens and open rejects",
			threshold: 3,
			steps: []step{
				{do: "allow", wantAllow: true, want: Closed},
				{do: "failure", want: Closed},
				{do: "failure", want: Closed},
				{do: "allow", wantAllow: true, want: Closed},
				{do: "failure", want: Open},
				{do: "allow", wantAllow: false, want: Open},
				{do: "advance", d: to - time.Nanosecond, want: Open},
				{do: "allow", wantAllow: false, want: Open},
				{do: "failure", want: Open}, // does not extend the timeout
				{do: "advance", d: time.Nanosecond, want: Open},
				{do: "allow", wantAllow: true, want: HalfOpen},
				{do: "allow", wantAllow: false, want: HalfOpen},
			},
			wantTrans: []transition{{Closed, Open}, {Open, HalfOpen}},
		},
		{
			name:      "probe success closes",
			threshold: 1,
			steps: []step{
				{do: "failure", want: Open},
				{do: "advance", d: to, want: Open},
				{do: "allow", wantAllow: true, want: HalfOpen},
				{do: "success", want: Closed},
				{do: "allow", wantAllow: true, want: Closed},
				{do: "allow", wantAllow: true, want: Closed},
			},
			wantTrans: []transition{{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Closed}},
		},
		{
			name:      "probe failure reopens with a new timeout",
			threshold: 2,
			steps: []step{
				{do: "failure", want: Closed},
				{do: "failure", want: Open},
				{do: "advance", d: to + 500*time.Millisecond, want: Open},
				{do: "allow", wantAllow: true, want: HalfOpen},
				{do: "failure", want: Open},
				{do: "allow", wantAllow: false, want: Open},
				{do: "advance", d: to - time.Millisecond, want: Open},
				{do: "allow", wantAllow: false, want: Open},
				{do: "advance", d: time.Millisecond, want: Open},
				{do: "allow", wantAllow: true, want: HalfOpen},
				{do: "success", want: Closed},
			},
			wantTrans: []transition{{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Open}, {Open, HalfOpen}, {HalfOpen, Closed}},
		},
		{
			name:      "success resets the failure count",
			threshold: 3,
			steps: []step{
				{do: "failure", want: Closed},
				{do: "failure", want: Closed},
				{do: "success", want: Closed},
				{do: "failure", want: Closed},
				{do: "failure", want: Closed},
				{do: "failure", want: Open},
			},
			wantTrans: []transition{{Closed, Open}},
		},
		{
			name:      "reset forces closed",
			threshold: 1,
			steps: []step{
				{do: "failure", want: Open},
				{do: "reset", want: Closed},
				{do: "allow", wantAllow: true, want: Closed},
				{do: "reset", want: Closed}, // no transition reported
				{do: "failure", want: Open},
			},
			wantTrans: []transition{{Closed, Open}, {Open, Closed}, {Closed, Open}},
		},
		{
			name:      "success while open closes",
			threshold: 1,
			steps: []step{
				{do: "failure", want: Open},
				{do: "success", want: Closed},
			},
			wantTrans: []transition{{Closed, Open}, {Open, Closed}},
		},
		{
			name:      "lost probe is replaced after another timeout",
			threshold: 1,
			steps: []step{
				{do: "failure", want: Open},
				{do: "advance", d: to, want: Open},
				{do: "allow", wantAllow: true, want: HalfOpen},
				{do: "advance", d: to - 1, want: HalfOpen},
				{do: "allow", wantAllow: false, want: HalfOpen},
				{do: "advance", d: 1, want: HalfOpen},
				{do: "allow", wantAllow: true, want: HalfOpen},
				{do: "allow", wantAllow: false, want: HalfOpen},
			},
			wantTrans: []transition{{Closed, Open}, {Open, HalfOpen}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.threshold, to)
			for i, s := range tc.steps {
				switch s.do {
				case "allow":
					if got := h.b.Allow(); got != s.wantAllow {
						t.Fatalf("step %d (%s): Allow() = %v, want %v", i, s.do, got, s.wantAllow)
					}
				case "success":
					h.b.Success()
				case "failure":
					h.b.Failure()
				case "advance":
					h.clock.Advance(s.d)
				case "reset":
					h.b.Reset()
				default:
					t.Fatalf("bad step %q", s.do)
				}
				if got := h.b.State(); got != s.want {
					t.Fatalf("step %d (%s): State() = %v, want %v", i, s.do, got, s.want)
				}
			}
			got := h.transitions()
			if len(got) != len(tc.wantTrans) {
				t.Fatalf("transitions = %v, want %v", got, tc.wantTrans)
			}
			for i := range got {
				if got[i] != tc.wantTrans[i] {
					t.Fatalf("transitions = %v, want %v", got, tc.wantTrans)
				}
			}
		})
	}
}

func TestExactlyOneProbe(t *testing.T) {
	for round := 0; round < 20; round++ {
		h := newHarness(t, 1, time.Second)
		h.b.Failure()
		h.clock.Advance(time.Second)
		var (
			allowed atomic.Int32
			start   = make(chan struct{})
			wg      sync.WaitGroup
		)
		for i := 0; i < 100; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if h.b.Allow() {
					allowed.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := allowed.Load(); n != 1 {
			t.Fatalf("round %d: %d callers allowed in half-open, want exactly 1", round, n)
		}
		if s := h.b.State(); s != HalfOpen {
			t.Fatalf("state = %v, want half-open", s)
		}
	}
}

func TestDefaults(t *testing.T) {
	b := New(Config{})
	for i := 0; i < DefaultFailureThreshold-1; i++ {
		b.Failure()
	}
	if b.State() != Closed {
		t.Fatalf("opened before %d failures", DefaultFailureThreshold)
	}
	b.Failure()
	if b.State() != Open || b.Allow() {
		t.Fatalf("not open after %d failures", DefaultFailureThreshold)
	}
	if b.timeout != DefaultOpenTimeout {
		t.Fatalf("timeout = %v", b.timeout)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Closed: "closed", Open: "open", HalfOpen: "half-open", State(7): "State(7)"} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(s), got, want)
		}
	}
}

// TestConcurrent hammers every method from many goroutines under the race
// detector, with the real clock and a short timeout: no race, no self
// transition, and the breaker still works afterwards.
func TestConcurrent(t *testing.T) {
	b := New(Config{FailureThreshold: 3, OpenTimeout: time.Millisecond})
	var changes atomic.Int64
	b.OnStateChange(func(from, to State) {
		if from == to {
			t.Errorf("self transition %v", from)
		}
		changes.Add(1)
	})
	var wg sync.WaitGroup
	// At least 200ms, and on until a transition was seen (three failures
	// in a row need a lucky interleaving: on a busy host 200ms may see
	// none), at most 10s.
	start := time.Now()
	more := func() bool {
		d := time.Since(start)
		return d < 200*time.Millisecond || (changes.Load() == 0 && d < 10*time.Second)
	}
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; more(); i++ {
				if b.Allow() {
					if (i+g)%3 == 0 {
						b.Failure()
					} else {
						b.Success()
					}
				}
				_ = b.State()
				if i%1000 == 999 && g == 0 {
					b.Reset()
				}
			}
		}(g)
	}
	wg.Wait()
	b.Reset()
	if b.State() != Closed || !b.Allow() {
		t.Fatal("not closed after Reset")
	}
	if changes.Load() == 0 {
		t.Fatal("no transitions observed")
	}
}

func TestAllowDoesNotAllocate(t *testing.T) {
	b := New(Config{})
	if n := testing.AllocsPerRun(1000, func() {
		if !b.Allow() {
			t.Fatal("closed breaker rejected")
		}
		b.Success()
	}); n != 0 {
		t.Fatalf("Allow+Success allocate %v times per run, want 0", n)
	}
}

func BenchmarkAllowClosed(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !br.Allow() {
				b.Error("closed breaker rejected")
			}
		}
	})
}

func BenchmarkAllowSuccessClosed(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Allow() {
				br.Success()
			}
		}
	})
}

// Trip opens the breaker at once from Closed (whatever failures were
// counted) and from HalfOpen, restarting the open timeout; Open stays as it
// is. A later Success closes it as usual.
func TestTrip(t *testing.T) {
	h := newHarness(t, 3, time.Second)
	h.b.Failure()
	h.b.Trip()
	if got := h.b.State(); got != Open {
		t.Fatalf("after Trip: %v, want open", got)
	}
	if h.b.Allow() {
		t.Fatal("an open breaker let a call through")
	}
	h.clock.Advance(500 * time.Millisecond)
	h.b.Trip() // already open: the timeout is not extended
	h.clock.Advance(500 * time.Millisecond)
	if !h.b.Allow() {
		t.Fatal("no probe after the open timeout")
	}
	h.b.Trip() // the probe found no reply: open again, a fresh timeout
	if got := h.b.State(); got != Open {
		t.Fatalf("Trip in half-open: %v, want open", got)
	}
	h.clock.Advance(999 * time.Millisecond)
	if h.b.Allow() {
		t.Fatal("the open timeout was not restarted")
	}
	h.clock.Advance(time.Millisecond)
	if !h.b.Allow() {
		t.Fatal("no probe after the restarted timeout")
	}
	h.b.Success()
	want := []transition{{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Open}, {Open, HalfOpen}, {HalfOpen, Closed}}
	got := h.transitions()
	if len(got) != len(want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("transitions %v, want %v", got, want)
		}
	}
}
