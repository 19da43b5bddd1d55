//go:build linux

package host_test

import (
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/host"
)

// exportMapped allocates an exportable chunk, maps it read-write with the
// pattern written, and exports it with flags.
func exportMapped(t *testing.T, d *host.Driver, flags uint64) (acl.PhysicalHandle, acl.DevicePtr, int) {
	t.Helper()
	p := acl.DeviceProp(0, 0)
	p.HandleType = acl.MemHandleTypePOSIX
	h, err := d.MallocPhysical(chunk, &p, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(chunk, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, chunk, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, chunk, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base, pattern))
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, flags)
	require.NoError(t, err)
	fd, ok := s.FD()
	require.True(t, ok)
	return h, base, fd
}

func freeMapped(t *testing.T, d *host.Driver, h acl.PhysicalHandle, base acl.DevicePtr) {
	t.Helper()
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
}

// reopen opens the file behind fd again, through /proc, as a consumer could.
func reopen(t *testing.T, fd, mode int) int {
	t.Helper()
	rw, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), mode|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(rw) })
	return rw
}

// An exported memory file cannot be resized by anyone holding it: the
// consumer cannot cut the producer's memory under it (which would kill the
// producer with SIGBUS on its next read), nor the other way round.
func TestExportIsSealed(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer func() { require.NoError(t, d.Close()) }()
	h, base, fd := exportMapped(t, d, 0)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	require.NoError(t, err)
	want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	assert.Equal(t, want, seals&want)
	assert.Zero(t, seals&unix.F_SEAL_FUTURE_WRITE, "a read-write export stays writable")
	rw := reopen(t, fd, unix.O_RDWR)
	for _, f := range []int{fd, rw} {
		assert.ErrorIs(t, unix.Ftruncate(f, 0), unix.EPERM, "shrink")
		assert.ErrorIs(t, unix.Ftruncate(f, 2*chunk), unix.EPERM, "grow")
		assert.ErrorIs(t, unix.Fallocate(f, 0, chunk, chunk), unix.EPERM, "grow by fallocate")
		_, err := unix.FcntlInt(uintptr(f), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
		assert.ErrorIs(t, err, unix.EPERM, "no more seals")
	}
	got := make([]byte, len(pattern))
	require.NoError(t, d.MemcpyDtoH(got, base), "the producer reads its memory, unharmed")
	assert.Equal(t, pattern, got)
	freeMapped(t, d, h, base)
}

// A read-only export cannot be written through any new mapping or
// descriptor, even one reopened read-write through /proc; the producer's
// own mapping stays writable.
func TestExportReadOnlyIsSealed(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer func() { require.NoError(t, d.Close()) }()
	h, base, fd := exportMapped(t, d, acl.ExportReadOnly)
	rw := reopen(t, fd, unix.O_RDWR)
	for _, f := range []int{fd, rw} {
		_, err := unix.Mmap(f, 0, chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		assert.ErrorIs(t, err, unix.EPERM, "a writable shared mapping")
		_, err = unix.Pwrite(f, []byte("x"), 0)
		assert.ErrorIs(t, err, unix.EPERM, "a write")
		assert.ErrorIs(t, unix.Fallocate(f, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096), unix.EPERM, "a hole")
	}
	require.NoError(t, d.MemcpyHtoD(base, []byte("still the producer's")))
	freeMapped(t, d, h, base)
}

// memfd makes a memory file of size bytes with seals added (none: not
// sealable).
func memfd(t *testing.T, size int64, seals int) int {
	t.Helper()
	flags := unix.MFD_CLOEXEC
	if seals != 0 {
		flags |= unix.MFD_ALLOW_SEALING
	}
	fd, err := unix.MemfdCreate("vmarena-host", flags) // the name proves nothing
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, size))
	if seals != 0 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
		require.NoError(t, err)
	}
	return fd
}

