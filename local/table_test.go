package local_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

func TestTableBasics(t *testing.T) {
	tb := local.NewTable[int](10, nil)
	require.Equal(t, 10, tb.Cap())
	require.Zero(t, tb.Len())
	_, ok := tb.Get("a")
	require.False(t, ok)

	v, created := tb.GetOrCreate("a", func() int { return 1 })
	require.True(t, created)
	require.Equal(t, 1, v)
	v, created = tb.GetOrCreate("a", func() int { t.Fatal("create on a hit"); return 0 })
	require.False(t, created)
	require.Equal(t, 1, v)

	v, ok = tb.Get("a")
	require.True(t, ok)
	require.Equal(t, 1, v)
	v, ok = tb.Peek("a")
	require.True(t, ok)
	require.Equal(t, 1, v)
	require.Equal(t, 1, tb.Len())

	require.False(t, tb.RemoveIf("a", func(v int) bool { return v == 2 }))
	require.False(t, tb.RemoveIf("missing", func(int) bool { return true }))
	require.True(t, tb.RemoveIf("a", func(v int) bool { return v == 1 }))
	_, ok = tb.Peek("a")
	require.False(t, ok)
	require.Zero(t, tb.Len())

	require.Equal(t, local.DefaultMaxKeys, local.NewTable[int](0, nil).Cap())
	require.Equal(t, local.DefaultMaxKeys, local.NewTable[int](-5, nil).Cap())
}

// The total capacity is exactly maxKeys for any maxKeys, including ones the
// shard count does not divide.
func TestTableExactCapacity(t *testing.T) {
	for _, max := range []int{1, 2, 3, 15, 16, 17, 31, 33, 100, 1000, 1023, 1025, 4097, 100_003} {
		var evicted atomic.Int64
		tb := local.NewTable(max, func(string, int) { evicted.Add(1) })
		require.Equal(t, max, tb.Cap())
		// Far more keys than capacity fill every shard.
		n := 3*max + 2000 // enough for every shard to overflow
		for i := 0; i < n; i++ {
			tb.GetOrCreate(strconv.Itoa(i), func() int { return i })
		}
		require.Equal(t, max, tb.Len(), "maxKeys=%d", max)
		require.EqualValues(t, n-max, evicted.Load(), "maxKeys=%d", max)
	}
}

func TestTableLRUOrder(t *testing.T) {
	var evicted []string
	tb := local.NewTable(3, func(k string, _ int) { evicted = append(evicted, k) }) // one shard
	for _, k := range []string{"a", "b", "c"} {
		tb.GetOrCreate(k, func() int { return 0 })
	}
	tb.Get("a")  // order (old→new): b c a
	tb.Peek("b") // no recency change
	tb.GetOrCreate("d", func() int { return 0 })
	tb.GetOrCreate("c", func() int { return 0 }) // hit: b gone, c becomes newest
	tb.GetOrCreate("e", func() int { return 0 })
	require.Equal(t, []string{"b", "a"}, evicted)
}

// onEvict runs outside the shard lock: it may call back into the table.
func TestTableOnEvictOutsideLock(t *testing.T) {
	var tb *local.Table[int]
	calls := 0
	tb = local.NewTable(4, func(k string, v int) {
		calls++
		_, ok := tb.Peek(k) // would deadlock under the lock
		require.False(t, ok)
		tb.Len()
	})
	for i := 0; i < 10; i++ {
		tb.GetOrCreate(strconv.Itoa(i), func() int { return i })
	}
	require.Equal(t, 6, calls)
	// RemoveIf does not call onEvict.
	tb.Range(func(k string, _ int) bool {
		require.True(t, tb.RemoveIf(k, func(int) bool { return true })) // calls back from Range
		return true
	})
	require.Equal(t, 6, calls)
	require.Zero(t, tb.Len())
}

func TestTableRange(t *testing.T) {
	tb := local.NewTable[int](100_000, nil) // far from full: no shard evicts
	for i := 0; i < 500; i++ {
		tb.GetOrCreate(strconv.Itoa(i), func() int { return i })
	}
	seen := map[string]int{}
	tb.Range(func(k string, v int) bool {
		seen[k] = v
		tb.Get(k) // calling back into the table is allowed
		return true
	})
	require.Len(t, seen, 500)
	for k, v := range seen {
		require.Equal(t, k, strconv.Itoa(v))
	}
	count := 0
	tb.Range(func(string, int) bool { count++; return count < 7 })
	require.Equal(t, 7, count)
}

