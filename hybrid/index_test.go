package hybrid

import (
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

func indexed(x *keyIndex, seed maphash.Seed, k string) *counter {
	return x.load(k, maphash.String(seed, k))
}

func newIndexed(seed maphash.Seed, k string) *counter {
	return &counter{key: k, hash: maphash.String(seed, k)}
}

// The index against a map, through stores, replacements and deletions of
// 5,000 keys in rounds: it holds what the map holds, finds every key it
// holds and none it does not, and rebuilds without its tombstones (never
// more than 3/4 of a table filled).
func TestKeyIndexModel(t *testing.T) {
	seed := maphash.MakeSeed()
	var x keyIndex
	model := map[string]*counter{}
	check := func(round int) {
		t.Helper()
		if x.len() != len(model) {
			t.Fatalf("round %d: index holds %d, model %d", round, x.len(), len(model))
		}
		for i := 0; i < 6000; i++ {
			k := "k" + strconv.Itoa(i)
			if got, want := indexed(&x, seed, k), model[k]; got != want {
				t.Fatalf("round %d: key %s: got %p, want %p", round, k, got, want)
			}
		}
		tab := x.tab.Load()
		if 4*x.filled > 3*len(tab.slots) {
			t.Fatalf("round %d: %d of %d slots filled", round, x.filled, len(tab.slots))
		}
	}
	for round := 0; round < 6; round++ {
		for i := round; i < 5000; i += 1 + round%3 {
			k := "k" + strconv.Itoa(i)
			c := newIndexed(seed, k)
			x.store(c) // new, or in place of the key's counter
			model[k] = c
		}
		check(round)
		for i := 0; i < 5000; i += 2 + round {
			k := "k" + strconv.Itoa(i)
			if c := model[k]; c != nil {
				x.compareAndDelete(newIndexed(seed, k)) // another counter of the key: stays
				if indexed(&x, seed, k) != c {
					t.Fatalf("key %s: a counter not held deleted the one held", k)
				}
				x.compareAndDelete(c)
				delete(model, k)
			}
		}
		check(round)
	}
	// Emptied and filled again: tombstones go at the rebuilds.
	for k, c := range model {
		x.compareAndDelete(c)
		delete(model, k)
	}
	check(6)
	for i := 0; i < 100; i++ {
		k := "k" + strconv.Itoa(i)
		c := newIndexed(seed, k)
		x.store(c)
		model[k] = c
	}
	check(7)
}

// Keys whose hashes collide are told apart by the key, probed past each
// other and past tombstones.
func TestKeyIndexCollisions(t *testing.T) {
	var x keyIndex
	a := &counter{key: "a", hash: 7}
	b := &counter{key: "b", hash: 7}
	c := &counter{key: "c", hash: 7 + minIndexSlots} // the same first slot
	for _, k := range []*counter{a, b, c} {
		x.store(k)
	}
	for _, k := range []*counter{a, b, c} {
		if got := x.load(k.key, k.hash); got != k {
			t.Fatalf("load %s: got %+v", k.key, got)
		}
	}
	if x.load("d", 7) != nil {
		t.Fatal("found a key never stored")
	}
	x.compareAndDelete(a)
	if x.load("a", 7) != nil || x.load("b", 7) != b || x.load("c", c.hash) != c {
		t.Fatal("after deleting a: a found, or b or c lost behind its tombstone")
	}
	a2 := &counter{key: "a", hash: 7}
	x.store(a2) // into a's tombstone
	if x.load("a", 7) != a2 || x.len() != 3 || x.filled != 3 {
		t.Fatalf("a stored again: got %p, len %d, filled %d; want the new counter, 3, 3", x.load("a", 7), x.len(), x.filled)
	}
}

// Lock-free reads beside writers under -race: readers of keys that stay
// always find them, while other keys are stored and deleted around them
// and the table is rebuilt many times.
func TestKeyIndexConcurrent(t *testing.T) {
	seed := maphash.MakeSeed()
	var x keyIndex
	stay := make([]*counter, 64)
	for i := range stay {
		stay[i] = newIndexed(seed, "stay"+strconv.Itoa(i))
		x.store(stay[i])
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var misses atomic.Int64
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := r; !stop.Load(); i++ {
				c := stay[i%len(stay)]
				if x.load(c.key, c.hash) != c {
					misses.Add(1)
				}
			}
		}(r)
	}
	for round := 0; round < 20; round++ {
		var churn []*counter
		for i := 0; i < 500; i++ {
			c := newIndexed(seed, "churn"+strconv.Itoa(round*500+i))
			x.store(c)
			churn = append(churn, c)
		}
		for _, c := range churn {
			x.compareAndDelete(c)
		}
	}
	stop.Store(true)
	wg.Wait()
	if m := misses.Load(); m != 0 {
		t.Fatalf("%d reads missed a key held all along", m)
	}
	if x.len() != len(stay) {
		t.Fatalf("index holds %d, want %d", x.len(), len(stay))
	}
}
