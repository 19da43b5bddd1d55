package model

import "github.com/vmarena/vmarena/acl"

// Device bytes. By default the model keeps the bytes written to device
// memory on host memory, per physical allocation, so that copies, memsets and
// device-side copies move real bytes, a handle mapped at two addresses shows
// the same bytes at both, and a read returns what was written. The host
// memory is made lazily, in pages of pageSize created on the first write of
// something other than zero, so a 141 GiB device costs only the pages
// written: a page never written reads as zero, zeros written by a memset
// make no page, and the pages go when the allocation is freed.
//
// With Config.NoData (the ",nodata" option of the device selector) the model
// keeps no bytes: writes, memsets and device-side copies move nothing, and a
// MemcpyDtoH fails with ErrNotSupported (207000) rather than return bytes
// that were never written. It is for measuring at server sizes.

// pageSize is the host memory made at a time for an allocation's bytes.
// 64 KiB keeps the page books small (32 pages for a 2 MiB chunk) and a copy
// one memmove per page.
const pageSize = 64 << 10

type page = [pageSize]byte

// pages holds the written pages of one physical allocation, by page index.
type pages map[uintptr]*page

// errNoData is the message of a read from a model without data.
const errNoData = "the device model keeps no device bytes (the nodata option, Config.NoData): a read has nothing to return; open it without nodata to read back"

// span is a piece of a device range inside one physical allocation.
type span struct {
	h   *handle
	off uintptr // offset in h
	n   uintptr
}

// forSpans calls fn for each piece of [addr, addr+n) that one mapping of r
// covers, in order, with the piece's position in the range. The range must
// be mapped throughout (book.Accessible said so).
func forSpans(r *reservation, addr, n uintptr, fn func(s span, pos uintptr)) {
	at, end := addr, addr+n
	for i := r.Index(addr); at < end && i < len(r.Maps); i++ {
		m := r.Maps[i]
		hi := min(m.Addr+m.Size, end)
		fn(span{h: m.H, off: at - m.Addr, n: hi - at}, at-addr)
		at = hi
	}
}

// spans returns the pieces of [addr, addr+n) for device work that runs
// later; nil without data.
func (d *Driver) spans(r *reservation, addr, n uintptr) []span {
	if d.cfg.NoData {
		return nil
	}
	var out []span
	forSpans(r, addr, n, func(s span, _ uintptr) { out = append(out, s) })
	return out
}

// pageAt returns page idx of h, made if create is set; nil if it was never
// written and create is not set.
func (h *handle) pageAt(idx uintptr, create bool) *page {
	p := h.pages[idx]
	if p == nil && create {
		if h.pages == nil {
			h.pages = pages{}
		}
		p = new(page)
		h.pages[idx] = p
	}
	return p
}

func (h *handle) write(off uintptr, src []byte) {
	if h.shm != nil {
		copy(h.shm[off:], src)
		return
	}
	for len(src) > 0 {
		idx, po := off/pageSize, off%pageSize
		k := min(uintptr(len(src)), pageSize-po)
		copy(h.pageAt(idx, true)[po:po+k], src[:k])
		src = src[k:]
		off += k
	}
}

func (h *handle) read(off uintptr, dst []byte) {
	if h.shm != nil {
		copy(dst, h.shm[off:])
		return
	}
	for len(dst) > 0 {
		idx, po := off/pageSize, off%pageSize
		k := min(uintptr(len(dst)), pageSize-po)
		if p := h.pages[idx]; p != nil {
			copy(dst[:k], p[po:po+k])
		} else {
			clear(dst[:k])
		}
		dst = dst[k:]
		off += k
	}
}

func (h *handle) fill(off, n uintptr, v byte) {
	if h.shm != nil {
		set(h.shm[off:off+n], v)
		return
	}
	for n > 0 {
		idx, po := off/pageSize, off%pageSize
		k := min(n, pageSize-po)
		switch p := h.pages[idx]; {
		case v == 0 && p == nil: // reads as zero already
		case v == 0:
			clear(p[po : po+k]) // kept: the next write will want it
		default:
			set(h.pageAt(idx, true)[po:po+k], v)
		}
		n -= k
		off += k
	}
}