const sealed = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Import trusts no name: only a memory file whose size and seals are sealed
// is imported, and each refusal names what failed.
func TestImportRefusesUnsealed(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer func() { require.NoError(t, d.Close()) }()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	zero, err := os.Open("/dev/zero")
	require.NoError(t, err)
	defer zero.Close()
	tmp, err := os.CreateTemp(t.TempDir(), "f")
	require.NoError(t, err)
	defer tmp.Close()
	require.NoError(t, tmp.Truncate(chunk))
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: t.TempDir() + "/s", Net: "unixgram"})
	require.NoError(t, err)
	defer sock.Close()
	sf, err := sock.File()
	require.NoError(t, err)
	defer sf.Close()
	opath, err := unix.Open(t.TempDir(), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(opath)
	for _, tc := range []struct {
		name, why string
		fd        int
	}{
		{"unsealed memfd named like the driver's", "seals", memfd(t, chunk, 0)},
		{"memfd sealed against shrinking only", "seals", memfd(t, chunk, unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL)},
		{"memfd whose seals are not sealed", "seals", memfd(t, chunk, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)},
		{"sealed memfd of a page", "not a whole physical allocation", memfd(t, 4096, sealed)},
		{"sealed empty memfd", "not a whole physical allocation", memfd(t, 0, sealed)},
		{"regular file", "seals", int(tmp.Fd())},
		{"pipe", "not a memory file", int(r.Fd())},
		{"/dev/zero", "not a memory file", int(zero.Fd())},
		{"socket", "not a memory file", int(sf.Fd())},
		{"O_PATH descriptor", "not", opath},
		{"closed descriptor", "not an open file descriptor", 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(tc.fd)}, 0)
			require.ErrorIs(t, err, acl.ErrInvalidHandle)
			assert.ErrorContains(t, err, tc.why)
			assert.True(t, d.Live().Zero(), "%+v", d.Live())
		})
	}
}

// Memory sealed against writes, or a descriptor open read-only, imports
// read-only: mapped readable, never writable, whatever the importer asks.
func TestImportReadOnly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fd    func(t *testing.T) int
		noSet bool
	}{
		{"future-write seal", func(t *testing.T) int { return memfd(t, chunk, sealed|unix.F_SEAL_FUTURE_WRITE) }, false},
		{"future-write seal, no MemSetAccess", func(t *testing.T) int { return memfd(t, chunk, sealed|unix.F_SEAL_FUTURE_WRITE) }, true},
		{"read-only descriptor", func(t *testing.T) int { return reopen(t, memfd(t, chunk, sealed), unix.O_RDONLY) }, false},
		{"read-only descriptor, no MemSetAccess", func(t *testing.T) int { return reopen(t, memfd(t, chunk, sealed), unix.O_RDONLY) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newHost(t, host.Config{Capacity: 64 << 20, NoSetAccess: tc.noSet})
			defer func() { require.NoError(t, d.Close()) }()
			h, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(tc.fd(t))}, 0)
			require.NoError(t, err)
			base, err := d.ReserveMemAddress(chunk, 0, 0, 0)
			require.NoError(t, err)
			require.NoError(t, d.MapMem(base, chunk, 0, h, 0))
			if !tc.noSet {
				err := d.MemSetAccess(base, chunk, acl.ReadWrite(0))
				require.ErrorIs(t, err, acl.ErrInvalidParam, "write access to read-only memory")
				assert.ErrorContains(t, err, "read-only")
				ro := acl.ReadWrite(0)
				ro[0].Flags = acl.MemAccessRead
				require.NoError(t, d.MemSetAccess(base, chunk, ro))
			}
			b, err := d.Bytes(base, chunk)
			require.NoError(t, err)
			assert.False(t, acltest.ReadFaults(b, 0))
			assert.True(t, acltest.WriteFaults(b, 0), "a write faults")
			require.Error(t, d.MemcpyHtoD(base, []byte{1}), "the driver refuses the write")
			freeMapped(t, d, h, base)
		})
	}
}
