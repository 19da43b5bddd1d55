package strategy

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// pagedStrategy is a PagedAttention-style block pool, as vLLM and the
// serving engines built like it give a KV cache memory: at start the whole
// budget (or, without one, 90% of the device's free memory, vLLM's default
// gpu_memory_utilization) is allocated and cleared once, and cut into
// fixed-size blocks. A sequence holds a block table, the list of its blocks
// in logical order; it takes blocks from the free list as it grows and
// gives them back when it is truncated. After Prepare no call reaches the
// driver until Close. When the free list runs dry a Grow fails with
// acl.ErrOutOfMemory and the workload preempts the sequence (recompute), as
// the engines do.
//
// Paged memory is not contiguous: a kernel that reads the cache must follow
// the block table (a paged-attention kernel). An Alloc that would straddle
// two blocks starts at the next block instead, so the workloads that cut
// tensors larger than a block (scratch, churn) cannot run on it; the suite
// runs it on kv alone.
type pagedStrategy struct {
	*dev
	cfg    Config
	block  int64 // bytes per block
	pool   segment
	blocks []int32 // free block indices, a stack
	n      int     // blocks in the pool
}

func newPaged(cfg Config) (*pagedStrategy, error) {
	d, err := newDev(cfg.Driver)
	if err != nil {
		return nil, fmt.Errorf("strategy paged: %w", err)
	}
	b := cfg.Block
	if b == 0 {
		b = d.gran
	}
	if b <= 0 || b%Align != 0 {
		return nil, fmt.Errorf("strategy paged: block of %d bytes: want a positive multiple of %d", b, Align)
	}
	return &pagedStrategy{dev: d, cfg: cfg, block: b}, nil
}

func (s *pagedStrategy) Name() string { return "paged" }

// poolBytes is the size of the pool Prepare allocates: the budget, or 90%
// of the device's free memory without one, in whole blocks and granules.
func (s *pagedStrategy) poolBytes() (int64, error) {
	n := s.cfg.Budget
	if n <= 0 {
		free, _, err := s.drv.GetMemInfo(acl.HBMMem)
		if err != nil {
			return 0, fmt.Errorf("strategy paged: free memory: %w", err)
		}
		n = int64(free) / 10 * 9
	}
	blocks := n / s.block
	// The pool is one allocation of whole granules: keep it inside n.
	for blocks > 0 && s.roundUp(blocks*s.block) > n {
		blocks--
	}
	if blocks == 0 {
		return 0, fmt.Errorf("strategy paged: %w: a pool of %d bytes holds no block of %d", acl.ErrOutOfMemory, n, s.block)
	}
	return blocks * s.block, nil
}

// Prepare allocates the pool, clears it (engines allocate the cache with
// zeros) and cuts it into blocks.
func (s *pagedStrategy) Prepare() error {
	if s.pool.size != 0 {
		return nil
	}
	size, err := s.poolBytes()
	if err != nil {
		return err
	}
	seg, err := s.alloc(size)
	if err != nil {
		return fmt.Errorf("strategy paged: allocate the pool of %d bytes: %w", size, err)
	}
	if err := s.drv.Memset(seg.base, 0, uintptr(seg.size)); err != nil {
		return errors.Join(fmt.Errorf("strategy paged: clear the pool: %w", err), s.dev.free(seg))
	}
	s.pool = seg
	s.n = int(size / s.block)
	s.blocks = make([]int32, s.n)
	for i := range s.blocks {
		s.blocks[i] = int32(s.n - 1 - i) // block 0 on top
	}
	return nil
}

// Close frees the pool. Regions must be closed first.
func (s *pagedStrategy) Close() error {
	if s.pool.size == 0 {
		return nil
	}
	if len(s.blocks) != s.n {
		return fmt.Errorf("strategy paged: close with %d of %d blocks still in use", s.n-len(s.blocks), s.n)
	}
	err := s.dev.free(s.pool)
	s.pool, s.blocks, s.n = segment{}, nil, 0
	return err
}

// FreeBlocks returns the blocks on the free list.
func (s *pagedStrategy) FreeBlocks() int { return len(s.blocks) }

func (s *pagedStrategy) Open(max int64) (Region, error) {
	if s.pool.size == 0 {
		if err := s.Prepare(); err != nil {
			return nil, err
		}
	}
	return &pagedRegion{s: s, max: max}, nil
}

