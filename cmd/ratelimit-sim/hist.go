package main

import (
	"fmt"
	"math/bits"
	"time"
)

// hist is a latency histogram with log-spaced buckets: 16 linear
// sub-buckets per power of two, so a value is known within 1/16 (6%). It is
// a plain array: each worker owns one and records without locks or
// allocation; they are merged when the phase ends.
type hist struct {
	n [histBuckets]uint64
}

const (
	histSub     = 16
	histBuckets = (64-4)*histSub + histSub
)

func bucketOf(ns uint64) int {
	if ns < histSub {
		return int(ns)
	}
	b := bits.Len64(ns) // 5..64
	return (b-4)*histSub + int((ns>>(b-5))&(histSub-1))
}

// bucketMid returns the middle of bucket i in nanoseconds.
func bucketMid(i int) float64 {
	if i < histSub {
		return float64(i)
	}
	b := i/histSub + 4
	m := i % histSub
	lo := float64(uint64(histSub+m) << (b - 5))
	w := float64(uint64(1) << (b - 5))
	return lo + w/2
}

func (h *hist) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.n[bucketOf(uint64(d))]++
}

func (h *hist) merge(o *hist) {
	for i, v := range o.n {
		h.n[i] += v
	}
}

func (h *hist) count() uint64 {
	var t uint64
	for _, v := range h.n {
		t += v
	}
	return t
}

// mean returns the mean of the recorded values (each taken as its
// bucket's middle), 0 for an empty histogram.
func (h *hist) mean() time.Duration {
	var n uint64
	var sum float64
	for i, v := range h.n {
		n += v
		sum += float64(v) * bucketMid(i)
	}
	if n == 0 {
		return 0
	}
	return time.Duration(sum / float64(n))
}

// quantile returns the q-quantile (0 < q <= 1), or 0 for an empty histogram.
func (h *hist) quantile(q float64) time.Duration {
	total := h.count()
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total) + 0.5)
	if rank < 1 {
		rank = 1
	}
	var c uint64
	for i, v := range h.n {
		c += v
		if c >= rank {
			return time.Duration(bucketMid(i))
		}
	}
	return time.Duration(bucketMid(histBuckets - 1))
}

// fmtDur prints a latency with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.3gµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.3gms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.3gs", d.Seconds())
}
