//go:build linux

package ipc_test

import (
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/acl/ipc/ipctest"
)

// openFDs returns this process's open descriptors, each with what it is.
func openFDs(t *testing.T) map[int]string {
	t.Helper()
	fds, err := ipctest.FDs()
	require.NoError(t, err)
	return fds
}

// sameFDs checks that the descriptors open now are those open before,
// naming the ones opened or closed since.
func sameFDs(t *testing.T, before map[int]string, msg string) {
	t.Helper()
	assert.Empty(t, ipctest.FDChanges(before, openFDs(t)), msg)
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
	sameFDs(t, before, "no descriptor left open")
}

// Over a connected socket the peer is who connected, as the kernel recorded
// it then (SO_PEERCRED): what the peer claims in a message does not count.
// The other process is this test again, told by envPeer where to connect.
func TestRecvPeerConnected(t *testing.T) {
	if path := os.Getenv(envPeer); path != "" {
		// The other process: connect, say hello, wait for the close.
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		require.NoError(t, err)
		defer c.Close()
		// With its credentials attached, as every message of the sharing
		// protocol: the receiver may enable credentials after it arrived.
		require.NoError(t, ipc.Send(c, []byte("hello"), nil, true))
		_, _ = c.Read(make([]byte, 1))
		return
	}
	path := t.TempDir() + "/s"
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	defer l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRecvPeerConnected$")
	cmd.Env = append(os.Environ(), envPeer+"="+path)
	require.NoError(t, cmd.Start())
	require.NoError(t, l.SetDeadline(time.Now().Add(time.Minute)), "fail, not hang, if the other process never connects")
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
	require.NoError(t, cmd.Wait(), "the other process")
}

// The receiver may enable credentials after the message arrived when the
// sender attached its own (Send with cred): the kernel keeps them with the
// message. A message sent without them before the receiver enabled
// credentials carries none the kernel vouched for, and is not the peer's.
func TestRecvPeerCredentialsBeforeEnable(t *testing.T) {
	a, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer a.Close()
	b, err := ipc.FileConn(f)
	require.NoError(t, err)
	f.Close()
	defer b.Close()

	require.NoError(t, ipc.Send(a, []byte("hi"), nil, true))
	require.NoError(t, ipc.EnableCredentials(b))
	p, err := ipc.RecvPeer(b, make([]byte, 2))
	require.NoError(t, err, "credentials attached by the sender survive a late enable")
	assert.Equal(t, os.Getpid(), p.PID)
	require.NoError(t, p.Close())

	c, g, err := ipc.Socketpair()
	require.NoError(t, err)
	defer c.Close()
	d, err := ipc.FileConn(g)
	require.NoError(t, err)
	g.Close()
	defer d.Close()
	_, err = c.Write([]byte("hi"))
	require.NoError(t, err)
	require.NoError(t, ipc.EnableCredentials(d))
	_, err = ipc.RecvPeer(d, make([]byte, 2))
	require.ErrorIs(t, err, ipc.ErrNotPeer, "a plain write before the enable vouches for nobody")
}

// envPeer makes TestRecvPeerConnected, started again by itself, the process
// that connects.
const envPeer = "VMARENA_IPC_PEER"

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
