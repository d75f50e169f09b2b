package local_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

// heapPerKey fills a Limiter bounded to maxKeys keys with twice as many
// distinct keys of keyLen bytes, each built in one reused buffer (so that
// only what the Limiter keeps stays on the heap), and returns the heap it
// holds per key.
func heapPerKey(t *testing.T, a ratelimit.Algorithm, keyLen, maxKeys int) int64 {
	t.Helper()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c := newClock()
	lim := newLim(t, ratelimit.PerMinute(100), a, c, local.WithMaxKeys(maxKeys))
	ctx := context.Background()
	buf := make([]byte, keyLen)
	for i := range buf {
		buf[i] = 'a' + byte(i%26)
	}
	for i := 0; i < 2*maxKeys; i++ {
		strconv.AppendInt(buf[:0], int64(1_000_000+i), 10) // distinct in its first 7 bytes
		if _, err := lim.Allow(ctx, unsafeString(buf)); err != nil {
			t.Fatal(err)
		}
	}
	require.Equal(t, maxKeys, lim.Len())
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(lim)
	return (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(maxKeys)
}

// A key costs the Limiter a bounded number of bytes, however long it is: a
// 10 KB key no more than a 128-byte one, so WithMaxKeys bounds the memory
// whatever keys a hostile caller sends (see Limiter's memory bound).
func TestLongKeyMemoryBounded(t *testing.T) {
	const maxKeys = 4000
	for _, a := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.TokenBucket, ratelimit.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			short := heapPerKey(t, a, 16, maxKeys)
			verbatim := heapPerKey(t, a, 128, maxKeys)
			long := heapPerKey(t, a, 10<<10, maxKeys)
			t.Logf("%v: heap per key: %d bytes for 16-byte keys, %d for 128-byte keys, %d for 10 KB keys", a, short, verbatim, long)
			require.Less(t, verbatim, int64(400), "bytes per 128-byte key (Limiter documents 400 at most)")
			require.Less(t, long, int64(400), "bytes per 10 KB key (Limiter documents 400 at most)")
		})
	}
}

// Long keys are told apart by their digests: two 10 KB keys that differ in
// their last byte count separately, one key counts as itself, and a short
// key that starts like a digest form is not another key's digest.
func TestLongKeysDistinct(t *testing.T) {
	c := newClock()
	lim := newLim(t, ratelimit.PerMinute(2), ratelimit.FixedWindow, c)
	ctx := context.Background()
	long := make([]byte, 10<<10)
	for i := range long {
		long[i] = 'k'
	}
	a := string(long)
	long[len(long)-1] = 'j'
	b := string(long)
	for _, k := range []string{a, b, a[:129], a[:128], "\x00" + a[:32], "\x00"} {
		for i := 0; i < 3; i++ {
			d, err := lim.Allow(ctx, k)
			require.NoError(t, err)
			require.Equal(t, i < 2, d.Allowed, "key of %d bytes, request %d", len(k), i)
		}
	}
	require.Equal(t, 6, lim.Len())
	require.Zero(t, testing.AllocsPerRun(100, func() { lim.Allow(ctx, a) }), "a decision on a known long key allocates")
}
