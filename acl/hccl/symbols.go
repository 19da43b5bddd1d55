package hccl

import "github.com/vmarena/vmarena/acl"

// symbols are the HCCL functions resolved at load, with Go signatures that
// match hccl_comm.h on LP64 Linux: HcclResult is int32 (a C enum); HcclComm
// and device addresses (void*) are integers; out-parameters are Go
// pointers, which HCCL uses only during the call.
type symbols struct {
	getRootInfo      func(root *RootInfo) int32
	commInitRootInfo func(nRanks uint32, root *RootInfo, rank uint32, comm *uintptr) int32
	commDestroy      func(comm uintptr) int32
	getErrorString   func(code int32) string // optional: NULL reads as ""
}

// symbol is one entry of a table to resolve.
type symbol struct {
	name     string
	fn       any  // pointer to the func field to fill
	required bool // Open fails without it
}

func (s *symbols) table() []symbol {
	return []symbol{
		{"HcclGetRootInfo", &s.getRootInfo, true},
		{"HcclCommInitRootInfo", &s.commInitRootInfo, true},
		{"HcclCommDestroy", &s.commDestroy, true},
		{"HcclGetErrorString", &s.getErrorString, false},
	}
}

// zeroCopy are the zero-copy memory calls, resolved together on first use.
type zeroCopy struct {
	setMemoryRange   func(comm uintptr, base acl.DevicePtr, size, alignment uintptr, flags uint64) int32
	unsetMemoryRange func(comm uintptr, base acl.DevicePtr) int32
	activate         func(comm uintptr, ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) int32
	deactivate       func(comm uintptr, ptr acl.DevicePtr) int32
}

func (z *zeroCopy) table() []symbol {
	return []symbol{
		{"HcclCommSetMemoryRange", &z.setMemoryRange, true},
		{"HcclCommUnsetMemoryRange", &z.unsetMemoryRange, true},
		{"HcclCommActivateCommMemory", &z.activate, true},
		{"HcclCommDeactivateCommMemory", &z.deactivate, true},
	}
}
