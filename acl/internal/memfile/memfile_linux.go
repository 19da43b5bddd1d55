//go:build linux

package memfile

import (
	"fmt"

	"golang.org/x/sys/unix"
)

const (
	sealSize     = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
	sealImported = sealSize | unix.F_SEAL_SEAL // what an importer requires
	sealNoWrite  = unix.F_SEAL_WRITE | unix.F_SEAL_FUTURE_WRITE
)

// Create makes a memory file called name of size bytes, runs commit on it
// (where not nil: the host driver allocates the pages up front), and seals
// its size. On failure nothing is left open.
func Create(name string, size uintptr, commit func(fd int) error) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, err
	}
	err = unix.Ftruncate(fd, int64(size))
	if err == nil && commit != nil {
		err = commit(fd)
	}
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sealSize)
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// SealExport seals fd's seals, and for a read-only export its contents
// against writes through new mappings and descriptors (the exporter's own
// mapping, made before, stays writable).
func SealExport(fd int, readOnly bool) error {
	seals := unix.F_SEAL_SEAL
	if readOnly {
		seals |= unix.F_SEAL_FUTURE_WRITE
	}
	_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
	return err
}

// Importable checks that fd is a memory file another process may not resize
// under this one: a regular file whose size and seals are sealed, open for
// reading. It returns whether the memory can only be read through it
// (sealed against writes, or opened read-only).
func Importable(fd int) (readOnly bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("not an open file descriptor: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, fmt.Errorf("not a memory file (file mode %#o)", st.Mode&unix.S_IFMT)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return false, fmt.Errorf("seals: not a sealable memory file: %v", err)
	}
	if seals&sealImported != sealImported {
		return false, fmt.Errorf("seals %#x: the size and the seals must be sealed (F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL), or the exporter could cut the memory under this process", seals)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return false, fmt.Errorf("file status flags: %v", err)
	}
	if fl&unix.O_PATH != 0 || (fl&unix.O_ACCMODE != unix.O_RDONLY && fl&unix.O_ACCMODE != unix.O_RDWR) {
		return false, fmt.Errorf("file status flags %#x: not open for reading", fl)
	}
	return seals&sealNoWrite != 0 || fl&unix.O_ACCMODE == unix.O_RDONLY, nil
}
