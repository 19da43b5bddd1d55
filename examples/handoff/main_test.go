package main

import (
	"flag"
	"os"
	"testing"
)

// The test binary is also the decode process: run with -decode, it decodes.
func TestMain(m *testing.M) {
	flag.Parse()
	if *decode {
		if err := decodeMain(); err != nil {
			os.Stderr.WriteString("handoff: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestRun(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	*layers, *dim, *prompt, *newToks, *every = 2, 512, 700, 200, 50
	if err := prefill(); err != nil {
		t.Fatal(err)
	}
}
