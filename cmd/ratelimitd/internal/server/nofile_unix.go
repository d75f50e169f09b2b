//go:build unix

package server

import "syscall"

// openFileLimit returns the process's RLIMIT_NOFILE (its soft limit, which
// the Go runtime raised to the hard one at startup).
func openFileLimit() (int, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur > 1<<30 {
		return 0, false
	}
	return int(r.Cur), true
}
