//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/ascend"
)

// Two goroutines each allocate and free their own pinned host buffers. A
// buffer freed by one may come back at the same address to the other; the
// books must still hold the other's buffer.
func TestHostBuffersRace(t *testing.T) {
	path := freshCopy(t, "full", "", "libascendcl.so")
	d, dbl := openDouble(t, path, 0, ascend.Config{})
	const size = 64 << 20 // above glibc's largest mmap threshold: malloc maps, free unmaps
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	stop := make(chan struct{})
	var once sync.Once
	deadline := time.Now().Add(time.Second) // enough: the old books failed within a tenth of it
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				default:
				}
				b, err := d.MallocHost(size)
				if err == nil {
					err = d.FreeHost(b)
				}
				if err != nil {
					errs <- err
					once.Do(func() { close(stop) })
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a goroutine's own buffer")
	}
	require.Equal(t, dbl.Live().HostBuffers, d.Live().HostBuffers)
	require.Equal(t, dbl.Live().HostBytes, d.Live().HostBytes)
}
