//go:build linux

package host_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/internal/leakgate"
)

// The test binary is also the other process of the sharing tests: started
// with $VMARENA_HOST_PEER set, it runs that role (peerMain) over the socket
// it inherits as descriptor 3.
const peerEnv = "VMARENA_HOST_PEER"

func TestMain(m *testing.M) {
	if role := os.Getenv(peerEnv); role != "" {
		if err := peerMain(role); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	// The process's default host driver lives as long as the process (by
	// design: TestDefault shows Close does nothing to it), so it is opened
	// before the gate's baseline; what it holds for callers must be zero.
	var checks []leakgate.Check
	if d, err := host.Default(); err == nil {
		checks = append(checks, leakgate.Live("host.Default", d))
	}
	leakgate.Main(m, checks...)
}

const chunk = acl.HugePageSize

var pattern = []byte("written by the producer")

// peer is the other process, started by a test.
type peer struct {
	cmd  *exec.Cmd
	conn *net.UnixConn
}

func startPeer(t *testing.T, role string) *peer {
	t.Helper()
	conn, f, err := ipc.Socketpair()
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), peerEnv+"="+role,
		"GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0") // a race-enabled peer exits at once
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	f.Close()
	p := &peer{cmd: cmd, conn: conn}
	t.Cleanup(func() {
		conn.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// tell sends a one-byte command.
func (p *peer) tell(t *testing.T, c byte) {
	t.Helper()
	require.NoError(t, ipc.Send(p.conn, []byte{c}, nil, false))
}

// wait waits for the peer to end, and reports whether it was killed.
func (p *peer) wait(t *testing.T) (killed bool) {
	t.Helper()
	err := p.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true
		}
	}
	require.NoError(t, err, "the peer failed")
	return false
}

// peerMain runs a role over the inherited socket.
func peerMain(role string) error {
	f := os.NewFile(3, "socket")
	conn, err := ipc.FileConn(f)
	if err != nil {
		return err
	}
	f.Close()
	defer conn.Close()
	d, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		return err
	}
	switch role {
	case "export":
		return exportRole(d, conn)
	case "import":
		return importRole(d, conn)
	}
	return fmt.Errorf("unknown role %q", role)
}

// exportRole allocates two exportable chunks holding pattern, sends their
// descriptors, and then frees them ('f') or dies ('k') when told.
func exportRole(d *host.Driver, conn *net.UnixConn) error {
	p := acl.DeviceProp(0, 0)
	p.HandleType = acl.MemHandleTypePOSIX
	base, err := d.ReserveMemAddress(2*chunk, 0, 0, 0)
	if err != nil {
		return err
	}
	var hs []acl.PhysicalHandle
	var fds []int
	for i := range 2 {
		h, err := d.MallocPhysical(chunk, &p, 0)
		if err != nil {
			return err
		}
		at := base.Add(uintptr(i) * chunk)
		if err := d.MapMem(at, chunk, 0, h, 0); err != nil {
			return err
		}
		if err := d.MemSetAccess(at, chunk, acl.ReadWrite(0)); err != nil {
			return err
		}
		if err := d.MemcpyHtoD(at, pattern); err != nil {
			return err
		}
		s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, acl.ExportDefault)
		if err != nil {
			return err
		}
		fd, _ := s.FD()
		hs, fds = append(hs, h), append(fds, fd)
	}
	if err := ipc.Send(conn, []byte("2"), fds, false); err != nil {
		return err
	}
	cmd := make([]byte, 1)
	if _, _, err := ipc.Recv(conn, cmd, 0); err != nil {
		return err
	}
	if cmd[0] == 'k' {
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	for i, h := range hs {
		if err := d.UnmapMem(base.Add(uintptr(i) * chunk)); err != nil {
			return err
		}
		if err := d.FreePhysical(h); err != nil {
			return err
		}
	}
	if err := d.ReleaseMemAddress(base); err != nil {
		return err
	}
	return d.Close()
}

