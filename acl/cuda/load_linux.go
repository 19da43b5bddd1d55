//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"runtime"

	"github.com/ebitengine/purego"

	"github.com/vmarena/vmarena/acl"
)

// supported reports whether this platform can load the CUDA driver.
const supported = true

// load opens the library and resolves every symbol with Dlsym and
// RegisterFunc (RegisterLibFunc would panic on a missing one). A missing
// library or symbol is an error wrapping acl.ErrNotSupported that names it.
func (l *library) load() error {
	// dlerror's message is per thread: keep dlopen/dlsym and the dlerror
	// purego calls after them on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(l.path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return fmt.Errorf("cuda: load %s: %w: %w", l.path, acl.ErrNotSupported, err)
	}
	for _, s := range l.symbols() {
		addr, err := purego.Dlsym(h, s.name)
		if err != nil && optionalSymbols[s.name] {
			continue
		}
		if err != nil {
			// The handle is not closed: dlclose of a half-initialised CUDA
			// driver is no safer than of a whole one, and it costs nothing.
			return fmt.Errorf("cuda: %s has no symbol %s (driver older than CUDA 10.2, or not the CUDA driver): %w: %w",
				l.path, s.name, acl.ErrNotSupported, err)
		}
		purego.RegisterFunc(s.fn, addr)
	}
	return nil
}
