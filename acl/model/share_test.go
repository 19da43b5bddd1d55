//go:build linux

package model

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/internal/leakgate"
)

// The test binary is also the importing process of TestShareAcrossProcesses:
// started with $VMARENA_MODEL_PEER set, it runs peerMain over the socket it
// inherits as descriptor 3.
const peerEnv = "VMARENA_MODEL_PEER"

func TestMain(m *testing.M) {
	if os.Getenv(peerEnv) != "" {
		if err := peerMain(); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	leakgate.Main(m)
}

// peerMain imports the descriptor it is sent into a model of its own, maps
// it, checks the producer's bytes, writes its own after them, and says so.
func peerMain() error {
	f := os.NewFile(3, "socket")
	conn, err := ipc.FileConn(f)
	f.Close()
	if err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, 2) // "fd"
	fds, _, err := ipc.Recv(conn, buf, 1)
	if err != nil || len(fds) != 1 {
		return fmt.Errorf("receive: %v, %d descriptors", err, len(fds))
	}
	d, err := New(Config{Untimed: true})
	if err != nil {
		return err
	}
	h, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fds[0])}, 0)
	if err != nil {
		return err
	}
	os.NewFile(uintptr(fds[0]), "received").Close() // the driver keeps its own
	const g = 2 << 20
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	if err != nil {
		return err
	}
	if err := d.MapMem(base, g, 0, h, 0); err != nil {
		return err
	}
	if err := d.MemSetAccess(base, g, acl.ReadWrite(0)); err != nil {
		return err
	}
	got := make([]byte, len("from the producer"))
	if err := d.MemcpyDtoH(got, base.Add(g-100)); err != nil {
		return err
	}
	if string(got) != "from the producer" {
		return fmt.Errorf("read %q where the producer wrote", got)
	}
	if l := d.Live(); l.Imported != 1 || l.ImportedBytes != g {
		return fmt.Errorf("live after the import: %+v", l)
	}
	if err := d.MemcpyHtoD(base.Add(g-50), []byte("and the consumer")); err != nil {
		return err
	}
	for _, err := range []error{d.UnmapMem(base), d.FreePhysical(h), d.ReleaseMemAddress(base)} {
		if err != nil {
			return err
		}
	}
	if !d.Live().Zero() {
		return fmt.Errorf("live at the end: %+v", d.Live())
	}
	if err := d.Close(); err != nil {
		return err
	}
	return ipc.Send(conn, []byte("done"), nil, false)
}

// A model in another process imports what this one exports and reads and
// writes the same bytes; the memory lives on after the exporter frees it.
func TestShareAcrossProcesses(t *testing.T) {
	d := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, d.Close()) }()
	require.Equal(t, acl.SharingFD, d.Caps().Sharing)
	const g = 2 << 20
	prop := acl.DeviceProp(0, 0)
	prop.HandleType = acl.MemHandleTypePOSIX
	h, err := d.MallocPhysical(g, &prop, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base.Add(g-100), []byte("from the producer")))
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, acl.ExportDefault)
	require.NoError(t, err)
	fd, _ := s.FD()

	conn, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer conn.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), peerEnv+"=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	f.Close()
	require.NoError(t, ipc.Send(conn, []byte("fd"), []int{fd}, false))
	reply := make([]byte, 4)
	_, _, err = ipc.Recv(conn, reply, 0)
	require.NoError(t, err)
	require.NoError(t, cmd.Wait(), "the peer checked the bytes and gave everything back")
	assert.Equal(t, "done", string(reply))

	got := make([]byte, len("and the consumer"))
	require.NoError(t, d.MemcpyDtoH(got, base.Add(g-50)))
	assert.Equal(t, "and the consumer", string(got), "the consumer's write is in the producer's memory")

	// A read-only mapping reads and refuses writes.
	require.NoError(t, d.MemSetAccess(base, g, []acl.MemAccessDesc{{Flags: acl.MemAccessRead, Location: acl.MemLocation{Type: acl.MemLocationTypeDevice}}}))
	require.NoError(t, d.MemcpyDtoH(got, base.Add(g-50)))
	acltest.RequireCode(t, d.MemcpyHtoD(base, []byte("x")), acl.ErrCodeRTParamInvalid)
	acltest.RequireCode(t, d.Memset(base, 0, 4096), acl.ErrCodeRTParamInvalid)

	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
}
