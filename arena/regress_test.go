package arena_test

// Regression tests for the bugs the reliability tests found, each the
// smallest case that failed before its fix.

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// sparseDriver pretends to be a device with any amount of memory: it keeps
// books but backs nothing, so a test can map a whole terabyte.
type sparseDriver struct {
	mu     sync.Mutex
	next   acl.PhysicalHandle
	handle map[acl.PhysicalHandle]bool
	maps   map[acl.DevicePtr]bool
	resv   int
}

func newSparse() *sparseDriver {
	return &sparseDriver{handle: map[acl.PhysicalHandle]bool{}, maps: map[acl.DevicePtr]bool{}}
}

func (d *sparseDriver) Name() string  { return "sparse" }
func (d *sparseDriver) Device() int32 { return 0 }
func (d *sparseDriver) MemGetAllocationGranularity(p *acl.PhysicalMemProp, _ acl.MemGranularityOptions) (uintptr, error) {
	if p.MemAttr.Huge1G() {
		return acl.Huge1GPageSize, nil
	}
	return acl.HugePageSize, nil
}
func (d *sparseDriver) MallocPhysical(uintptr, *acl.PhysicalMemProp, uint64) (acl.PhysicalHandle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	d.handle[d.next] = true
	return d.next, nil
}
func (d *sparseDriver) FreePhysical(h acl.PhysicalHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.handle, h)
	return nil
}
func (d *sparseDriver) ReserveMemAddress(uintptr, uintptr, acl.DevicePtr, uint64) (acl.DevicePtr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resv++
	return 1 << 44, nil
}
func (d *sparseDriver) ReleaseMemAddress(acl.DevicePtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resv--
	return nil
}
func (d *sparseDriver) MapMem(p acl.DevicePtr, _, _ uintptr, _ acl.PhysicalHandle, _ uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.maps[p] = true
	return nil
}
func (d *sparseDriver) UnmapMem(p acl.DevicePtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.maps, p)
	return nil
}
func (d *sparseDriver) MemSetAccess(acl.DevicePtr, uintptr, []acl.MemAccessDesc) error { return nil }
func (d *sparseDriver) MemcpyHtoD(acl.DevicePtr, []byte) error {
	return acl.NewError("aclrtMemcpy", acl.ErrCodeRTFeatureNotSupport, "sparse")
}
func (d *sparseDriver) MemcpyDtoH([]byte, acl.DevicePtr) error {
	return acl.NewError("aclrtMemcpy", acl.ErrCodeRTFeatureNotSupport, "sparse")
}
func (d *sparseDriver) MemcpyDtoD(acl.DevicePtr, acl.DevicePtr, uintptr) error {
	return acl.NewError("aclrtMemcpy", acl.ErrCodeRTFeatureNotSupport, "sparse")
}
func (d *sparseDriver) Memset(acl.DevicePtr, byte, uintptr) error { return nil }
func (d *sparseDriver) GetMemInfo(acl.MemAttr) (uintptr, uintptr, error) {
	return 1 << 41, 1 << 41, nil
}
func (d *sparseDriver) Close() error { return nil }

// The sparse device has no work in flight: every stream is idle.
func (d *sparseDriver) CreateStream() (acl.Stream, error)                          { return 1, nil }
func (d *sparseDriver) DestroyStream(acl.Stream) error                             { return nil }
func (d *sparseDriver) SynchronizeStream(acl.Stream) error                         { return nil }
func (d *sparseDriver) SynchronizeDevice() error                                   { return nil }
func (d *sparseDriver) CreateEvent() (acl.Event, error)                            { return 1, nil }
func (d *sparseDriver) RecordEvent(acl.Event, acl.Stream) error                    { return nil }
func (d *sparseDriver) QueryEvent(acl.Event) (bool, error)                         { return true, nil }
func (d *sparseDriver) SynchronizeEvent(acl.Event) error                           { return nil }
func (d *sparseDriver) DestroyEvent(acl.Event) error                               { return nil }
func (d *sparseDriver) MemsetAsync(acl.DevicePtr, byte, uintptr, acl.Stream) error { return nil }
func (d *sparseDriver) Caps() acl.Caps                                             { return acl.Caps{MaxReserve: tib} }

// The sparse device has no host memory to lend.
func (d *sparseDriver) MallocHost(uintptr) ([]byte, error) {
	return nil, acl.NewError("aclrtMallocHost", acl.ErrCodeRTFeatureNotSupport, "sparse")
}
func (d *sparseDriver) FreeHost([]byte) error {
	return acl.NewError("aclrtFreeHost", acl.ErrCodeRTParamInvalid, "sparse")
}

