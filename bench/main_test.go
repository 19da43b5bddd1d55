package main

import (
	"os"
	"testing"

	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
)

// TestMain lets the test binary serve as the suite's fresh processes
// (-fresh): started again with the child variables set, it makes one run
// and exits.
func TestMain(m *testing.M) {
	if childMode(os.Args[1:]) {
		return
	}
	arenagate.Main(m)
}
