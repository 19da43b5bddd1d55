package main

import (
	"os"
	"strings"
	"testing"
)

// The tour runs on the host driver and on the device model, which keeps the
// bytes written as a device does.
func TestTour(t *testing.T) {
	for _, dev := range []string{"host", "model:h200"} {
		t.Run(dev, func(t *testing.T) {
			t.Setenv("VMARENA_DEVICE", dev)
			if err := tour(); err != nil {
				t.Fatal(err)
			}
			if err := shared(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The README shows this program as it is: the first Go block of its "A short
// tour" section is main.go, byte for byte.
func TestREADMEShowsTheTour(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## A short tour\n")
	if !ok {
		t.Fatal(`README.md has no "## A short tour" section`)
	}
	_, block, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("the tour section has no ```go block")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("the tour's ```go block is not closed")
	}
	if got, want := block+"\n", string(src); got != want {
		gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("README.md's tour differs from examples/tour/main.go at line %d:\nREADME:  %q\nmain.go: %q\n"+
					"(copy main.go into the README's block)", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("README.md's tour has %d lines, examples/tour/main.go %d (copy main.go into the README's block)",
			len(gl), len(wl))
	}
}
