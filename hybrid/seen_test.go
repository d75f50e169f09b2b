package hybrid

import (
	"fmt"
	"hash/maphash"
	"testing"
)

// seen finds a key recorded in this window or the last, with what Redis
// had free when noted (rounded down, by less than a 254th of the limit and a unit),
// and forgets it two windows on.
func TestSeenWindows(t *testing.T) {
	s := newSeen(1000)
	if _, ok := s.find(s.hash("a"), 10, 1000, leaseAt); ok {
		t.Fatal("a key never recorded found")
	}
	sd, ok := s.find(s.hash("a"), 10, 1000, leaseAt)
	if !ok || sd != (seed{idx: 10, uses: 1, asked: 1}) {
		t.Fatalf("recorded in window 10, found in 10: %+v %v; want window 10, free unknown", sd, ok)
	}
	s.note(s.hash("a"), 10, 700, 1000)
	sd, ok = s.find(s.hash("a"), 11, 1000, leaseAt)
	if !ok || sd.idx != 10 || sd.uses != 1 || sd.asked != 1 || !sd.known || sd.free > 700 || sd.free < 700-1000/254-1 {
		t.Fatalf("noted 700 free in window 10, found in 11: %+v %v", sd, ok)
	}
	if _, ok := s.find(s.hash("a"), 12, 1000, leaseAt); ok {
		t.Fatal("a key last recorded two windows back found")
	}
	for _, free := range []int64{-3, 0, 1, 999, 1000, 5000} {
		s.note(s.hash("b"), 20, free, 1000)
		sd, _ := s.find(s.hash("b"), 20, 1000, leaseAt)
		if want := min(max(free, 0), 1000); !sd.known || sd.free > want || sd.free < want-1000/254-1 {
			t.Errorf("noted %d free of 1000: found %+v", free, sd)
		}
	}
	s.note(s.hash("c"), 30, 1, 2)
	if sd, _ := s.find(s.hash("c"), 30, 2, leaseAt); !sd.known || sd.free != 1 {
		t.Errorf("noted 1 free of 2: found %+v; want 1, exact for a limit under 254", sd)
	}
}

// Keys that share a bucket: as many as it has slots are all found; one
// more takes the slot of a key recorded in the last window, never one of
// this window while another is older.
func TestSeenBucket(t *testing.T) {
	s := newSeen(1)
	bucket := func(k string) uint64 { return maphash.String(s.seed, k) & s.mask }
	var keys []string
	for i := 0; len(keys) < seenWays+1; i++ {
		if k := fmt.Sprint("k", i); len(keys) == 0 || bucket(k) == bucket(keys[0]) {
			keys = append(keys, k)
		}
	}
	s.find(s.hash(keys[0]), 9, 100, leaseAt) // the last window
	for _, k := range keys[1:seenWays] {
		s.find(s.hash(k), 10, 100, leaseAt)
	}
	for _, k := range keys[:seenWays] {
		if _, ok := s.find(s.hash(k), 10, 100, leaseAt); !ok {
			t.Fatalf("%s not found with %d keys in a bucket of %d", k, seenWays, seenWays)
		}
	}
	// keys[0] was found in window 9 above and left there; the extra key
	// takes its slot.
	s.find(s.hash(keys[seenWays]), 10, 100, leaseAt)
	if _, ok := s.find(s.hash(keys[seenWays]), 10, 100, leaseAt); !ok {
		t.Error("the extra key was not recorded")
	}
	for _, k := range keys[1:seenWays] {
		if _, ok := s.find(s.hash(k), 10, 100, leaseAt); !ok {
			t.Errorf("%s, of this window, lost its slot", k)
		}
	}
	if _, ok := s.find(s.hash(keys[0]), 10, 100, leaseAt); ok {
		t.Error("the key of the last window kept its slot; want it given to the key of this one")
	}
}

// On a crowded instance (need crowdedAt) a key is found at its need-th
// decision of one window, with the decisions before it as its counter's
// start, and never for a decision in the window before: a key asked once a
// window stays without a counter. The count restarts with each window, and
// note keeps it.
func TestSeenCrowded(t *testing.T) {
	s := newSeen(1000)
	for w := int64(10); w < 14; w++ {
		if sd, ok := s.find(s.hash("a"), w, 1000, crowdedAt); ok {
			t.Fatalf("asked once in each window, found in window %d: %+v", w, sd)
		}
	}
	for i := 2; i < crowdedAt; i++ {
		if _, ok := s.find(s.hash("a"), 13, 1000, crowdedAt); ok {
			t.Fatalf("found at decision %d of window 13; want %d", i, crowdedAt)
		}
		s.note(s.hash("a"), 13, 900, 1000)
	}
	sd, ok := s.find(s.hash("a"), 13, 1000, crowdedAt)
	if want := int64(crowdedAt - 1); !ok || sd.idx != 13 || sd.uses != want || sd.asked != want || !sd.known || sd.free > 900 || sd.free < 900-1000/254-1 {
		t.Fatalf("decision %d of window 13: %+v %v; want found, %d asked before, 900 free", crowdedAt, sd, ok, crowdedAt-1)
	}
	if _, ok := s.find(s.hash("a"), 14, 1000, crowdedAt); ok {
		t.Fatal("first decision of window 14 found: the count did not restart")
	}
	// Not crowded any more: the window before counts again.
	if sd, ok := s.find(s.hash("a"), 15, 1000, leaseAt); !ok || sd.idx != 14 || sd.asked != 1 {
		t.Fatalf("not crowded, recorded in window 14, found in 15: %+v %v", sd, ok)
	}
	// The count saturates, it does not wrap into the remainder.
	hb := s.hash("b")
	for range 40 {
		s.find(hb, 20, 1000, 100)
	}
	b := s.slots[hb&s.mask:][:seenWays]
	for i := range b {
		if x := b[i].Load(); x&seenFP == hb&seenFP && (x&seenCount != seenCount || x&seenFree != 0) {
			t.Errorf("40 decisions of a window: slot %#x; want the count at 15 and the remainder unknown", x)
		}
	}
}

// crowded follows the calls per waited round trip, up and down.
func TestCrowd(t *testing.T) {
	var c crowd
	for range 100 {
		c.add(crowdedCalls - 1)
	}
	if c.crowded() {
		t.Fatalf("round trips of %d calls: crowded (avg %d/16)", crowdedCalls-1, c.avg.Load())
	}
	for range 100 {
		c.add(64)
	}
	if !c.crowded() {
		t.Fatalf("round trips of 64 calls: not crowded (avg %d/16)", c.avg.Load())
	}
	for range 100 {
		c.add(4)
	}
	if c.crowded() {
		t.Fatalf("round trips of 4 calls after 64: still crowded (avg %d/16)", c.avg.Load())
	}
}
