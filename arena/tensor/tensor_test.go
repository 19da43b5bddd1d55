package tensor_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/arenatest"
	"github.com/vmarena/vmarena/arena/tensor"
	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
)

func TestMain(m *testing.M) { arenagate.Main(m) }

// isoDriver is a host driver that the test checks for leaks when it ends.
func isoDriver(t *testing.T, capacity uintptr) *host.Driver {
	t.Helper()
	d, err := host.New(host.Config{Capacity: capacity})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
		assert.NoError(t, d.Close())
	})
	return d
}

func isNaN16(h tensor.Float16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }
func isNaNB(b tensor.BFloat16) bool { return b&0x7f80 == 0x7f80 && b&0x7f != 0 }

// Every Float16 and BFloat16 converts to float32 and back to itself; NaNs
// stay NaNs.
func TestHalfRoundTrip(t *testing.T) {
	for i := range 1 << 16 {
		h := tensor.Float16(i)
		if isNaN16(h) {
			require.True(t, isNaN16(tensor.NewFloat16(h.Float32())), "%#04x", i)
			continue
		}
		require.Equal(t, h, tensor.NewFloat16(h.Float32()), "%#04x", i)
		b := tensor.BFloat16(i)
		if isNaNB(b) {
			require.True(t, isNaNB(tensor.NewBFloat16(b.Float32())), "%#04x", i)
			continue
		}
		require.Equal(t, b, tensor.NewBFloat16(b.Float32()), "%#04x", i)
	}
}

func TestHalfKnownValues(t *testing.T) {
	for _, c := range []struct {
		f float32
		h tensor.Float16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff}, {0.1, 0x2e66},
		{65519, 0x7bff}, {65520, 0x7c00}, // halfway to 65536 rounds to even: infinity
		{float32(math.Inf(-1)), 0xfc00}, {0, 0}, {float32(math.Copysign(0, -1)), 0x8000},
		{0x1p-14, 0x0400}, // the smallest normal
		{0x1p-24, 0x0001}, // the smallest subnormal
		{0x1p-25, 0x0000}, // halfway to it rounds to even: zero
		{0x1.8p-25, 0x0001},
		{0x1.ffcp-15, 0x0400}, // rounds up from the largest subnormal into the normals
		{1 + 0x1p-11, 0x3c00}, // halfway between 1 and the next: even
		{1 + 0x3p-11, 0x3c02},
	} {
		assert.Equal(t, c.h, tensor.NewFloat16(c.f), "%g", c.f)
	}
	for _, c := range []struct {
		f float32
		b tensor.BFloat16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {3.14159265, 0x4049}, {math.MaxFloat32, 0x7f80},
		{1 + 0x1p-8, 0x3f80}, {1 + 0x3p-8, 0x3f82}, {float32(math.Inf(1)), 0x7f80},
	} {
		assert.Equal(t, c.b, tensor.NewBFloat16(c.f), "%g", c.f)
	}
	assert.True(t, isNaN16(tensor.NewFloat16(float32(math.NaN()))))
	assert.True(t, isNaNB(tensor.NewBFloat16(math.Float32frombits(0x7f800001))), "a NaN whose payload rounding would clear")
}

// Conversion picks the nearest value: no neighbour of the result is
// nearer.
func TestHalfNearest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		f := math.Float32frombits(r.Uint32())
		if math.IsNaN(float64(f)) {
			continue
		}
		h := tensor.NewFloat16(f)
		if math.Abs(float64(f)) < 65520 {
			nearest(t, float64(f), float64(h.Float32()), float64(tensor.Float16(h+1).Float32()), float64(tensor.Float16(h-1).Float32()))
		}
		b := tensor.NewBFloat16(f)
		if !math.IsInf(float64(b.Float32()), 0) {
			nearest(t, float64(f), float64(b.Float32()), float64(tensor.BFloat16(b+1).Float32()), float64(tensor.BFloat16(b-1).Float32()))
		}
	}
}

