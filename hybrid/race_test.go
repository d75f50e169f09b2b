//go:build race

package hybrid_test

// raceEnabled: the race detector is on. It slows the in-memory decision
// path tenfold and more, and Redis not at all, so the tests that compare
// the two, or that only measure, run without it: scripts/test.sh runs them
// in a pass of their own (see skipUnderRace).
const raceEnabled = true
