//go:build !linux

package host

func sysShareMemfile(size uintptr) (int, error)       { return -1, errNotLinux }
func sysSealExport(fd int, readOnly bool) error       { return errNotLinux }
func sysImportable(fd int) (readOnly bool, err error) { return false, errNotLinux }
