//go:build !unix

package server

// openFileLimit: unknown on this system.
func openFileLimit() (int, bool) { return 0, false }
