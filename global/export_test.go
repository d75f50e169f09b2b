package global

import "time"

// SetSettleLate makes a Settle retried d after its first attempt a late one,
// for tests, and returns the function that restores the default.
func SetSettleLate(d time.Duration) (restore func()) {
	old := settleLate
	settleLate = d
	return func() { settleLate = old }
}
