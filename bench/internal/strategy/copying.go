package strategy

import (
	"errors"
	"fmt"
	"math"

	"github.com/vmarena/vmarena/acl"
)

// reallocStrategy is how Go engines grow device buffers today: like append
// on a slice, a full buffer is replaced by a larger one and the data copied.
type reallocStrategy struct {
	*dev
	growth float64
}

func (s *reallocStrategy) Name() string   { return "realloc" }
func (s *reallocStrategy) Prepare() error { return nil }
func (s *reallocStrategy) Close() error   { return nil }

func (s *reallocStrategy) Open(max int64) (Region, error) {
	return &reallocRegion{s: s, max: max, bump: bump{name: "realloc"}}, nil
}

type reallocRegion struct {
	s    *reallocStrategy
	max  int64
	bump // seg.size is the capacity; zero when nothing is allocated
}

// bump is a bump allocator over one segment, the part realloc and prealloc
// share: they differ only in how the segment grows.
type bump struct {
	name string
	seg  segment
	len  int64
}

func (r *bump) Alloc(n, align int64) (int64, error) {
	if err := checkAlloc(n, align); err != nil {
		return 0, err
	}
	off := alignUp(r.len, align)
	if off+n > r.seg.size {
		return 0, fmt.Errorf("%s: alloc %d bytes at %d: %w: capacity %d", r.name, n, off, ErrFull, r.seg.size)
	}
	r.len = off + n
	return off, nil
}

// AllocN is one bump: the tensors lie in a row in the one segment.
func (r *bump) AllocN(count int, n, align int64) (int64, error) {
	total, err := span(count, n, align)
	if err != nil {
		return 0, err
	}
	return r.Alloc(total, align)
}

func (r *bump) Ptr(off, n int64) (acl.DevicePtr, error) {
	if off < 0 || n < 0 || off+n > r.len {
		return 0, fmt.Errorf("%s: [%d, +%d) outside %d bytes in use", r.name, off, n, r.len)
	}
	return r.seg.base.Add(uintptr(off)), nil
}

func (r *bump) Len() int64 { return r.len }

func (r *bump) Truncate(n int64) error {
	if n < 0 || n > r.len {
		return fmt.Errorf("%s: truncate to %d: length is %d", r.name, n, r.len)
	}
	r.len = n
	return nil
}

// move replaces the buffer by one of size bytes holding the first r.len
// bytes: allocate, map, copy on the device, free the old. On failure the old
// buffer stays.
func (r *reallocRegion) move(size int64) error {
	if size == 0 {
		err := r.s.free(r.seg)
		r.seg = segment{}
		return err
	}
	next, err := r.s.alloc(size)
	if err != nil {
		return err
	}
	if r.len > 0 {
		if err := r.s.drv.MemcpyDtoD(next.base, r.seg.base, uintptr(r.len)); err != nil {
			return errors.Join(err, r.s.free(next))
		}
	}
	old := r.seg
	r.seg = next
	return r.s.free(old)
}

func (r *reallocRegion) Grow(n int64) error {
	need := r.len + n
	if need <= r.seg.size {
		return nil
	}
	size := need
	if r.seg.size > 0 {
		size = max(need, int64(math.Ceil(float64(r.seg.size)*r.s.growth)))
	}
	size = r.s.roundUp(size)
	if m := r.s.roundUp(r.max); size > m && need <= m {
		size = m // never beyond what the region will ever hold
	}
	return r.move(size)
}

// Trim frees the buffer when it is empty and otherwise halves it (copying)
// once it is at most a quarter full: the amortised rule of dynamic arrays,
// which keeps a shrinking buffer from copying at every step.
func (r *reallocRegion) Trim() error {
	switch {
	case r.len == 0:
		return r.move(0)
	case r.len <= r.seg.size/4:
		return r.move(r.s.roundUp(max(r.len, r.seg.size/2)))
	}
	return nil
}

// Idle trims: a realloc buffer has no way to lend its unused capacity.
func (r *reallocRegion) Idle() error { return r.Trim() }

func (r *reallocRegion) Close() error {
	r.len = 0
	return r.move(0)
}

// preallocStrategy maps each region's maximum when it opens: a static KV
// cache, a worst-case scratch buffer.
type preallocStrategy struct{ *dev }

func (s *preallocStrategy) Name() string   { return "prealloc" }
func (s *preallocStrategy) Prepare() error { return nil }
func (s *preallocStrategy) Close() error   { return nil }

func (s *preallocStrategy) Open(max int64) (Region, error) {
	seg, err := s.alloc(max)
	if err != nil {
		return nil, err
	}
	return &preallocRegion{s: s, bump: bump{name: "prealloc", seg: seg}}, nil
}

type preallocRegion struct {
	s *preallocStrategy
	bump
}

