// Package nccl binds NCCL's user-buffer registration and registers an
// arena's memory with an NCCL communicator through it ([Registrar], an
// acl.Registrar).
//
// NCCL (libnccl.so.2) is loaded at run time with purego, as package acl/cuda
// loads the CUDA driver: no cgo and no CUDA headers at build time. [Open]
// loads Config.Library, else $VMARENA_NCCL_LIBRARY ([LibraryEnv]), else
// libnccl.so.2 through the dynamic loader, and only the first of these that
// is set; where it does not load, or on a platform other than linux/amd64
// and linux/arm64, Open fails with an error wrapping acl.ErrNotSupported.
//
// # Registration
//
// ncclCommRegister(comm, buff, size, &handle) tells a communicator that a
// device buffer will be passed to its collectives and transfers, so that it
// can map it for its peers (through CUDA IPC, NVLink SHARP or the network)
// the first time it is used, instead of copying through buffers of its own;
// ncclCommDeregister(comm, handle) undoes it, and must come before the
// memory goes. NCCL keeps the registrations per communicator, counts a
// buffer registered inside another as one more reference to it, and, with
// NCCL_LOCAL_REGISTER=0, registers nothing and returns a NULL handle.
//
// Memory reserved once and mapped chunk by chunk is backed by several
// physical allocations. NCCL reads a buffer's extent from CUDA
// (cuMemGetAddressRange), which for such memory is the extent of one
// allocation, so a registration that spans chunks is not what it seems, and
// some NCCL releases refuse such memory outright. The Registrar registers
// each mapping on its own: one registration per chunk, each one physical
// allocation, none larger than what is mapped. docs/distributed.md gives
// the rules and what is known and unknown about them.
package nccl