func nearest(t *testing.T, f, got float64, neighbours ...float64) {
	t.Helper()
	for _, n := range neighbours {
		if math.IsNaN(n) || math.IsInf(n, 0) || math.Signbit(n) != math.Signbit(got) {
			continue
		}
		if math.Abs(n-f) < math.Abs(got-f) {
			t.Fatalf("%g converted to %g, but %g is nearer", f, got, n)
		}
	}
}

func TestTensor(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := arenatest.New(t, arena.Config{Driver: d, Reserve: 16 << 20})
	_, err := a.Alloc(3, 1) // so that alignment matters
	require.NoError(t, err)

	x, err := tensor.Alloc[tensor.Float16](a, 2, 3)
	require.NoError(t, err)
	assert.Equal(t, 6, x.Len())
	assert.Equal(t, 12, x.Buffer().Len())
	assert.Zero(t, uintptr(x.Ptr())%tensor.Align)
	assert.Equal(t, 2, x.Rank())
	assert.Equal(t, []int{2, 3}, x.Shape())
	assert.Equal(t, 3, x.Dim(1))
	assert.Zero(t, x.Dim(2))
	assert.Contains(t, x.String(), "tensor.Tensor[tensor.Float16]{shape=[2 3] ptr=")

	in := []float32{0, 1, -2, 0.5, 65504, 0x1p-24}
	require.NoError(t, tensor.CopyInFloat32(x, in))
	out := make([]float32, 6)
	require.NoError(t, tensor.CopyOutFloat32(out, x))
	assert.Equal(t, in, out)
	raw := make([]tensor.Float16, 6)
	require.NoError(t, x.CopyOut(raw))
	assert.Equal(t, tensor.Float16(0x3c00), raw[1])
	require.ErrorIs(t, x.CopyIn(raw[:5]), arena.ErrRange)
	require.ErrorIs(t, x.CopyOut(make([]tensor.Float16, 7)), arena.ErrRange)
	require.ErrorIs(t, tensor.CopyInFloat32(x, in[:1]), arena.ErrRange)
	require.ErrorIs(t, tensor.CopyOutFloat32(out[:2], x), arena.ErrRange)

	bf, err := tensor.Alloc[tensor.BFloat16](a, 4)
	require.NoError(t, err)
	require.NoError(t, tensor.CopyInFloat32(bf, []float32{1, 2, 3, 3.14159265}))
	got := make([]float32, 4)
	require.NoError(t, tensor.CopyOutFloat32(got, bf))
	assert.Equal(t, []float32{1, 2, 3, 3.140625}, got)

	s, err := tensor.Alloc[float64](a)
	require.NoError(t, err)
	assert.Equal(t, 1, s.Len(), "a scalar")
	require.NoError(t, s.CopyIn([]float64{math.Pi}))
	empty, err := tensor.Alloc[int32](a, 4, 0)
	require.NoError(t, err)
	assert.Zero(t, empty.Len())
	require.NoError(t, empty.CopyIn(nil))

	_, err = tensor.Alloc[float32](a, 2, -1)
	require.ErrorIs(t, err, arena.ErrInvalid)
	_, err = tensor.Alloc[float32](a, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	require.ErrorIs(t, err, arena.ErrInvalid)
	_, err = tensor.Alloc[float32](a, 1<<40, 1<<40)
	require.ErrorIs(t, err, arena.ErrInvalid)
	_, err = tensor.Alloc[complex128](a, 1<<20, 1<<17)
	require.ErrorIs(t, err, arena.ErrInvalid, "2^41 bytes: past MaxReserve")
	_, err = tensor.Alloc[float32](a, 8<<20) // 32 MiB: past the reservation
	require.ErrorIs(t, err, arena.ErrExhausted)
}

func TestView(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := arenatest.New(t, arena.Config{Driver: d, Reserve: 16 << 20})
	b, err := a.Alloc(64, 8)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, []int32{1, 2, 3, 4, 5, 6}))
	v, err := tensor.View[int32](b, 2, 2)
	require.NoError(t, err)
	got := make([]int32, 4)
	require.NoError(t, v.CopyOut(got))
	assert.Equal(t, []int32{1, 2, 3, 4}, got)
	_, err = tensor.View[int32](b, 17)
	require.ErrorIs(t, err, arena.ErrRange)
	odd, err := b.Slice(2, 10)
	require.NoError(t, err)
	_, err = tensor.View[int32](odd, 2)
	require.ErrorIs(t, err, arena.ErrInvalid)
	_, err = tensor.View[tensor.Float16](odd, 4)
	require.NoError(t, err)
}

