package main

import "testing"

func TestRun(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	*dim, *every = 512, 64
	if err := run([]int{700, 300, 500}); err != nil {
		t.Fatal(err)
	}
}
