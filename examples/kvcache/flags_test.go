package main

import (
	"fmt"
	"testing"
)

// A bad flag value is refused with an error, never a panic or a silent run.
func TestBadFlagsAreErrors(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	l0, d0, e0 := *layers, *dim, *every
	defer func() { *layers, *dim, *every = l0, d0, e0 }()
	for _, tc := range []struct{ layers, dim, every int }{
		{4, 64, 0},  // -every 0
		{0, 64, 16}, // -layers 0
		{4, -1, 16}, // -dim -1
	} {
		t.Run(fmt.Sprintf("layers=%d,dim=%d,every=%d", tc.layers, tc.dim, tc.every), func(t *testing.T) {
			*layers, *dim, *every = tc.layers, tc.dim, tc.every
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("run panicked on a bad flag value: %v", r)
					}
				}()
				err = run([]int{40})
			}()
			if err == nil {
				t.Fatal("run accepted a bad flag value")
			}
		})
	}
}