// Alloc costs no Go heap allocation.
func TestAllocAllocFree(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := arenatest.New(t, arena.Config{Driver: d, Reserve: 16 << 20})
	require.NoError(t, a.Grow(8<<20))
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		if _, err := tensor.Alloc[tensor.BFloat16](a, 4, 8); err != nil {
			t.Fatal(err)
		}
	}))
}

// Half floats print as numbers, and every one prints in a form that parses
// back to the same bits (NaNs aside).
func TestHalfString(t *testing.T) {
	assert.Equal(t, "1.5", tensor.NewFloat16(1.5).String())
	assert.Equal(t, "65504", tensor.Float16(0x7bff).String())
	assert.Equal(t, "-Inf", tensor.Float16(0xfc00).String())
	assert.Equal(t, "NaN", tensor.Float16(0x7e00).String())
	assert.Equal(t, "1.5", tensor.NewBFloat16(1.5).String())
	assert.Equal(t, "+Inf", tensor.BFloat16(0x7f80).String())
	assert.Equal(t, "[0.5 -2]", fmt.Sprint([]tensor.Float16{tensor.NewFloat16(0.5), tensor.NewFloat16(-2)}))
	for i := range 1 << 16 {
		h, b := tensor.Float16(i), tensor.BFloat16(i)
		if !isNaN16(h) {
			f, err := strconv.ParseFloat(h.String(), 32)
			require.NoError(t, err)
			require.Equal(t, h, tensor.NewFloat16(float32(f)), "%#04x prints %s", i, h)
		}
		if !isNaNB(b) {
			f, err := strconv.ParseFloat(b.String(), 32)
			require.NoError(t, err)
			require.Equal(t, b, tensor.NewBFloat16(float32(f)), "%#04x prints %s", i, b)
		}
	}
}

// The conversions copy a whole tensor; a part of one is a view of a slice of
// its Buffer.
func TestCopyHalfPart(t *testing.T) {
	a, err := arena.New(arena.Config{Driver: isoDriver(t, 16<<20), Reserve: 4 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	tn, err := tensor.Alloc[tensor.BFloat16](a, 8)
	require.NoError(t, err)
	require.NoError(t, tensor.CopyInFloat32(tn, []float32{1, 2, 3, 4, 5, 6, 7, 8}))
	head, err := tensor.View[tensor.BFloat16](tn.Buffer(), 2)
	require.NoError(t, err)
	require.NoError(t, tensor.CopyInFloat32(head, []float32{-1, -2}), "a prefix")
	got := make([]float32, 3)
	part, err := tensor.View[tensor.BFloat16](tn.Buffer(), 3)
	require.NoError(t, err)
	require.NoError(t, tensor.CopyOutFloat32(got, part))
	assert.Equal(t, []float32{-1, -2, 3}, got)
	rest, err := tn.Buffer().Slice(4, 16)
	require.NoError(t, err)
	tail, err := tensor.View[tensor.BFloat16](rest, 6)
	require.NoError(t, err)
	require.NoError(t, tensor.CopyOutFloat32(got[:2], mustView[tensor.BFloat16](t, tail.Buffer(), 2)))
	assert.Equal(t, []float32{3, 4}, got[:2], "a view of a slice")
	require.ErrorIs(t, tensor.CopyInFloat32(tn, make([]float32, 9)), arena.ErrRange)
	require.ErrorIs(t, tensor.CopyOutFloat32(got, tn), arena.ErrRange, "a tensor copies whole")
}

func mustView[T arena.Element](t *testing.T, b arena.Buffer, shape ...int) tensor.Tensor[T] {
	t.Helper()
	v, err := tensor.View[T](b, shape...)
	require.NoError(t, err)
	return v
}
