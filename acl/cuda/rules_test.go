//go:build linux && (amd64 || arm64)

package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ipc"
)

// One reservation holds this process's own memory or imported memory, never
// both at once (ACL's rule, docs/acl.md; the host driver refuses it with
// 107000, and the CUDA binding claims the host driver's rules and codes).
func TestMapRefusesMixedSources(t *testing.T) {
	const g = 2 << 20
	a, _ := openFake(t, 0, Config{})
	b, _ := openFake(t, 0, Config{})
	h, err := a.MallocPhysical(g, exportableProp(), 0)
	require.NoError(t, err)
	s, err := a.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, acl.ExportDisablePIDValidation)
	require.NoError(t, err)
	fd, ok := s.FD()
	require.True(t, ok)
	other, err := ipc.Dup(fd)
	require.NoError(t, err)
	imp, err := b.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(other)}, 0)
	require.NoError(t, err)
	require.NoError(t, ipc.Close(other))

	own, err := b.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	base, err := b.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, b.MapMem(base, g, 0, own, 0))
	err = b.MapMem(base.Add(g), g, 0, imp, 0)
	if err == nil {
		require.NoError(t, b.UnmapMem(base.Add(g)))
	}
	require.NoError(t, b.UnmapMem(base))
	require.NoError(t, b.FreePhysical(own))
	require.NoError(t, b.FreePhysical(imp))
	require.NoError(t, b.ReleaseMemAddress(base))
	require.NoError(t, a.FreePhysical(h))
	assert.True(t, b.Live().Zero(), "%+v", b.Live())
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "imported beside own")
}
