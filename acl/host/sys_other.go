//go:build !linux

package host

import (
	"errors"
	"unsafe"
)

const supported = false

var errNotLinux = errors.New("the host driver needs Linux")

func sysReserve(size, align uintptr) (unsafe.Pointer, error) { return nil, errNotLinux }
func sysRelease(p unsafe.Pointer, size uintptr) error        { return errNotLinux }
func sysMap(p unsafe.Pointer, size uintptr, fd int, off uintptr, access, readOnly bool) error {
	return errNotLinux
}
func sysUnmap(p unsafe.Pointer, size uintptr) error                  { return errNotLinux }
func sysProtect(p unsafe.Pointer, size uintptr, readOnly bool) error { return errNotLinux }
func sysMemfile(size uintptr) (int, error)                           { return -1, errNotLinux }
func sysClose(fd int) error                                          { return errNotLinux }
func sysCommit(fd int, off, size uintptr) error                      { return errNotLinux }
func sysDecommit(fd int, off, size uintptr) error                    { return errNotLinux }
func memAvailable() uintptr                                          { return 0 }
func maxMapCount() int                                               { return 65530 }
func isFDLimit(err error) bool                                       { return false }
func sysHostAlloc(size uintptr) ([]byte, error)                      { return nil, errNotLinux }
func sysHostFree(b []byte) error                                     { return errNotLinux }
