//go:build linux

package host

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// The seals of a shareable memory file. The size is sealed once the file is
// committed, so that no process holding it (the consumer included) can
// shrink it under another's mapping, which would fault that process (SIGBUS)
// on its next touch, nor grow it; the seals themselves are sealed at export,
// with, for a read-only export, a seal against writes through any new
// mapping or descriptor (F_SEAL_FUTURE_WRITE: the exporter's own mapping,
// made before, stays writable).
const (
	sealSize     = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
	sealImported = sealSize | unix.F_SEAL_SEAL // what an importer requires
	sealNoWrite  = unix.F_SEAL_WRITE | unix.F_SEAL_FUTURE_WRITE
)

// sysShareMemfile creates the memory file of one exportable allocation of
// size bytes, committed, with its size sealed.
func sysShareMemfile(size uintptr) (int, error) {
	fd, err := unix.MemfdCreate(memfileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, err
	}
	err = unix.Ftruncate(fd, int64(size))
	if err == nil {
		err = sysCommit(fd, 0, size)
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

// sysSealExport seals fd's seals, and for a read-only export its contents
// against writes through new mappings and descriptors.
func sysSealExport(fd int, readOnly bool) error {
	seals := unix.F_SEAL_SEAL
	if readOnly {
		seals |= unix.F_SEAL_FUTURE_WRITE
	}
	_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
	return err
}

// sysImportable checks that fd is a memory file another process may not
// resize under this one: a regular file (a memfd) whose size and seals are
// sealed. It returns whether the memory can only be read through it (sealed
// against writes, or opened read-only).
func sysImportable(fd int) (readOnly bool, err error) {
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
