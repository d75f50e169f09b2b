package hybrid

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit/internal/script"
)

// TestWindowKey: windowKey's key and base are script.WindowKey's and the
// key base every other call uses, for keys with and without a hash tag,
// of any length (those past script.MaxVerbatimKey are hashed), and
// prefixes long enough that the key does not fit windowKey's buffer.
func TestWindowKey(t *testing.T) {
	long := strings.Repeat("k", script.MaxVerbatimKey+10)
	for _, prefix := range []string{"rl", strings.Repeat("p", 150)} {
		for _, k := range []string{"", "user:1", "{tag}rest", "a{b}c{d}", long} {
			for _, idx := range []int64{0, -1, 1_765_432_100} {
				key, base := windowKey(prefix, k, "fw:2000", idx)
				require.Equal(t, prefix+":{"+tagOf(k)+"}:", base)
				require.Equal(t, base, keyBase(prefix, k))
				require.Equal(t, script.WindowKey(base, "fw:2000", idx), key)
			}
		}
	}
}
