//go:build linux

// Package ipctest helps tests play a hostile peer of sharing: it makes the
// descriptors such a peer would send (memory files with chosen seals, a
// read-only reopen) and counts this process's open descriptors, so that a
// test can prove that nothing leaked. It is for tests only.
package ipctest

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Seals of a memory file (fcntl F_ADD_SEALS).
const (
	SealShrink      = unix.F_SEAL_SHRINK
	SealGrow        = unix.F_SEAL_GROW
	SealSeal        = unix.F_SEAL_SEAL
	SealFutureWrite = unix.F_SEAL_FUTURE_WRITE
	// Sealed is what the host driver's exports carry: size and seals
	// sealed.
	Sealed = SealShrink | SealGrow | SealSeal
)

// Memfd returns a close-on-exec memory file of size bytes, named name,
// with seals added (0: a file that cannot be sealed at all).
func Memfd(name string, size int64, seals int) (int, error) {
	flags := unix.MFD_CLOEXEC
	if seals != 0 {
		flags |= unix.MFD_ALLOW_SEALING
	}
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return -1, err
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// Reopen opens the file behind fd again through /proc/self/fd, with mode
// (unix.O_RDONLY, unix.O_RDWR), as any process holding fd can.
func Reopen(fd, mode int) (int, error) {
	return unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), mode|unix.O_CLOEXEC, 0)
}

// Close closes fd.
func Close(fd int) error { return unix.Close(fd) }

// Truncate sets the size of the file behind fd, as a hostile holder of a
// memory file would to cut it under another process's mapping. A sealed
// size refuses with an error matching ErrSealed.
func Truncate(fd int, size int64) error { return unix.Ftruncate(fd, size) }

// ErrSealed is what a change to a sealed memory file fails with (EPERM).
var ErrSealed error = unix.EPERM

// OpenFDs counts this process's open descriptors.
func OpenFDs() (int, error) {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	return len(es) - 1, nil // less the directory's own
}

// ReadOnly is unix.O_RDONLY, and ReadWrite unix.O_RDWR, for Reopen.
const (
	ReadOnly  = unix.O_RDONLY
	ReadWrite = unix.O_RDWR
)
