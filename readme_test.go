package ratelimit_test

import (
	"bytes"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeBlock returns the first ```go block after the heading in README.md.
func readmeBlock(t *testing.T, heading string) []byte {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, after, ok := bytes.Cut(readme, []byte("\n"+heading+"\n"))
	require.True(t, ok, "README.md has no %q heading", heading)
	_, after, ok = bytes.Cut(after, []byte("```go\n"))
	require.True(t, ok, "no go block after %q", heading)
	block, _, ok := bytes.Cut(after, []byte("```\n"))
	require.True(t, ok, "the go block after %q does not end", heading)
	return block
}

// The README's "Use" program is gofmt'ed, and compiles and passes go vet as
// it stands, in this module (so against this module's code and go.sum).
func TestReadmeUse(t *testing.T) {
	src := readmeBlock(t, "## Use")
	formatted, err := format.Source(src)
	require.NoError(t, err)
	require.Equal(t, string(formatted), string(src), "the README's program is not gofmt'ed")

	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command runs the tests, so it must be on PATH")
	// A directory in the module, its name starting with a dot so that
	// ./... never sees it.
	dir, err := os.MkdirTemp(".", ".readme-use-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644))
	out, err := exec.Command(goTool, "vet", "./"+filepath.Base(dir)).CombinedOutput()
	require.NoError(t, err, "go vet of the README's program:\n%s", out)
}
