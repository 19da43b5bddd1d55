//go:build linux

package ipc_test

import (
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/ipc"
)

func TestSendRecv(t *testing.T) {
	a, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer a.Close()
	b, err := ipc.FileConn(f)
	require.NoError(t, err)
	f.Close()
	defer b.Close()
	require.NoError(t, ipc.EnableCredentials(b))

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	require.NoError(t, ipc.Send(a, []byte("hello"), []int{int(r.Fd()), int(w.Fd())}, true))
	buf := make([]byte, 5)
	fds, cred, err := ipc.Recv(b, buf, 2)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(buf))
	require.Len(t, fds, 2)
	require.NotNil(t, cred)
	assert.Equal(t, os.Getpid(), cred.PID)
	assert.Equal(t, os.Getuid(), cred.UID)
	// The received descriptors are the same files.
	id0, _, err := ipc.Stat(fds[0])
	require.NoError(t, err)
	idr, _, err := ipc.Stat(int(r.Fd()))
	require.NoError(t, err)
	assert.Equal(t, idr, id0)
	require.NoError(t, ipc.CloseAll(fds))

	// Too many descriptors: the message fails and nothing stays open.
	require.NoError(t, ipc.Send(a, []byte("x"), []int{int(r.Fd()), int(w.Fd())}, false))
	fds, _, err = ipc.Recv(b, buf[:1], 1)
	require.Error(t, err)
	assert.Empty(t, fds)

	// A peer that goes away: EOF, or unexpected EOF mid-message.
	require.NoError(t, ipc.Send(a, []byte("ab"), nil, false))
	require.NoError(t, a.Close())
	_, _, err = ipc.Recv(b, make([]byte, 3), 0)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, _, err = ipc.Recv(b, make([]byte, 3), 0)
	require.ErrorIs(t, err, io.EOF)
}

func TestLimits(t *testing.T) {
	a, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer a.Close()
	f.Close()
	require.Error(t, ipc.Send(a, nil, nil, false), "empty")
	require.Error(t, ipc.Send(a, []byte("x"), make([]int, ipc.MaxFDs+1), false), "too many descriptors")
	_, _, err = ipc.Recv(a, make([]byte, 1), ipc.MaxFDs+1)
	require.Error(t, err)
	_, _, err = ipc.Stat(-1)
	require.Error(t, err)
	require.Error(t, ipc.Close(-1))
	require.Error(t, ipc.EnableCredentials(nil))
}
