package main

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// workload is the set of keys and how often each is drawn. Key i is drawn
// with weight 1/(i+1)^s (Zipf; s = 0 is uniform), through a table of
// quantiles so that drawing costs one random number and one load.
type workload struct {
	keys  []string
	table []uint32 // table[j]: the key at quantile (j+0.5)/len(table)
	share []float64
}

func newWorkload(n int, s float64) *workload {
	w := &workload{keys: make([]string, n), share: make([]float64, n)}
	for i := range w.keys {
		w.keys[i] = fmt.Sprintf("user:%06d", i)
	}
	var sum float64
	for i := range w.share {
		w.share[i] = math.Pow(float64(i+1), -s)
		sum += w.share[i]
	}
	for i := range w.share {
		w.share[i] /= sum
	}
	size := min(max(64*n, 1<<16), 1<<22)
	w.table = make([]uint32, size)
	k, cum := 0, w.share[0]
	for j := range w.table {
		q := (float64(j) + 0.5) / float64(size)
		for q > cum && k < n-1 {
			k++
			cum += w.share[k]
		}
		w.table[j] = uint32(k)
	}
	return w
}

// picker draws keys for one worker.
type picker struct {
	src   *rand.PCG
	table []uint32
}

func (w *workload) picker(seed, stream uint64) picker {
	return picker{src: rand.NewPCG(seed, stream), table: w.table}
}

func (p *picker) next() int {
	// 32 random bits scaled to the table (Lemire's multiply-shift; the
	// table is at most 2^22 long, so the product fits).
	return int(p.table[((p.src.Uint64()>>32)*uint64(len(p.table)))>>32])
}
