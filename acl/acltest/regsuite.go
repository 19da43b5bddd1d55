package acltest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// RegistrarFactory opens what [RunRegistrar] needs.
type RegistrarFactory struct {
	// Driver returns a fresh driver to map memory with. The suite closes
	// it, and checks that it leaked nothing.
	Driver func(t testing.TB) acl.Driver
	// Open returns a fresh registrar for memory of d.
	Open func(t testing.TB, d acl.Driver) acl.Registrar
	// Held reports what the library holds for reg, as the library (or its
	// test double) counts it, not as the registrar's own books say: the set
	// ranges, the registered mappings and their bytes.
	Held func(t testing.TB, reg acl.Registrar) RegistrationCounts
	// Align is the alignment the library needs of registered addresses and
	// lengths (2 MiB for HCCL's remote access), or 0.
	Align uintptr
}

// RunRegistrar runs the conformance suite of an [acl.Registrar]: the whole
// protocol through a [Registrations] double in front of it (grow, shrink,
// remap of the same handle at the same address, from several goroutines),
// with the library holding exactly the mapped bytes (no padding) and nothing
// at the end; and the refusals every registrar makes itself, each leaving
// the library as it was.
func RunRegistrar(t *testing.T, f RegistrarFactory) {
	tests := []struct {
		name string
		fn   func(*testing.T, acl.Driver, acl.Registrar, RegistrarFactory)
	}{
		{"Lifecycle", testRegLifecycle},
		{"Refusals", testRegRefusals},
		{"Concurrent", testRegConcurrent},
	}
	if f.Align != 0 { // a library that needs no alignment has nothing to refuse
		tests = append(tests, struct {
			name string
			fn   func(*testing.T, acl.Driver, acl.Registrar, RegistrarFactory)
		}{"Misaligned", testRegMisaligned})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := open(t, f.Driver)
			reg := f.Open(t, d)
			require.NotNil(t, reg)
			t.Cleanup(func() {
				assert.True(t, f.Held(t, reg).Zero(), "the library still holds %+v", f.Held(t, reg))
			})
			tc.fn(t, d, reg, f)
		})
	}
}

func mapRegister(t testing.TB, d acl.Driver, r acl.Registrar, ptr acl.DevicePtr, size uintptr, h acl.PhysicalHandle) acl.Mapping {
	t.Helper()
	if h == 0 {
		var err error
		h, err = d.MallocPhysical(size, prop(d), 0)
		require.NoError(t, err)
	}
	require.NoError(t, d.MapMem(ptr, size, 0, h, 0))
	setAccess(t, d, ptr, size)
	m := acl.Mapping{Ptr: ptr, Size: size, Handle: h}
	require.NoError(t, r.Register(m))
	return m
}

// deregisterUnmap deregisters and unmaps m, and frees its handle unless keep.
func deregisterUnmap(t testing.TB, d acl.Driver, r acl.Registrar, m acl.Mapping, keep bool) {
	t.Helper()
	require.NoError(t, r.Deregister(m))
	require.NoError(t, d.UnmapMem(m.Ptr))
	if !keep {
		require.NoError(t, d.FreePhysical(m.Handle))
	}
}

func requireHeld(t testing.TB, f RegistrarFactory, reg acl.Registrar, want RegistrationCounts, what string) {
	t.Helper()
	require.Equal(t, want, f.Held(t, reg), "%s: what the library holds", what)
}

