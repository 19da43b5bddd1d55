package model

import "time"

// Modelled time.
//
// The model spends a call's cost on the calling goroutine, as a real driver
// call occupies its thread. Sleeping is too coarse for microseconds (a timer
// fires tens of microseconds to a millisecond late), so the model spins on
// the monotonic clock, which is accurate to well under a microsecond and
// allocates nothing. A wait longer than sleepAbove sleeps for all but the
// last spinTail and spins the rest, so that a long wait neither burns a CPU
// for its whole length nor loses its accuracy.

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
