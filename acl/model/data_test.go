package model

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
)

// mapped maps n bytes of fresh chunks of size c into a reservation of the
// model, with access, and returns the base and a cleanup that gives
// everything back.
func mapped(t *testing.T, d *Driver, n, c uintptr) (acl.DevicePtr, []acl.PhysicalHandle, func()) {
	t.Helper()
	prop := acl.DeviceProp(0, 0)
	base, err := d.ReserveMemAddress(n, 0, 0, 0)
	require.NoError(t, err)
	var hs []acl.PhysicalHandle
	for off := uintptr(0); off < n; off += c {
		h, err := d.MallocPhysical(c, &prop, 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(base.Add(off), c, 0, h, 0))
		require.NoError(t, d.MemSetAccess(base.Add(off), c, acl.ReadWrite(0)))
		hs = append(hs, h)
	}
	return base, hs, func() {
		for i := len(hs) - 1; i >= 0; i-- {
			require.NoError(t, d.UnmapMem(base.Add(uintptr(i)*c)))
			require.NoError(t, d.FreePhysical(hs[i]))
		}
		require.NoError(t, d.ReleaseMemAddress(base))
		require.True(t, d.Live().Zero(), "%+v", d.Live())
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// The model keeps the bytes by default: every kind of write is read back,
// across chunk and page boundaries, and through a second mapping of the
// same memory.
func TestDataByDefault(t *testing.T) {
	d := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, d.Close()) }()
	const c = 2 << 20
	base, hs, done := mapped(t, d, 4*c, c)
	defer done()
	shadow := make([]byte, 4*c) // what the device must hold

	write := func(off int, b []byte) {
		require.NoError(t, d.MemcpyHtoD(base.Add(uintptr(off)), b))
		copy(shadow[off:], b)
	}
	check := func(what string) {
		t.Helper()
		got := make([]byte, len(shadow))
		for i := range got {
			got[i] = 0xEE // a read that leaves bytes alone shows
		}
		require.NoError(t, d.MemcpyDtoH(got, base))
		if !bytes.Equal(got, shadow) {
			i := 0
			for got[i] == shadow[i] {
				i++
			}
			t.Fatalf("%s: byte %d reads %#x, want %#x", what, i, got[i], shadow[i])
		}
	}
	check("fresh memory reads zero")
	write(c-1000, pattern(3000, 1)) // across a chunk boundary
	write(pageSize-5, pattern(10, 2))
	check("writes")

	require.NoError(t, d.Memset(base.Add(c/2), 0xAB, c+12345)) // across a chunk, partial pages
	for i := c / 2; i < c/2+c+12345; i++ {
		shadow[i] = 0xAB
	}
	check("memset")
	require.NoError(t, d.Memset(base.Add(c/2+100), 0, 3*pageSize)) // zeros over written pages, partly whole
	clear(shadow[c/2+100 : c/2+100+3*pageSize])
	check("memset of zeros")

	// Device-side copies: disjoint, overlapping upwards and downwards, and
	// out of a never-written page (which must copy zeros over written ones).
	for _, cp := range []struct{ dst, src, n int }{
		{2*c + c/2, 0, c + 777},
		{c/2 + 10, c / 2, c},
		{c / 2, c/2 + 4099, c},
		{c - 100, 3*c + c/2, 2 * pageSize},
	} {
		require.NoError(t, d.MemcpyDtoD(base.Add(uintptr(cp.dst)), base.Add(uintptr(cp.src)), uintptr(cp.n)))
		copy(shadow[cp.dst:cp.dst+cp.n], append([]byte(nil), shadow[cp.src:cp.src+cp.n]...))
		check("DtoD")
	}

	// Queued memsets land when their stream has run.
	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.MemsetAsync(base.Add(100), 0x5A, pageSize+1, s))
	require.NoError(t, d.SynchronizeStream(s))
	require.NoError(t, d.DestroyStream(s))
	for i := 100; i < 100+pageSize+1; i++ {
		shadow[i] = 0x5A
	}
	check("memset on a stream")

	// The same memory mapped a second time shows the same bytes.
	alias, err := d.ReserveMemAddress(c, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(alias, c, 0, hs[1], 0))
	require.NoError(t, d.MemSetAccess(alias, c, acl.ReadWrite(0)))
	got := make([]byte, c)
	require.NoError(t, d.MemcpyDtoH(got, alias))
	assert.True(t, bytes.Equal(got, shadow[c:2*c]), "a second mapping reads the same bytes")
	require.NoError(t, d.UnmapMem(alias))
	require.NoError(t, d.ReleaseMemAddress(alias))
}

