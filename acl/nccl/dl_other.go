//go:build !(linux && (amd64 || arm64))

package nccl

import (
	"fmt"
	"runtime"

	"github.com/vmarena/vmarena/acl"
)

// The binding loads NCCL on 64-bit Linux (x86-64 and aarch64) only;
// elsewhere the package builds, and every Open fails with an error wrapping
// acl.ErrNotSupported.

var errPlatform = fmt.Errorf("%w: the NCCL binding loads libraries on linux/amd64 and linux/arm64 only, not %s/%s",
	acl.ErrNotSupported, runtime.GOOS, runtime.GOARCH)

func dlopen(string) (uintptr, error)         { return 0, errPlatform }
func dlsym(uintptr, string) (uintptr, error) { return 0, errPlatform }
func register(any, uintptr)                  {}
func dlclose(uintptr) error                  { return nil }
