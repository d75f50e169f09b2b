package hybrid

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// A clock whose local wall time at mono 0 is 1,000s and whose server is
// 250ms ahead of it.
func testClock() *serverClock {
	return newServerClock(1_000_000_000, time.Second, 10*time.Second)
}

func TestServerClockOffset(t *testing.T) {
	k := testClock()
	// before any sample: server time is taken to be the local wall time
	if got := k.serverAt(5 * ms); got != 1_000_005_000 {
		t.Fatalf("serverAt before a sample = %d", got)
	}
	// Redis read TIME = 1,000.250100s while we sent at mono 100ms and read
	// the reply at 100.2ms: local wall 1,000.1001s mid-way, offset +150ms.
	k.observe(1_000_250_100, 100*ms, 100*ms+200_000)
	if got := k.offsetUS.Load(); got != 150_000 {
		t.Fatalf("offset %dus, want 150000", got)
	}
	if got := k.errorBound(); got != 100_000+int64(time.Microsecond) {
		t.Fatalf("error bound %dns, want half the round trip + 1us", got)
	}
	if got := k.serverAt(200 * ms); got != 1_000_350_000 {
		t.Fatalf("serverAt(200ms) = %d, want 1000350000", got)
	}
	if got := k.monoAt(1_000_350_000); got != 200*ms {
		t.Fatalf("monoAt = %d, want %d", got, 200*ms)
	}
	// A sample with a longer round trip does not replace it...
	k.observe(1_000_999_999, 300*ms, 320*ms)
	if got := k.offsetUS.Load(); got != 150_000 {
		t.Fatalf("a worse sample replaced the offset: %d", got)
	}
	// ...a shorter one does...
	k.observe(1_000_450_050, 400*ms, 400*ms+100_000)
	if got, want := k.offsetUS.Load(), int64(1_000_450_050-(1_000_000_000+400_050)); got != want {
		t.Fatalf("offset %d, want %d", got, want)
	}
	// ...and any newer one once the kept one is older than maxAge.
	k.observe(1_012_000_000, 11*time.Second.Nanoseconds(), 11*time.Second.Nanoseconds()+50*ms)
	if got, want := k.offsetUS.Load(), int64(1_012_000_000-(1_000_000_000+11_025_000)); got != want {
		t.Fatalf("an old sample was kept: offset %d, want %d", got, want)
	}
}

func TestServerClockWindow(t *testing.T) {
	k := testClock()
	k.observe(1_000_250_000, 0, 0) // server 250ms ahead, exactly
	idx, end := k.window(600 * ms) // server time 1,000.85s
	if idx != 1000 || end != 750*ms {
		t.Fatalf("window(600ms) = %d, end %dms; want 1000, 750ms", idx, end/ms)
	}
	idx, end = k.window(750 * ms) // server time 1,001.0s: the next window begins
	if idx != 1001 || end != 1750*ms {
		t.Fatalf("window(750ms) = %d, end %dms; want 1001, 1750ms", idx, end/ms)
	}
}

// end takes the offset's estimate of a window's end, clamped to what the
// reply proves: Redis read TIME between before and after, and said reset
// was left then.
func TestServerClockEnd(t *testing.T) {
	k := testClock()
	k.observe(1_000_250_000, 0, 0) // window 1000 ends at mono 750ms
	// a reply read at 700ms..710ms that says 45ms were left: the end lies
	// in [745ms, 755ms]; the estimate (750ms) is inside
	if got := k.end(1000, 45_000, 700*ms, 710*ms); got != 750*ms {
		t.Fatalf("end = %dms, want 750ms", got/ms)
	}
	// a reply that waited long in a run queue (read at 900ms) still cannot
	// end the window before what it proves: sent at 700ms with 60ms left
	if got := k.end(1000, 60_000, 700*ms, 900*ms); got != 760*ms {
		t.Fatalf("end = %dms, want 760ms (clamped up)", got/ms)
	}
	// nor after: sent at 600ms, read at 601ms, 100ms left
	if got := k.end(1000, 100_000, 600*ms, 601*ms); got != 701*ms {
		t.Fatalf("end = %dms, want 701ms (clamped down)", got/ms)
	}
}
