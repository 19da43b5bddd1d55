// Package hccl binds the zero-copy memory calls of HCCL, Huawei's collective
// communication library for Ascend NPUs, and registers an arena's memory
// with an HCCL communicator through them ([Registrar], an acl.Registrar).
//
// HCCL (libhccl.so) is loaded at run time with purego, as package acl/ascend
// loads the ACL runtime: no cgo and no CANN headers at build time. Where no
// HCCL can be loaded, or on a platform other than linux/amd64 and
// linux/arm64, [Open] fails with an error wrapping acl.ErrNotSupported.
//
// # Finding HCCL
//
// Open loads the first library of this list that loads, and only that one:
//
//  1. Config.Library, else $VMARENA_HCCL_LIBRARY ([LibraryEnv]): a file, or
//     a directory holding libhccl.so; the only candidate when given;
//  2. $ASCEND_HOME_PATH/lib64/libhccl.so, then $ASCEND_TOOLKIT_HOME/lib64/libhccl.so;
//  3. lib64/libhccl.so of the default CANN install (ascend.DefaultInstall);
//  4. libhccl.so through the dynamic loader.
//
// HcclGetRootInfo, HcclCommInitRootInfo and HcclCommDestroy are resolved at
// load (HcclGetErrorString too, optionally); the four zero-copy calls are
// resolved together, on first use: a library without them loads, and only
// the zero-copy methods and NewRegistrar fail, with ErrNotSupported.
//
// # Zero-copy memory
//
// HCCL's collectives normally copy a rank's data through a buffer of their
// own. Its zero-copy calls let them use the caller's memory directly, when
// that memory was reserved and mapped with ACL's virtual-memory calls and
// announced to HCCL step by step: each reservation with
// HcclCommSetMemoryRange, each mapping with HcclCommActivateCommMemory
// (naming its physical handle, which HCCL exports to the peers, who map it
// into a mirror of the range), each mapping again before it goes with
// HcclCommDeactivateCommMemory (whole blocks only), and each reservation
// before it goes with HcclCommUnsetMemoryRange. The books are the process's,
// shared by its communicators. The calls are documented for the Atlas A3
// series, as a trial interface that Huawei supports only from torch_npu's
// backend; a chip without them answers HCCL_E_NOT_SUPPORT. A communicator of
// one rank accepts them and does nothing. docs/distributed.md gives the rules
// in full and what is known and unknown about them.
package hccl
