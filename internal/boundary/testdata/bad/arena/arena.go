package arena

import (
	"syscall"
	u "unsafe"

	"example.com/bad/acl/cuda"
	"example.com/bad/acl/host"
	"golang.org/x/sys/unix"
)

func New() { _, _, _ = cuda.New, unix.Getpid, syscall.Getpid; host.New() }

func at(p u.Pointer, n uintptr) u.Pointer { return u.Add(p, n) }

func addr(p u.Pointer) uintptr { return uintptr(p) + uintptr(u.Pointer(&p)) }

func back(a uintptr) u.Pointer { return u.Pointer(uintptr(a)) }
