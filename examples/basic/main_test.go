package main

import "testing"

// The example runs on the host driver and on the device model, which keeps
// the bytes written as a device does.
func TestRun(t *testing.T) {
	for _, dev := range []string{"host", "model:h200"} {
		t.Run(dev, func(t *testing.T) {
			t.Setenv("VMARENA_DEVICE", dev)
			if err := run(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
