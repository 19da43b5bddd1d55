// Package schedtest helps tests force an interleaving where no point of
// package sched can say what they need: that a goroutine is blocked, here and
// now, and so cannot do what the test checks it does not do.
package schedtest

import (
	"strings"
	"testing"
	"time"

	"github.com/vmarena/vmarena/internal/leakgate"
)

// WaitBlocked waits, for up to 10 s, until some goroutine is blocked in the
// state the runtime names (the word in brackets of a goroutine dump:
// "sync.Mutex.Lock", "select", "chan receive") with frame among the
// functions on its stack (a qualified name such as
// "github.com/vmarena/vmarena/arena.client.Unmapping"). It fails the test
// when none is. A goroutine in that state cannot run until whatever blocks
// it lets go, so a test that holds that, and has seen the goroutine blocked,
// knows what the goroutine has not done yet, without sleeping on it.
func WaitBlocked(t testing.TB, state, frame string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !Blocked(state, frame) {
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine blocked in [%s] in %s", state, frame)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// Blocked reports whether some goroutine is blocked in state with frame on
// its stack (see WaitBlocked).
func Blocked(state, frame string) bool {
	for _, g := range leakgate.Stacks() {
		head, body, _ := strings.Cut(g, "\n")
		// "goroutine 7 [sync.Mutex.Lock]:" or, after a while,
		// "goroutine 7 [sync.Mutex.Lock, 2 minutes]:".
		_, s, ok := strings.Cut(head, " [")
		if !ok {
			continue
		}
		s, _, _ = strings.Cut(strings.TrimSuffix(s, "]:"), ",")
		if s == state && strings.Contains(body, frame+"(") {
			return true
		}
	}
	return false
}