// Concurrent GetOrCreate of one key runs create once.
func TestTableGetOrCreateOnce(t *testing.T) {
	tb := local.NewTable[*int](100, nil)
	var creates atomic.Int64
	var wg sync.WaitGroup
	results := make([]*int, 64)
	for g := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, _ := tb.GetOrCreate("k", func() *int { creates.Add(1); return new(int) })
			results[g] = v
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1, creates.Load())
	for _, r := range results {
		require.Same(t, results[0], r)
	}
}

func TestTableGetDoesNotAllocate(t *testing.T) {
	tb := local.NewTable[*int](100_000, nil)
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
		tb.GetOrCreate(keys[i], func() *int { return new(int) })
	}
	i := 0
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		tb.Get(keys[i%len(keys)])
		i++
	}))
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		tb.GetOrCreate(keys[i%len(keys)], func() *int { return nil })
		i++
	}))
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		tb.Peek(keys[i%len(keys)])
		i++
	}))
}

// A million distinct keys: the table stays at its bound and onEvict fires
// exactly once for each evicted key.
func TestTableMillionKeys(t *testing.T) {
	const total, maxKeys = 1_000_000, 10_000
	seen := make([]uint8, total)
	var evicted atomic.Int64
	tb := local.NewTable(maxKeys, func(k string, v int) {
		seen[v]++ // keys are inserted by one goroutine: no race
		evicted.Add(1)
	})
	buf := make([]byte, 0, 16)
	for i := 0; i < total; i++ {
		buf = strconv.AppendInt(buf[:0], int64(i), 10)
		// a string that aliases buf: the table must keep its own copy
		tb.GetOrCreate(unsafeString(buf), func() int { return i })
		if i%100_000 == 0 {
			require.LessOrEqual(t, tb.Len(), maxKeys)
		}
	}
	require.Equal(t, maxKeys, tb.Len())
	require.EqualValues(t, total-maxKeys, evicted.Load())
	resident := 0
	tb.Range(func(k string, v int) bool {
		require.Equal(t, strconv.Itoa(v), k, "the stored key must not alias the caller's buffer")
		require.Zero(t, seen[v], "a resident key was reported evicted")
		seen[v] = 2
		resident++
		return true
	})
	require.Equal(t, maxKeys, resident)
	for i, s := range seen {
		if s != 1 && s != 2 {
			t.Fatalf("key %d: evicted %d times", i, s)
		}
	}
}

// The heap a Limiter holds after a million distinct keys is bounded by its
// key bound.
func TestLimiterHeapBounded(t *testing.T) {
	const total, maxKeys = 1_000_000, 20_000
	for _, a := range []ratelimit.Algorithm{ratelimit.SlidingWindow, ratelimit.SlidingLog} {
		t.Run(a.String(), func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)

			c := newClock()
			lim := newLim(t, ratelimit.PerMinute(100), a, c, local.WithMaxKeys(maxKeys))
			ctx := context.Background()
			buf := make([]byte, 0, 32)
			for i := 0; i < total; i++ {
				buf = strconv.AppendInt(append(buf[:0], "user:"...), int64(i), 10)
				if _, err := lim.Allow(ctx, unsafeString(buf)); err != nil {
					t.Fatal(err)
				}
				if i%1000 == 0 {
					c.Advance(time.Millisecond)
				}
			}
			require.Equal(t, maxKeys, lim.Len())
			runtime.GC()
			runtime.ReadMemStats(&after)
			perKey := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / maxKeys
			t.Logf("%v: %d keys tracked after %d distinct: %d bytes per key (HeapAlloc delta / maxKeys)", a, lim.Len(), total, perKey)
			require.Less(t, perKey, int64(1024), "bytes per key")
			runtime.KeepAlive(lim)
		})
	}
}

// GetOrCreateKeyed hands create the table's own copy of the key, not the
// caller's buffer: a value that keeps it shares the bytes the table holds.
func TestTableGetOrCreateKeyedSharesKey(t *testing.T) {
	tb := local.NewTable[*string](100, nil)
	buf := "user-42 and the rest of a request line"
	key := buf[:7]
	var got string
	v, created := tb.GetOrCreateKeyed(key, func(own string) *string { got = own; return &own })
	require.True(t, created)
	require.Equal(t, key, got)
	require.NotSame(t, unsafe.StringData(key), unsafe.StringData(got), "not the caller's buffer")
	var stored string
	tb.Range(func(k string, _ *string) bool { stored = k; return true })
	require.Same(t, unsafe.StringData(got), unsafe.StringData(stored), "create's key is the table's")
	again, created := tb.GetOrCreateKeyed("user-42", func(string) *string { t.Fatal("created twice"); return nil })
	require.False(t, created)
	require.Same(t, v, again)
}
