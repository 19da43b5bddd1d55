//go:build !(linux && (amd64 || arm64))

package cuda

import (
	"fmt"
	"runtime"

	"github.com/vmarena/vmarena/acl"
)

// supported reports whether this platform can load the CUDA driver.
const supported = false

// load fails: the binding loads libcuda.so.1 with purego on Linux amd64 and
// arm64 only.
func (l *library) load() error {
	return fmt.Errorf("cuda: load %s: %w on %s/%s", l.path, acl.ErrNotSupported, runtime.GOOS, runtime.GOARCH)
}

// goString is never called on this platform: no library loads.
func goString(*byte) string { return "" }

// hostSlice is never called on this platform: no library loads.
func hostSlice(*byte, uintptr) []byte { return nil }
