//go:build linux && (amd64 || arm64)

package cuda

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/internal/skip"
)

// envShareChild makes TestHardware, started again by
// testShareAcrossProcesses, play the importing process (shareChild).
const envShareChild = "VMARENA_CUDA_SHARE_CHILD"

// testShareAcrossProcesses exports a chunk holding a pattern, sends the
// descriptor to a second process (this test binary again), which imports,
// maps and reads it and writes an answer into it, and reads the answer: one
// memory, two processes, on the GPU.
func testShareAcrossProcesses(t *testing.T) {
	d := openGPU(t)
	defer func() { require.NoError(t, d.Close()) }()
	if d.Caps().Sharing != acl.SharingFD {
		skip.NoDevice(t, "%s does not export POSIX file descriptors", d.Name())
	}
	g := d.gran
	p := acl.DeviceProp(d.Device(), 0)
	p.HandleType = acl.MemHandleTypePOSIX
	h, err := d.MallocPhysical(g, &p, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(d.Device())))
	require.NoError(t, d.MemcpyHtoD(base, []byte("written by the exporter")))
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
	require.NoError(t, err)

	conn, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer conn.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHardware$", "-test.v")
	cmd.Env = append(os.Environ(), envShareChild+"=1")
	cmd.ExtraFiles = []*os.File{f}
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	f.Close()
	fd, _ := s.FD()
	require.NoError(t, ipc.Send(conn, []byte{byte(g >> 21)}, []int{fd}, false))
	require.NoError(t, cmd.Wait(), "the importing process:\n%s", out)
	got := make([]byte, 23)
	require.NoError(t, d.MemcpyDtoH(got, base.Add(64)))
	require.Equal(t, "written by the importer", string(got), "the importer's write, in the exporter's mapping")
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	require.True(t, d.Live().Zero(), "%+v", d.Live())
}

// shareChild is the importing process of testShareAcrossProcesses.
func shareChild(t *testing.T) {
	f := os.NewFile(3, "socket")
	conn, err := ipc.FileConn(f)
	require.NoError(t, err)
	f.Close()
	defer conn.Close()
	b := make([]byte, 1)
	fds, _, err := ipc.Recv(conn, b, 1)
	require.NoError(t, err)
	require.Len(t, fds, 1)
	g := uintptr(b[0]) << 21
	d := openGPU(t)
	defer func() { require.NoError(t, d.Close()) }()
	h, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fds[0])}, d.Device())
	require.NoError(t, err)
	require.NoError(t, ipc.CloseAll(fds))
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(d.Device())))
	got := make([]byte, 23)
	require.NoError(t, d.MemcpyDtoH(got, base))
	require.Equal(t, "written by the exporter", string(got))
	require.NoError(t, d.MemcpyHtoD(base.Add(64), []byte("written by the importer")))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}