func testRegLifecycle(t *testing.T, d acl.Driver, reg acl.Registrar, f RegistrarFactory) {
	g := granule(t, d)
	const n = 8
	r := NewRegistrations(d, reg)
	wd := r.Driver()
	base := reserve(t, wd, n*g)
	require.NoError(t, r.SetMemoryRange(base, n*g))
	maps := make([]acl.Mapping, n)
	for i := range maps {
		maps[i] = mapRegister(t, wd, r, base.Add(uintptr(i)*g), g, 0)
		require.NoError(t, r.Check(), "after chunk %d", i)
	}
	// No padding: the library holds exactly the mapped bytes.
	requireHeld(t, f, reg, RegistrationCounts{Ranges: 1, Mappings: n, Bytes: n * g}, "grown")
	require.Equal(t, r.Live(), f.Held(t, reg))

	// Shrink by half, then grow back with fresh memory.
	for i := n - 1; i >= n/2; i-- {
		deregisterUnmap(t, wd, r, maps[i], false)
		require.NoError(t, r.Check(), "after shrinking chunk %d", i)
	}
	requireHeld(t, f, reg, RegistrationCounts{Ranges: 1, Mappings: n / 2, Bytes: n / 2 * g}, "shrunk")
	for i := n / 2; i < n; i++ {
		maps[i] = mapRegister(t, wd, r, base.Add(uintptr(i)*g), g, 0)
	}
	require.NoError(t, r.Check())

	// The same handle behind the same address again, twice: what a reuse
	// cache does, and what breaks a registration that outlives its unmap.
	for round := 0; round < 2; round++ {
		m := maps[2]
		deregisterUnmap(t, wd, r, m, true)
		maps[2] = mapRegister(t, wd, r, m.Ptr, m.Size, m.Handle)
		require.NoError(t, r.Check(), "remap round %d", round)
	}
	requireHeld(t, f, reg, RegistrationCounts{Ranges: 1, Mappings: n, Bytes: n * g}, "regrown")

	for i := range maps {
		deregisterUnmap(t, wd, r, maps[i], false)
	}
	require.NoError(t, r.UnsetMemoryRange(base))
	require.NoError(t, wd.ReleaseMemAddress(base))
	require.NoError(t, r.Check())
	require.Empty(t, r.Violations())
	require.True(t, r.Live().Zero(), "%+v", r.Live())
}

// refused asserts err is a refusal with ErrInvalidParam that left the
// library holding what it held before.
func refused(t testing.TB, f RegistrarFactory, reg acl.Registrar, before RegistrationCounts, err error, what string) {
	t.Helper()
	require.ErrorIs(t, err, acl.ErrInvalidParam, what)
	requireHeld(t, f, reg, before, what)
}

func testRegRefusals(t *testing.T, d acl.Driver, reg acl.Registrar, f RegistrarFactory) {
	g := granule(t, d)
	base := reserve(t, d, 4*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(g, prop(d), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h)) }()
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	defer func() { require.NoError(t, d.UnmapMem(base)) }()
	setAccess(t, d, base, g)
	m := acl.Mapping{Ptr: base, Size: g, Handle: h}

	none := RegistrationCounts{}
	refused(t, f, reg, none, reg.Register(m), "Register before any SetMemoryRange")
	refused(t, f, reg, none, reg.SetMemoryRange(0, g), "SetMemoryRange of NULL")
	refused(t, f, reg, none, reg.SetMemoryRange(base, 0), "SetMemoryRange of 0 bytes")
	refused(t, f, reg, none, reg.UnsetMemoryRange(base), "UnsetMemoryRange of a range never set")

	require.NoError(t, reg.SetMemoryRange(base, 2*g))
	set := RegistrationCounts{Ranges: 1}
	refused(t, f, reg, set, reg.SetMemoryRange(base, 2*g), "SetMemoryRange twice")
	refused(t, f, reg, set, reg.SetMemoryRange(base.Add(g), 2*g), "SetMemoryRange overlapping a set range")
	refused(t, f, reg, set, reg.Register(acl.Mapping{Ptr: base.Add(2 * g), Size: g, Handle: h}), "Register outside the set range")
	refused(t, f, reg, set, reg.Register(acl.Mapping{Ptr: base.Add(g), Size: 2 * g, Handle: h}), "Register across the set range's end")
	refused(t, f, reg, set, reg.Register(acl.Mapping{Ptr: base, Size: g}), "Register of a NULL handle")
	refused(t, f, reg, set, reg.Register(acl.Mapping{Ptr: base, Handle: h}), "Register of 0 bytes")
	refused(t, f, reg, set, reg.Deregister(m), "Deregister of what is not registered")

	require.NoError(t, reg.Register(m))
	one := RegistrationCounts{Ranges: 1, Mappings: 1, Bytes: g}
	refused(t, f, reg, one, reg.Register(m), "Register twice")
	refused(t, f, reg, one, reg.Register(acl.Mapping{Ptr: base, Size: 2 * g, Handle: h}), "Register overlapping a registered mapping")
	refused(t, f, reg, one, reg.Deregister(acl.Mapping{Ptr: base, Size: 2 * g, Handle: h}), "Deregister with another size")
	refused(t, f, reg, one, reg.Deregister(acl.Mapping{Ptr: base, Size: g, Handle: h + 1}), "Deregister with another handle")
	refused(t, f, reg, one, reg.UnsetMemoryRange(base), "UnsetMemoryRange with a registered mapping")
	refused(t, f, reg, one, reg.UnsetMemoryRange(base.Add(g)), "UnsetMemoryRange of an address inside the range")

	require.NoError(t, reg.Deregister(m))
	require.NoError(t, reg.UnsetMemoryRange(base))
	requireHeld(t, f, reg, none, "after the refusals")
}

