package arena

import (
	"errors"

	"github.com/vmarena/vmarena/acl"
)

// Sentinels callers branch on with errors.Is.
var (
	// ErrClosed: the arena was closed.
	ErrClosed = errors.New("arena: closed")
	// ErrExhausted: the request does not fit in the reservation. Growth past
	// Config.Reserve is impossible by design (the base never moves); create
	// the arena with a larger reservation.
	ErrExhausted = errors.New("arena: reservation exhausted")
	// ErrRange: an offset or length lies outside the bytes in use.
	ErrRange = errors.New("arena: out of range")

	// ErrOutOfMemory is acl.ErrOutOfMemory: the device, or the pool's budget,
	// has no memory left.
	ErrOutOfMemory = acl.ErrOutOfMemory
	// ErrInvalid is acl.ErrInvalidParam: a bad argument or Config.
	ErrInvalid = acl.ErrInvalidParam
)
