// Package hostmem keeps the books of the host buffers a driver's MallocHost
// returned: which are live, and how many bytes they hold, so that FreeHost
// refuses a slice it did not hand out and Live counts what is still held.
package hostmem

import (
	"sync"
	"unsafe"
)

// Table is the live host buffers of one driver, by their first byte. The
// zero Table is empty and ready to use; it is safe for concurrent use.
type Table struct {
	mu    sync.Mutex
	m     map[*byte]int
	bytes uintptr
}

// Add enters b, which MallocHost has just made.
func (t *Table) Add(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[*byte]int)
	}
	t.m[unsafe.SliceData(b)] = len(b)
	t.bytes += uintptr(len(b))
}

// Size returns the length MallocHost gave the buffer that starts at b's
// first byte, and whether there is such a live buffer.
func (t *Table) Size(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.m[unsafe.SliceData(b)]
	return n, ok
}

// Holds reports whether b lies wholly inside one live buffer: whether a copy
// to or from b reads or writes MallocHost's memory.
func (t *Table) Holds(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	hi := lo + uintptr(len(b))
	t.mu.Lock()
	defer t.mu.Unlock()
	for p, n := range t.m {
		start := uintptr(unsafe.Pointer(p))
		if lo >= start && hi <= start+uintptr(n) {
			return true
		}
	}
	return false
}

// Remove takes the buffer that starts at b's first byte out of the books,
// and returns its length, or false if no such buffer is live.
func (t *Table) Remove(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := unsafe.SliceData(b)
	n, ok := t.m[p]
	if ok {
		delete(t.m, p)
		t.bytes -= uintptr(n)
	}
	return n, ok
}

// Live returns the buffers and bytes held.
func (t *Table) Live() (int, uintptr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m), t.bytes
}

// All returns the live buffers' first bytes and lengths, for a Close that
// frees what its callers leaked.
func (t *Table) All() map[*byte]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[*byte]int, len(t.m))
	for p, n := range t.m {
		out[p] = n
	}
	return out
}
