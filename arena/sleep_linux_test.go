//go:build linux

package arena_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
)

// An Imported cannot sleep: the memory is another process's.
func TestSleepRefusesImported(t *testing.T) {
	p := spawn(t, peerSpec{Role: "bench-fds", Chunks: 1, ChunkSize: sleepChunk})
	fds, _, err := ipc.Recv(p.conn, make([]byte, 1), 1)
	require.NoError(t, err)
	defer ipc.CloseAll(fds)
	require.Len(t, fds, 1)
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	v, err := arena.ImportedOf(d, sleepChunk, []acl.ShareableHandle{{Type: acl.MemHandleTypePOSIX, Value: uint64(fds[0])}})
	require.NoError(t, err)
	defer func() { require.NoError(t, v.Close()) }()
	a := v.Buffer().Arena()
	require.ErrorIs(t, a.Sleep(context.Background(), arena.Offload), arena.ErrImported)
	require.ErrorIs(t, a.Wake(context.Background()), arena.ErrImported)
	require.False(t, a.Asleep())
}
