package cuda

import (
	"os"
	"sync"
)

// Library names.
const (
	// LibraryEnv is the environment variable naming the CUDA driver library
	// to load when Config.Library is empty (tests point it at the test
	// double), named as the ACL binding's VMARENA_ASCEND_LIBRARY is.
	LibraryEnv = "VMARENA_CUDA_LIBRARY"
	// DefaultLibrary is the soname of the CUDA driver library, found by the
	// dynamic loader's search path. The unversioned libcuda.so is usually a
	// development link or the toolkit's stub, so it is never tried.
	DefaultLibrary = "libcuda.so.1"
)

// minDriverVersion is CUDA 10.2, the first driver with the VMM API
// (cudaTypedefs.h names every cuMem* VMM call _v10020).
const minDriverVersion = 10020

// CUDA enum values, as cuda.h defines them.
const (
	cuMemAllocationTypePinned  = 1   // CU_MEM_ALLOCATION_TYPE_PINNED
	cuMemLocationTypeDevice    = 1   // CU_MEM_LOCATION_TYPE_DEVICE
	cuMemAccessProtReadWrite   = 3   // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	cuGranularityMinimum       = 0   // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	cuGranularityRecommended   = 1   // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
	cuDevAttrVirtualMemorySupp = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	cuDevAttrPosixFDSupported  = 103 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
	cuMemHandleTypePosixFD     = 1   // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	cuMemAccessProtRead        = 1   // CU_MEM_ACCESS_FLAGS_PROT_READ
	cuStreamNonBlocking        = 1   // CU_STREAM_NON_BLOCKING: not ordered with the legacy default stream
	cuEventDisableTiming       = 2   // CU_EVENT_DISABLE_TIMING: no timestamp, the cheapest event
	cuDevAttrRDMAWithVMM       = 110 // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
	cuDevAttrDMABufSupported   = 124 // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
	cuMemRangeHandleDMABufFD   = 1   // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
)

// memLocation is CUmemLocation (8 bytes).
type memLocation struct {
	Type int32 // CUmemLocationType
	ID   int32 // device ordinal for CU_MEM_LOCATION_TYPE_DEVICE
}

// memAllocationProp is CUmemAllocationProp (32 bytes, align 8). purego adds
// no padding, so every byte of the C layout is spelled out; unsafe.go checks
// the size and offsets at compile time.
type memAllocationProp struct {
	Type                 int32       // @0  CUmemAllocationType
	RequestedHandleTypes int32       // @4  CUmemAllocationHandleType; 0 = none
	Location             memLocation // @8
	Win32HandleMetaData  uint64      // @16 void*, NULL on Linux
	CompressionType      uint8       // @24 allocFlags.compressionType
	GPUDirectRDMACapable uint8       // @25 allocFlags.gpuDirectRDMACapable
	Usage                uint16      // @26 allocFlags.usage
	Reserved             [4]uint8    // @28 allocFlags.reserved
}

// memAccessDesc is CUmemAccessDesc (12 bytes).
type memAccessDesc struct {
	Location memLocation // @0
	Flags    int32       // @8 CUmemAccess_flags
}

