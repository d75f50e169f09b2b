package script

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/hybridlimit/ratelimit"
)

// DefaultPrefix is the Redis key prefix the limiters use when none is given.
const DefaultPrefix = "ratelimit"

// MaxVerbatimKey is the longest user key that is used in Redis verbatim;
// longer keys are replaced by a hash.
const MaxVerbatimKey = 128

// HashTag returns the part of a Redis key that stands for the user key: the
// key itself, or "#" and the hex SHA-256 of it when the key is longer than
// MaxVerbatimKey bytes, holds '{' or '}', or starts with '#'. It never
// returns a string holding braces, so it is safe inside a Cluster hash tag.
func HashTag(key string) string {
	if len(key) <= MaxVerbatimKey && !strings.ContainsAny(key, "{}") && !strings.HasPrefix(key, "#") {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(sum[:])
}

// KeyBase returns "<prefix>:{<tag>}:", the part every Redis key of one user
// key starts with, so that all of them hash to one Cluster slot. It returns
// an error wrapping ratelimit.ErrInvalidKey for an empty key.
func KeyBase(prefix, key string) (string, error) {
	if key == "" {
		return "", ratelimit.ErrInvalidKey
	}
	return prefix + ":{" + HashTag(key) + "}:", nil
}

// CounterKind returns the kind of the window counters of a FixedWindow
// ("fw") or SlidingWindow ("sw") limiter: the part of a counter's Redis key
// between the key base and the window index.
func CounterKind(a ratelimit.Algorithm) string {
	if a == ratelimit.SlidingWindow {
		return "sw"
	}
	return "fw"
}

// WindowKey returns the Redis key of the counter of window idx (the window
// starts at idx x Period since the epoch) of the given kind, for the
// KeyBase of a user key. Global and hybrid limiters count in these same
// counters.
func WindowKey(base, kind string, idx int64) string {
	return base + kind + ":" + strconv.FormatInt(idx, 10)
}
