//go:build linux

package host

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

const supported = true

// sysReserve maps size bytes of inaccessible, unaccounted address space whose
// start is a multiple of align, and returns it.
func sysReserve(size, align uintptr) (unsafe.Pointer, error) {
	p, err := unix.MmapPtr(-1, 0, nil, size+align, unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	// Trim the unaligned head and the tail beyond size. Both lie outside the
	// reservation, so giving them back to the kernel cannot punch a hole in it.
	// unsafe: p is the start of our own mapping; every offset stays inside it.
	addr := uintptr(p)
	head := (align - addr%align) % align
	if head > 0 {
		if err := unix.MunmapPtr(p, head); err != nil {
			_ = unix.MunmapPtr(p, size+align)
			return nil, err
		}
	}
	start := unsafe.Add(p, head)
	if tail := align - head; tail > 0 {
		if err := unix.MunmapPtr(unsafe.Add(start, size), tail); err != nil {
			_ = unix.MunmapPtr(start, size+tail)
			return nil, err
		}
	}
	return start, nil
}

// sysRelease gives a whole reservation back.
func sysRelease(p unsafe.Pointer, size uintptr) error { return unix.MunmapPtr(p, size) }

// sysMap maps size bytes of the memory file at off over p (which lies inside a
// reservation), replacing the inaccessible pages there: accessible when access
// is set, read-only when readOnly is set too.
func sysMap(p unsafe.Pointer, size uintptr, fd int, off uintptr, access, readOnly bool) error {
	prot := unix.PROT_NONE
	if access {
		prot = unix.PROT_READ | unix.PROT_WRITE
		if readOnly {
			prot = unix.PROT_READ
		}
	}
	_, err := unix.MmapPtr(fd, int64(off), p, size, prot, unix.MAP_SHARED|unix.MAP_FIXED)
	return err
}

// sysUnmap turns [p, p+size) back into inaccessible reserved space. It never
// calls munmap, which would leave a hole another mmap could take.
func sysUnmap(p unsafe.Pointer, size uintptr) error {
	_, err := unix.MmapPtr(-1, 0, p, size, unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED)
	return err
}

// sysProtect makes [p, p+size) readable, and writable unless readOnly.
func sysProtect(p unsafe.Pointer, size uintptr, readOnly bool) error {
	prot := unix.PROT_READ | unix.PROT_WRITE
	if readOnly {
		prot = unix.PROT_READ
	}
	return unix.Mprotect(unsafe.Slice((*byte)(p), size), prot)
}

// sysMemfile creates the sparse memory file all physical allocations are cut from.
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

func sysClose(fd int) error { return unix.Close(fd) }

// sysCommit allocates (and zeroes) the pages of [off, off+size) in the file.
// A shortage of memory is reported as errNoMemory.
func sysCommit(fd int, off, size uintptr) error {
	for {
		err := unix.Fallocate(fd, 0, int64(off), int64(size))
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.ENOMEM):
			return errNoMemory
		}
		return err
	}
}

// sysDecommit frees the pages of [off, off+size) in the file.
func sysDecommit(fd int, off, size uintptr) error {
	for {
		err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(size))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err
	}
}

// memAvailable returns MemAvailable from /proc/meminfo, or 0.
func memAvailable() uintptr {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		f := bytes.Fields(s.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseUint(string(f[1]), 10, 64)
			if err != nil {
				return 0
			}
			return uintptr(kb) << 10
		}
	}
	return 0
}

// maxMapCount returns vm.max_map_count, or the kernel default.
func maxMapCount() int {
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err == nil {
		if n, err := strconv.Atoi(string(bytes.TrimSpace(b))); err == nil && n > 0 {
			return n
		}
	}
	return 65530
}

// isFDLimit reports whether err says the process or system is out of
// descriptors.
func isFDLimit(err error) bool { return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) }

// sysHostAlloc maps size bytes of private anonymous memory, populated.
func sysHostAlloc(size uintptr) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, err
	}
	// unsafe: p is the start of a mapping of size bytes that we own until sysHostFree.
	return unsafe.Slice((*byte)(p), size), nil
}

// sysHostFree unmaps a buffer sysHostAlloc made, given whole.
func sysHostFree(b []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
}
