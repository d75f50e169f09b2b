package local_test

import (
	"sync/atomic"
	"unsafe"
)

// unsafeString returns a string sharing b's bytes, as a caller converting a
// reused buffer without copying would pass.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) next() int64 { return c.n.Add(1) }
