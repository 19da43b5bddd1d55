//go:build linux

// Package ipctest helps tests play a hostile peer of sharing: it makes the
// descriptors such a peer would send (memory files with chosen seals, a
// read-only reopen) and lists this process's open descriptors, so that a
// test can prove that nothing leaked, and name what did. It is for tests only.
package ipctest

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

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

// FDs returns this process's open descriptors, each with what
// /proc/self/fd says it is ("socket:[4711]", "/memfd:vmarena-host
// (deleted)", a path), so that a test can say which ones it leaked or
// closed, not only how many.
func FDs() (map[int]string, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	fds := make(map[int]string, len(names))
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd == int(d.Fd()) {
			continue // the directory's own
		}
		link, err := os.Readlink("/proc/self/fd/" + name)
		if err != nil {
			continue // closed since the listing
		}
		fds[fd] = link
	}
	return fds, nil
}

// FDChanges says how the descriptors open after differ from those open
// before (both from FDs): the ones opened since and the ones closed since,
// each with what it is, lowest number first; "" when they are the same.
func FDChanges(before, after map[int]string) string {
	diff := func(a, b map[int]string) []string {
		var out []string
		for _, fd := range slices.Sorted(maps.Keys(a)) {
			if l, ok := b[fd]; !ok || l != a[fd] {
				out = append(out, fmt.Sprintf("%d %s", fd, a[fd]))
			}
		}
		return out
	}
	var parts []string
	if o := diff(after, before); len(o) > 0 {
		parts = append(parts, "opened since: "+strings.Join(o, ", "))
	}
	if c := diff(before, after); len(c) > 0 {
		parts = append(parts, "closed since: "+strings.Join(c, ", "))
	}
	return strings.Join(parts, "; ")
}

// ReadOnly is unix.O_RDONLY, and ReadWrite unix.O_RDWR, for Reopen.
const (
	ReadOnly  = unix.O_RDONLY
	ReadWrite = unix.O_RDWR
)
