//go:build linux && (amd64 || arm64)

package cuda

import (
	"context"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
)

// rdmaEngine plays an RDMA engine that keeps a NIC registration of an
// arena's mapped memory: it drops its registration (and descriptor) when the
// arena is about to unmap memory, and exports again whenever the arena's
// generation moved. The registration stands for ibv_reg_dmabuf_mr of the
// descriptor.
type rdmaEngine struct {
	t       *testing.T
	a       *arena.Arena
	reg     *arena.DMABuf
	exports int
	dropped int
}

// callback drops the registration before any unmap.
func (e *rdmaEngine) callback(ch arena.BackingChange) error {
	if ch.Phase == arena.BackingUnmapping && e.reg != nil {
		require.NoError(e.t, e.reg.Close())
		e.reg = nil
		e.dropped++
	}
	return nil
}

// refresh exports again when the registration is stale or gone, and checks
// that it covers exactly the arena's mapped prefix.
func (e *rdmaEngine) refresh() {
	t := e.t
	if e.reg != nil && !e.reg.Stale(e.a) {
		return
	}
	if e.reg != nil {
		require.NoError(t, e.reg.Close())
		e.reg = nil
	}
	if e.a.Cap() == 0 {
		_, err := e.a.ExportDMABuf()
		require.ErrorIs(t, err, acl.ErrInvalidParam, "nothing mapped, nothing to export")
		return
	}
	d, err := e.a.ExportDMABuf()
	require.NoError(t, err)
	e.exports++
	require.Equal(t, e.a.Base(), d.Ptr)
	require.Equal(t, uintptr(e.a.Cap()), d.Size)
	require.Equal(t, e.a.Generation(), d.Generation)
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(d.FD, &st))
	require.Equal(t, int64(d.Size), st.Size, "the descriptor is the mapped prefix's size")
	e.reg = &d
}

// An arena's mapped prefix exports as one dma-buf on the CUDA binding, with
// the generation it describes: after each growth, shrink, sleep and wake the
// engine finds it stale and exports again; before each unmap its callback
// drops the old registration; no descriptor is left at the end.
func TestArenaExportDMABuf(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	exports := arenaDMABuf(t, d)
	require.Equal(t, int64(exports), f.dmabufs(), "every export reached CUDA")
}

// arenaDMABuf runs an arena on d through growths, a shrink, a sleep, a wake
// and a close with the RDMA engine following it, and returns how many
// exports it made.
func arenaDMABuf(t *testing.T, d *Driver) int {
	fds := openFDs(t)
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 * g})
	require.NoError(t, err)
	e := &rdmaEngine{t: t, a: a}
	require.NoError(t, a.OnBackingChange(e.callback))
	e.refresh() // nothing mapped yet
	require.Nil(t, e.reg)

	require.NoError(t, a.Grow(3*g))
	e.refresh()
	require.NotNil(t, e.reg)
	gen := e.reg.Generation
	e.refresh()
	require.Equal(t, gen, e.reg.Generation, "no change, no export")
	require.Equal(t, 1, e.exports)

	_, err = a.Alloc(5*g, 1)
	require.NoError(t, err)
	require.True(t, e.reg.Stale(a), "a growth moves the generation")
	e.refresh()
	require.Equal(t, uintptr(5*g), e.reg.Size)

	require.NoError(t, a.Truncate(g))
	require.NoError(t, a.Shrink())
	require.Nil(t, e.reg, "dropped before the shrink unmapped")
	e.refresh()
	require.Equal(t, uintptr(g), e.reg.Size)

	require.NoError(t, a.Sleep(context.Background(), arena.Discard))
	require.Nil(t, e.reg)
	e.refresh()
	require.Nil(t, e.reg, "asleep: nothing to export")
	require.NoError(t, a.Wake(context.Background()))
	e.refresh()
	require.Equal(t, uintptr(a.Cap()), e.reg.Size)

	require.NoError(t, a.Close())
	require.Nil(t, e.reg, "Close unmapped: the registration went first")
	_, err = a.ExportDMABuf()
	require.ErrorIs(t, err, arena.ErrClosed)
	require.GreaterOrEqual(t, e.dropped, 3)
	require.Equal(t, fds, openFDs(t), "no descriptor left")
	return e.exports
}
