package main

import (
	"strings"
	"testing"
)

// -every 0 and -layers 0 are refused with a clear error by the prefill
// process, not by a decode process that crashed (a Go panic exits 2).
func TestBadFlagsAreErrors(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	l0, d0, p0, n0, e0 := *layers, *dim, *prompt, *newToks, *every
	defer func() { *layers, *dim, *prompt, *newToks, *every = l0, d0, p0, n0, e0 }()
	for _, tc := range []struct{ layers, every int }{{2, 0}, {0, 50}} {
		*layers, *dim, *prompt, *newToks, *every = tc.layers, 512, 100, 20, tc.every
		err := prefill()
		if err == nil || strings.Contains(err.Error(), "exit status 2") {
			t.Errorf("-layers %d -every %d: %v; want a clear error, not a crashed decode process", tc.layers, tc.every, err)
		}
	}
}
