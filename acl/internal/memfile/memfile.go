// Package memfile makes, seals and checks the memory files (Linux memfds)
// through which the host driver and the device model share physical memory
// with other processes: a file's descriptor is the shareable handle.
//
// A memory file crossing processes is sealed so that no process holding it
// can cut it under another's mapping: its size is sealed once it is made
// (F_SEAL_SHRINK, F_SEAL_GROW), so that a shrink cannot make the next touch
// of another process's mapping fault (SIGBUS, which kills a Go process); its
// seals are sealed at export (F_SEAL_SEAL), and a read-only export is also
// sealed against writes through any mapping or descriptor made after it
// (F_SEAL_FUTURE_WRITE). An importer trusts no file's name: it checks the
// file's kind and seals (Importable).
package memfile

import "errors"

// ErrNotLinux is returned where there are no memory files.
var ErrNotLinux = errors.New("memory files need Linux")
