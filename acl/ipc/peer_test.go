//go:build linux

package ipc_test

import (
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/ipc"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(es)
}

// Over a socketpair this process made, SO_PEERCRED names this process: the
// peer is the sender of the message, as the kernel checked its credentials,
// pinned by the pidfd that came with it.
func TestRecvPeerSocketpair(t *testing.T) {
	before := openFDs(t)
	a, f, err := ipc.Socketpair()
	require.NoError(t, err)
	b, err := ipc.FileConn(f)
	require.NoError(t, err)
	f.Close()
	require.NoError(t, ipc.EnableCredentials(b))
	require.NoError(t, ipc.Send(a, []byte("hi"), nil, true))
	p, err := ipc.RecvPeer(b, make([]byte, 2))
	require.NoError(t, err)
	assert.Equal(t, "SCM_CREDENTIALS", p.Via)
	assert.Equal(t, os.Getpid(), p.PID)
	assert.Equal(t, os.Getuid(), p.UID)
	require.NotNil(t, p.Proc, "pinned")
	require.NoError(t, p.Proc.Alive())
	me, err := ipc.OpenProcess(os.Getpid())
	require.NoError(t, err)
	same, err := ipc.Same(me, p.Proc)
	require.NoError(t, err)
	assert.True(t, same)
	require.NoError(t, me.Close())
	require.NoError(t, p.Close())

	// Plain receives on a socket with credentials on close the pidfds.
	for range 10 {
		require.NoError(t, ipc.Send(a, []byte("x"), nil, true))
		_, _, err := ipc.Recv(b, make([]byte, 1), 0)
		require.NoError(t, err)
	}
	// A message with descriptors where none may come: they are closed.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	require.NoError(t, ipc.Send(a, []byte("y"), []int{int(r.Fd()), int(w.Fd())}, true))
	_, err = ipc.RecvPeer(b, make([]byte, 1))
	require.Error(t, err)
	r.Close()
	w.Close()
	a.Close()
	b.Close()
	assert.Equal(t, before, openFDs(t), "no descriptor left open")
}

// Over a connected socket the peer is who connected, as the kernel recorded
// it then (SO_PEERCRED): what the peer claims in a message does not count.
func TestRecvPeerConnected(t *testing.T) {
	path := t.TempDir() + "/s"
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	defer l.Close()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("needs python3 to play another process")
	}
	cmd := exec.Command("python3", "-c",
		"import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b'hello'); s.recv(1)", path)
	require.NoError(t, cmd.Start())
	c, err := l.AcceptUnix()
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, ipc.EnableCredentials(c))
	p, err := ipc.RecvPeer(c, make([]byte, 5))
	require.NoError(t, err)
	defer p.Close()
	assert.Equal(t, "SO_PEERCRED", p.Via)
	assert.NotEqual(t, os.Getpid(), p.PID, "another process")
	assert.Equal(t, os.Getuid(), p.UID)
	assert.Equal(t, cmd.Process.Pid, p.PID)
	assert.Contains(t, p.String(), "SO_PEERCRED")
	c.Close()
	_ = cmd.Wait()
}

// A process that has exited is not alive, and a pidfd never names a later
// holder of its PID.
func TestProcessExited(t *testing.T) {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Start())
	p, err := ipc.OpenProcess(cmd.Process.Pid)
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, cmd.Wait())
	require.ErrorIs(t, p.Alive(), ipc.ErrNoProcess)
	me, err := ipc.OpenProcess(os.Getpid())
	require.NoError(t, err)
	defer me.Close()
	same, err := ipc.Same(me, p)
	if err != nil {
		require.ErrorIs(t, err, ipc.ErrNoProcess)
	}
	assert.False(t, same)
	gone, err := ipc.OpenProcess(cmd.Process.Pid)
	if err != nil {
		require.ErrorIs(t, err, ipc.ErrNoProcess)
	} else {
		require.NoError(t, gone.Close())
	}
	_, err = ipc.OpenProcess(-1)
	require.ErrorIs(t, err, ipc.ErrNoProcess)
	_, err = ipc.Same(nil, me)
	require.Error(t, err)
}