func testRegMisaligned(t *testing.T, d acl.Driver, reg acl.Registrar, f RegistrarFactory) {
	g := granule(t, d)
	a := f.Align
	size := 4 * a
	if size < 4*g {
		size = 4 * g
	}
	base := reserve(t, d, size)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	require.Zero(t, uintptr(base)%a, "the driver reserves %v, not aligned to %#x", base, a)
	refused(t, f, reg, RegistrationCounts{}, reg.SetMemoryRange(base, size-a/2), "SetMemoryRange of an unaligned length")
	require.NoError(t, reg.SetMemoryRange(base, size))
	defer func() { require.NoError(t, reg.UnsetMemoryRange(base)) }()
	set := RegistrationCounts{Ranges: 1}
	for _, m := range []acl.Mapping{
		{Ptr: base.Add(a / 2), Size: a, Handle: 0x100},
		{Ptr: base, Size: a + a/2, Handle: 0x100},
		{Ptr: base.Add(4096), Size: a, Handle: 0x100},
	} {
		refused(t, f, reg, set, reg.Register(m), fmt.Sprintf("Register of %v", m))
	}
}

func testRegConcurrent(t *testing.T, d acl.Driver, reg acl.Registrar, f RegistrarFactory) {
	g := granule(t, d)
	const workers, rounds = 4, 16
	r := NewRegistrations(d, reg)
	wd := r.Driver()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- regRounds(wd, r, g, rounds)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, r.Check())
	require.True(t, r.Live().Zero(), "%+v", r.Live())
}

// regRounds grows a reservation of its own by two chunks and shrinks it
// again, rounds times, through the double.
func regRounds(d acl.Driver, r *Registrations, g uintptr, rounds int) (err error) {
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	if err != nil {
		return err
	}
	if err := r.SetMemoryRange(base, 2*g); err != nil {
		return err
	}
	for i := 0; i < rounds; i++ {
		var ms []acl.Mapping
		for k := uintptr(0); k < 2; k++ {
			h, err := d.MallocPhysical(g, prop(d), 0)
			if err != nil {
				return err
			}
			p := base.Add(k * g)
			if err := d.MapMem(p, g, 0, h, 0); err != nil {
				return err
			}
			if err := d.MemSetAccess(p, g, acl.ReadWrite(d.Device())); err != nil && !errors.Is(err, acl.ErrNotSupported) {
				return err
			}
			m := acl.Mapping{Ptr: p, Size: g, Handle: h}
			if err := r.Register(m); err != nil {
				return err
			}
			ms = append(ms, m)
		}
		for _, m := range ms {
			if err := r.Deregister(m); err != nil {
				return err
			}
			if err := d.UnmapMem(m.Ptr); err != nil {
				return err
			}
			if err := d.FreePhysical(m.Handle); err != nil {
				return err
			}
		}
	}
	if err := r.UnsetMemoryRange(base); err != nil {
		return err
	}
	return d.ReleaseMemAddress(base)
}
