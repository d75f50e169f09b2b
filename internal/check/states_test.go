package check_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/check"
)

func TestStates(t *testing.T) {
	p := check.States(nil, 3)
	require.Len(t, *p, 3)
	buf := make([]ratelimit.LimitState, 1, 4)
	q := check.States(&buf, 3)
	require.Same(t, &buf, q)
	require.Len(t, buf, 3)
	require.Equal(t, 4, cap(buf), "its array reused")
	small := make([]ratelimit.LimitState, 0, 2)
	check.States(&small, 3)
	require.Len(t, small, 3)
}