// library is one loaded CUDA driver library: the functions the binding calls,
// resolved by their exact exported names (the _v2 one where cuda.h renames
// the API with a macro, and never the _ptds/_ptsz per-thread-stream variants).
// C types: CUresult, CUdevice and enums are int32; CUdeviceptr and
// CUmemGenericAllocationHandle are uint64; size_t is uintptr; a CUcontext,
// CUstream or CUevent is an opaque C pointer, held as a uintptr (a NULL
// CUstream is the legacy default stream).
type library struct {
	path string

	cuInit                        func(flags uint32) Result
	cuDriverGetVersion            func(v *int32) Result
	cuDeviceGetCount              func(n *int32) Result
	cuDeviceGet                   func(dev *int32, ordinal int32) Result
	cuDeviceGetAttribute          func(v *int32, attr int32, dev int32) Result
	cuDevicePrimaryCtxRetain      func(ctx *uintptr, dev int32) Result
	cuDevicePrimaryCtxRelease     func(dev int32) Result // cuDevicePrimaryCtxRelease_v2
	cuCtxSetCurrent               func(ctx uintptr) Result
	cuCtxGetCurrent               func(ctx *uintptr) Result
	cuCtxSynchronize              func() Result
	cuMemGetAllocationGranularity func(gran *uintptr, prop *memAllocationProp, option int32) Result
	cuMemCreate                   func(h *uint64, size uintptr, prop *memAllocationProp, flags uint64) Result
	cuMemRelease                  func(h uint64) Result
	cuMemAddressReserve           func(ptr *uint64, size, alignment uintptr, addr uint64, flags uint64) Result
	cuMemAddressFree              func(ptr uint64, size uintptr) Result
	cuMemMap                      func(ptr uint64, size, offset uintptr, h uint64, flags uint64) Result
	cuMemUnmap                    func(ptr uint64, size uintptr) Result
	cuMemSetAccess                func(ptr uint64, size uintptr, desc *memAccessDesc, count uintptr) Result
	cuMemcpyHtoD                  func(dst uint64, src []byte, n uintptr) Result             // cuMemcpyHtoD_v2
	cuMemcpyDtoH                  func(dst []byte, src uint64, n uintptr) Result             // cuMemcpyDtoH_v2
	cuMemcpyDtoDAsync             func(dst, src uint64, n uintptr, s uintptr) Result         // cuMemcpyDtoDAsync_v2
	cuMemsetD8Async               func(dst uint64, value uint8, n uintptr, s uintptr) Result // no _v2: cuda.h keeps the name
	cuMemGetInfo                  func(free, total *uintptr) Result                          // cuMemGetInfo_v2
	cuStreamCreate                func(s *uintptr, flags uint32) Result
	cuStreamDestroy               func(s uintptr) Result // cuStreamDestroy_v2
	cuStreamQuery                 func(s uintptr) Result
	cuStreamSynchronize           func(s uintptr) Result
	cuEventCreate                 func(e *uintptr, flags uint32) Result
	cuEventRecord                 func(e, s uintptr) Result
	cuEventQuery                  func(e uintptr) Result
	cuEventSynchronize            func(e uintptr) Result
	cuEventDestroy                func(e uintptr) Result // cuEventDestroy_v2
	cuGetErrorName                func(r Result, s **byte) Result
	cuMemHostAlloc                func(p **byte, size uintptr, flags uint32) Result
	cuMemFreeHost                 func(p *byte) Result
	cuGetErrorString              func(r Result, s **byte) Result

	// cuMemExportToShareableHandle writes, for a POSIX descriptor, an int
	// through its void* shareableHandle; cuMemImportFromShareableHandle
	// takes the descriptor itself as its void* osHandle.
	cuMemExportToShareableHandle   func(shareable *int32, h uint64, handleType int32, flags uint64) Result
	cuMemImportFromShareableHandle func(h *uint64, osHandle uintptr, handleType int32) Result
	// cuMemGetAllocationPropertiesFromHandle says where an imported
	// allocation lives, and so its granularity.
	cuMemGetAllocationPropertiesFromHandle func(prop *memAllocationProp, h uint64) Result

	// cuMemGetHandleForAddressRange (CUDA 11.7 on) writes, for a dma-buf,
	// an int descriptor through its void* handle. Optional: nil when the
	// driver lacks it.
	cuMemGetHandleForAddressRange func(fd *int32, dptr uint64, size uintptr, handleType int32, flags uint64) Result
}

