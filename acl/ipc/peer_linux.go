//go:build linux

package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// RecvPeer reads exactly len(b) bytes from c, which must carry no
// descriptors (a message that does fails, and they are closed), and returns
// the peer as the kernel reports it (Identify), with the credentials that
// came with the message: the sender of the message must be the peer
// (ErrNotPeer otherwise, whether or not the peer still runs). Enable
// credentials on c first (EnableCredentials). The caller closes the Peer.
func RecvPeer(c *net.UnixConn, b []byte) (*Peer, error) {
	_, cred, pidfd, err := recv(c, b, 0)
	if err != nil {
		return nil, err
	}
	return identify(c, cred, pidfd, true)
}

// RecvFrom is Recv of a message that must come from p, the peer an earlier
// message identified (RecvPeer): the same credentials and, where the
// message brought a pidfd and p is pinned, the same live process. A message
// from anyone else fails with ErrNotPeer, its descriptors closed.
func RecvFrom(c *net.UnixConn, b []byte, maxFDs int, p *Peer) ([]int, error) {
	fds, cred, pidfd, err := recv(c, b, maxFDs)
	if err == nil {
		err = p.sent(cred, pidfd)
	} else {
		closeOpen(pidfd)
	}
	if err != nil {
		closeAll(fds)
		return nil, err
	}
	return fds, nil
}

// sent checks that the message that brought cred and pidfd (or -1, which
// it takes over) came from p.
func (p *Peer) sent(cred *Cred, pidfd int) error {
	var msg *Process
	if pidfd >= 0 {
		msg = &Process{pid: credPID(cred), pidfd: pidfd}
		defer msg.Close()
	}
	if err := p.sentCred(cred); err != nil {
		return err
	}
	if msg != nil && p.Proc != nil {
		// One PID, and both pidfds hold a live process: one process.
		if same, err := Same(p.Proc, msg); err != nil || !same {
			return fmt.Errorf("ipc: %w: the message came from another process than the peer's pidfd holds (%v)", ErrNotPeer, err)
		}
	}
	return nil
}

// sentCred checks that a message that brought cred came from p's
// credentials: what can be said without p's process, so before it is
// pinned (a message another process wrote is not the peer's, whether or
// not the peer still lives).
func (p *Peer) sentCred(cred *Cred) error {
	switch {
	case p == nil:
		return fmt.Errorf("ipc: %w: no peer to compare with", ErrNotPeer)
	case cred == nil:
		return fmt.Errorf("ipc: %w: the message carried no credentials (enable them before it is read)", ErrNotPeer)
	case *cred != p.Cred:
		return fmt.Errorf("ipc: %w: a message from process %d (uid %d, gid %d), not from the peer", ErrNotPeer, cred.PID, cred.UID, cred.GID)
	}
	return nil
}

// identify is Identify with the message's credentials and pidfd (or -1),
// which it takes over; msg says whether a message was read.
func identify(c *net.UnixConn, sent *Cred, pidfd int, msg bool) (*Peer, error) {
	var uc *unix.Ucred
	peerfd := -1
	err := control(c, func(fd int) error {
		var err error
		if uc, err = unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED); err != nil {
			return err
		}
		if p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
			peerfd = p
		}
		return nil
	})
	if err != nil {
		closeOpen(pidfd)
		return nil, fmt.Errorf("ipc: identify the peer: SO_PEERCRED: %w", err)
	}
	if int(uc.Pid) != os.Getpid() {
		// The peer connected: the kernel recorded who, then. A message
		// read must be the connector's own: a connected socket handed on
		// to another process speaks with that process's credentials.
		p := &Peer{Cred: Cred{PID: int(uc.Pid), UID: int(uc.Uid), GID: int(uc.Gid)}, Via: "SO_PEERCRED"}
		if msg {
			// A message another process wrote is not the peer's, even if
			// the connector has exited since: say so before pinning it.
			if err := p.sentCred(sent); err != nil {
				closeOpen(peerfd, pidfd)
				return nil, err
			}
		}
		if err := p.pin(peerfd); err != nil {
			closeOpen(pidfd)
			return nil, err
		}
		if msg {
			if err := p.sent(sent, pidfd); err != nil {
				_ = p.Close()
				return nil, err
			}
		} else {
			closeOpen(pidfd)
		}
		return p, nil
	}
	// This process made the socket (a socketpair it handed to the peer):
	// SO_PEERCRED names this process. The credentials of the message, which
	// the kernel checked when it was sent, name the peer.
	closeOpen(peerfd)
	if sent == nil {
		closeOpen(pidfd)
		return nil, errors.New("ipc: identify the peer: the socket is this process's own and the message carried no credentials (enable them before it is read)")
	}
	if sent.PID == 0 {
		// No process the kernel vouched for: a plain write that came
		// before credentials were enabled, or a sender in a PID namespace
		// this one cannot see. Nobody to pin, so nobody to trust.
		closeOpen(pidfd)
		return nil, fmt.Errorf("ipc: %w: the message names no process (PID 0, uid %d): sent without credentials before they were enabled, or from a PID namespace not visible here", ErrNotPeer, sent.UID)
	}
	p := &Peer{Cred: *sent, Via: "SCM_CREDENTIALS"}
	return p, p.pin(pidfd)
}

