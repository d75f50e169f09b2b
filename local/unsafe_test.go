package local_test

import "unsafe"

// unsafeString returns a string sharing b's bytes, as a caller converting a
// reused buffer without copying would pass.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
