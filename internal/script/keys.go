package script

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

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

// Kind returns the part of a state key's name between the key base and
// the window index (for the window algorithms) that names the algorithm and
// the limit: "fw:<R>", "sw:<R>", "sl:<R>:<P>", "tb:<R>:<P>:<B>",
// "gcra:<R>:<P>:<B>" (P in microseconds, B the capacity). Limiters count in
// one state only when they share the prefix, the algorithm and the limit:
// two limits on one prefix (a free and a paid tier, say) never share a
// counter by mistake. (A window index implies its period: windows of
// different periods never share an index at the same time.)
func Kind(a ratelimit.Algorithm, l ratelimit.Limit) string {
	r := strconv.Itoa(l.Rate)
	p := strconv.FormatInt(int64(l.Period/time.Microsecond), 10)
	b := strconv.Itoa(l.Capacity(a))
	switch a {
	case ratelimit.FixedWindow:
		return "fw:" + r
	case ratelimit.SlidingWindow:
		return "sw:" + r
	case ratelimit.SlidingLog:
		return "sl:" + r + ":" + p
	case ratelimit.TokenBucket:
		return "tb:" + r + ":" + p + ":" + b
	case ratelimit.GCRA:
		return "gcra:" + r + ":" + p + ":" + b
	}
	return "x"
}

// WindowKey returns the Redis key of the counter of window idx (the window
// starts at idx x Period since the epoch) of the given Kind, for the
// KeyBase of a user key. Global and hybrid limiters count in these same
// counters.
func WindowKey(base, kind string, idx int64) string {
	var buf [128]byte // (one allocation, the string, when it fits)
	return string(appendWindow(append(buf[:0], base...), kind, idx))
}

// TaggedWindowKey is WindowKey for the key base "<prefix>:{<tag>}:" (see
// KeyBase), built in the same string: it returns the key and the base,
// which is the start of it (one allocation for both).
func TaggedWindowKey(prefix, tag, kind string, idx int64) (key, base string) {
	var buf [128]byte
	b := append(buf[:0], prefix...)
	b = append(b, ":{"...)
	b = append(b, tag...)
	b = append(b, "}:"...)
	n := len(b)
	key = string(appendWindow(b, kind, idx))
	return key, key[:n]
}

// appendWindow appends what follows the key base in a window's key.
func appendWindow(b []byte, kind string, idx int64) []byte {
	b = append(b, kind...)
	b = append(b, ':')
	return strconv.AppendInt(b, idx, 10)
}
