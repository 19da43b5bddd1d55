//go:build linux

package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// EnableCredentials makes c receive the sender's credentials with each
// message (SO_PASSCRED), and where the kernel offers it (Linux 6.5) a pidfd
// of the sender (SO_PASSPIDFD), which Identify keeps and Recv closes. Call
// it before the message is read.
func EnableCredentials(c *net.UnixConn) error {
	return control(c, func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
			return err
		}
		// Older kernels do not know the option: Identify then opens a pidfd
		// itself.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSPIDFD, 1)
		return nil
	})
}

func control(c *net.UnixConn, fn func(fd int) error) error {
	if c == nil {
		return fmt.Errorf("ipc: %w", net.ErrClosed)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	if ferr != nil {
		return fmt.Errorf("ipc: %w", ferr)
	}
	return nil
}

// Send writes b to c, with the descriptors fds (at most MaxFDs) attached to
// its first byte, and with this process's credentials when cred is set: its
// PID, effective user and effective group, which is what the kernel records
// of a process that connects (SO_PEERCRED), so that a receiver can compare
// the two. The descriptors stay the caller's.
func Send(c *net.UnixConn, b []byte, fds []int, cred bool) error {
	if len(b) == 0 {
		return errors.New("ipc: send: empty message")
	}
	if len(fds) > MaxFDs {
		return fmt.Errorf("ipc: send: %d descriptors, at most %d per message", len(fds), MaxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = append(oob, unix.UnixRights(fds...)...)
	}
	if cred {
		oob = append(oob, unix.UnixCredentials(&unix.Ucred{
			Pid: int32(os.Getpid()), Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid()),
		})...)
	}
	n, _, err := c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("ipc: send: %w", err)
	}
	// A stream socket may take part of the message; the ancillary data went
	// with its first byte.
	for n < len(b) {
		k, err := c.Write(b[n:])
		if err != nil {
			return fmt.Errorf("ipc: send: %w", err)
		}
		n += k
	}
	return nil
}

// Recv reads exactly len(b) bytes from c, and returns the descriptors (up to
// maxFDs) and the credentials that came with them. A message that carried
// more descriptors than maxFDs fails (the kernel closes those that did not
// fit), and so does one cut short by the peer (io.ErrUnexpectedEOF, or
// io.EOF before the first byte), and, with credentials enabled, one whose
// pieces came from two writers (ErrNotPeer: the kernel never joins two
// writers' bytes in one read then, so they arrive as pieces with other
// credentials); on failure no descriptor stays open.
func Recv(c *net.UnixConn, b []byte, maxFDs int) (fds []int, cred *Cred, err error) {
	fds, cred, pidfd, err := recv(c, b, maxFDs)
	if pidfd >= 0 {
		_ = unix.Close(pidfd)
	}
	return fds, cred, err
}

// recv is Recv that also returns the pidfd of the sender of the message's
// first byte (SCM_PIDFD), or -1.
func recv(c *net.UnixConn, b []byte, maxFDs int) (fds []int, cred *Cred, pidfd int, err error) {
	pidfd = -1
	if maxFDs < 0 || maxFDs > MaxFDs {
		return nil, nil, -1, fmt.Errorf("ipc: receive: maxFDs %d out of [0, %d]", maxFDs, MaxFDs)
	}
	oob := make([]byte, unix.CmsgSpace(maxFDs*4)+unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4))
	defer func() {
		if err != nil {
			closeAll(fds)
			fds = nil
			if pidfd >= 0 {
				_ = unix.Close(pidfd)
				pidfd = -1
			}
		}
	}()
	got := 0
	for got < len(b) {
		n, oobn, flags, _, rerr := c.ReadMsgUnix(b[got:], oob)
		if oobn > 0 {
			f, cr, pfd, perr := parse(oob[:oobn])
			fds = append(fds, f...)
			switch {
			case pfd >= 0 && (pidfd >= 0 || got > 0):
				_ = unix.Close(pfd) // a later piece's sender: the first byte's counts
			case pfd >= 0:
				pidfd = pfd
			}
			switch {
			case cr != nil && got == 0:
				cred = cr
			case cr != nil && n > 0 && (cred == nil || *cr != *cred):
				return fds, nil, pidfd, fmt.Errorf("ipc: %w: the message's pieces came from process %d and process %d", ErrNotPeer, credPID(cred), cr.PID)
			}
			if perr != nil {
				return fds, nil, pidfd, perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return fds, nil, pidfd, fmt.Errorf("ipc: receive: more than %d descriptors: the message's control data was cut", maxFDs)
		}
		got += n
		if rerr != nil {
			if got > 0 && errors.Is(rerr, io.EOF) {
				rerr = io.ErrUnexpectedEOF
			}
			return fds, nil, pidfd, fmt.Errorf("ipc: receive: %w", rerr)
		}
		if n == 0 {
			if got == 0 {
				return fds, nil, pidfd, fmt.Errorf("ipc: receive: %w", io.EOF)
			}
			return fds, nil, pidfd, fmt.Errorf("ipc: receive: %w", io.ErrUnexpectedEOF)
		}
	}
	if len(fds) > maxFDs {
		return fds, nil, pidfd, fmt.Errorf("ipc: receive: %d descriptors, want at most %d", len(fds), maxFDs)
	}
	return fds, cred, pidfd, nil
}

