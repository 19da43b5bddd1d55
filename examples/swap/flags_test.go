package main

import (
	"bytes"
	"testing"
)

// -turns 0 and a negative size are refused with an error, not a panic.
func TestBadFlagsAreErrors(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	w0, k0, n0 := *weightsMiB, *kvMiB, *turns
	defer func() { *weightsMiB, *kvMiB, *turns = w0, k0, n0 }()
	for _, tc := range []struct{ w, kv, turns int }{{16, 8, 0}, {-1, 8, 2}} {
		*weightsMiB, *kvMiB, *turns = tc.w, tc.kv, tc.turns
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("-weights %d -kv %d -turns %d: run panicked: %v", tc.w, tc.kv, tc.turns, r)
				}
			}()
			_, err = run(&bytes.Buffer{})
		}()
		if err == nil {
			t.Errorf("-weights %d -kv %d -turns %d: accepted", tc.w, tc.kv, tc.turns)
		}
	}
}
