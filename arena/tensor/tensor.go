// Package tensor types the memory of an arena: a Tensor is an arena.Buffer
// with an element type and a shape, dense and row-major, with no padding
// between elements. Alloc works out its bytes (the product of the
// dimensions times the element's size, overflow checked) and its alignment
// (Align), View types a buffer already allocated, and the copy methods check
// that the host slice holds exactly the tensor's elements. Float16 and
// BFloat16 are the 16-bit float types; CopyInFloat32 and CopyOutFloat32
// convert to and from float32 on the way.
//
// The package uses nothing of the arena but its public API (Alloc,
// AllocContext, Buffer, CopyIn, CopyOut): a tensor is valid as long as its
// Buffer is, and fails as that Buffer does (arena.ErrStale, ErrClosed, …).
package tensor

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
)

// MaxRank is the most dimensions a Tensor has.
const MaxRank = 8

// Align is the alignment of the tensors Alloc allocates: 256
// bytes, what cudaMalloc guarantees and so what kernels written for it may
// assume (vector loads, and the alignment of every element type).
const Align = 256

// maxBytes bounds a tensor's size: the most bytes an arena holds.
const maxBytes = 1 << 40

// Tensor is a dense, row-major array of T in an arena's memory. It is a
// small value (no Go heap allocation), valid as long as its Buffer is.
type Tensor[T arena.Element] struct {
	buf   arena.Buffer
	shape [MaxRank]int
	rank  int
}

// Alloc allocates a tensor of shape (no dimensions: a scalar) in a, aligned
// to Align, as a.Alloc does. A negative dimension, more than MaxRank of
// them, or a size that overflows fails with arena.ErrInvalid.
func Alloc[T arena.Element](a *arena.Arena, shape ...int) (t Tensor[T], err error) {
	n, err := t.setShape(shape)
	if err != nil {
		return Tensor[T]{}, err
	}
	if t.buf, err = a.Alloc(n, Align); err != nil {
		return Tensor[T]{}, err
	}
	return t, nil
}

// AllocContext is Alloc that waits for memory under ctx, as
// arena.Arena.AllocContext does.
func AllocContext[T arena.Element](ctx context.Context, a *arena.Arena, shape ...int) (t Tensor[T], err error) {
	n, err := t.setShape(shape)
	if err != nil {
		return Tensor[T]{}, err
	}
	if t.buf, err = a.AllocContext(ctx, n, Align); err != nil {
		return Tensor[T]{}, err
	}
	return t, nil
}

// View returns the tensor of shape at the start of b. b's offset must be a
// multiple of the element's size, and b must hold the tensor's bytes
// (arena.ErrInvalid, arena.ErrRange).
func View[T arena.Element](b arena.Buffer, shape ...int) (t Tensor[T], err error) {
	n, err := t.setShape(shape)
	if err != nil {
		return Tensor[T]{}, err
	}
	if size := elemSize[T](); b.Offset()%size != 0 {
		return Tensor[T]{}, fmt.Errorf("tensor: view: %w: offset %d is not a multiple of the element size %d", arena.ErrInvalid,
			b.Offset(), size)
	}
	t.buf, err = b.Slice(0, n)
	if err != nil {
		return Tensor[T]{}, fmt.Errorf("tensor: view of %d bytes: %w", n, err)
	}
	return t, nil
}

// setShape checks shape, sets it, and returns the tensor's size in bytes.
func (t *Tensor[T]) setShape(shape []int) (int, error) {
	if len(shape) > MaxRank {
		return 0, fmt.Errorf("tensor: %w: %d dimensions, at most %d", arena.ErrInvalid, len(shape), MaxRank)
	}
	n := uint64(elemSize[T]())
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("tensor: %w: dimension %d is %d", arena.ErrInvalid, i, d)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > maxBytes {
			return 0, fmt.Errorf("tensor %v: %w: more than %d bytes, the most an arena holds", slices.Clone(shape), arena.ErrInvalid,
				int64(maxBytes))
		}
		n = lo
		t.shape[i] = d
	}
	t.rank = len(shape)
	return int(n), nil
}

func elemSize[T arena.Element]() int {
	var zero T
	return int(unsafe.Sizeof(zero))
}

// Buffer returns the tensor's memory.
func (t Tensor[T]) Buffer() arena.Buffer { return t.buf }

