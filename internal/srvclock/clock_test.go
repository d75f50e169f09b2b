package srvclock

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// A clock whose local wall time at mono 0 is 1,000s and whose server is
// 250ms ahead of it.
func testClock() *Clock {
	return New(1_000_000_000, time.Second, 10*time.Second)
}

func TestServerClockOffset(t *testing.T) {
	k := testClock()
	// before any sample: server time is taken to be the local wall time
	if got := k.ServerAt(5 * ms); got != 1_000_005_000 {
		t.Fatalf("serverAt before a sample = %d", got)
	}
	// Redis read TIME = 1,000.250100s while we sent at mono 100ms and read
	// the reply at 100.2ms: local wall 1,000.1001s mid-way, offset +150ms.
	k.Observe(1_000_250_100, 100*ms, 100*ms+200_000)
	if got := k.offsetUS.Load(); got != 150_000 {
		t.Fatalf("offset %dus, want 150000", got)
	}
	if got := k.ErrorBound(); got != 100_000+int64(time.Microsecond) {
		t.Fatalf("error bound %dns, want half the round trip + 1us", got)
	}
	if got := k.ServerAt(200 * ms); got != 1_000_350_000 {
		t.Fatalf("serverAt(200ms) = %d, want 1000350000", got)
	}
	if got := k.MonoAt(1_000_350_000); got != 200*ms {
		t.Fatalf("monoAt = %d, want %d", got, 200*ms)
	}
	// A sample with a longer round trip does not replace it...
	k.Observe(1_000_999_999, 300*ms, 320*ms)
	if got := k.offsetUS.Load(); got != 150_000 {
		t.Fatalf("a worse sample replaced the offset: %d", got)
	}
	// ...a shorter one does...
	k.Observe(1_000_450_050, 400*ms, 400*ms+100_000)
	if got, want := k.offsetUS.Load(), int64(1_000_450_050-(1_000_000_000+400_050)); got != want {
		t.Fatalf("offset %d, want %d", got, want)
	}
	// ...and any newer one once the kept one is older than maxAge.
	k.Observe(1_012_000_000, 11*time.Second.Nanoseconds(), 11*time.Second.Nanoseconds()+50*ms)
	if got, want := k.offsetUS.Load(), int64(1_012_000_000-(1_000_000_000+11_025_000)); got != want {
		t.Fatalf("an old sample was kept: offset %d, want %d", got, want)
	}
}

func TestServerClockWindow(t *testing.T) {
	k := testClock()
	k.Observe(1_000_250_000, 0, 0) // server 250ms ahead, exactly
	idx, end := k.Window(600 * ms) // server time 1,000.85s
	if idx != 1000 || end != 750*ms {
		t.Fatalf("window(600ms) = %d, end %dms; want 1000, 750ms", idx, end/ms)
	}
	idx, end = k.Window(750 * ms) // server time 1,001.0s: the next window begins
	if idx != 1001 || end != 1750*ms {
		t.Fatalf("window(750ms) = %d, end %dms; want 1001, 1750ms", idx, end/ms)
	}
}

// end takes the offset's estimate of a window's end, clamped to what the
// reply proves: Redis read TIME between before and after, and said reset
// was left then.
func TestServerClockEnd(t *testing.T) {
	k := testClock()
	k.Observe(1_000_250_000, 0, 0) // window 1000 ends at mono 750ms
	// a reply read at 700ms..710ms that says 45ms were left: the end lies
	// in [745ms, 755ms]; the estimate (750ms) is inside
	if got := k.End(1000, 45_000, 700*ms, 710*ms); got != 750*ms {
		t.Fatalf("end = %dms, want 750ms", got/ms)
	}
	// a reply that waited long in a run queue (read at 900ms) still cannot
	// end the window before what it proves: sent at 700ms with 60ms left
	if got := k.End(1000, 60_000, 700*ms, 900*ms); got != 760*ms {
		t.Fatalf("end = %dms, want 760ms (clamped up)", got/ms)
	}
	// nor after: sent at 600ms, read at 601ms, 100ms left
	if got := k.End(1000, 100_000, 600*ms, 601*ms); got != 701*ms {
		t.Fatalf("end = %dms, want 701ms (clamped down)", got/ms)
	}
}

// Certain finds the window a command sent at mono runs in only when that
// is sure: a sample taken, and the instant farther than the error bound and
// Margin from both ends of the window. Late flags a reply read within them
// of the end.
func TestCertainLate(t *testing.T) {
	k := testClock()
	if ok, _ := k.View().Certain(600 * ms); ok {
		t.Fatal("certain before any sample")
	}
	k.Observe(1_000_250_000, 0, 100_000) // server 250ms ahead; error bound 50us + 1us
	v := k.View()
	for _, c := range []struct {
		at int64
		ok bool
	}{
		{600 * ms, true},          // server 1,000.85s
		{748 * ms, true},          // 2ms before the end
		{749*ms + 10_000, false},  // within the bound and Margin of the end
		{750*ms + 500_000, false}, // just after the start of window 1001
		{752 * ms, true},          // window 1001, 2ms in
	} {
		ok, idx := v.Certain(c.at)
		want := int64(1000)
		if c.at >= 750*ms {
			want = 1001
		}
		if ok != c.ok || ok && idx != want {
			t.Errorf("Certain(%v) = %v, %d; want %v, %d", time.Duration(c.at), ok, idx, c.ok, want)
		}
	}
	if v.Late(1000, 748*ms) {
		t.Error("a reply 2ms before the end is late")
	}
	if !v.Late(1000, 749*ms+10_000) || !v.Late(1000, 800*ms) {
		t.Error("a reply within the bound of the end, or after it, is not late")
	}
	if k.Stale(5*time.Second.Nanoseconds()) || !k.Stale(11*time.Second.Nanoseconds()) {
		t.Error("Stale: want a sample kept for maxAge (10s)")
	}
	if !testClock().Stale(0) {
		t.Error("Stale: want true before any sample")
	}
}
