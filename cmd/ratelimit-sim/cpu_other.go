//go:build !unix

package main

// processCPU returns -1: this platform's process CPU is not read.
func processCPU() float64 { return -1 }