func credPID(c *Cred) int {
	if c == nil {
		return 0
	}
	return c.PID
}

// parse returns the descriptors, credentials and sender's pidfd (or -1) in a
// control message. Every descriptor it met is returned, even on failure, so
// that the caller closes them.
func parse(oob []byte) ([]int, *Cred, int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, nil, -1, fmt.Errorf("ipc: receive: control data: %w", err)
	}
	var fds []int
	var cred *Cred
	pidfd := -1
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Level != unix.SOL_SOCKET {
			continue
		}
		switch m.Header.Type {
		case unix.SCM_RIGHTS:
			f, err := unix.ParseUnixRights(m)
			if err != nil {
				return fds, nil, pidfd, fmt.Errorf("ipc: receive: descriptors: %w", err)
			}
			fds = append(fds, f...)
		case unix.SCM_CREDENTIALS:
			u, err := unix.ParseUnixCredentials(m)
			if err != nil {
				return fds, nil, pidfd, fmt.Errorf("ipc: receive: credentials: %w", err)
			}
			cred = &Cred{PID: int(u.Pid), UID: int(u.Uid), GID: int(u.Gid)}
		case unix.SCM_PIDFD:
			if len(m.Data) == 4 && pidfd < 0 {
				pidfd = int(int32(binary.NativeEndian.Uint32(m.Data)))
			}
		}
	}
	return fds, cred, pidfd, nil
}

// Close closes a descriptor received with Recv.
func Close(fd int) error {
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("ipc: close %d: %w", fd, err)
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// CloseAll closes every descriptor of fds and returns the first error.
func CloseAll(fds []int) error {
	var errs []error
	for _, fd := range fds {
		errs = append(errs, Close(fd))
	}
	return errors.Join(errs...)
}

// Stat returns the identity and size of the file fd refers to. It fails with
// an error wrapping unix.EBADF for a descriptor that is not open.
func Stat(fd int) (FileID, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileID{}, 0, err
	}
	return FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, st.Size, nil
}

// Dup returns a close-on-exec duplicate of fd.
func Dup(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}

// Socketpair returns a connected pair of Unix stream sockets: one end as a
// connection for this process, the other as a file to hand to a process this
// one starts (exec.Cmd.ExtraFiles), which makes it a connection again with
// FileConn. Close the file once the other process has started.
func Socketpair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ipc: socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "socketpair")
	defer mine.Close() // FileConn duplicates it
	c, err := FileConn(mine)
	if err != nil {
		_ = unix.Close(fds[1])
		return nil, nil, err
	}
	return c, os.NewFile(uintptr(fds[1]), "socketpair"), nil
}

// FileConn returns a connection for the Unix socket f (a duplicate of it:
// close f when done with the file).
func FileConn(f *os.File) (*net.UnixConn, error) {
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("ipc: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("ipc: %s is not a Unix domain socket", f.Name())
	}
	return uc, nil
}
