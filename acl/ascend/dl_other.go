//go:build !(linux && (amd64 || arm64))

package ascend

import (
	"fmt"
	"runtime"

	"github.com/vmarena/vmarena/acl"
)

// CANN runs on 64-bit Linux (x86-64 and aarch64) only; elsewhere the binding
// builds, and every Open fails with an error wrapping acl.ErrNotSupported.

var errPlatform = fmt.Errorf("%w: the ACL runtime exists for linux/amd64 and linux/arm64 only, not %s/%s",
	acl.ErrNotSupported, runtime.GOOS, runtime.GOARCH)

func dlopen(string) (uintptr, error)         { return 0, errPlatform }
func dlsym(uintptr, string) (uintptr, error) { return 0, errPlatform }
func dlclose(uintptr) error                  { return nil }
func register(any, uintptr)                  {}
func call1(uintptr, uintptr) int32           { return acl.ErrCodeRTFeatureNotSupport }

// hostSlice is never called on this platform: no runtime loads.
func hostSlice(*byte, uintptr) []byte { return nil }
