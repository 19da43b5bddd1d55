package host

// offsets hands out ranges of the memory file's offset space. It is a
// first-fit free list kept sorted and coalesced, so an arena growing chunk by
// chunk gets contiguous offsets and its mappings merge into one kernel VMA.
type offsets struct {
	free []span // sorted by off, never adjacent
}

type span struct{ off, end uintptr }

func newOffsets(size uintptr) offsets { return offsets{free: []span{{0, size}}} }

// take returns the lowest offset, aligned to align, of a free range of size
// bytes, or false.
func (o *offsets) take(size, align uintptr) (uintptr, bool) {
	for i, s := range o.free {
		off := (s.off + align - 1) &^ (align - 1)
		if off < s.off || off+size < off || off+size > s.end {
			continue
		}
		end := off + size
		switch {
		case off == s.off && end == s.end:
			o.free = append(o.free[:i], o.free[i+1:]...)
		case off == s.off:
			o.free[i].off = end
		case end == s.end:
			o.free[i].end = off
		default:
			o.free = append(o.free, span{})
			copy(o.free[i+2:], o.free[i+1:])
			o.free[i] = span{s.off, off}
			o.free[i+1] = span{end, s.end}
		}
		return off, true
	}
	return 0, false
}

// give returns [off, off+size) to the free list.
func (o *offsets) give(off, size uintptr) {
	end := off + size
	i := 0
	for i < len(o.free) && o.free[i].off < off {
		i++
	}
	joinPrev := i > 0 && o.free[i-1].end == off
	joinNext := i < len(o.free) && o.free[i].off == end
	switch {
	case joinPrev && joinNext:
		o.free[i-1].end = o.free[i].end
		o.free = append(o.free[:i], o.free[i+1:]...)
	case joinPrev:
		o.free[i-1].end = end
	case joinNext:
		o.free[i].off = off
	default:
		o.free = append(o.free, span{})
		copy(o.free[i+1:], o.free[i:])
		o.free[i] = span{off, end}
	}
}