// importRole imports the descriptor it receives, checks it holds pattern,
// writes "the consumer was here" after it, answers "ok", and frees or dies
// when told.
func importRole(d *host.Driver, conn *net.UnixConn) error {
	fds, _, err := ipc.Recv(conn, make([]byte, 1), 1)
	if err != nil {
		return err
	}
	h, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fds[0])}, 0)
	ipc.CloseAll(fds)
	if err != nil {
		return err
	}
	base, err := d.ReserveMemAddress(chunk, 0, 0, 0)
	if err != nil {
		return err
	}
	if err := d.MapMem(base, chunk, 0, h, 0); err != nil {
		return err
	}
	if err := d.MemSetAccess(base, chunk, acl.ReadWrite(0)); err != nil {
		return err
	}
	got := make([]byte, len(pattern))
	if err := d.MemcpyDtoH(got, base); err != nil {
		return err
	}
	if !bytes.Equal(got, pattern) {
		return fmt.Errorf("imported memory holds %q, want %q", got, pattern)
	}
	if err := d.MemcpyHtoD(base.Add(64), []byte("the consumer was here")); err != nil {
		return err
	}
	if err := ipc.Send(conn, []byte("ok"), nil, false); err != nil {
		return err
	}
	cmd := make([]byte, 1)
	if _, _, err := ipc.Recv(conn, cmd, 0); err != nil {
		return err
	}
	if cmd[0] == 'k' {
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if err := d.UnmapMem(base); err != nil {
		return err
	}
	if err := d.FreePhysical(h); err != nil {
		return err
	}
	if err := d.ReleaseMemAddress(base); err != nil {
		return err
	}
	return d.Close()
}

// A consumer maps what a producer exported, with no copy; the memory
// outlives the producer, which is killed while the consumer maps it.
func TestImportOutlivesProducer(t *testing.T) {
	p := startPeer(t, "export")
	fds, _, err := ipc.Recv(p.conn, make([]byte, 1), 2)
	require.NoError(t, err)
	require.Len(t, fds, 2)
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer func() { require.NoError(t, d.Close()) }()
	s0 := acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fds[0])}
	h0, err := d.MemImportFromShareableHandle(s0, 0)
	require.NoError(t, err)
	again, err := d.MemImportFromShareableHandle(s0, 0)
	require.NoError(t, err)
	assert.Equal(t, h0, again, "a second import of the same memory is the same handle")
	h1, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fds[1])}, 0)
	require.NoError(t, err)
	require.NoError(t, ipc.CloseAll(fds), "the driver keeps its own descriptors")
	l := d.Live()
	assert.Equal(t, 2, l.Handles)
	assert.Equal(t, 2, l.Imported)
	assert.Equal(t, uintptr(2*chunk), l.ImportedBytes)
	_, err = d.MemExportToShareableHandle(h0, acl.MemHandleTypePOSIX, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal, "export of imported memory")

	base, err := d.ReserveMemAddress(2*chunk, 0, 0, 0)
	require.NoError(t, err)
	for i, h := range []acl.PhysicalHandle{h0, h1} {
		at := base.Add(uintptr(i) * chunk)
		require.NoError(t, d.MapMem(at, chunk, 0, h, 0))
		require.NoError(t, d.MemSetAccess(at, chunk, acl.ReadWrite(0)))
	}
	read := func(i int) []byte {
		got := make([]byte, len(pattern))
		require.NoError(t, d.MemcpyDtoH(got, base.Add(uintptr(i)*chunk)))
		return got
	}
	assert.Equal(t, pattern, read(0))
	assert.Equal(t, pattern, read(1))

	p.tell(t, 'k')
	require.True(t, p.wait(t), "the producer was killed")
	assert.Equal(t, pattern, read(0), "the mapping outlives the producer")
	assert.Equal(t, pattern, read(1))
	require.NoError(t, d.MemcpyHtoD(base, []byte("still writable")))

	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.UnmapMem(base.Add(chunk)))
	require.NoError(t, d.FreePhysical(h0))
	assert.Equal(t, 2, d.Live().Handles, "one reference of the twice-imported handle left")
	require.NoError(t, d.FreePhysical(h0))
	require.NoError(t, d.FreePhysical(h1))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
}

