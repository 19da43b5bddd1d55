//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
)

// The consumer Share names and verifies (this process, over a socketpair)
// says in its hello that its device id is that of another process (1003),
// which Share never named nor checked. The chunks' allow-list holds the
// consumer alone: Share refuses (check pid), and process 1003 gets no token
// to import.
func TestShareAllowListIsTheConsumer(t *testing.T) {
	const stranger = 1003
	path := freshCopy(t, "full", "", "libascendcl.so")
	d, dbl := openDouble(t, path, 0, ascend.Config{})
	imp, _ := openDouble(t, path, 0, ascend.Config{})
	defer dbl.setPid(int32(os.Getpid()))
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	cs := a.ChunkSize()
	b, err := a.Alloc(cs, cs)
	require.NoError(t, err)

	mine, theirs := connPair(t)

	strangerErr := make(chan error, 1)
	go func() {
		defer theirs.Close()
		hello := make([]byte, 32)
		copy(hello, "VMAHELO2")
		binary.LittleEndian.PutUint32(hello[8:], 2)
		binary.LittleEndian.PutUint32(hello[12:], uint32(acl.SharingToken))
		binary.LittleEndian.PutUint32(hello[16:], stranger) // not this process
		if err := ipc.Send(theirs, hello, nil, true); err != nil {
			strangerErr <- err
			return
		}
		o := make([]byte, 64)
		if _, _, err := ipc.Recv(theirs, o, 0); err != nil {
			strangerErr <- err
			return
		}
		tok := make([]byte, 8)
		if _, _, err := ipc.Recv(theirs, tok, 0); err != nil {
			strangerErr <- err
			return
		}
		// The stranger imports what was meant for the consumer alone.
		dbl.setPid(stranger)
		h, err := imp.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypeNone, Value: binary.LittleEndian.Uint64(tok)}, 0)
		dbl.setPid(int32(os.Getpid()))
		if err == nil {
			_ = imp.FreePhysical(h)
		}
		strangerErr <- err
		ack := make([]byte, 24)
		copy(ack, "VMAACK02")
		_ = ipc.Send(theirs, ack, nil, true)
	}()
	shareErr := b.Share(mine, arena.ShareOptions{PID: os.Getpid()})
	require.ErrorIs(t, shareErr, arena.ErrRefused)
	assert.ErrorContains(t, shareErr, "check pid")
	err = <-strangerErr
	assert.Error(t, err, "process %d, never named, imported the consumer's token", stranger)
}
