package chunk

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// Sentinels callers branch on with errors.Is, all of them here. Their texts
// name the condition alone; an error the package returns names it once,
// first ("chunk: pool budget exhausted: ..."), so a sentinel returned as it
// is goes out with the prefix (errClosed, errBusy).
var (
	// ErrBudget is returned (wrapped, together with acl.ErrOutOfMemory) when a
	// Get would take the pool past Config.Budget and nothing could be reclaimed.
	ErrBudget = errors.New("pool budget exhausted")

	// ErrClosed is returned by a Pool after Close.
	ErrClosed = errors.New("pool closed")

	// ErrMapped is matched by the error of a Map that mapped the chunk, failed
	// after that (granting access or scrubbing), and could not unmap it again:
	// the chunk is still mapped at the address, without access or unscrubbed,
	// and must be unmapped before it is Put back.
	ErrMapped = errors.New("left mapped by a failed Map")

	// ErrBusy is the error of a speculative growth that found, at an address
	// it maps into, a chunk a relief claimed or that is being unmapped: its
	// client asks again later.
	ErrBusy = errors.New("a chunk in the growth's way is being settled")

	// ErrDeadlock is returned by Waiter.Wait, wrapped with acl.ErrOutOfMemory,
	// when waiting cannot serve the growth: every member of the pool that holds
	// its memory waits for memory too, no chunk waits for the device or is on
	// its way back to the driver, no growth is relieving pressure, and what the
	// budget leaves, the cache holds and the members hold idle would not serve
	// the first waiter. The youngest waiter whose member holds memory gets it at
	// once, as a serving engine preempts its youngest sequence: what its caller
	// then frees serves the others. The rule cannot see memory another goroutine
	// of a waiting member might still free; failing the youngest is then an
	// early preemption, and nothing is lost (a failed growth changes nothing).
	ErrDeadlock = errors.New("deadlock avoided: every member holding the pool's memory waits for memory")

	// ErrNoOrder is matched by the error of ReleaseAfter when it could not order
	// the release with events (an event call failed): nothing was released, and
	// the caller releases the chunks the synchronous way (SyncDevice, then
	// Release). Stats.SyncFallbacks counts it.
	ErrNoOrder = errors.New("stream-ordered release unavailable")
)

// The sentinels as the package returns them alone: with its prefix.
var (
	errClosed = fmt.Errorf("chunk: %w", ErrClosed)
	// errNotMade is what a Pool not made by New (its zero value) answers.
	errNotMade = fmt.Errorf("chunk: %w: the Pool was not made by New", acl.ErrInvalidParam)
	errBusy    = fmt.Errorf("chunk: %w", ErrBusy)
)
