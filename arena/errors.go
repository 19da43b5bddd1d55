package arena

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/units"
)

// Sentinels callers branch on with errors.Is, all of them here (each
// package of the module keeps its sentinels in its errors.go). One rule for
// their texts, in every package of the module: a sentinel's text names the
// condition alone, without a package prefix; an error a function returns
// names its package once, first ("arena: grow 4 MiB: reservation
// exhausted: ..."), so a sentinel returned as it is goes out wrapped in its
// package's prefix (errClosed).
var (
	// ErrClosed: the arena was closed, or the shared pool it draws from was.
	ErrClosed = errors.New("closed")
	// ErrExhausted: the request does not fit in the reservation. Growth past
	// Config.Reserve is impossible by design (the base never moves); create
	// the arena with a larger reservation.
	ErrExhausted = errors.New("reservation exhausted")
	// ErrRange: an offset or length lies outside the bytes in use.
	ErrRange = errors.New("out of range")
	// ErrImported: the arena is that of an Imported, memory another process
	// shared (Import): its size is the producer's, so it cannot grow, shrink
	// or allocate, and it cannot be shared again.
	ErrImported = errors.New("imported memory has a fixed size")
	// ErrReadOnly: a write into a read-only import.
	ErrReadOnly = errors.New("read-only import")
	// ErrRefused: Share or Import refused the other end of the connection:
	// not the process named (its PID, user, pidfd or check), or a message
	// that breaks the protocol or does not fit this process's limits. That
	// the other end refused this one is its word: a *PeerError (ErrPeer).
	ErrRefused = errors.New("share refused")
	// ErrAsleep is returned by Alloc (beyond the fast path's reach), Grow,
	// Truncate, Reset, Shrink and the copies of an arena that is asleep: its
	// memory was given back to the device by Sleep, and Wake brings it back.
	ErrAsleep = errors.New("asleep")
	// ErrShared is returned by Sleep while a chunk of the arena is shared with
	// another process (Share): the other process maps that memory, so the
	// arena cannot give it back or change it under that process.
	ErrShared = errors.New("memory shared with another process")
	// ErrStale: the buffer's allocation was dropped (Truncate or Reset below
	// its end, Sleep in Discard mode, Close), so its range may hold another
	// allocation now. Copies through it, views of it and Share of it fail with
	// an error matching ErrStale, whatever the arena holds there since.
	ErrStale = errors.New("stale buffer: its allocation was dropped")
	// ErrCallback is returned by an arena's methods called from one of its own
	// OnBackingChange callbacks: the callback runs while the arena changes its
	// memory (holding its lock, for the changes it makes), and such a call would
	// wait for itself. It is refused instead.
	ErrCallback = errors.New("called from its own backing-change callback")
	// ErrPeer is matched by every error the other process of a Share or Import
	// reported about itself (a *PeerError): what it says is its own account,
	// and never matches this process's sentinels (ErrOutOfMemory, ErrRefused,
	// the acl errors).
	ErrPeer = errors.New("the other process failed")

	// ErrOutOfMemory is acl.ErrOutOfMemory: the device, or the pool's budget,
	// has no memory left.
	ErrOutOfMemory = acl.ErrOutOfMemory
	// ErrDeadlock is chunk.ErrDeadlock: a GrowContext or AllocContext failed
	// at once, without waiting out its deadline, because every arena
	// holding the pool's memory waits for memory too, so that none can come
	// back; it is the youngest such waiter. It matches ErrOutOfMemory too.
	// Free memory (preempt that request) and the others are served. See
	// docs/design.md, "Pressure".
	ErrDeadlock = chunk.ErrDeadlock
	// ErrInvalid is acl.ErrInvalidParam: a bad argument or Config.
	ErrInvalid = acl.ErrInvalidParam
)

// The sentinels as the arena returns them alone: with its prefix.
var (
	errClosed   = fmt.Errorf("arena: %w", ErrClosed)
	errCallback = fmt.Errorf("arena: %w", ErrCallback)
)

// errClosedBuffer is the error of a copy through a buffer of a closed
// arena: the allocation went with the arena, so it matches ErrStale as well
// as ErrClosed.
var errClosedBuffer error = closedBuffer{}

type closedBuffer struct{}

func (closedBuffer) Error() string        { return "arena: closed: the buffer's allocation went with it" }
func (closedBuffer) Is(target error) bool { return target == ErrClosed || target == ErrStale }

// poolClosed is the error of a growth whose shared pool was closed under the
// arena: it reads as the pool's error and matches ErrClosed too.
type poolClosed struct{ err error }

func (e poolClosed) Error() string        { return e.err.Error() }
func (e poolClosed) Unwrap() error        { return e.err }
func (e poolClosed) Is(target error) bool { return target == ErrClosed }

// exhausted is the error of a request (what, as "grow by 4 MiB at 0") that
// passes the reservation. It names the one remedy, Config.Reserve: the base
// never moves, so no arena grows past what it reserved when it was made.
func (a *Arena) exhausted(what string) error {
	return fmt.Errorf("arena: %s: %w: %s reserved, the most this arena can ever map; make it with a larger Config.Reserve",
		what, ErrExhausted, units.Ubytes(a.reserved))
}

// joinErr is the error of New, or Import, when the pool refuses the new
// arena: a closed shared pool matches ErrClosed, as the arena's growths do
// once it is closed under them, and chunk.ErrClosed still.
func joinErr(err error) error {
	if errors.Is(err, chunk.ErrClosed) {
		return fmt.Errorf("arena: %w", poolClosed{err})
	}
	return fmt.Errorf("arena: %w", err)
}
