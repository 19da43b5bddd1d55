//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/internal/sched"
)

// A token is not a descriptor: no number of the producer's can take its
// place. A chunk the arena gives back between the export and the send
// leaves the consumer a token of a freed allocation, whose import fails
// (107017): it never names the allocation the producer exports next, even
// to the same consumer (the double never hands a token out twice; the
// allow-list keeps anyone else out in any case). Both ends are this
// process; the double gives them the device ids 1001 and 1002, as a driver
// that sees processes through a container's PID namespace would, where the
// producer cannot check the id the consumer's hello names (checkTgid).
func TestShareTokenGivenBackOverDouble(t *testing.T) {
	const producer, consumer = 1001, 1002
	path := freshCopy(t, "full", "", "libascendcl.so")
	d, dbl := openDouble(t, path, 0, ascend.Config{})
	imp, _ := openDouble(t, path, 0, ascend.Config{})
	defer dbl.setPid(int32(os.Getpid()))
	dbl.setPid(producer)
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	cs := a.ChunkSize()
	b, err := a.Alloc(cs, cs)
	require.NoError(t, err)

	var nextToken acl.ShareableHandle
	var nextHandle acl.PhysicalHandle
	defer func() {
		if nextHandle != 0 {
			require.NoError(t, d.FreePhysical(nextHandle))
		}
	}()
	defer sched.Set(func(p sched.Point, who any) {
		if p != sched.ShareExported || who != a {
			return
		}
		require.NoError(t, a.Reset())
		require.NoError(t, a.Shrink())
		// The next export, to the same consumer.
		prop := acl.DeviceProp(0, 0)
		h, err := d.MallocPhysical(uintptr(cs), &prop, 0)
		require.NoError(t, err)
		nextHandle = h
		nextToken, err = d.MemExportToShareableHandle(h, acl.MemHandleTypeNone, acl.ExportDefault)
		require.NoError(t, err)
		require.NoError(t, d.MemSetPidToShareableHandle(nextToken, []int32{consumer}))
	})()

	mine, theirs := connPair(t)

	type got struct {
		token acl.ShareableHandle
		err   error // the consumer's import
		io    error
	}
	done := make(chan got, 1)
	go func() {
		var g got
		defer func() { theirs.Close(); done <- g }()
		hello := make([]byte, 32)
		copy(hello, "VMAHELO2")
		binary.LittleEndian.PutUint32(hello[8:], 2)
		binary.LittleEndian.PutUint32(hello[12:], uint32(acl.SharingToken))
		binary.LittleEndian.PutUint32(hello[16:], consumer)
		if g.io = ipc.Send(theirs, hello, nil, true); g.io != nil {
			return
		}
		o := make([]byte, 64)
		if _, _, g.io = ipc.Recv(theirs, o, 0); g.io != nil {
			return
		}
		tok := make([]byte, 8)
		if _, _, g.io = ipc.Recv(theirs, tok, 0); g.io != nil {
			return
		}
		g.token = acl.ShareableHandle{Type: acl.MemHandleTypeNone, Value: binary.LittleEndian.Uint64(tok)}
		dbl.setPid(consumer)
		h, err := imp.MemImportFromShareableHandle(g.token, 0)
		dbl.setPid(producer)
		g.err = err
		if err == nil {
			_ = imp.FreePhysical(h)
		}
		ack := make([]byte, 24)
		copy(ack, "VMAACK02")
		binary.LittleEndian.PutUint32(ack[8:], 2) // failed
		g.io = ipc.Send(theirs, ack, nil, true)
	}()
	err = b.Share(mine, arena.ShareOptions{PID: os.Getpid()})
	g := <-done
	require.NoError(t, g.io)
	require.ErrorIs(t, err, arena.ErrPeer, "the consumer said it failed")
	require.Error(t, g.err, "a token of a freed allocation")
	var ae *acl.Error
	require.True(t, errors.As(g.err, &ae))
	assert.Equal(t, acl.ErrCodeRTInvalidHandle, ae.Code)
	assert.NotEqual(t, nextToken.Value, g.token.Value, "the token sent is not the next export's")
	assert.True(t, imp.Live().Zero(), "%+v", imp.Live())
}
