package global

import "time"

// SetSettleLate makes a Settle retried d after its first attempt a late one,
// for tests, and returns the function that restores the default.
func SetSettleLate(d time.Duration) (restore func()) {
	old := settleLate
	settleLate = d
	return func() { settleLate = old }
}

// OnDroppedDebt makes a FailLocal Limiter of a window algorithm call f
// with the units it admitted locally in window win that no call charged to
// Redis while that window lasted. f must be safe for concurrent use.
func OnDroppedDebt(l *Limiter, f func(win, units int64)) {
	l.ledger.dropped = func(_ int, win, units int64) { f(win, units) }
}
