package model

import (
	"sync/atomic"
	"time"
)

// Modelled time.
//
// The model spends a call's cost on the calling goroutine, as a real driver
// call occupies its thread. Sleeping is too coarse for microseconds (a timer
// fires tens of microseconds to a millisecond late), so the model spins on
// the monotonic clock, which is accurate to well under a microsecond and
// allocates nothing. A wait longer than sleepAbove sleeps for all but the
// last spinTail and spins the rest, so that a long wait neither burns a CPU
// for its whole length nor loses its accuracy.

// A driver made with Config.virtualTime (tests only) spends nothing: its
// clock is a counter that each wait moves forward to its deadline, so that a
// single goroutine's calls add up to exactly what the profile charges,
// however loaded the machine. The calibration test measures on it.

// epoch is the origin of the model's clock.
var epoch = time.Now()

const (
	sleepAbove = 2 * time.Millisecond
	spinTail   = time.Millisecond
)

// now returns the monotonic time in nanoseconds since epoch.
func now() int64 { return int64(time.Since(epoch)) }

// waitUntil returns once now() has reached deadline.
func waitUntil(deadline int64) {
	left := deadline - now()
	if left <= 0 {
		return
	}
	if left > int64(sleepAbove) {
		time.Sleep(time.Duration(left) - spinTail)
	}
	for now() < deadline {
	}
}

// waitUntilOr is waitUntil, returning early once quit is closed.
func waitUntilOr(deadline int64, quit <-chan struct{}) {
	if left := deadline - now(); left > int64(sleepAbove) {
		t := time.NewTimer(time.Duration(left) - spinTail)
		select {
		case <-t.C:
		case <-quit:
			t.Stop()
			return
		}
	}
	waitUntil(deadline)
}

// vclock is a virtual clock: a wait moves it forward to its deadline at
// once. It is exact for the calls of one goroutine; concurrent calls
// overlap in it as they please.
type vclock struct{ t atomic.Int64 }

func (c *vclock) advance(deadline int64) {
	for {
		t := c.t.Load()
		if t >= deadline || c.t.CompareAndSwap(t, deadline) {
			return
		}
	}
}

// now returns the driver's clock: the monotonic clock, or the virtual one.
func (d *Driver) now() int64 {
	if d.virt != nil {
		return d.virt.t.Load()
	}
	return now()
}

// waitUntil spends the driver's time until deadline.
func (d *Driver) waitUntil(deadline int64) {
	if d.virt != nil {
		d.virt.advance(deadline)
		return
	}
	waitUntil(deadline)
}

// waitUntilOr is waitUntil, returning early once quit is closed.
func (d *Driver) waitUntilOr(deadline int64, quit <-chan struct{}) {
	if d.virt != nil {
		d.virt.advance(deadline)
		return
	}
	waitUntilOr(deadline, quit)
}