func (r *preallocRegion) Grow(n int64) error {
	if r.len+n > r.seg.size {
		return fmt.Errorf("prealloc: grow by %d at %d: %w: %d bytes preallocated", n, r.len, ErrFull, r.seg.size)
	}
	return nil
}

func (r *preallocRegion) Trim() error { return nil }
func (r *preallocRegion) Idle() error { return nil }

func (r *preallocRegion) Close() error {
	err := r.s.free(r.seg)
	r.seg, r.len = segment{}, 0
	return err
}

// perTensorStrategy makes a physical allocation and a mapping for every
// Grow: each tensor (a KV block, an activation) is its own segment, freed
// when Truncate drops it. Nothing is cached.
type perTensorStrategy struct{ *dev }

func (s *perTensorStrategy) Name() string   { return "pertensor" }
func (s *perTensorStrategy) Prepare() error { return nil }
func (s *perTensorStrategy) Close() error   { return nil }

func (s *perTensorStrategy) Open(int64) (Region, error) {
	return &perTensorRegion{name: "pertensor", mem: s}, nil
}

// alloc and freeTensor make perTensorStrategy a tensorMem: each tensor a
// segment of its own.
func (s *perTensorStrategy) alloc(n int64) (segment, any, error) {
	seg, err := s.dev.alloc(n)
	return seg, seg, err
}

func (s *perTensorStrategy) freeTensor(tag any) error { return s.dev.free(tag.(segment)) }

// tensorMem gives memory a tensor at a time: the device itself (pertensor),
// or a caching allocator.
type tensorMem interface {
	// alloc returns at least n bytes, and a tag to give them back with.
	alloc(n int64) (segment, any, error)
	freeTensor(tag any) error
}

type ptSeg struct {
	segment
	tag   any
	start int64 // logical offset of the segment's first byte
	used  int64 // bytes cut from it
}

// perTensorRegion makes each Grow a tensor of its own, from mem.
type perTensorRegion struct {
	name string
	mem  tensorMem
	segs []ptSeg // in logical order; each starts where the previous one's use ended
	len  int64
}

func (r *perTensorRegion) Grow(n int64) error {
	if n <= 0 {
		return nil
	}
	seg, tag, err := r.mem.alloc(n)
	if err != nil {
		return err
	}
	r.segs = append(r.segs, ptSeg{segment: seg, tag: tag, start: r.len})
	return nil
}

func (r *perTensorRegion) Alloc(n, align int64) (int64, error) {
	if err := checkAlloc(n, align); err != nil {
		return 0, err
	}
	if len(r.segs) == 0 {
		return 0, fmt.Errorf("%s: alloc %d bytes: %w: no tensor allocated", r.name, n, ErrFull)
	}
	s := &r.segs[len(r.segs)-1]
	at := alignUp(s.used, align) // tensor bases are aligned to 512 bytes at least
	if at+n > s.size {
		return 0, fmt.Errorf("%s: alloc %d bytes: %w: the tensor holds %d of %d", r.name, n, ErrFull, s.used, s.size)
	}
	s.used = at + n
	r.len = s.start + s.used
	return s.start + at, nil
}

// AllocN is one bump in the last tensor's segment, as Alloc cuts there.
func (r *perTensorRegion) AllocN(count int, n, align int64) (int64, error) {
	total, err := span(count, n, align)
	if err != nil {
		return 0, err
	}
	return r.Alloc(total, align)
}

func (r *perTensorRegion) find(off int64) int {
	lo, hi := 0, len(r.segs)
	for lo < hi {
		m := (lo + hi) / 2
		if r.segs[m].start+r.segs[m].used <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func (r *perTensorRegion) Ptr(off, n int64) (acl.DevicePtr, error) {
	i := r.find(off)
	if off < 0 || n < 0 || i == len(r.segs) || off < r.segs[i].start || off+n > r.segs[i].start+r.segs[i].used {
		return 0, fmt.Errorf("%s: [%d, +%d) is not inside one tensor", r.name, off, n)
	}
	return r.segs[i].base.Add(uintptr(off - r.segs[i].start)), nil
}

func (r *perTensorRegion) Len() int64 { return r.len }

func (r *perTensorRegion) Truncate(n int64) error {
	if n < 0 || n > r.len {
		return fmt.Errorf("%s: truncate to %d: length is %d", r.name, n, r.len)
	}
	var errs []error
	for len(r.segs) > 0 && r.segs[len(r.segs)-1].start >= n {
		errs = append(errs, r.mem.freeTensor(r.segs[len(r.segs)-1].tag))
		r.segs = r.segs[:len(r.segs)-1]
	}
	if len(r.segs) > 0 {
		s := &r.segs[len(r.segs)-1]
		s.used = min(s.used, n-s.start)
	}
	r.len = n
	return errors.Join(errs...)
}

func (r *perTensorRegion) Trim() error { return nil }
func (r *perTensorRegion) Idle() error { return nil }

func (r *perTensorRegion) Close() error { return r.Truncate(0) }
