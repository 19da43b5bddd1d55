// Package ipc is the socket work of sharing device memory between processes:
// it sends file descriptors over a Unix domain socket (SCM_RIGHTS), and the
// sender's credentials, which the kernel verifies (SCM_CREDENTIALS). Drivers
// and the arena's Share and Import use it; it is the one place above the
// drivers that calls golang.org/x/sys/unix for sharing.
//
// # Who is on the other end
//
// A receiver that enables credentials (EnableCredentials) gets, with each
// message, the PID, UID and GID of the process that sent it. The kernel
// fills them in, or checks those the sender claims (a process may claim only
// its own, unless it holds CAP_SYS_ADMIN or CAP_SETUID), so a peer cannot
// pretend to be another. This is used instead of the socket's SO_PEERCRED,
// which records who called connect(2) or socketpair(2): over a socketpair
// made by the producer before starting the consumer, SO_PEERCRED would name
// the producer itself. PIDs are those of the receiver's PID namespace (0
// when the sender's is not visible from it).
//
// # Descriptors
//
// At most MaxFDs descriptors travel in one message (the kernel's
// SCM_MAX_FD). Received descriptors are close-on-exec; they belong to the
// caller, who closes them (Close).
//
// Sharing is Linux-only: elsewhere every function fails with an error
// matching acl.ErrNotSupported.
package ipc

import "errors"

// ErrNoProcess is matched by the errors of OpenProcess and Process.Alive
// when the process does not run.
var ErrNoProcess = errors.New("ipc: no such process")

// MaxFDs is the most descriptors one message carries (SCM_MAX_FD).
const MaxFDs = 253

// Cred is the identity of the process that sent a message.
type Cred struct {
	PID int // in the receiver's PID namespace
	UID int
	GID int
}

// FileID identifies the open file behind a descriptor: the device and inode
// of the file. Two descriptors of one memory file have the same ID, in any
// process.
type FileID struct {
	Dev, Ino uint64
}
