//go:build !linux

package model

import "errors"

// The model shares memory only on Linux, where memory files (memfd) and
// descriptor passing (acl/ipc) exist.
const canShare = false

var errNoMemfile = errors.New("no memory files on this system")

func sysMemfile(size uintptr) (int, error)        { return -1, errNoMemfile }
func sysMap(fd int, size uintptr) ([]byte, error) { return nil, errNoMemfile }
func sysUnmap(b []byte) error                     { return errNoMemfile }
func sysClose(fd int) error                       { return errNoMemfile }
func sysIsMemfile(fd int) bool                    { return false }
