//go:build linux

package model

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
)

const sealGran = 2 << 20

// exportOne allocates an exportable allocation, maps it with "mine" written
// at its start, and exports it with flags.
func exportOne(t *testing.T, d *Driver, flags uint64) (acl.PhysicalHandle, acl.DevicePtr, int) {
	t.Helper()
	p := acl.DeviceProp(0, 0)
	p.HandleType = acl.MemHandleTypePOSIX
	h, err := d.MallocPhysical(sealGran, &p, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(sealGran, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, sealGran, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, sealGran, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base, []byte("mine")))
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, flags)
	require.NoError(t, err)
	fd, ok := s.FD()
	require.True(t, ok)
	return h, base, fd
}

func unmapFree(t *testing.T, d *Driver, h acl.PhysicalHandle, base acl.DevicePtr) {
	t.Helper()
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
}

// An exported memory file cannot be resized by whoever holds it (a consumer
// that shrank it would kill the producer with SIGBUS on its next copy), and a
// read-only export cannot be mapped writable; the producer's own mapping
// stays as it was.
func TestExportIsSealed(t *testing.T) {
	d, err := New(Config{Untimed: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	for _, ro := range []bool{false, true} {
		flags := uint64(acl.ExportDefault)
		if ro {
			flags = acl.ExportReadOnly
		}
		h, base, fd := exportOne(t, d, flags)
		assert.ErrorIs(t, unix.Ftruncate(fd, 0), unix.EPERM, "shrink")
		assert.ErrorIs(t, unix.Ftruncate(fd, 2*sealGran), unix.EPERM, "grow")
		_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE)
		assert.ErrorIs(t, err, unix.EPERM, "no more seals")
		m, err := unix.Mmap(fd, 0, sealGran, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if ro {
			assert.ErrorIs(t, err, unix.EPERM, "a writable mapping of a read-only export")
		} else {
			require.NoError(t, err, "a read-write export maps writable")
			require.NoError(t, unix.Munmap(m))
		}
		require.NoError(t, d.MemcpyHtoD(base.Add(8), []byte("still mine")), "read-only %v", ro)
		got := make([]byte, 4)
		require.NoError(t, d.MemcpyDtoH(got, base))
		assert.Equal(t, "mine", string(got))
		unmapFree(t, d, h, base)
	}
}

// Import trusts no name: a memory file called as the model calls its own is
// refused unless its size and seals are sealed; memory sealed against
// writes is imported read-only, and cannot be made writable.
func TestImportChecksSeals(t *testing.T) {
	d, err := New(Config{Untimed: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	memfd := func(seals int) int {
		fd, err := unix.MemfdCreate(memfileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Close(fd) })
		require.NoError(t, unix.Ftruncate(fd, sealGran))
		if seals != 0 {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
			require.NoError(t, err)
		}
		return fd
	}
	const sealed = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	imp := func(fd int) (acl.PhysicalHandle, error) {
		return d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fd)}, 0)
	}
	for _, seals := range []int{0, unix.F_SEAL_SHRINK | unix.F_SEAL_GROW, unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL} {
		_, err := imp(memfd(seals))
		acltest.RequireCode(t, err, acl.ErrCodeRTInvalidHandle, "seals %#x", seals)
	}

	base, err := d.ReserveMemAddress(sealGran, 0, 0, 0)
	require.NoError(t, err)
	h, err := imp(memfd(sealed))
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, sealGran, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, sealGran, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base, []byte("writable")))
	unmapFree(t, d, h, base)

	base, err = d.ReserveMemAddress(sealGran, 0, 0, 0)
	require.NoError(t, err)
	h, err = imp(memfd(sealed | unix.F_SEAL_FUTURE_WRITE))
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, sealGran, 0, h, 0))
	acltest.RequireCode(t, d.MemSetAccess(base, sealGran, acl.ReadWrite(0)), acl.ErrCodeRTParamInvalid, "write access to read-only memory")
	require.NoError(t, d.MemSetAccess(base, sealGran, []acl.MemAccessDesc{{Flags: acl.MemAccessRead, Location: acl.MemLocation{Type: acl.MemLocationTypeDevice}}}))
	got := make([]byte, 4)
	require.NoError(t, d.MemcpyDtoH(got, base))
	acltest.RequireCode(t, d.MemcpyHtoD(base, []byte("x")), acl.ErrCodeRTParamInvalid, "a write to read-only memory")
	unmapFree(t, d, h, base)
}

// One reservation holds this process's own memory or imported memory, never
// both at once, as on ACL and the host driver.
func TestMapRefusesMixedSources(t *testing.T) {
	d, err := New(Config{Untimed: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	fd, err := unix.MemfdCreate(memfileName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, sealGran))
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	require.NoError(t, err)
	imp, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fd)}, 0)
	require.NoError(t, err)
	p := acl.DeviceProp(0, 0)
	own, err := d.MallocPhysical(sealGran, &p, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(2*sealGran, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, sealGran, 0, own, 0))
	acltest.RequireCode(t, d.MapMem(base.Add(sealGran), sealGran, 0, imp, 0), acl.ErrCodeRTParamInvalid, "imported beside own")
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.MapMem(base.Add(sealGran), sealGran, 0, imp, 0), "imported alone")
	acltest.RequireCode(t, d.MapMem(base, sealGran, 0, own, 0), acl.ErrCodeRTParamInvalid, "own beside imported")
	require.NoError(t, d.UnmapMem(base.Add(sealGran)))
	require.NoError(t, d.FreePhysical(own))
	require.NoError(t, d.FreePhysical(imp))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
}
