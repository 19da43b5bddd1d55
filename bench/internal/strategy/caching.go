package strategy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/acl"
)

// cachingStrategy is a PyTorch-style caching allocator under the
// per-tensor pattern: every Grow is one tensor, allocated from the cache and
// given back to it when Truncate drops the tensor, as a framework's tensors
// are. The cache (one per device, shared by every region) follows the design
// of PyTorch's CUDA caching allocator:
//
//   - sizes are rounded up to 512 bytes; requests of at most 1 MiB come
//     from the small pool, whose segments are 2 MiB, the rest from the large
//     pool, whose segments are 20 MiB for requests under 10 MiB and the
//     request rounded up to 2 MiB above;
//   - a request takes the smallest free block that fits (best fit, then the
//     lowest address) and splits it when the rest is worth keeping (at
//     least 512 bytes in the small pool and in expandable mode, more than
//     1 MiB in the large pool otherwise: PyTorch's should_split);
//   - a freed block merges with the free blocks beside it in its segment;
//   - when no block fits, a new segment is allocated; when the device (or
//     the budget) refuses, every wholly free segment is released (the
//     device synchronised first, as cudaFree does) and the allocation tried
//     once more, and only then does it fail with acl.ErrOutOfMemory.
//
// Expandable, it is PyTorch's expandable-segments mode: each pool is one
// reservation of address space that grows at its end by mapping pages (2 MiB
// in the small pool, 20 MiB in the large: a physical allocation and a map
// each, and one access call over the new run, or one per page where the
// driver's Caps().AccessSpan says a call covers one mapping), so a free block at the end
// of the segment grows instead of a new segment being made; releasing
// unmaps the pages of the free space at the segment's end.
type cachingStrategy struct {
	*dev
	expandable bool
	pools      [2]cpool // small, large
}

// The caching allocator's constants, PyTorch's.
const (
	cRound      = 512        // every size is rounded up to this
	cSmallSize  = 1 << 20    // the largest request of the small pool
	cSmallSeg   = 2 << 20    // a small pool's segment (and expandable page)
	cLargeSeg   = 20 << 20   // a large pool's segment for requests under cMinLarge (and expandable page)
	cMinLarge   = 10 << 20   // requests from here on get a segment of their own
	cRoundLarge = 2 << 20    // what such a segment's size is rounded to
	cSplitSmall = cRound     // the least remainder a small block is split for
	cSplitLarge = cSmallSize // a large block is split when more than this remains
)

// cpool is one of the two pools: its segments and its free blocks.
type cpool struct {
	small bool
	free  []*cblock // sorted by (size, address)
	segs  []*cseg
	exp   *cseg // the expandable segment, when expandable
}

// cseg is a segment: one cudaMalloc (a segment of dev), or the expandable
// reservation with its pages.
type cseg struct {
	seg    segment // classic mode: the allocation
	base   acl.DevicePtr
	size   int64 // bytes usable (mapped)
	pages  []segment
	page   int64 // expandable: bytes per page
	resv   int64 // expandable: bytes reserved
	blocks *cblock
}

// cblock is a piece of a segment, in use or free; blocks of a segment form a
// list in address order.
type cblock struct {
	seg        *cseg
	off, size  int64
	free       bool
	prev, next *cblock
}

func (b *cblock) addr() acl.DevicePtr { return b.seg.base.Add(uintptr(b.off)) }

func blockLess(a, b *cblock) int {
	if c := cmp.Compare(a.size, b.size); c != 0 {
		return c
	}
	return cmp.Compare(a.addr(), b.addr())
}

func newCaching(d *dev, expandable bool) *cachingStrategy {
	s := &cachingStrategy{dev: d, expandable: expandable}
	s.pools[0].small = true
	return s
}

func (s *cachingStrategy) Name() string {
	if s.expandable {
		return "caching-expandable"
	}
	return "caching"
}

func (s *cachingStrategy) Prepare() error { return nil }

func (s *cachingStrategy) Open(int64) (Region, error) {
	return &perTensorRegion{name: s.Name(), mem: s}, nil
}

// Close releases every segment; regions must be closed first.
func (s *cachingStrategy) Close() error {
	var errs []error
	for i := range s.pools {
		p := &s.pools[i]
		for _, sg := range p.segs {
			if !onlyFree(sg) {
				errs = append(errs, fmt.Errorf("%s: close with blocks in use", s.Name()))
				break
			}
		}
		errs = append(errs, s.release(p, true))
	}
	return errors.Join(errs...)
}

func onlyFree(sg *cseg) bool {
	for b := sg.blocks; b != nil; b = b.next {
		if !b.free {
			return false
		}
	}
	return true
}

