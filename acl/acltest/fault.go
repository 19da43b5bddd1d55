package acltest

import (
	"runtime/debug"
	"sync/atomic"
)

// sink takes the reads of ReadFaults, so that the compiler keeps them.
var sink atomic.Uint32

// Faults reports whether fn faulted on a memory access, such as a touch of a
// range the host driver has unmapped. It relies on runtime/debug's
// SetPanicOnFault, which turns the fault into a recoverable panic.
func Faults(fn func()) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			_, faulted = r.(interface{ Addr() uintptr })
		}
	}()
	fn()
	return false
}

// ReadFaults reports whether reading b[i] faults.
func ReadFaults(b []byte, i int) bool { return Faults(func() { sink.Store(uint32(b[i])) }) }

// WriteFaults reports whether writing b[i] faults.
func WriteFaults(b []byte, i int) bool { return Faults(func() { b[i] = 1 }) }
