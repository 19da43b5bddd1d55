//go:build !linux

package ipc

import (
	"fmt"
	"net"
	"os"

	"github.com/vmarena/vmarena/acl"
)

var errNotLinux = fmt.Errorf("ipc: %w: sharing device memory between processes needs Linux", acl.ErrNotSupported)

// EnableCredentials fails: sharing needs Linux.
func EnableCredentials(c *net.UnixConn) error { return errNotLinux }

// Send fails: sharing needs Linux.
func Send(c *net.UnixConn, b []byte, fds []int, cred bool) error { return errNotLinux }

// Recv fails: sharing needs Linux.
func Recv(c *net.UnixConn, b []byte, maxFDs int) ([]int, *Cred, error) { return nil, nil, errNotLinux }

// Close fails: sharing needs Linux.
func Close(fd int) error { return errNotLinux }

// CloseAll fails: sharing needs Linux.
func CloseAll(fds []int) error { return errNotLinux }

// Stat fails: sharing needs Linux.
func Stat(fd int) (FileID, int64, error) { return FileID{}, 0, errNotLinux }

// Dup fails: sharing needs Linux.
func Dup(fd int) (int, error) { return -1, errNotLinux }

// Socketpair fails: sharing needs Linux.
func Socketpair() (*net.UnixConn, *os.File, error) { return nil, nil, errNotLinux }

// FileConn fails: sharing needs Linux.
func FileConn(f *os.File) (*net.UnixConn, error) { return nil, errNotLinux }
