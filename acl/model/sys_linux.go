package model

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// memfileName names the model's shareable memory files (in /proc/PID/fd).
const memfileName = "vmarena-model"

// canShare says whether this system can share the model's memory files.
const canShare = true

// sysMemfile makes a memory file of size bytes, without committing them:
// the kernel makes a page when it is first written.
func sysMemfile(size uintptr) (int, error) {
	fd, err := unix.MemfdCreate(memfileName, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// sysMap maps the memory file fd, size bytes, shared and writable.
func sysMap(fd int, size uintptr) ([]byte, error) {
	return unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func sysUnmap(b []byte) error { return unix.Munmap(b) }

func sysClose(fd int) error { return unix.Close(fd) }

// sysIsMemfile reports whether fd is one of the model's memory files.
func sysIsMemfile(fd int) bool {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	return err == nil && bytes.HasPrefix([]byte(link), []byte("/memfd:"+memfileName))
}

// sysOpenProfile opens a profile file for reading without blocking: opening
// a FIFO that has no writer returns at once, and the caller refuses what is
// not a regular file.
func sysOpenProfile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
}
