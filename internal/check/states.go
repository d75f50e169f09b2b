package check

import "github.com/hybridlimit/ratelimit"

// States returns the buffer AllowNInto writes the states of k limits into:
// states itself, *states resized to k over its array when its capacity
// holds them and over a new one otherwise, or a new buffer for a nil
// states (AllowN).
func States(states *[]ratelimit.LimitState, k int) *[]ratelimit.LimitState {
	if states == nil {
		s := make([]ratelimit.LimitState, k)
		return &s
	}
	if cap(*states) >= k {
		*states = (*states)[:k]
	} else {
		*states = make([]ratelimit.LimitState, k)
	}
	return states
}