// set sets every byte of b to v, doubling a filled prefix with copy (a
// memmove) rather than storing byte by byte.
func set(b []byte, v byte) {
	if v == 0 {
		clear(b)
		return
	}
	if len(b) == 0 {
		return
	}
	b[0] = v
	for i := 1; i < len(b); i *= 2 {
		copy(b[i:], b[:i])
	}
}

// copyTo copies n bytes at off in h to doff in dst, page by page, without
// making pages for zeros.
func (h *handle) copyTo(dst *handle, doff, off, n uintptr) {
	switch {
	case h.shm != nil:
		dst.write(doff, h.shm[off:off+n])
		return
	case dst.shm != nil:
		h.read(off, dst.shm[doff:doff+n])
		return
	}
	for n > 0 {
		k := min(n, pageSize-off%pageSize, pageSize-doff%pageSize)
		if p := h.pages[off/pageSize]; p != nil {
			copy(dst.pageAt(doff/pageSize, true)[doff%pageSize:doff%pageSize+k], p[off%pageSize:off%pageSize+k])
		} else {
			dst.fill(doff, k, 0)
		}
		n -= k
		off += k
		doff += k
	}
}

// The following run with d.mu held (shared) and d.data.

// writeData stores src at addr, inside r.
func (d *Driver) writeData(r *reservation, addr uintptr, src []byte) {
	if d.cfg.NoData {
		return
	}
	forSpans(r, addr, uintptr(len(src)), func(s span, pos uintptr) { s.h.write(s.off, src[pos:pos+s.n]) })
}

// readData reads addr, inside r, into dst.
func (d *Driver) readData(r *reservation, addr uintptr, dst []byte) {
	if d.cfg.NoData {
		return // the read fails: nothing to fill, and no host time to spend
	}
	forSpans(r, addr, uintptr(len(dst)), func(s span, pos uintptr) { s.h.read(s.off, dst[pos:pos+s.n]) })
}

// fillData sets n bytes at addr, inside r, to v.
func (d *Driver) fillData(r *reservation, addr, n uintptr, v byte) {
	if d.cfg.NoData {
		return
	}
	forSpans(r, addr, n, func(s span, _ uintptr) { s.h.fill(s.off, s.n, v) })
}

// copyData copies n bytes from src to dst, both mapped with access. The
// ranges may overlap: the copy then goes the way memmove would.
func (d *Driver) copyData(dst, src acl.DevicePtr, n uintptr) {
	if d.cfg.NoData {
		return
	}
	rs, err1 := d.book.Accessible("copy", src, n)
	rd, err2 := d.book.Accessible("copy", dst, n)
	if err1 != nil || err2 != nil {
		return // checked by the caller
	}
	var ss, ds []span
	forSpans(rs, uintptr(src), n, func(s span, _ uintptr) { ss = append(ss, s) })
	forSpans(rd, uintptr(dst), n, func(s span, _ uintptr) { ds = append(ds, s) })
	type piece struct{ s, d span }
	var pieces []piece
	for len(ss) > 0 && len(ds) > 0 {
		k := min(ss[0].n, ds[0].n)
		pieces = append(pieces, piece{span{ss[0].h, ss[0].off, k}, span{ds[0].h, ds[0].off, k}})
		ss[0].off, ss[0].n, ds[0].off, ds[0].n = ss[0].off+k, ss[0].n-k, ds[0].off+k, ds[0].n-k
		if ss[0].n == 0 {
			ss = ss[1:]
		}
		if ds[0].n == 0 {
			ds = ds[1:]
		}
	}
	if dst > src && dst < src.Add(n) {
		// dst overlaps the end of src: copy from the top down, in pieces no
		// longer than the distance, so that no piece reads what an earlier
		// one wrote.
		dist := uintptr(dst) - uintptr(src)
		for i := len(pieces) - 1; i >= 0; i-- {
			p := pieces[i]
			for left := p.s.n; left > 0; {
				k := min(left, dist)
				left -= k
				p.s.h.copyTo(p.d.h, p.d.off+left, p.s.off+left, k)
			}
		}
		return
	}
	for _, p := range pieces {
		p.s.h.copyTo(p.d.h, p.d.off, p.s.off, p.s.n)
	}
}

// applyFill runs a memset queued with data on the pieces it was queued
// over. Call with d.data held.
func applyFill(spans []span, v byte) {
	for _, s := range spans {
		s.h.fill(s.off, s.n, v)
	}
}
