// Package memkey bounds the memory a user key costs in a limiter's tables: a
// key longer than MaxVerbatim bytes is kept by its SHA-256 digest, as the
// Redis keys already are (see internal/script.HashTag), so a hostile caller
// sending 10 KB keys costs as much memory per key as one sending short ones.
package memkey

import (
	"crypto/sha256"
	"unsafe"
)

// MaxVerbatim is the longest key kept in memory as it is.
const MaxVerbatim = 128

// DigestLen is the length of the form a longer key is kept in: Mark and the
// key's SHA-256.
const DigestLen = 1 + sha256.Size

// Mark is the first byte of every digest form. A key that starts with it is
// kept by its digest whatever its length, so no key kept as it is can equal
// another key's digest form.
const Mark = 0

// Hashed reports whether key is kept by its digest.
func Hashed(key string) bool {
	return len(key) > MaxVerbatim || (len(key) > 0 && key[0] == Mark)
}

// Digest writes the digest form of key into dst. Two keys share a digest
// form only if they are equal or SHA-256 collides.
func Digest(dst *[DigestLen]byte, key string) {
	dst[0] = Mark
	// Sum256 only reads its argument: hashing the string's bytes in place
	// spares copying a key that may be kilobytes long.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(key), len(key)))
	copy(dst[1:], sum[:])
}