// The sparse device shares nothing between processes.
func (d *sparseDriver) MemExportToShareableHandle(acl.PhysicalHandle, acl.MemHandleType, uint64) (acl.ShareableHandle, error) {
	return acl.ShareableHandle{}, acl.NewError("aclrtMemExportToShareableHandle", acl.ErrCodeRTFeatureNotSupport, "sparse")
}
func (d *sparseDriver) MemSetPidToShareableHandle(acl.ShareableHandle, []int32) error {
	return acl.NewError("aclrtMemSetPidToShareableHandle", acl.ErrCodeRTFeatureNotSupport, "sparse")
}
func (d *sparseDriver) MemImportFromShareableHandle(acl.ShareableHandle, int32) (acl.PhysicalHandle, error) {
	return 0, acl.NewError("aclrtMemImportFromShareableHandle", acl.ErrCodeRTFeatureNotSupport, "sparse")
}
func (d *sparseDriver) DeviceGetBareTgid() (int32, error) { return 1, nil }

// tib is the most an arena reserves, whatever its driver grants.
const tib = 1 << 40

// Bug: Len had 40 bits, so an arena of 1 TiB, the most an arena reserves, allocated to its
// very end stored 2^40 into the state word: Len read 0 and the next Alloc
// handed out offset 0 again, over live data. Fixed by giving Len 41 bits.
func TestRegressionAllocToMaxReserve(t *testing.T) {
	// The sparse device grants 1 TiB in one reservation (Caps.MaxReserve).
	d := newSparse()
	a, err := arena.New(arena.Config{Driver: d, Reserve: tib, Chunk: chunk.Config{MemAttr: acl.HBMMemHuge1G}})
	require.NoError(t, err)
	require.Equal(t, tib, a.Reserved())
	b, err := a.Alloc(tib-4096, 1)
	require.NoError(t, err)
	require.Zero(t, b.Offset())
	b, err = a.Alloc(4096, 1) // ends exactly at 1 TiB
	require.NoError(t, err)
	require.Equal(t, tib-4096, b.Offset())
	require.Equal(t, tib, a.Len(), "Len is the whole reservation, not 0")
	_, err = a.Alloc(1, 1)
	require.ErrorIs(t, err, arena.ErrExhausted, "nothing is handed out twice")
	require.NoError(t, a.Truncate(tib/2))
	require.Equal(t, tib/2, a.Len())
	require.NoError(t, a.Close())
	require.Empty(t, d.maps)
	require.Empty(t, d.handle)
	require.Zero(t, d.resv)
}

// Bug: Close gave every chunk back to the pool before releasing the
// reservation; when the release failed, the arena stayed open with Len above
// Cap (0) and its buffers' data gone. Now a failed Close maps the chunks back
// (their memory was kept) and the arena is as it was.
func TestRegressionCloseReleaseFailureChangesNothing(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	a, err := arena.New(arena.Config{Driver: fd, Reserve: 16 << 20})
	require.NoError(t, err)
	b, err := a.Alloc(3*g, 1)
	require.NoError(t, err)
	data := pattern(3 * g)
	require.NoError(t, arena.CopyIn(b, data))
	before, live := a.Stats(), d.Live()

	fd.FailNth(faultdriver.ReleaseMemAddress, 1, 0)
	err = a.Close()
	require.Error(t, err)
	require.True(t, isInjected(err), "%v", err)
	after := a.Stats()
	before.Maps, before.Unmaps = after.Maps, after.Unmaps
	require.Equal(t, before, after, "the arena is as it was")
	require.Equal(t, live, d.Live())
	got := make([]byte, len(data))
	require.NoError(t, arena.CopyOut(got, b), "its buffers still work")
	require.Equal(t, data, got)
	require.NoError(t, a.Close(), "Close can be retried")
}

func pattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + i>>11)
	}
	return p
}

// Bug: when MemSetAccess failed after MapMem and the unmap undoing it failed
// too, the pool put the still-mapped chunk in its cache. The arena's next Grow
// then failed for ever (the address was mapped) and its Close failed for ever
// (a mapping left in the reservation): chunk and reservation leaked, and
// another arena could map the same physical memory. Now Map reports
// chunk.ErrMapped, the arena keeps the chunk as a stray, and unmaps it first
// thing next time.
func TestRegressionMapUndoFailureLeavesStray(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	pool, err := chunk.New(fd, chunk.Config{FreshZeroed: true})
	require.NoError(t, err)
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	require.NoError(t, a.Grow(g))
	before := a.Stats()

	// The pool's unmap fails; the arena's rollback unmaps it.
	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailNth(faultdriver.UnmapMem, 1, 0)
	err = a.Grow(2 * g)
	require.ErrorIs(t, err, chunk.ErrMapped)
	after := a.Stats()
	before.Maps, before.Unmaps = after.Maps, after.Unmaps // the calls were made
	require.Equal(t, before, after, "the failed Grow changed nothing")
	require.Equal(t, 1, d.Live().Mappings)

	// Both unmaps fail: the chunk stays mapped above Cap, a stray.
	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailAfter(faultdriver.UnmapMem, 0, 0)
	err = a.Grow(2 * g)
	fd.Clear()
	require.ErrorIs(t, err, chunk.ErrMapped)
	s := a.Stats()
	require.Equal(t, before.Mapped, s.Mapped, "Cap is unchanged")
	require.Equal(t, 1, s.Strays)
	require.Equal(t, 2, d.Live().Mappings, "the stray is still mapped, and known")
	require.Equal(t, 2, pool.Stats().InUse, "and not in the cache")

	require.NoError(t, a.Grow(2*g), "the next Grow unmaps the stray first")
	require.Zero(t, a.Stats().Strays)
	require.Equal(t, 2*g, a.Cap())
	require.NoError(t, a.Close())
	require.NoError(t, pool.Close())
}

