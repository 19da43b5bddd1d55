// Package ipc is the socket work of sharing device memory between processes:
// it sends file descriptors over a Unix domain socket (SCM_RIGHTS), and the
// sender's credentials, which the kernel verifies (SCM_CREDENTIALS). Drivers
// and the arena's Share and Import use it; it is the one place above the
// drivers that calls golang.org/x/sys/unix for sharing.
//
// # Who is on the other end
//
// Identify and RecvPeer say who the peer is as the kernel reports it, never
// as the peer claims. A peer that connected (connect(2)) is the process the
// kernel recorded then (SO_PEERCRED). Over a socket this process made itself
// (a socketpair handed to a process it starts), SO_PEERCRED names this
// process, so the peer is the sender of the message read: its credentials
// (SCM_CREDENTIALS, which the kernel checks when they are sent: a process
// may claim only its own, unless it holds CAP_SYS_ADMIN or CAP_SETUID). The
// receiver enables credentials (EnableCredentials) before it reads; a message
// carries them when its sender attached them (Send with cred, as every
// message of the sharing protocol does) or when the receiver had enabled
// them before it was sent. A plain write that arrived earlier carries none
// (the kernel reports PID 0 and the overflow user) and is nobody's. Where the kernel offers pidfds, the peer is pinned by
// one (SO_PEERPIDFD, SCM_PIDFD, Linux 6.5; else pidfd_open, Linux 5.3), so
// that it cannot be confused with a later process given its PID (Same).
// PIDs are those of the receiver's PID namespace (0 when the sender's is not
// visible from it).
//
// What speaks must be the peer. A connected socket can be handed on (over
// another socket, or to a child): the process that connected is then not
// the one writing. So a message read from a peer that connected must carry
// the connector's own credentials, and come from the process its pidfd
// holds; and every later message (RecvFrom) must come from the peer the
// first one identified. A message from anyone else fails with ErrNotPeer.
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
