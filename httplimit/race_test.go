//go:build race

package httplimit_test

// raceEnabled: the race detector is on; sync.Pool then drops items at
// random, so allocation counts are not the program's.
const raceEnabled = true
