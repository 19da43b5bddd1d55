package model

import "github.com/vmarena/vmarena/acl"

// Data mode (Config.Data): the bytes written to device memory are kept per
// physical allocation, in 4 KiB pages created on first write, so that copies
// read back what was written and a handle mapped elsewhere shows the same
// bytes. A page never written reads as zero. It is meant for tests: its
// memory grows with the bytes written. Without it no page is ever made.

const pageSize = 4096

// pages holds the written pages of one physical allocation, by page index.
type pages map[uintptr]*[pageSize]byte

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

// spans returns the pieces of [addr, addr+n) in data mode, for device work
// that runs later; nil otherwise.
func (d *Driver) spans(r *reservation, addr, n uintptr) []span {
	if !d.cfg.Data {
		return nil
	}
	var out []span
	forSpans(r, addr, n, func(s span, _ uintptr) { out = append(out, s) })
	return out
}

func (h *handle) write(off uintptr, src []byte) {
	for len(src) > 0 {
		idx, po := off/pageSize, off%pageSize
		k := min(uintptr(len(src)), pageSize-po)
		p := h.pages[idx]
		if p == nil {
			if h.pages == nil {
				h.pages = make(pages)
			}
			p = new([pageSize]byte)
			h.pages[idx] = p
		}
		copy(p[po:po+k], src[:k])
		src = src[k:]
		off += k
	}
}

func (h *handle) read(off uintptr, dst []byte) {
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
	for n > 0 {
		idx, po := off/pageSize, off%pageSize
		k := min(n, pageSize-po)
		p := h.pages[idx]
		switch {
		case v == 0 && k == pageSize:
			delete(h.pages, idx) // a page of zeros is no page
		case v == 0 && p == nil:
		default:
			if p == nil {
				if h.pages == nil {
					h.pages = make(pages)
				}
				p = new([pageSize]byte)
				h.pages[idx] = p
			}
			b := p[po : po+k]
			for i := range b {
				b[i] = v
			}
		}
		n -= k
		off += k
	}
}

// The following run with d.mu held (shared) and, in data mode, d.data.

// writeData stores src at addr, inside r.
func (d *Driver) writeData(r *reservation, addr uintptr, src []byte) {
	if !d.cfg.Data {
		return
	}
	forSpans(r, addr, uintptr(len(src)), func(s span, pos uintptr) { s.h.write(s.off, src[pos:pos+s.n]) })
}

// readData reads addr, inside r, into dst; without data mode it reads zeros.
func (d *Driver) readData(r *reservation, addr uintptr, dst []byte) {
	if !d.cfg.Data {
		clear(dst)
		return
	}
	forSpans(r, addr, uintptr(len(dst)), func(s span, pos uintptr) { s.h.read(s.off, dst[pos:pos+s.n]) })
}

// fillData sets n bytes at addr, inside r, to v.
func (d *Driver) fillData(r *reservation, addr, n uintptr, v byte) {
	if !d.cfg.Data {
		return
	}
	forSpans(r, addr, n, func(s span, _ uintptr) { s.h.fill(s.off, s.n, v) })
}

// copyData copies n bytes from src to dst, both mapped with access.
func (d *Driver) copyData(dst, src acl.DevicePtr, n uintptr) {
	if !d.cfg.Data {
		return
	}
	rs, err1 := d.book.Accessible("copy", src, n)
	rd, err2 := d.book.Accessible("copy", dst, n)
	if err1 != nil || err2 != nil {
		return // checked by the caller
	}
	buf := make([]byte, min(n, 1<<20))
	for done := uintptr(0); done < n; {
		k := min(n-done, uintptr(len(buf)))
		d.readData(rs, uintptr(src)+done, buf[:k])
		d.writeData(rd, uintptr(dst)+done, buf[:k])
		done += k
	}
}

// applyFill runs a memset queued in data mode on the pieces it was queued
// over. Call with d.data held.
func applyFill(spans []span, v byte) {
	for _, s := range spans {
		s.h.fill(s.off, s.n, v)
	}
}
