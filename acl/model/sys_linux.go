package model

import (
	"os"

	"golang.org/x/sys/unix"
)

// canShare says whether this system can share the model's memory files.
const canShare = true

// sysMap maps the memory file fd, size bytes, shared, and writable unless
// readOnly.
func sysMap(fd int, size uintptr, readOnly bool) ([]byte, error) {
	prot := unix.PROT_READ | unix.PROT_WRITE
	if readOnly {
		prot = unix.PROT_READ
	}
	return unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
}

func sysUnmap(b []byte) error { return unix.Munmap(b) }

func sysClose(fd int) error { return unix.Close(fd) }

// sysOpenProfile opens a profile file for reading without blocking: opening
// a FIFO that has no writer returns at once, and the caller refuses what is
// not a regular file.
func sysOpenProfile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
}