// Identify returns the process on the other end of c as the kernel reports
// it: the process that connected (SO_PEERCRED), or, when this process made
// the socket itself (a socketpair, whose SO_PEERCRED names its maker), the
// sender of the message that brought sent (SCM_CREDENTIALS, which the kernel
// checks when they are sent). With sent, from a peer that connected, the
// message must be the connector's (ErrNotPeer otherwise); sent nil asks
// only who connected. Where the kernel offers one, the peer is pinned with a
// pidfd (Peer.Proc): SO_PEERPIDFD, or one opened for its PID. The caller
// closes the Peer.
func Identify(c *net.UnixConn, sent *Cred) (*Peer, error) { return identify(c, sent, -1, sent != nil) }

// pin holds p's process with pidfd, or with one opened for its PID when
// pidfd is -1 and the kernel has pidfd_open. A pidfd opened by PID may name
// a later holder of the PID if the peer is gone already (the kernel's own
// pidfds, SO_PEERPIDFD and SCM_PIDFD, cannot): a caller compares it with the
// process it expects, opened before (Same).
func (p *Peer) pin(pidfd int) error {
	if pidfd < 0 {
		pr, err := OpenProcess(p.PID)
		switch {
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM), errors.Is(err, unix.EINVAL):
			return nil // no pidfds here: not pinned
		case err != nil:
			return fmt.Errorf("ipc: pin process %d: %w", p.PID, err)
		}
		p.Proc = pr
		return nil
	}
	p.Proc = &Process{pid: p.PID, pidfd: pidfd}
	if err := p.Proc.Alive(); err != nil {
		_ = p.Proc.Close()
		p.Proc = nil
		return err
	}
	return nil
}

// OpenProcess returns the process that has the PID pid now, held by a
// pidfd (pidfd_open, Linux 5.3). It fails with an error matching
// ErrNoProcess when there is none, and unix.ENOSYS where the kernel has no
// pidfds.
func OpenProcess(pid int) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("ipc: open process %d: %w: %w", pid, ErrNoProcess, unix.ESRCH)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("ipc: open process %d: %w: %w", pid, ErrNoProcess, err)
	}
	if err != nil {
		return nil, fmt.Errorf("ipc: open process %d: %w", pid, err)
	}
	unix.CloseOnExec(fd)
	return &Process{pid: pid, pidfd: fd}, nil
}

// Alive returns nil while p runs, and an error matching ErrNoProcess once
// it has exited.
func (p *Process) Alive() error {
	if p == nil {
		return fmt.Errorf("ipc: no process: %w: %w", ErrNoProcess, unix.ESRCH)
	}
	// A pidfd polls readable once its process has exited, reaped or not
	// (a zombie still takes signal 0).
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	if n, perr := unix.Poll(fds, 0); perr == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0 {
		return fmt.Errorf("ipc: process %d: %w: %w", p.pid, ErrNoProcess, unix.ESRCH)
	}
	err := unix.PidfdSendSignal(p.pidfd, 0, nil, 0)
	switch {
	case err == nil, errors.Is(err, unix.EPERM): // EPERM: alive, and not ours to signal
		return nil
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("ipc: process %d: %w: %w", p.pid, ErrNoProcess, err)
	}
	return fmt.Errorf("ipc: process %d: %w", p.pid, err)
}

// Close releases the pidfd. It is safe on a nil *Process.
func (p *Process) Close() error {
	if p == nil || p.pidfd < 0 {
		return nil
	}
	err := unix.Close(p.pidfd)
	p.pidfd = -1
	return err
}

// closeOpen closes each of fds that is open (not -1).
func closeOpen(fds ...int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