// Cached returns the bytes a caching strategy holds in free blocks: memory
// the process holds and any of its tensors may take (as the arena pool's
// cache is), and 0 for other strategies.
func Cached(st Strategy) int64 {
	if s, ok := st.(*cachingStrategy); ok {
		return s.cached()
	}
	return 0
}

func (s *cachingStrategy) cached() int64 {
	var n int64
	for i := range s.pools {
		for _, b := range s.pools[i].free {
			n += b.size
		}
	}
	return n
}

func roundSize(n int64) int64 { return max(cRound, (n+cRound-1)/cRound*cRound) }

// alloc implements tensorMem: a block of at least n bytes.
func (s *cachingStrategy) alloc(n int64) (segment, any, error) {
	size := roundSize(n)
	p := &s.pools[1]
	if size <= cSmallSize {
		p = &s.pools[0]
	}
	b := p.bestFit(size)
	if b == nil {
		err := s.grow(p, size)
		if errors.Is(err, acl.ErrOutOfMemory) {
			// Free the cache and try once more, as PyTorch does before
			// reporting out of memory.
			if rerr := s.releaseAll(); rerr != nil {
				return segment{}, nil, errors.Join(err, rerr)
			}
			err = s.grow(p, size)
		}
		if err != nil {
			return segment{}, nil, err
		}
		if b = p.bestFit(size); b == nil {
			return segment{}, nil, fmt.Errorf("%s: no block of %d bytes after growing the pool", s.Name(), size)
		}
	}
	p.remove(b)
	split := cSplitLarge + 1
	if p.small || s.expandable {
		split = cSplitSmall // PyTorch's should_split: is_small || expandable_segments
	}
	if rest := b.size - size; rest >= int64(split) {
		nb := &cblock{seg: b.seg, off: b.off + size, size: rest, free: true, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = nb
		}
		b.next, b.size = nb, size
		p.insert(nb)
	}
	b.free = false
	return segment{base: b.addr(), size: b.size}, b, nil
}

// free implements tensorMem: the block goes back to its pool, merged with
// its free neighbours.
func (s *cachingStrategy) freeTensor(tag any) error {
	b := tag.(*cblock)
	p := &s.pools[1]
	if s.poolOf(b.seg) == 0 {
		p = &s.pools[0]
	}
	b.free = true
	for _, nb := range []*cblock{b.prev, b.next} {
		if nb == nil || !nb.free {
			continue
		}
		p.remove(nb)
		if nb == b.prev {
			nb.size += b.size
			nb.next = b.next
			if b.next != nil {
				b.next.prev = nb
			}
			b = nb
		} else {
			b.size += nb.size
			b.next = nb.next
			if nb.next != nil {
				nb.next.prev = b
			}
		}
	}
	p.insert(b)
	return nil
}

func (s *cachingStrategy) poolOf(sg *cseg) int {
	for _, x := range s.pools[0].segs {
		if x == sg {
			return 0
		}
	}
	return 1
}

func (p *cpool) bestFit(size int64) *cblock {
	i, _ := slices.BinarySearchFunc(p.free, size, func(b *cblock, n int64) int { return cmp.Compare(b.size, n) })
	if i == len(p.free) {
		return nil
	}
	return p.free[i]
}

func (p *cpool) insert(b *cblock) {
	i, _ := slices.BinarySearchFunc(p.free, b, blockLess)
	p.free = slices.Insert(p.free, i, b)
}

func (p *cpool) remove(b *cblock) {
	i, ok := slices.BinarySearchFunc(p.free, b, blockLess)
	if ok {
		p.free = slices.Delete(p.free, i, i+1)
	}
}