// Bug: a Grow whose rollback failed to unmap a chunk kept the chunks below
// it mapped and raised Cap, so a failed Grow changed the arena. Now Cap stays
// and the chunk is a stray until the next operation unmaps it.
func TestRegressionRollbackUnmapFailureKeepsCap(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	a, err := arena.New(arena.Config{Driver: fd, Reserve: 16 << 20})
	require.NoError(t, err)
	fd.FailNth(faultdriver.MapMem, 3, 0)   // the third chunk fails to map
	fd.FailNth(faultdriver.UnmapMem, 1, 0) // and the rollback of the second fails in the pool's undo
	fd.FailNth(faultdriver.UnmapMem, 3, 0) // (the first chunk's succeeds), and again in the arena's
	require.Error(t, a.Grow(4*g))
	require.Zero(t, a.Cap(), "a failed Grow changes no Cap")
	require.Equal(t, 1, a.Stats().Strays)
	require.NoError(t, a.Shrink(), "Shrink unmaps strays too")
	require.Zero(t, a.Stats().Strays)
	require.Equal(t, 0, d.Live().Mappings)
	require.NoError(t, a.Close())
}

// Bug: when the driver failed to free a chunk, the pool dropped the handle
// and kept counting its bytes against the budget: memory leaked for good, and
// a private pool's arena Close, called again, did not try again. Now the pool
// keeps the chunk and frees it on the next Trim or Close.
func TestRegressionFreeFailureRetried(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	a, err := arena.New(arena.Config{Driver: fd, Reserve: 16 << 20})
	require.NoError(t, err)
	require.NoError(t, a.Grow(2*g))
	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	err = a.Close()
	require.Error(t, err)
	require.True(t, isInjected(err), "%v", err)
	require.True(t, a.Stats().Closed, "the arena itself closed")
	require.Equal(t, 1, d.Live().Handles, "the pool still holds the chunk it could not free")
	require.NoError(t, a.Close(), "a second Close frees it")
	require.True(t, d.Live().Zero(), "%+v", d.Live())
}

// Bug: with the chunk size above the largest reservation and Reserve 0, New
// failed with "arena: reserve: %!w(<nil>)". Now the error says why.
func TestRegressionReserveChunkTooLarge(t *testing.T) {
	d := isoDriver(t, 64<<20)
	_, err := arena.New(arena.Config{Driver: d, Chunk: chunk.Config{Size: 256 << 30}})
	require.ErrorIs(t, err, arena.ErrInvalid)
	require.False(t, strings.Contains(err.Error(), "%!"), "%v", err)
	require.Contains(t, err.Error(), "Config.Size 274877906944 bytes (256 GiB) exceeds host's largest reservation")
}

// Bug: a typed nil driver, or an Arena not made by New, panicked with a nil
// dereference. Now both are refused with ErrInvalid.
func TestRegressionNilDriverAndZeroArena(t *testing.T) {
	_, err := chunk.New((*host.Driver)(nil), chunk.Config{})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	var z arena.Arena
	require.ErrorIs(t, z.Close(), arena.ErrInvalid)
	require.ErrorIs(t, z.Grow(1), arena.ErrInvalid)
	_, err = z.Slice(0, 0)
	require.ErrorIs(t, err, arena.ErrInvalid)
}

// Copy between overlapping ranges is refused: ACL and CUDA device copies do
// not promise memmove's semantics, so it worked on the host driver only.
func TestRegressionOverlappingCopyRefused(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := isoArena(t, arena.Config{Driver: d, Reserve: 4 << 20})
	b, err := a.Alloc(100, 1)
	require.NoError(t, err)
	dst, _ := b.Slice(1, 51)
	src, _ := b.Slice(0, 50)
	err = arena.Copy(dst, src)
	require.ErrorIs(t, err, arena.ErrInvalid)
	assert.True(t, errors.Is(err, acl.ErrInvalidParam))
	dst, _ = b.Slice(50, 100)
	require.NoError(t, arena.Copy(dst, src), "adjacent ranges are fine")
}

// newSparseNoShare returns a driver that cannot share memory.
func newSparseNoShare() acl.Driver { return newSparse() }
