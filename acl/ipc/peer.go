package ipc

import "fmt"

// Peer is the process on the other end of a connection, as the kernel
// reports it (Identify, RecvPeer): the one process whose messages RecvFrom
// accepts after the first.
type Peer struct {
	Cred
	// Via says where the kernel reported it: "SO_PEERCRED" (the process
	// that made the connection, recorded when it connected) or
	// "SCM_CREDENTIALS" (the sender of a message, over a socket this
	// process made itself).
	Via string
	// Proc is the process pinned by a pidfd, or nil where the kernel offers
	// none (before Linux 5.3, or 6.5 for the socket's own pidfds).
	Proc *Process
}

// Close releases the peer's pidfd. It is safe on a nil *Peer.
func (p *Peer) Close() error {
	if p == nil || p.Proc == nil {
		return nil
	}
	return p.Proc.Close()
}

// String formats p as "process PID (uid UID, via ...)".
func (p *Peer) String() string {
	if p == nil {
		return "no peer"
	}
	pin := "not pinned"
	if p.Proc != nil {
		pin = "pinned by a pidfd"
	}
	return fmt.Sprintf("process %d (uid %d, gid %d; %s, %s)", p.PID, p.UID, p.GID, p.Via, pin)
}

// Process is a process held by a pidfd: it names that process and no other,
// even once its PID is reused. Alive says whether it still runs.
type Process struct {
	pid   int
	pidfd int
}

// PID returns the process id the pidfd was taken for (in this process's
// PID namespace).
func (p *Process) PID() int { return p.pid }

// Same reports whether a and b are one process: both alive now, with one
// PID. A PID names one live process at a time, and a pidfd never names a
// later holder of its PID, so two live pidfds of one PID hold one process.
func Same(a, b *Process) (bool, error) {
	if a == nil || b == nil {
		return false, fmt.Errorf("ipc: compare processes: no pidfd")
	}
	if a.pid != b.pid {
		return false, nil
	}
	if err := a.Alive(); err != nil {
		return false, err
	}
	if err := b.Alive(); err != nil {
		return false, err
	}
	return true, nil
}
