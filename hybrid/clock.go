package hybrid

import "github.com/hybridlimit/ratelimit/internal/srvclock"

// serverClock estimates Redis server time on this process' monotonic
// clock (mono: nanoseconds since the limiter's start), from the server
// times the scripts' replies carry; clockView is its estimate at one
// moment, what the keys' state machines read Redis time through.
type (
	serverClock = srvclock.Clock
	clockView   = srvclock.View
)

var newServerClock = srvclock.New