// pagedRegion is one sequence: a block table over the pool.
type pagedRegion struct {
	s     *pagedStrategy
	max   int64
	table []int32 // the blocks, in logical order
	len   int64
	end   int64 // the end of the block Len lies in, when that block is held; 0 otherwise
}

func (r *pagedRegion) capacity() int64 { return int64(len(r.table)) * r.s.block }

// Grow takes the blocks that make room for n more bytes from the free list,
// all or none.
func (r *pagedRegion) Grow(n int64) error {
	if n < 0 {
		return fmt.Errorf("paged: grow by %d: negative size", n)
	}
	need := r.len + n
	if need > r.max {
		return fmt.Errorf("paged: grow to %d: %w: the region holds at most %d", need, ErrFull, r.max)
	}
	more := ceilDiv(need-r.capacity(), r.s.block)
	if more <= 0 {
		return nil
	}
	if int(more) > len(r.s.blocks) {
		return fmt.Errorf("paged: grow by %d blocks: %w: %d of %d blocks free", more, acl.ErrOutOfMemory, len(r.s.blocks), r.s.n)
	}
	top := len(r.s.blocks) - int(more)
	for i := len(r.s.blocks) - 1; i >= top; i-- {
		r.table = append(r.table, r.s.blocks[i])
	}
	r.s.blocks = r.s.blocks[:top]
	return nil
}

// Alloc cuts n bytes at the end; a tensor never straddles two blocks.
func (r *pagedRegion) Alloc(n, align int64) (int64, error) {
	if err := checkAlloc(n, align); err != nil {
		return 0, err
	}
	off := alignUp(r.len, align)
	if off+n <= r.end {
		r.len = off + n // within the block in use: the common case
		return off, nil
	}
	b := r.s.block
	if n > b {
		return 0, fmt.Errorf("paged: alloc %d bytes: %w: larger than a block of %d", n, ErrFull, b)
	}
	if off/b != (off+n-1)/b {
		off = (off/b + 1) * b
	}
	if off+n > r.capacity() {
		return 0, fmt.Errorf("paged: alloc %d bytes at %d: %w: %d blocks", n, off, ErrFull, len(r.table))
	}
	r.len = off + n
	r.end = (off/b + 1) * b
	return off, nil
}

// AllocN is one bump when the tensors fit the block in use, else as many
// Allocs (each may start a block).
func (r *pagedRegion) AllocN(count int, n, align int64) (int64, error) {
	total, err := span(count, n, align)
	if err != nil {
		return 0, err
	}
	if off := alignUp(r.len, align); off+total <= r.end {
		r.len = off + total
		return off, nil
	}
	l, end := r.len, r.end
	first := int64(-1)
	for range count {
		off, err := r.Alloc(n, align)
		if err != nil {
			r.len, r.end = l, end
			return 0, err
		}
		if first < 0 {
			first = off
		}
	}
	return first, nil
}

func (r *pagedRegion) Ptr(off, n int64) (acl.DevicePtr, error) {
	b := r.s.block
	if off < 0 || n < 0 || off+n > r.len || (n > 0 && off/b != (off+n-1)/b) {
		return 0, fmt.Errorf("paged: [%d, +%d) is not inside one block in use (length %d)", off, n, r.len)
	}
	blk := int64(r.table[off/b])
	return r.s.pool.base.Add(uintptr(blk*b + off%b)), nil
}

func (r *pagedRegion) Len() int64 { return r.len }

// Truncate drops the tensors at and above n and gives the blocks wholly
// above it back to the free list, as a finished or preempted sequence does.
func (r *pagedRegion) Truncate(n int64) error {
	if n < 0 || n > r.len {
		return fmt.Errorf("paged: truncate to %d: length is %d", n, r.len)
	}
	keep := int(ceilDiv(n, r.s.block))
	for i := len(r.table) - 1; i >= keep; i-- {
		r.s.blocks = append(r.s.blocks, r.table[i])
	}
	r.table = r.table[:keep]
	r.len, r.end = n, 0
	return nil
}

func (r *pagedRegion) Idle() error { return nil }
func (r *pagedRegion) Trim() error { return nil }

func (r *pagedRegion) Close() error { return r.Truncate(0) }

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}
