// Package arenagate is the leak gate (package leakgate) for test packages
// whose tests use arenas: it also checks the process's default driver.
//
// The default driver (arena.DefaultDriver: the driver an arena with a zero
// Config uses) lives as long as the process, by design: nobody closes it.
// Main opens it before the gate takes its baseline, so that the descriptor
// and whatever else it keeps for itself belong to the process as the tests
// found it; after the tests, what it holds for callers (acl.LiveCounts:
// reservations, mappings, physical memory, streams, events, host buffers)
// must be zero, as every test's own driver must be. When the default driver
// cannot be opened ($VMARENA_DEVICE names a device that is not here), the
// gate checks goroutines and descriptors only; the tests that need it fail
// on their own.
package arenagate

import (
	"fmt"
	"os"
	"testing"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/internal/leakgate"
)

// Main runs m's tests through the leak gate, with the default driver's
// live objects checked too, and exits.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain that has more to do: it returns the exit
// status.
func Run(m *testing.M) int {
	return leakgate.Run(m, DefaultDriver()...)
}

// DefaultDriver opens the default driver and returns the check of its live
// objects; none when it cannot be opened or counts nothing. Call it before
// the gate's baseline (Run does).
func DefaultDriver() []leakgate.Check {
	d, err := arena.DefaultDriver()
	if err != nil {
		return nil
	}
	c, ok := d.(acl.Counter)
	if !ok {
		return nil
	}
	return []leakgate.Check{leakgate.Live(fmt.Sprintf("the default driver (%s)", d.Name()), c)}
}
