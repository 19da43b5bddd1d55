//go:build linux

package ipc_test

import (
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/acl/ipc/ipctest"
	"github.com/vmarena/vmarena/internal/leakgate"
)

func TestMain(m *testing.M) {
	ipctest.Child()
	leakgate.Main(m)
}

// nobody is the user a handed-on socket goes to.
const nobody = 65534

func accept(t *testing.T, l *net.UnixListener) *net.UnixConn {
	t.Helper()
	c := ipctest.Accept(t, l)
	require.NoError(t, ipc.EnableCredentials(c))
	return c
}

// A process connects, then hands the connected socket to a process of
// another user, which writes: the writer is not the peer the kernel
// recorded, and RecvPeer says so instead of naming the connector, also
// once the connector has exited (it once failed then with "no such
// process", as it tried to pin the connector first, whenever the
// connector was quicker to exit than the read).
func TestRecvPeerHandedOn(t *testing.T) {
	ipctest.NeedRoot(t)
	for _, gone := range []bool{false, true} {
		t.Run(fmt.Sprintf("connector gone=%v", gone), func(t *testing.T) {
			l, path := ipctest.Listen(t)
			p := ipctest.HandOn(t, ipctest.HandOnSpec{Path: path, UID: nobody, GID: nobody,
				After: []ipctest.Step{{Send: []byte("hello")}}})
			c := accept(t, l)
			var conn, other ipctest.Report
			wait := func() {
				var err error
				conn, other, err = p.Wait()
				require.NoError(t, err)
			}
			if gone {
				wait() // both processes have written and exited
			}
			before := openFDs(t)
			peer, err := ipc.RecvPeer(c, make([]byte, 5))
			require.ErrorIs(t, err, ipc.ErrNotPeer, "the connector is process %d", p.PID())
			assert.Nil(t, peer)
			sameFDs(t, before, "no pidfd left open")
			if !gone {
				wait()
			}
			assert.Empty(t, conn.Err)
			assert.Empty(t, other.Err)
			assert.Equal(t, nobody, other.UID)
			assert.NotEqual(t, conn.PID, other.PID)
		})
	}
}

// The connector's own message identifies it; a later message from the
// process it handed the socket to does not pass RecvFrom, and neither does
// a message whose pieces came from both.
func TestRecvFromHandedOn(t *testing.T) {
	ipctest.NeedRoot(t)
	for _, tc := range []struct {
		name  string
		after []byte
		piece bool
	}{{"later message", []byte("later"), false}, {"second piece", []byte("cd"), true}} {
		t.Run(tc.name, func(t *testing.T) {
			l, path := ipctest.Listen(t)
			first := []byte("first")
			if tc.piece {
				first = []byte("ab")
			}
			after := []ipctest.Step{{Send: tc.after}}
			if !tc.piece {
				// The other process waits for a byte of the test's before it
				// exits, and the connector, its parent, with it: RecvPeer
				// pins a connector that lives however late it reads.
				after = append(after, ipctest.Step{Read: 1})
			}
			p := ipctest.HandOn(t, ipctest.HandOnSpec{Path: path, UID: nobody, GID: nobody,
				Before: []ipctest.Step{{Send: first}}, After: after})
			c := accept(t, l)
			if tc.piece {
				_, _, err := p.Wait() // both wrote before the read
				require.NoError(t, err)
				_, _, err = ipc.Recv(c, make([]byte, 4), 0)
				require.ErrorIs(t, err, ipc.ErrNotPeer)
				return
			}
			peer, err := ipc.RecvPeer(c, make([]byte, len(first)))
			require.NoError(t, err)
			defer peer.Close()
			assert.Equal(t, p.PID(), peer.PID)
			assert.Equal(t, "SO_PEERCRED", peer.Via)
			_, err = ipc.RecvFrom(c, make([]byte, len(tc.after)), 0, peer)
			require.ErrorIs(t, err, ipc.ErrNotPeer)
			require.NoError(t, ipc.Send(c, []byte{1}, nil, false))
			_, _, err = p.Wait()
			require.NoError(t, err)
		})
	}
}

// A socket handed back to this process by the process that connected: what
// this process writes on it is not the peer's.
func TestRecvPeerHandedBack(t *testing.T) {
	l, path := ipctest.Listen(t)
	c := ipctest.Pass(t, path) // the test holds the connector's socket too
	srv := accept(t, l)
	// Written by this process, on a socket another process connected: not
	// the peer.
	require.NoError(t, ipc.Send(c, []byte("x"), nil, true))
	_, err := ipc.RecvPeer(srv, make([]byte, 1))
	require.ErrorIs(t, err, ipc.ErrNotPeer)
}
