//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/internal/skip"
)

// envShareChild makes TestNPUShareAcrossProcesses, started by itself in a
// second process, play the importing process.
const envShareChild = "VMARENA_ASCEND_SHARE_CHILD"

// TestNPUShareAcrossProcesses exports a chunk holding a pattern for a second
// process (this test binary again), which sends its aclrtDeviceGetBareTgid,
// gets the token once it is on the allow-list, imports, maps and reads the
// memory, and writes an answer into it, which this process reads: one
// memory, two processes, on the NPU.
func TestNPUShareAcrossProcesses(t *testing.T) {
	if os.Getenv(envShareChild) != "" {
		npuShareChild(t)
		return
	}
	d := openNPU(t)
	if d.Caps().Sharing != acl.SharingToken {
		skip.NoDevice(t, "%s: the runtime has no sharing calls", d.Name())
	}
	if strings.HasPrefix(d.SocName(), "Fake") {
		// The dry run on the test double: one loaded double is one device
		// in one process, so a token means nothing in another
		// (TestShareTokens plays both processes in one instead).
		skip.NoDevice(t, "%s is the test double (%s), whose books do not cross processes: this needs an NPU", d.Library(), d.SocName())
	}
	const g = acl.HugePageSize
	p := acl.DeviceProp(d.Device(), 0)
	h, err := d.MallocPhysical(g, &p, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemcpyHtoD(base, []byte("written by the exporter")))
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypeNone, acl.ExportDefault)
	require.NoError(t, err)

	conn, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer conn.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNPUShareAcrossProcesses$", "-test.v")
	cmd.Env = append(os.Environ(), envShareChild+"=1")
	cmd.ExtraFiles = []*os.File{f}
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	f.Close()
	tgid := make([]byte, 4)
	_, _, err = ipc.Recv(conn, tgid, 0)
	require.NoError(t, err, "the importing process:\n%s", out)
	require.NoError(t, d.MemSetPidToShareableHandle(s, []int32{int32(binary.LittleEndian.Uint32(tgid))}))
	require.NoError(t, ipc.Send(conn, binary.LittleEndian.AppendUint64(nil, s.Value), nil, false))
	require.NoError(t, cmd.Wait(), "the importing process:\n%s", out)
	got := make([]byte, 23)
	require.NoError(t, d.MemcpyDtoH(got, base.Add(64)))
	require.Equal(t, "written by the importer", string(got), "the importer's write, in the exporter's mapping")
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// npuShareChild is the importing process of TestNPUShareAcrossProcesses.
func npuShareChild(t *testing.T) {
	f := os.NewFile(3, "socket")
	conn, err := ipc.FileConn(f)
	require.NoError(t, err)
	f.Close()
	defer conn.Close()
	d := openNPU(t)
	tgid, err := d.DeviceGetBareTgid()
	require.NoError(t, err)
	require.NoError(t, ipc.Send(conn, binary.LittleEndian.AppendUint32(nil, uint32(tgid)), nil, false))
	tok := make([]byte, 8)
	_, _, err = ipc.Recv(conn, tok, 0)
	require.NoError(t, err)
	h, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Value: binary.LittleEndian.Uint64(tok)}, d.Device())
	require.NoError(t, err)
	const g = acl.HugePageSize
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	got := make([]byte, 23)
	require.NoError(t, d.MemcpyDtoH(got, base))
	require.Equal(t, "written by the exporter", string(got))
	require.NoError(t, d.MemcpyHtoD(base.Add(64), []byte("written by the importer")))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}