// symbols lists every symbol the binding resolves, with the field it fills.
// A test double of the library exports exactly these.
func (l *library) symbols() []symbol {
	return []symbol{
		{"cuInit", &l.cuInit},
		{"cuDriverGetVersion", &l.cuDriverGetVersion},
		{"cuDeviceGetCount", &l.cuDeviceGetCount},
		{"cuDeviceGet", &l.cuDeviceGet},
		{"cuDeviceGetAttribute", &l.cuDeviceGetAttribute},
		{"cuDevicePrimaryCtxRetain", &l.cuDevicePrimaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &l.cuDevicePrimaryCtxRelease},
		{"cuCtxSetCurrent", &l.cuCtxSetCurrent},
		{"cuCtxGetCurrent", &l.cuCtxGetCurrent},
		{"cuCtxSynchronize", &l.cuCtxSynchronize},
		{"cuMemGetAllocationGranularity", &l.cuMemGetAllocationGranularity},
		{"cuMemCreate", &l.cuMemCreate},
		{"cuMemRelease", &l.cuMemRelease},
		{"cuMemAddressReserve", &l.cuMemAddressReserve},
		{"cuMemAddressFree", &l.cuMemAddressFree},
		{"cuMemMap", &l.cuMemMap},
		{"cuMemUnmap", &l.cuMemUnmap},
		{"cuMemSetAccess", &l.cuMemSetAccess},
		{"cuMemExportToShareableHandle", &l.cuMemExportToShareableHandle},
		{"cuMemImportFromShareableHandle", &l.cuMemImportFromShareableHandle},
		{"cuMemGetAllocationPropertiesFromHandle", &l.cuMemGetAllocationPropertiesFromHandle},
		{"cuMemcpyHtoD_v2", &l.cuMemcpyHtoD},
		{"cuMemcpyDtoH_v2", &l.cuMemcpyDtoH},
		{"cuMemcpyDtoDAsync_v2", &l.cuMemcpyDtoDAsync},
		{"cuMemsetD8Async", &l.cuMemsetD8Async},
		{"cuMemGetInfo_v2", &l.cuMemGetInfo},
		{"cuStreamCreate", &l.cuStreamCreate},
		{"cuStreamDestroy_v2", &l.cuStreamDestroy},
		{"cuStreamQuery", &l.cuStreamQuery},
		{"cuStreamSynchronize", &l.cuStreamSynchronize},
		{"cuEventCreate", &l.cuEventCreate},
		{"cuEventRecord", &l.cuEventRecord},
		{"cuEventQuery", &l.cuEventQuery},
		{"cuEventSynchronize", &l.cuEventSynchronize},
		{"cuEventDestroy_v2", &l.cuEventDestroy},
		{"cuGetErrorName", &l.cuGetErrorName},
		{"cuMemHostAlloc", &l.cuMemHostAlloc},
		{"cuMemFreeHost", &l.cuMemFreeHost},
		{"cuGetErrorString", &l.cuGetErrorString},
		{"cuMemGetHandleForAddressRange", &l.cuMemGetHandleForAddressRange},
	}
}

type symbol struct {
	name string
	fn   any // pointer to a func field of library
}

// optionalSymbols are the symbols the binding works without: a driver that
// lacks one leaves its field nil, and only the calls that need it fail (with
// ErrNotSupported).
var optionalSymbols = map[string]bool{
	"cuMemGetHandleForAddressRange": true, // CUDA 11.7
}

// libraryPath returns the library Open loads for cfg: Config.Library, else
// $VMARENA_CUDA_LIBRARY, else DefaultLibrary. The first one set is the only
// one tried, so an explicit choice never silently
// loads another driver.
func libraryPath(cfg Config) string {
	if cfg.Library != "" {
		return cfg.Library
	}
	if p := os.Getenv(LibraryEnv); p != "" {
		return p
	}
	return DefaultLibrary
}

// libs caches loaded libraries by path, for the life of the process. The CUDA
// driver starts threads of its own in cuInit and does not survive being
// unloaded under them, so a library is never closed.
var libs struct {
	sync.Mutex
	m map[string]*library
}

// loadLibrary returns the library at path, loading it on first use.
func loadLibrary(path string) (*library, error) {
	libs.Lock()
	defer libs.Unlock()
	if l, ok := libs.m[path]; ok {
		return l, nil
	}
	l := &library{path: path}
	if err := l.load(); err != nil {
		return nil, err
	}
	if libs.m == nil {
		libs.m = make(map[string]*library)
	}
	libs.m[path] = l
	return l, nil
}
