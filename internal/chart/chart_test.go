package chart

import (
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	f := Figure{
		Name:    "test-fig",
		Command: "go run ./x --plot DIR",
		Panels: []Panel{
			{
				Title: "linear", X: "time (s)", Y: "decisions/s",
				Series: []Series{
					{Name: "a", X: []float64{0, 1, 2}, Y: []float64{3, 1, 2}},
					{Name: "limit", X: []float64{0, 2}, Y: []float64{2, 2}, Style: Steps},
					{Name: "empty"},
				},
			},
			{
				Title: "log, with points a log axis cannot show", X: "u", Y: "round trips", LogX: true, LogY: true,
				Series: []Series{
					{Name: "b", X: []float64{0.1, 1, 10, 100}, Y: []float64{1, 0, 0.01, math.NaN()}, Style: LinesPoints},
					{Name: "one point", X: []float64{5}, Y: []float64{5}, Style: Points},
					{Name: "nothing drawable", X: []float64{-1}, Y: []float64{0}},
				},
			},
			{Title: "log without any drawable point", LogY: true, Series: []Series{{Name: "z", X: []float64{1}, Y: []float64{0}}}},
		},
	}
	require.NoError(t, f.Write(dir))
	g, err := Read(dir, "test-fig")
	require.NoError(t, err)
	require.Equal(t, f.Command, g.Command)
	require.Len(t, g.Panels, 3)
	p, ok := g.Panel("log")
	require.True(t, ok)
	require.Equal(t, []string{"b", "one point", "nothing drawable"}, p.Names())
	b, ok := p.Get("b")
	require.True(t, ok)
	require.Equal(t, []float64{1, 0, 0.01, 0}, b.Y, "every point kept in the JSON; NaN as 0")
	_, ok = p.Get("nope")
	require.False(t, ok)
	_, ok = g.Panel("nope")
	require.False(t, ok)
}

func TestWriteRejects(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []Figure{
		{Name: "Bad Name", Panels: []Panel{{}}},
		{Name: ""},
		{Name: "no-panels"},
		{Name: "uneven", Panels: []Panel{{Series: []Series{{Name: "s", X: []float64{1, 2}, Y: []float64{1}}}}}},
	} {
		require.Error(t, f.Write(dir), f.Name)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing written for a rejected figure")
}

func TestReadRejects(t *testing.T) {
	dir := t.TempDir()
	f := Figure{Name: "ok", Panels: []Panel{{Title: "t", Series: []Series{{Name: "s", X: []float64{1, 2}, Y: []float64{1, 2}}}}}}
	require.NoError(t, f.Write(dir))
	_, err := Read(dir, "ok")
	require.NoError(t, err)

	png, svg, js := Files(dir, "ok")
	corrupt := func(path, content string) {
		old, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
		_, err = Read(dir, "ok")
		require.Error(t, err, "%s: %q", path, content)
		require.NoError(t, os.WriteFile(path, old, 0o644))
	}
	corrupt(png, "not a png")
	corrupt(svg, "<svg><g></svg>")
	corrupt(svg, "<html></html>")
	corrupt(js, "{")
	corrupt(js, `{"name":"other","panels":[{}]}`)
	corrupt(js, `{"name":"ok","panels":[{"series":[{"name":"s","x":[1],"y":[]}]}]}`)
	_, err = Read(dir, "missing")
	require.Error(t, err)
}

func TestShort(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.01: "0.01", 1.5: "1.5", 2500: "2.5k", 5000: "5k", 1e6: "1M", 12345678: "12.35M", -3000: "-3k", 1e10: "10G"} {
		require.Equal(t, want, short(v), "%v", v)
	}
}
