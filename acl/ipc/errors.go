package ipc

import "errors"

// Sentinels callers branch on with errors.Is, all of them here.
var (
	// ErrNoProcess is matched by the errors of OpenProcess and Process.Alive
	// when the process does not run.
	ErrNoProcess = errors.New("no such process")

	// ErrNotPeer is matched by the errors of RecvPeer, Identify and RecvFrom
	// when a message came from another process than the peer: a connected
	// socket handed on to a process that writes with credentials of its own, or
	// a message whose pieces came from two writers, or a message that names no
	// process (sent without credentials before the receiver enabled them).
	ErrNotPeer = errors.New("the message's sender is not the peer")
)