// A consumer that dies frees nothing of the producer's, whose mapping shows
// what the consumer wrote: the same memory, not a copy.
func TestConsumerDies(t *testing.T) {
	for _, die := range []bool{false, true} {
		t.Run(fmt.Sprintf("killed=%v", die), func(t *testing.T) {
			d := newHost(t, host.Config{Capacity: 64 << 20})
			defer func() { require.NoError(t, d.Close()) }()
			p := acl.DeviceProp(0, 0)
			p.HandleType = acl.MemHandleTypePOSIX
			h, err := d.MallocPhysical(chunk, &p, 0)
			require.NoError(t, err)
			base, err := d.ReserveMemAddress(chunk, 0, 0, 0)
			require.NoError(t, err)
			require.NoError(t, d.MapMem(base, chunk, 0, h, 0))
			require.NoError(t, d.MemSetAccess(base, chunk, acl.ReadWrite(0)))
			require.NoError(t, d.MemcpyHtoD(base, pattern))
			s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
			require.NoError(t, err)
			before := d.Live()

			peer := startPeer(t, "import")
			fd, _ := s.FD()
			require.NoError(t, ipc.Send(peer.conn, []byte("1"), []int{fd}, false))
			ok := make([]byte, 2)
			_, _, err = ipc.Recv(peer.conn, ok, 0)
			require.NoError(t, err)
			cmd := byte('f')
			if die {
				cmd = 'k'
			}
			peer.tell(t, cmd)
			assert.Equal(t, die, peer.wait(t))

			got := make([]byte, 21)
			require.NoError(t, d.MemcpyDtoH(got, base.Add(64)))
			assert.Equal(t, "the consumer was here", string(got))
			assert.Equal(t, before, d.Live(), "the consumer's end freed nothing here")
			require.NoError(t, d.UnmapMem(base))
			require.NoError(t, d.FreePhysical(h))
			require.NoError(t, d.ReleaseMemAddress(base))
			assert.True(t, d.Live().Zero())
		})
	}
}

// A producer that frees its memory as soon as it has sent the descriptor
// pulls nothing from under the consumer: the descriptor in flight keeps the
// memory alive.
func TestProducerFreesFirst(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer func() { require.NoError(t, d.Close()) }()
	p := acl.DeviceProp(0, 0)
	p.HandleType = acl.MemHandleTypePOSIX
	h, err := d.MallocPhysical(chunk, &p, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(chunk, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, chunk, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, chunk, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base, pattern))
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
	require.NoError(t, err)
	peer := startPeer(t, "import")
	fd, _ := s.FD()
	require.NoError(t, ipc.Send(peer.conn, []byte("1"), []int{fd}, false))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero(), "the producer holds nothing")
	_, _, err = ipc.Recv(peer.conn, make([]byte, 2), 0)
	require.NoError(t, err, "the consumer imported and read the memory")
	peer.tell(t, 'f')
	assert.False(t, peer.wait(t))
}

// Read-only mappings fault on a write from the host, as on a device.
func TestReadOnlyMappingFaults(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer func() { require.NoError(t, d.Close()) }()
	base, err := d.ReserveMemAddress(chunk, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(chunk, ptrTo(acl.DeviceProp(0, 0)), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, chunk, 0, h, 0))
	ro := acl.ReadWrite(0)
	ro[0].Flags = acl.MemAccessRead
	require.NoError(t, d.MemSetAccess(base, chunk, ro))
	b, err := d.Bytes(base, chunk)
	require.NoError(t, err)
	assert.False(t, acltest.ReadFaults(b, 0))
	assert.True(t, acltest.WriteFaults(b, 0), "a write into a read-only mapping faults")
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

func ptrTo[T any](v T) *T { return &v }
