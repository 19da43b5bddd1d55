//go:build !linux

package model

import (
	"errors"
	"fmt"
	"os"

	"github.com/vmarena/vmarena/acl"
)

// The model shares memory only on Linux, where memory files (memfd) and
// descriptor passing (acl/ipc) exist.
const canShare = false

var errNoMemfile = errors.New("no memory files on this system")

func sysMap(fd int, size uintptr, readOnly bool) ([]byte, error) { return nil, errNoMemfile }
func sysUnmap(b []byte) error                                    { return errNoMemfile }
func sysClose(fd int) error                                      { return errNoMemfile }

// sysOpenProfile opens a profile file, once its path names a regular file
// (where opening a FIFO would wait for a writer).
func sysOpenProfile(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: not a regular file (%v)", acl.ErrInvalidParam, st.Mode().Type())
	}
	return os.Open(path)
}