// grow gives pool p a free block of at least size bytes: a new segment, or,
// expandable, more pages at the end of the pool's segment.
func (s *cachingStrategy) grow(p *cpool, size int64) error {
	if !s.expandable {
		segSize := int64(cLargeSeg)
		switch {
		case p.small:
			segSize = cSmallSeg
		case size >= cMinLarge:
			segSize = (size + cRoundLarge - 1) / cRoundLarge * cRoundLarge
		}
		seg, err := s.dev.alloc(segSize)
		if err != nil {
			return err
		}
		sg := &cseg{seg: seg, base: seg.base, size: seg.size}
		sg.blocks = &cblock{seg: sg, size: seg.size, free: true}
		p.segs = append(p.segs, sg)
		p.insert(sg.blocks)
		return nil
	}
	if p.exp == nil {
		page := int64(cLargeSeg)
		if p.small {
			page = cSmallSeg
		}
		page = s.roundUp(page)
		// PyTorch reserves address space for the whole device per pool.
		_, total, err := s.drv.GetMemInfo(acl.HBMMem)
		if err != nil {
			return err
		}
		resv := min(int64(total)/page*page+page, acl.MaxReserve/page*page)
		base, err := s.drv.ReserveMemAddress(uintptr(resv), 0, 0, 0)
		if err != nil {
			return err
		}
		p.exp = &cseg{base: base, page: page, resv: resv}
		p.segs = append(p.segs, p.exp)
	}
	sg := p.exp
	// The free block at the end grows; otherwise a new one starts there.
	var last *cblock
	for b := sg.blocks; b != nil; b = b.next {
		last = b
	}
	have := int64(0)
	if last != nil && last.free {
		have = last.size
	}
	pages := (size - have + sg.page - 1) / sg.page
	if sg.size+pages*sg.page > sg.resv {
		return fmt.Errorf("%s: %w: the expandable segment's %d reserved bytes are mapped", s.Name(), acl.ErrOutOfMemory, sg.resv)
	}
	at := sg.base.Add(uintptr(sg.size))
	var made []segment
	undo := func(err error) error {
		var errs []error
		for _, pg := range made {
			errs = append(errs, s.drv.UnmapMem(pg.base), s.drv.FreePhysical(pg.h))
		}
		return errors.Join(append([]error{err}, errs...)...)
	}
	for i := range pages {
		h, err := s.drv.MallocPhysical(uintptr(sg.page), &s.prop, 0)
		if err != nil {
			return undo(err)
		}
		ptr := at.Add(uintptr(i * sg.page))
		if err := s.drv.MapMem(ptr, uintptr(sg.page), 0, h, 0); err != nil {
			return undo(errors.Join(err, s.drv.FreePhysical(h)))
		}
		made = append(made, segment{base: ptr, h: h, size: sg.page})
	}
	if !s.implicit {
		// One access call over the run of new pages, as PyTorch does, where
		// the driver allows it (CUDA); one per page where it does not (ACL).
		err := acl.GrantAccess(s.drv, at, uintptr(sg.page), int(pages), s.access)
		switch {
		case errors.Is(err, acl.ErrNotSupported):
			s.implicit = true
		case err != nil:
			return undo(err)
		}
	}
	sg.pages = append(sg.pages, made...)
	add := pages * sg.page
	if have > 0 {
		p.remove(last)
		last.size += add
		p.insert(last)
	} else {
		nb := &cblock{seg: sg, off: sg.size, size: add, free: true, prev: last}
		if last != nil {
			last.next = nb
		} else {
			sg.blocks = nb
		}
		p.insert(nb)
	}
	sg.size += add
	return nil
}

// releaseAll gives the free memory of both pools back to the device.
func (s *cachingStrategy) releaseAll() error {
	return errors.Join(s.release(&s.pools[0], false), s.release(&s.pools[1], false))
}

// release gives back what pool p holds free: every wholly free segment, or,
// expandable, the pages under the free block at the segment's end (all of
// the segment, and its reservation, when closing).
func (s *cachingStrategy) release(p *cpool, closing bool) error {
	var errs []error
	if s.expandable {
		sg := p.exp
		if sg == nil {
			return nil
		}
		var last *cblock
		for b := sg.blocks; b != nil; b = b.next {
			last = b
		}
		if last != nil && last.free {
			keep := (last.off + sg.page - 1) / sg.page // pages still holding blocks in use
			if n := int64(len(sg.pages)) - keep; n > 0 {
				if err := s.drv.SynchronizeDevice(); err != nil {
					return err
				}
				for _, pg := range sg.pages[keep:] {
					errs = append(errs, s.drv.UnmapMem(pg.base), s.drv.FreePhysical(pg.h))
				}
				sg.pages = sg.pages[:keep]
				p.remove(last)
				sg.size = keep * sg.page
				if last.size = sg.size - last.off; last.size > 0 {
					p.insert(last)
				} else if last.prev != nil {
					last.prev.next = nil
				} else {
					sg.blocks = nil
				}
			}
		}
		if closing {
			errs = append(errs, s.drv.ReleaseMemAddress(sg.base))
			p.exp, p.segs, p.free = nil, nil, nil
		}
		return errors.Join(errs...)
	}
	kept := p.segs[:0]
	for _, sg := range p.segs {
		if b := sg.blocks; b.free && b.next == nil {
			p.remove(b)
			errs = append(errs, s.dev.free(sg.seg))
			continue
		}
		kept = append(kept, sg)
	}
	clear(p.segs[len(kept):])
	p.segs = kept
	return errors.Join(errs...)
}
