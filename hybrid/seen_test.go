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
	if _, ok := s.find("a", 10, 1000); ok {
		t.Fatal("a key never recorded found")
	}
	sd, ok := s.find("a", 10, 1000)
	if !ok || sd != (seed{idx: 10, uses: 1, asked: 1}) {
		t.Fatalf("recorded in window 10, found in 10: %+v %v; want window 10, free unknown", sd, ok)
	}
	s.note("a", 10, 700, 1000)
	sd, ok = s.find("a", 11, 1000)
	if !ok || sd.idx != 10 || sd.uses != 1 || sd.asked != 1 || !sd.known || sd.free > 700 || sd.free < 700-1000/254-1 {
		t.Fatalf("noted 700 free in window 10, found in 11: %+v %v", sd, ok)
	}
	if _, ok := s.find("a", 12, 1000); ok {
		t.Fatal("a key last recorded two windows back found")
	}
	for _, free := range []int64{-3, 0, 1, 999, 1000, 5000} {
		s.note("b", 20, free, 1000)
		sd, _ := s.find("b", 20, 1000)
		if want := min(max(free, 0), 1000); !sd.known || sd.free > want || sd.free < want-1000/254-1 {
			t.Errorf("noted %d free of 1000: found %+v", free, sd)
		}
	}
	s.note("c", 30, 1, 2)
	if sd, _ := s.find("c", 30, 2); !sd.known || sd.free != 1 {
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
	s.find(keys[0], 9, 100) // the last window
	for _, k := range keys[1:seenWays] {
		s.find(k, 10, 100)
	}
	for _, k := range keys[:seenWays] {
		if _, ok := s.find(k, 10, 100); !ok {
			t.Fatalf("%s not found with %d keys in a bucket of %d", k, seenWays, seenWays)
		}
	}
	// keys[0] was found in window 9 above and left there; the extra key
	// takes its slot.
	s.find(keys[seenWays], 10, 100)
	if _, ok := s.find(keys[seenWays], 10, 100); !ok {
		t.Error("the extra key was not recorded")
	}
	for _, k := range keys[1:seenWays] {
		if _, ok := s.find(k, 10, 100); !ok {
			t.Errorf("%s, of this window, lost its slot", k)
		}
	}
	if _, ok := s.find(keys[0], 10, 100); ok {
		t.Error("the key of the last window kept its slot; want it given to the key of this one")
	}
}
