package host

import (
	"syscall"

	"example.com/good/acl"
	"golang.org/x/sys/unix"
)

type Driver struct{}

func Default() (*Driver, error) {
	_ = acl.Ptr
	_ = unix.Getpid
	_ = syscall.Getpid
	return &Driver{}, nil
}
