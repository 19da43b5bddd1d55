//go:build linux

package arena_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// A peer that never answers holds ShareContext and ImportContext only until
// their context is done (the connection has no deadline), and they leave
// nothing behind; a context done before the call fails it before anything
// is sent.
func TestShareContextSilentPeer(t *testing.T) {
	for _, side := range []string{"share", "import"} {
		for _, cancel := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/cancel=%v", side, cancel), func(t *testing.T) {
				before := openFDs(t)
				d, err := host.New(host.Config{Capacity: 64 << 20})
				require.NoError(t, err)
				a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
				require.NoError(t, err)
				b, err := a.Alloc(shareChunk, shareChunk)
				require.NoError(t, err)
				mine, f, err := ipc.Socketpair()
				require.NoError(t, err)
				theirs, err := ipc.FileConn(f)
				require.NoError(t, err)
				f.Close()
				// No deadline on either end: only the context ends the wait.
				ctx, stop := context.WithTimeout(context.Background(), 150*time.Millisecond)
				defer stop()
				want := context.DeadlineExceeded
				if cancel {
					ctx, stop = context.WithCancel(context.Background())
					time.AfterFunc(150*time.Millisecond, stop)
					want = context.Canceled
				}
				t0 := time.Now()
				if side == "share" {
					err = b.ShareContext(ctx, mine, arena.ShareOptions{PID: os.Getpid()})
				} else {
					var v *arena.Imported
					v, err = arena.ImportContext(ctx, mine, arena.ImportConfig{Driver: d})
					require.Nil(t, v)
				}
				took := time.Since(t0)
				require.ErrorIs(t, err, want)
				assert.Less(t, took, 10*time.Second, "the context ended the wait")
				mine.Close()
				theirs.Close()
				require.NoError(t, a.Close())
				assert.True(t, d.Live().Zero(), "%+v", d.Live())
				require.NoError(t, d.Close())
				sameFDs(t, before, "no descriptor left open")
			})
		}
	}
}

// A context done before the call fails it at once, and nothing is sent.
func TestShareContextDoneBefore(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Alloc(shareChunk, shareChunk)
	require.NoError(t, err)
	mine, theirs := peerConns(t, 100*time.Millisecond)
	defer mine.Close()
	defer theirs.Close()
	ctx, stop := context.WithCancel(context.Background())
	stop()
	require.ErrorIs(t, b.ShareContext(ctx, mine, arena.ShareOptions{PID: os.Getpid()}), context.Canceled)
	_, err = arena.ImportContext(ctx, mine, arena.ImportConfig{Driver: d})
	require.ErrorIs(t, err, context.Canceled)
	_, _, err = ipc.Recv(theirs, make([]byte, 1), 0)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "nothing was sent")
}

// A producer that never offers anything: ImportContext gives up when its
// context is done, as net.Dialer.DialContext does with a silent server.
func ExampleImportContext() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	conn, silent, err := ipc.Socketpair() // the other end is never written
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	defer silent.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = arena.ImportContext(ctx, conn, arena.ImportConfig{Driver: drv})
	fmt.Println("gave up:", errors.Is(err, context.DeadlineExceeded))
	// Output:
	// gave up: true
}
