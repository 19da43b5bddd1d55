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

// RecvPeer fails: sharing needs Linux.
func RecvPeer(c *net.UnixConn, b []byte) (*Peer, error) { return nil, errNotLinux }

// RecvFrom fails: sharing needs Linux.
func RecvFrom(c *net.UnixConn, b []byte, maxFDs int, p *Peer) ([]int, error) { return nil, errNotLinux }

// Identify fails: sharing needs Linux.
func Identify(c *net.UnixConn, sent *Cred) (*Peer, error) { return nil, errNotLinux }

// OpenProcess fails: sharing needs Linux.
func OpenProcess(pid int) (*Process, error) { return nil, errNotLinux }

// Alive fails: sharing needs Linux.
func (p *Process) Alive() error { return errNotLinux }

// Close does nothing: sharing needs Linux.
func (p *Process) Close() error { return nil }
