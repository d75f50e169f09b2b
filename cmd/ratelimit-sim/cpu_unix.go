//go:build unix

package main

import "syscall"

// processCPU returns the CPU seconds (user and system) this process has
// spent since it started, or -1 when it cannot tell.
func processCPU() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return -1
	}
	sec := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return sec(u.Utime) + sec(u.Stime)
}
