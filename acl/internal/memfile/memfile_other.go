//go:build !linux

package memfile

// Create fails: there are no memory files here.
func Create(name string, size uintptr, commit func(fd int) error) (int, error) {
	return -1, ErrNotLinux
}

// SealExport fails: there are no memory files here.
func SealExport(fd int, readOnly bool) error { return ErrNotLinux }

// Importable fails: there are no memory files here.
func Importable(fd int) (readOnly bool, err error) { return false, ErrNotLinux }
