package arena_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// An Alloc or Grow larger than the pool's budget fails before any driver
// call, and so does an Acquire of more chunks than the budget holds.
func TestOverBudgetFailsFast(t *testing.T) {
	hd := isoDriver(t, 2<<30)
	fd := faultdriver.New(hd)
	pool, err := chunk.New(fd, chunk.Config{Budget: 1 << 30})
	require.NoError(t, err)
	defer func() { assert.NoError(t, pool.Close()) }()
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 4 << 30})
	require.NoError(t, err)
	defer func() { assert.NoError(t, a.Close()) }()

	before := fd.Calls(faultdriver.Any)
	_, err = a.Alloc(2<<30, 1)
	assert.ErrorIs(t, err, arena.ErrOutOfMemory)
	assert.ErrorIs(t, err, chunk.ErrBudget)
	assert.ErrorContains(t, err, "2147483648 bytes (2 GiB)")
	assert.ErrorContains(t, err, "1073741824 bytes (1 GiB)")
	assert.ErrorIs(t, a.Grow(2<<30), chunk.ErrBudget)
	_, err = pool.Lender().Acquire(chunk.NewTenant(), 513)
	assert.ErrorIs(t, err, chunk.ErrBudget)
	assert.Equal(t, before, fd.Calls(faultdriver.Any), "no driver call")

	// What the arena holds counts: 600 MiB mapped, 600 MiB more cannot fit.
	require.NoError(t, a.Grow(600<<20))
	before = fd.Calls(faultdriver.Any)
	assert.ErrorIs(t, a.Grow(1200<<20), chunk.ErrBudget)
	assert.Equal(t, before, fd.Calls(faultdriver.Any), "no driver call")
	assert.Equal(t, 600<<20, a.Cap(), "unchanged")
	require.NoError(t, a.Grow(1<<30), "exactly the budget fits")
}

// Alloc accepts every power of two up to BaseAlign, which the arena reports,
// and refuses a larger one, naming the limit.
func TestBaseAlign(t *testing.T) {
	a, err := arena.New(arena.Config{Driver: isoDriver(t, 64<<20), Reserve: 16 << 20})
	require.NoError(t, err)
	defer a.Close()
	m := a.BaseAlign()
	assert.GreaterOrEqual(t, m, 2<<20, "at least the granularity")
	assert.LessOrEqual(t, m, arena.AlignLimit)
	assert.Zero(t, m&(m-1), "a power of two")
	assert.Zero(t, uintptr(a.Base())%uintptr(m), "Base is so aligned")
	b, err := a.Alloc(16, m)
	require.NoError(t, err)
	assert.Zero(t, uintptr(b.Ptr())%uintptr(m))
	_, err = a.Alloc(16, 2*m)
	assert.ErrorIs(t, err, arena.ErrInvalid)
	assert.ErrorContains(t, err, "BaseAlign, "+strconv.Itoa(m)+" bytes")
	_, err = a.Alloc(16, 2*arena.AlignLimit)
	assert.ErrorIs(t, err, arena.ErrInvalid)
}

// The accessors and Stats are safe on a nil *Arena.
func TestNilArenaAccessors(t *testing.T) {
	var a *arena.Arena
	assert.NotPanics(t, func() {
		assert.Zero(t, a.Base())
		assert.Zero(t, a.Len())
		assert.Zero(t, a.Cap())
		assert.Zero(t, a.Reserved())
		assert.Zero(t, a.ChunkSize())
		assert.Zero(t, a.BaseAlign())
		assert.Nil(t, a.Driver())
		assert.Nil(t, a.Pool())
		assert.Equal(t, arena.Stats{Closed: true}, a.Stats())
	})
}

// A Grow or Alloc that needs memory from a shared pool that was closed
// matches ErrClosed (and the pool's own chunk.ErrClosed).
func TestGrowAfterPoolClosed(t *testing.T) {
	pool, err := chunk.New(isoDriver(t, 64<<20), chunk.Config{})
	require.NoError(t, err)
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	require.NoError(t, a.Grow(1))
	require.NoError(t, a.Close())
	b, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	require.NoError(t, pool.Close())
	err = b.Grow(4 << 20)
	assert.ErrorIs(t, err, arena.ErrClosed)
	assert.ErrorIs(t, err, chunk.ErrClosed)
	_, err = b.Alloc(4<<20, 1)
	assert.ErrorIs(t, err, arena.ErrClosed)
	assert.Zero(t, b.Cap(), "unchanged")
	require.NoError(t, b.Close())
}

// New on a shared pool that was closed fails with an error that matches
// ErrClosed (and chunk.ErrClosed), and keeps no reservation.
func TestNewOnClosedPool(t *testing.T) {
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	require.NoError(t, pool.Close())
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.Error(t, err)
	assert.Nil(t, a)
	assert.ErrorIs(t, err, arena.ErrClosed)
	assert.ErrorIs(t, err, chunk.ErrClosed)
	assert.Equal(t, "arena: chunk: pool closed", err.Error())
	assert.Zero(t, d.Live().Reservations, "the reservation went back")
}

// A request past the reservation says how to get a larger one: Config.Reserve.
func TestExhaustedNamesReserve(t *testing.T) {
	a, err := arena.New(arena.Config{Driver: isoDriver(t, 64<<20), Reserve: 4 << 20})
	require.NoError(t, err)
	defer a.Close()
	_, aerr := a.Alloc(8<<20, 1)
	for _, err := range []error{a.Grow(8 << 20), aerr, a.Prefetch(8 << 20)} {
		assert.ErrorIs(t, err, arena.ErrExhausted)
		assert.ErrorContains(t, err, "4 MiB) reserved")
		assert.ErrorContains(t, err, "Config.Reserve")
	}
}

// Stats.Maps and Unmaps count the chunks placed in and taken out of the
// range: without streams, one MapMem or UnmapMem call each.
func TestStatsCountMapCalls(t *testing.T) {
	fd := faultdriver.New(isoDriver(t, 64<<20))
	a, err := arena.New(arena.Config{Driver: fd, Reserve: 32 << 20})
	require.NoError(t, err)
	require.NoError(t, a.Grow(6<<20))
	_, err = a.Alloc(2<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.Shrink())
	require.NoError(t, a.Grow(8<<20))
	require.NoError(t, a.Reset())
	require.NoError(t, a.Shrink())
	s := a.Stats()
	assert.Equal(t, fd.Calls(faultdriver.MapMem), s.Maps)
	assert.Equal(t, fd.Calls(faultdriver.UnmapMem), s.Unmaps)
	assert.Equal(t, int64(3+4), s.Maps)
	assert.Equal(t, int64(2+5), s.Unmaps)
	require.NoError(t, a.Close())
}
