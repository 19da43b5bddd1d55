package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/bench/internal/workload"
)

// TestGrowPlotAnyLatencies draws the Grow-latency plot for the sets of
// latencies a run can produce. A single Grow (or all of one latency) once
// crashed the bench after its results were written: the plotting library
// padded the one-value log axis to below zero and panicked.
func TestGrowPlotAnyLatencies(t *testing.T) {
	ev := func(ns ...int64) []workload.GrowEvent {
		out := make([]workload.GrowEvent, len(ns))
		for i, n := range ns {
			out[i].NS = n
		}
		return out
	}
	for name, curves := range map[string][]cdfCurve{
		"none":         nil,
		"one":          {{name: "arena", ev: ev(932)}},
		"equal":        {{name: "arena", ev: ev(5000, 5000, 5000)}, {name: "paged", ev: ev(5000)}},
		"zero":         {{name: "arena", ev: ev(0)}},
		"spread":       {{name: "arena", ev: ev(1, 900, 42_000, 7_000_000)}},
		"one is empty": {{name: "arena", ev: ev(3000)}, {name: "paged"}},
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "grow.png")
			require.NoError(t, cdfPlot(p, "title", curves))
			st, err := os.Stat(p)
			require.NoError(t, err)
			require.Positive(t, st.Size())
		})
	}
	for _, c := range []struct{ lo, hi, a, b float64 }{
		{0.932, 0.932, 0.1, 1}, {5, 5, 1, 10}, {1, 10, 1, 10}, {1e-3, 7000, 1e-3, 1e4}, {3, 40, 1, 100},
	} {
		a, b := logRange(c.lo, c.hi)
		require.InEpsilon(t, c.a, a, 1e-9, "logRange(%v, %v)", c.lo, c.hi)
		require.InEpsilon(t, c.b, b, 1e-9, "logRange(%v, %v)", c.lo, c.hi)
	}
}