// Bytes live with the physical allocation: unmapped and mapped again
// elsewhere, a chunk still holds what was written.
func TestDataFollowsTheHandle(t *testing.T) {
	d := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, d.Close()) }()
	const c = 2 << 20
	prop := acl.DeviceProp(0, 0)
	h, err := d.MallocPhysical(c, &prop, 0)
	require.NoError(t, err)
	a, err := d.ReserveMemAddress(c, 0, 0, 0)
	require.NoError(t, err)
	b, err := d.ReserveMemAddress(c, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(a, c, 0, h, 0))
	require.NoError(t, d.MemSetAccess(a, c, acl.ReadWrite(0)))
	want := pattern(c, 9)
	require.NoError(t, d.MemcpyHtoD(a, want))
	require.NoError(t, d.UnmapMem(a))
	require.NoError(t, d.MapMem(b, c, 0, h, 0))
	require.NoError(t, d.MemSetAccess(b, c, acl.ReadWrite(0)))
	got := make([]byte, c)
	require.NoError(t, d.MemcpyDtoH(got, b))
	assert.True(t, bytes.Equal(want, got))
	require.NoError(t, d.UnmapMem(b))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(a))
	require.NoError(t, d.ReleaseMemAddress(b))
}

// The host memory behind the bytes is made lazily: a 141 GiB device with a
// GiB mapped costs the model only the pages written, and they go when the
// memory is freed.
func TestDataIsLazy(t *testing.T) {
	d := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, d.Close()) }()
	var m0, m1, m2 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	base, _, done := mapped(t, d, 1<<30, 2<<20)
	require.NoError(t, d.Memset(base, 0, 1<<30)) // zeros make no pages
	require.NoError(t, d.MemcpyHtoD(base.Add(5<<20), pattern(8<<20, 3)))
	runtime.GC()
	runtime.ReadMemStats(&m1)
	grown := int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
	t.Logf("1 GiB mapped, 8 MiB written: heap grew by %.1f MiB", float64(grown)/(1<<20))
	assert.Less(t, grown, int64(16<<20))
	assert.Greater(t, grown, int64(8<<20)-1)
	done()
	runtime.GC()
	runtime.ReadMemStats(&m2)
	assert.Less(t, int64(m2.HeapAlloc)-int64(m0.HeapAlloc), int64(2<<20), "freed memory takes its pages along")
}

// With NoData the model keeps nothing, and every read says so instead of
// returning zeros; the rest of the contract is unchanged.
func TestNoData(t *testing.T) {
	d := open(t, Config{Untimed: true, NoData: true})
	defer func() { require.NoError(t, d.Close()) }()
	assert.Contains(t, d.Modelled(), "nodata")
	base, _, done := mapped(t, d, 4<<20, 2<<20)
	defer done()
	require.NoError(t, d.MemcpyHtoD(base, []byte("hello")))
	require.NoError(t, d.Memset(base, 1, 4<<20))
	require.NoError(t, d.MemcpyDtoD(base.Add(2<<20), base, 1<<20))
	got := []byte("xxxxx")
	err := d.MemcpyDtoH(got, base)
	acltest.RequireCode(t, err, acl.ErrCodeRTFeatureNotSupport)
	assert.ErrorIs(t, err, acl.ErrNotSupported)
	assert.Contains(t, err.Error(), "keeps no device bytes")
	assert.Equal(t, "xxxxx", string(got))
	// A bad range is still the bad range's error.
	err = d.MemcpyDtoH(got, base.Add(8<<20))
	require.Error(t, err)
	assert.NotErrorIs(t, err, acl.ErrNotSupported)
}
