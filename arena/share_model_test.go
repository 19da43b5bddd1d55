//go:build linux

package arena_test

import (
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/acl/ipc/ipctest"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// readSafely reads b, turning a fault on its memory (SIGBUS) into an error
// instead of a crash of the whole process.
func readSafely(b arena.Buffer) (err error) {
	done := make(chan error, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				if f, ok := r.(interface{ Addr() uintptr }); ok {
					done <- fmt.Errorf("reading the buffer faulted at %#x (SIGBUS: the process would die): %v", f.Addr(), r)
					return
				}
				done <- fmt.Errorf("reading the buffer panicked: %v", r)
			}
		}()
		got := make([]byte, 4096)
		done <- arena.CopyOut(got, b)
	}()
	return <-done
}

// A hostile producer sends the device model an unsealed memory file that
// bears the model's name, to cut it under the consumer's mapping once
// mapped: the import is refused (the seals are checked, not the name); were
// it taken, the consumer's next read must not kill it.
func TestShareModelRefusesUnsealed(t *testing.T) {
	d, err := model.New(model.Config{Untimed: true})
	require.NoError(t, err)
	defer d.Close()
	mine, theirs := peerConns(t, 5*time.Second)
	memfd, err := ipctest.Memfd("vmarena-model", shareChunk, 0) // no seals at all
	require.NoError(t, err)
	defer ipctest.Close(memfd)
	acked := make(chan struct{})
	played := make(chan struct{})
	// The producer's goroutine closes its end, waiting for an ack that a
	// refused import never sends: closing ours ends it, and the test waits
	// for it, so that its close does not land in the next test's count of
	// open descriptors.
	defer func() {
		mine.Close()
		<-played
	}()
	go func() {
		defer close(played)
		defer theirs.Close()
		if _, _, err := ipc.Recv(theirs, make([]byte, 32), 0); err != nil {
			return
		}
		send(theirs, good(1).bytes())
		send(theirs, batchFrame(1, 0), memfd)
		if _, _, err := ipc.Recv(theirs, make([]byte, 24), 0); err != nil { // the ack: mapped
			return
		}
		close(acked)
	}()
	v, err := arena.Import(mine, arena.ImportConfig{Driver: d})
	if err == nil {
		defer v.Close()
	}
	require.Error(t, err, "an unsealed memory file imported")
	if err != nil {
		return
	}
	<-acked
	require.NoError(t, readSafely(v.Buffer()), "before the cut")
	require.NoError(t, ipctest.Truncate(memfd, 0)) // the producer cuts the memory
	require.NoError(t, readSafely(v.Buffer()))
}

// A hostile consumer tries to truncate the memory file a producer on the
// device model exported to it: the file's size is sealed, and the
// producer's next read of its own buffer does not kill it.
func TestShareModelExportSealed(t *testing.T) {
	d, err := model.New(model.Config{Untimed: true})
	require.NoError(t, err)
	defer d.Close()
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Alloc(a.ChunkSize(), a.ChunkSize())
	require.NoError(t, err)
	mine, theirs := peerConns(t, 5*time.Second)
	defer mine.Close()
	cut := make(chan error, 64)
	go func(c *net.UnixConn) {
		defer close(cut)
		defer c.Close()
		send(c, helloFrame(fdForm, uint32(os.Getpid()), 0, 0))
		if _, _, err := ipc.Recv(c, make([]byte, 64), 0); err != nil {
			return
		}
		fds, _, err := ipc.Recv(c, make([]byte, 8), 64)
		if err != nil {
			return
		}
		for _, fd := range fds {
			cut <- ipctest.Truncate(fd, 0) // the consumer cuts the producer's memory
			_ = ipc.Close(fd)
		}
		send(c, ackFrame("VMAACK02", 0, 0, 0, 0, ""))
	}(theirs)
	require.NoError(t, readSafely(b), "before the share")
	require.NoError(t, b.Share(mine, arena.ShareOptions{PID: os.Getpid()}))
	n := 0
	for err := range cut {
		assert.ErrorIs(t, err, ipctest.ErrSealed, "the consumer truncated the export")
		n++
	}
	assert.Positive(t, n, "descriptors received")
	require.NoError(t, readSafely(b))
}
