package main

import "testing"

func TestRun(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	*weightsMiB, *kvMiB, *turns = 16, 8, 4
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
