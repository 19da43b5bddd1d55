package arena_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// noAccessEnv: an arena on a fault driver in front of the registration double.
func noAccessEnv(t *testing.T) (*host.Driver, *acltest.Registrations, *faultdriver.Driver, *chunk.Pool, *arena.Arena) {
	t.Helper()
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	reg := acltest.NewRegistrations(hd, nil)
	fd := faultdriver.New(reg.Driver())
	pool, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	t.Cleanup(func() {
		fd.Clear()
		require.NoError(t, a.Close())
		require.NoError(t, pool.Close())
		require.True(t, hd.Live().Zero(), "%+v", hd.Live())
		require.NoError(t, hd.Close())
	})
	return hd, reg, fd, pool, a
}

// A Wake whose access grant fails, and whose undo cannot unmap, leaves a
// slot mapped without access (slotLeft). A callback attached then is not
// told of it (it was: it registered memory not mapped with access).
func TestAttachSkipsSlotLeftWithoutAccess(t *testing.T) {
	_, reg, fd, _, a := noAccessEnv(t)
	require.NoError(t, a.Grow(2<<20))
	require.NoError(t, a.Sleep(context.Background(), arena.Discard))
	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailAfter(faultdriver.UnmapMem, 0, 0)
	require.Error(t, a.Wake(context.Background()))
	fd.Clear()
	require.True(t, a.Asleep())
	require.Equal(t, 1, a.Stats().Strays, "a slot left mapped without access")

	err := a.OnBackingChange(arena.RegisterWith(reg))
	require.Empty(t, reg.Violations(), "attach registered memory not mapped with access (OnBackingChange: %v)", err)
	require.NoError(t, err)
}

// The same slot, with the callback registered from the start: a second
// Sleep lets go of it (no callback holds it) and its unmap fails; only a
// mapping some callback held (so had access) is told Mapped again (every
// callback was, and registered memory without access).
func TestSleepAgainSkipsSlotLeftWithoutAccess(t *testing.T) {
	_, reg, fd, _, a := noAccessEnv(t)
	require.NoError(t, a.OnBackingChange(arena.RegisterWith(reg)))
	require.NoError(t, a.Grow(2<<20))
	require.NoError(t, a.Sleep(context.Background(), arena.Discard))
	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailAfter(faultdriver.UnmapMem, 0, 0)
	require.Error(t, a.Wake(context.Background()))
	require.Empty(t, reg.Violations())
	require.True(t, a.Asleep())

	// Sleep again: the slot's unmap fails once more.
	require.Error(t, a.Sleep(context.Background(), arena.Discard))
	fd.Clear()
	require.Empty(t, reg.Violations(), "Sleep again registered memory not mapped with access")
}

// A growth whose access grant fails, and whose undo cannot unmap, leaves a
// stray mapped without access: a callback attached then is not told of it.
func TestAttachSkipsStrayWithoutAccess(t *testing.T) {
	_, reg, fd, _, a := noAccessEnv(t)
	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailAfter(faultdriver.UnmapMem, 0, 0)
	require.Error(t, a.Grow(2<<20))
	fd.Clear()
	require.Equal(t, 1, a.Stats().Strays)

	err := a.OnBackingChange(arena.RegisterWith(reg))
	require.Empty(t, reg.Violations(), "attach registered a stray not mapped with access (OnBackingChange: %v)", err)
}

// The same stray with the callback registered from the start: the next
// unstray fails to unmap it, and it is not told Mapped (it was registered).
func TestUnstraySkipsStrayWithoutAccess(t *testing.T) {
	_, reg, fd, _, a := noAccessEnv(t)
	require.NoError(t, a.OnBackingChange(arena.RegisterWith(reg)))
	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailAfter(faultdriver.UnmapMem, 0, 0)
	require.Error(t, a.Grow(2<<20))
	require.Equal(t, 1, a.Stats().Strays)
	require.Empty(t, reg.Violations())

	_ = a.Shrink() // unstray: its unmap fails again
	fd.Clear()
	require.Empty(t, reg.Violations(), "a stray not mapped with access was registered")
}
