package main

import "testing"

func TestRun(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