// Ptr returns the device address of the tensor's first element.
func (t Tensor[T]) Ptr() acl.DevicePtr { return t.buf.Ptr() }

// Len returns the number of elements.
func (t Tensor[T]) Len() int { return t.buf.Len() / elemSize[T]() }

// Rank returns the number of dimensions (0 for a scalar).
func (t Tensor[T]) Rank() int { return t.rank }

// Dim returns dimension i (0 ≤ i < Rank), or 0 if there is none.
func (t Tensor[T]) Dim(i int) int {
	if i < 0 || i >= t.rank {
		return 0
	}
	return t.shape[i]
}

// Shape returns a copy of the dimensions.
func (t Tensor[T]) Shape() []int { return append([]int(nil), t.shape[:t.rank]...) }

// String describes the tensor, e.g.
// "tensor.Tensor[tensor.Float16]{shape=[2 3] ptr=0x7f0000200000}".
func (t Tensor[T]) String() string {
	var zero T
	return fmt.Sprintf("tensor.Tensor[%T]{shape=%v ptr=%v}", zero, t.shape[:t.rank], t.Ptr())
}

// CopyIn copies src, which must hold exactly Len elements, into the tensor
// (ErrRange otherwise).
func (t Tensor[T]) CopyIn(src []T) error {
	if len(src) != t.Len() {
		return fmt.Errorf("tensor: copy in: %w: %d elements for a tensor of %d", arena.ErrRange, len(src), t.Len())
	}
	return arena.CopyIn(t.buf, src)
}

// CopyOut copies the tensor into dst, which must hold exactly Len elements
// (ErrRange otherwise).
func (t Tensor[T]) CopyOut(dst []T) error {
	if len(dst) != t.Len() {
		return fmt.Errorf("tensor: copy out: %w: %d elements for a tensor of %d", arena.ErrRange, len(dst), t.Len())
	}
	return arena.CopyOut(dst, t.buf)
}

// The copies follow one rule: those given a Buffer (arena.CopyIn, CopyOut) copy
// into or out of its start, as many elements as the slice holds, which must
// fit; those given a Tensor (its methods, CopyInFloat32, CopyOutFloat32)
// copy the whole tensor, and the slice must hold exactly Len elements. For
// part of a tensor, View a Slice of its Buffer.

// CopyInFloat32 converts src to T (rounding to nearest, ties to even) and
// copies it into t. src must hold exactly t.Len() elements.
func CopyInFloat32[T HalfFloat](t Tensor[T], src []float32) error {
	if len(src) != t.Len() {
		return fmt.Errorf("tensor: copy in: %w: %d elements for a tensor of %d", arena.ErrRange, len(src), t.Len())
	}
	return copyInHalf[T](t.buf, src)
}

// CopyOutFloat32 copies t out and converts it to float32 (exactly) into
// dst, which must hold exactly t.Len() elements.
func CopyOutFloat32[T HalfFloat](dst []float32, t Tensor[T]) error {
	if len(dst) != t.Len() {
		return fmt.Errorf("tensor: copy out: %w: %d elements for a tensor of %d", arena.ErrRange, len(dst), t.Len())
	}
	return copyOutHalf[T](dst, t.buf)
}

// copyInHalf converts src to the half float T (rounding to nearest, ties to
// even) and copies it into the start of dst, as CopyIn does: 2×len(src)
// bytes must fit in dst.
func copyInHalf[T HalfFloat](dst arena.Buffer, src []float32) error {
	h := make([]T, len(src))
	var zero T
	switch any(zero).(type) {
	case Float16:
		for i, f := range src {
			h[i] = T(NewFloat16(f))
		}
	case BFloat16:
		for i, f := range src {
			h[i] = T(NewBFloat16(f))
		}
	}
	return arena.CopyIn(dst, h)
}

// copyOutHalf fills dst from the start of src, read as half floats T and
// converted to float32 (exactly), as CopyOut does: 2×len(dst) bytes must
// fit in src.
func copyOutHalf[T HalfFloat](dst []float32, src arena.Buffer) error {
	h := make([]T, len(dst))
	if err := arena.CopyOut(h, src); err != nil {
		return err
	}
	for i, x := range h {
		dst[i] = x.Float32()
	}
	return nil
}
