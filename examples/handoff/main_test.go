package main

import (
	"flag"
	"os"
	"testing"

	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
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
	arenagate.Main(m)
}

// The handoff runs on the host driver and on the device model, each process
// with a driver of its own, as on a device.
func TestRun(t *testing.T) {
	*layers, *dim, *prompt, *newToks, *every = 2, 512, 700, 200, 50
	for _, dev := range []string{"host", "model:h200"} {
		t.Run(dev, func(t *testing.T) {
			t.Setenv("VMARENA_DEVICE", dev)
			if err := prefill(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
