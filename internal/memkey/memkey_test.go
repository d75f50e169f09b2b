package memkey_test

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit/internal/memkey"
)

func TestHashed(t *testing.T) {
	require.False(t, memkey.Hashed(""))
	require.False(t, memkey.Hashed("user:42"))
	require.False(t, memkey.Hashed(strings.Repeat("k", memkey.MaxVerbatim)))
	require.True(t, memkey.Hashed(strings.Repeat("k", memkey.MaxVerbatim+1)))
	require.True(t, memkey.Hashed("\x00short"), "a key starting with Mark could pose as a digest form")
}

func TestDigest(t *testing.T) {
	long := strings.Repeat("x", 10<<10)
	var a, b [memkey.DigestLen]byte
	memkey.Digest(&a, long)
	sum := sha256.Sum256([]byte(long))
	require.Equal(t, byte(memkey.Mark), a[0])
	require.Equal(t, sum[:], a[1:])
	memkey.Digest(&b, long[:len(long)-1]+"y")
	require.NotEqual(t, a, b)
	require.Zero(t, testing.AllocsPerRun(100, func() { memkey.Digest(&b, long) }), "hashing a key copies it")
}
