package main

import "testing"

// The example runs on the host driver and on the device model, which keeps
// the bytes written as a device does.
func TestRun(t *testing.T) {
	*dim, *every = 512, 64
	for _, dev := range []string{"host", "model:h200"} {
		t.Run(dev, func(t *testing.T) {
			t.Setenv("VMARENA_DEVICE", dev)
			if err := run([]int{700, 300, 500}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
