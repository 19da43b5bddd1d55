//go:build linux && (amd64 || arm64)

package cuda

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// The binding keeps the descriptor cuMemExportToShareableHandle wrote and
// closes it when the allocation is freed. Share sends duplicates it took
// while the arena held the chunks: an arena that gives the chunks back
// between the export and the send (here at once, and the process opens
// files of its own, which take the lowest free numbers) still sends the
// double's memory files, never one of the producer's files.
func TestShareSendsWhatItExportedOverDouble(t *testing.T) {
	const privateKey = "producer's private key"
	d, _ := openFake(t, 0, Config{})
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	cs := a.ChunkSize()
	b, err := a.Alloc(2*cs, cs)
	require.NoError(t, err)

	dir := t.TempDir()
	var keys []*os.File
	defer func() {
		for _, f := range keys {
			f.Close()
		}
	}()
	defer sched.Set(func(p sched.Point, who any) {
		if p != sched.ShareExported || who != a {
			return
		}
		require.NoError(t, a.Reset())
		require.NoError(t, a.Shrink())
		require.Zero(t, d.Live().Handles, "the chunks were freed")
		for i := range 8 {
			path := filepath.Join(dir, fmt.Sprintf("key%d", i))
			require.NoError(t, os.WriteFile(path, []byte(privateKey), 0o600))
			f, err := os.Open(path)
			require.NoError(t, err)
			keys = append(keys, f)
		}
	})()

	mine, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer mine.Close()
	theirs, err := ipc.FileConn(f)
	require.NoError(t, err)
	f.Close()
	require.NoError(t, mine.SetDeadline(time.Now().Add(10*time.Second)))
	require.NoError(t, theirs.SetDeadline(time.Now().Add(10*time.Second)))

	type got struct {
		links []string
		heads []string
		err   error
	}
	done := make(chan got, 1)
	go func() {
		var g got
		defer func() { theirs.Close(); done <- g }()
		hello := make([]byte, 32)
		copy(hello, "VMAHELO2")
		binary.LittleEndian.PutUint32(hello[8:], 2)
		binary.LittleEndian.PutUint32(hello[12:], uint32(acl.SharingFD))
		binary.LittleEndian.PutUint32(hello[16:], uint32(os.Getpid()))
		if g.err = ipc.Send(theirs, hello, nil, true); g.err != nil {
			return
		}
		o := make([]byte, 64)
		if _, _, g.err = ipc.Recv(theirs, o, 0); g.err != nil {
			return
		}
		for n := binary.LittleEndian.Uint64(o[32:]); uint64(len(g.links)) < n; {
			fds, _, err := ipc.Recv(theirs, make([]byte, 8), 64)
			if err != nil {
				g.err = err
				return
			}
			for _, fd := range fds {
				link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
				file := os.NewFile(uintptr(fd), "received")
				head := make([]byte, len(privateKey))
				k, _ := file.ReadAt(head, 0)
				file.Close()
				g.links, g.heads = append(g.links, link), append(g.heads, string(head[:k]))
			}
		}
		ack := make([]byte, 24)
		copy(ack, "VMAACK02")
		g.err = ipc.Send(theirs, ack, nil, true)
	}()
	require.NoError(t, b.Share(mine, arena.ShareOptions{PID: os.Getpid()}))
	g := <-done
	require.NoError(t, g.err)
	require.Len(t, g.links, 2)
	for i := range g.links {
		assert.NotEqual(t, privateKey, g.heads[i], "descriptor %d (%s) is the producer's file", i, g.links[i])
		assert.True(t, strings.HasPrefix(g.links[i], "/memfd:"), "descriptor %d is %q, not the double's memory", i, g.links[i])
	}
}
