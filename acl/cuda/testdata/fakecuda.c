// fakecuda.c: a test double of the CUDA driver library (libcuda.so.1) for the
// tests of package acl/cuda. It exports the symbols the binding resolves, with
// the prototypes, struct layouts and enum values of cuda.h, and models the
// semantics the binding depends on:
//
//   - cuInit must come first (CUDA_ERROR_NOT_INITIALIZED otherwise);
//   - the current context is per thread; calls that need one fail with
//     CUDA_ERROR_INVALID_CONTEXT (201) without it, or when it is a primary
//     context whose last reference was released (which also destroys the
//     context's streams and events, and drops their work);
//   - cuMemMap maps only unmapped reserved address space, at offset 0, and
//     gives no access: copies into a mapping fail until cuMemSetAccess, which
//     takes any run of whole, adjacent mappings;
//   - cuMemUnmap takes whole mappings only, and does not wait for device work;
//     cuMemRelease is legal while the allocation is mapped, and the memory goes
//     when the last mapping does;
//   - cuMemCreate fails with CUDA_ERROR_OUT_OF_MEMORY past a capacity;
//   - structs are checked field by field at their cuda.h offsets, so a binding
//     that lays one out wrongly gets CUDA_ERROR_INVALID_VALUE;
//   - dma-bufs: cuMemGetHandleForAddressRange exports a range as a dma-buf
//     (a real descriptor: a new memory file of the range's size) only when
//     the device supports it (the dma_buf knob, attribute 124), the range
//     is aligned to 4 KiB, mapped throughout, and every allocation behind
//     it has the same properties (requested handle types, device, and the
//     GPUDirect RDMA flag, which cuMemCreate accepts only where the rdma_vmm
//     knob, attribute 110, says the device supports it on VMM memory);
//     CUDA_ERROR_INVALID_VALUE otherwise, CUDA_ERROR_NOT_SUPPORTED without
//     support. An imported allocation reports the RDMA flag the device
//     supports, as if its exporter had made it the way this binding does;
//   - sharing: an allocation made with requestedHandleTypes =
//     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR lives in a memory file of its
//     own (memfd); cuMemExportToShareableHandle writes a new descriptor of
//     it, which the caller owns; cuMemImportFromShareableHandle maps the file
//     a descriptor names (any process's: the memory is really shared) as a
//     new allocation, keeping a duplicate of the descriptor. An export of an
//     allocation made without the handle type fails with
//     CUDA_ERROR_INVALID_VALUE; an import of a descriptor that is not an open
//     memory file with CUDA_ERROR_INVALID_HANDLE. Imported memory does not
//     count against the capacity: the exporter's process counted it. The
//     codes are the double's choice where cuda.h does not say.
//
// Device work in flight. Each stream is a FIFO of work items: memsets
// (cuMemsetD8Async), copies (cuMemcpyDtoDAsync_v2) and stand-in kernels queued
// by the test hook fakecuda_launch. An item runs when it reaches the head of
// its stream: a memset or copy does its write then and finishes at once; a
// kernel stays unfinished until a test calls fakecuda_finish (from any
// thread). Each context has a legacy default stream (CUstream NULL); work on
// it waits for work queued before it on the context's blocking streams
// (created with flags 0), and work on those waits for work queued before it on
// the legacy stream, as CUDA orders them; non-blocking streams
// (CU_STREAM_NON_BLOCKING) are ordered with nothing else. The synchronous
// cuMemcpyHtoD_v2 and cuMemcpyDtoH_v2 run on the legacy stream, so they first
// wait for the work they are ordered after. An event marks the end of a
// stream's queue when recorded and completes when the items before the mark
// have finished; cuEventQuery and cuStreamQuery answer CUDA_ERROR_NOT_READY
// (600) until then; cuStreamSynchronize, cuEventSynchronize and
// cuCtxSynchronize block until it is so. An event never recorded is complete.
//
// Faults, counted by fakecuda_faults (what a device reports as an illegal
// address, or what would be a data race):
//
//   - cuMemUnmap of a range that queued or running work touches succeeds, and
//     each such item is marked faulted: a faulted memset or copy writes
//     nothing, and when a faulted item finishes its stream holds
//     CUDA_ERROR_ILLEGAL_ADDRESS (700) until its next cuStreamSynchronize or
//     the context's next cuCtxSynchronize returns it. (A real GPU makes 700
//     sticky for the whole context; the double reports it once, as the host
//     driver does, so that a test can go on.)
//   - a synchronous copy touching a range that unfinished work will still
//     write (or, for a write, read), and a memset or copy that runs while
//     unfinished work on another stream touches its range in the same way,
//     count one fault each.
//
// The double is laxer than ACL where CUDA is (a mapping may be smaller than
// its allocation; one cuMemUnmap or cuMemSetAccess may cover several adjacent
// mappings), so the tests prove the binding enforces the ACL rules itself.
//
// "Device memory" is host memory from mmap; device addresses are the double's
// own integers, translated through its mapping table on every access. Stream
// and event handles are the double's own integers too, never reused (unless
// the reuse_streams knob is set: then a new stream takes the handle of the
// stream destroyed last, as a pointer freed and allocated again would), so a
// stale handle is CUDA_ERROR_INVALID_HANDLE rather than a crash.
//
// Foreign streams. fakecuda_foreign_stream creates a stream the way the CUDA
// runtime of the caller's own framework would, outside the binding: it
// retains the device's primary context (as the runtime does) and creates a
// stream there, counted among the live streams but not as a cuStreamCreate
// call. Only fakecuda_destroy_foreign_stream destroys it (and releases the
// context): cuStreamDestroy_v2 refuses it with CUDA_ERROR_INVALID_HANDLE, so
// that a binding which destroys a stream it did not create fails its tests.
//
// One mutex guards all state and one condition variable signals progress, so
// the double may be called from any number of threads.
//
// Test controls (exported, prefixed fakecuda_), and environment variables read
// at load: FAKECUDA_CAPACITY (bytes), FAKECUDA_DEVICES (count),
// FAKECUDA_GRANULARITY (bytes), FAKECUDA_STUB=1 (behave as the toolkit's stub
// library: every call returns CUDA_ERROR_STUB_LIBRARY). Built with
// -DFAKECUDA_NO_DMABUF it lacks cuMemGetHandleForAddressRange, like a driver
// older than CUDA 11.7.

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int memfd_create(const char *name, unsigned int flags); // <sys/mman.h> with _GNU_SOURCE
#define FAKE_MFD_CLOEXEC 0x0001U

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef uint64_t CUmemGenericAllocationHandle;
typedef struct fake_ctx *CUcontext;
typedef struct fake_stream_handle *CUstream; // the value is a handle number, never dereferenced
typedef struct fake_event_handle *CUevent;   // likewise

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_STUB_LIBRARY = 34,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

enum {
	CU_STREAM_NON_BLOCKING = 0x1,
	CU_EVENT_BLOCKING_SYNC = 0x1,
	CU_EVENT_DISABLE_TIMING = 0x2,
	CU_EVENT_INTERPROCESS = 0x4,
};
#define CU_STREAM_LEGACY ((uintptr_t)0x1)

typedef struct {
	int type; // CUmemLocationType
	int id;
} CUmemLocation;

typedef struct {
	int type;                 // CUmemAllocationType: PINNED = 1
	int requestedHandleTypes; // CUmemAllocationHandleType
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct {
	CUmemLocation location;
	int flags; // CUmemAccess_flags
} CUmemAccessDesc;

_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "location");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "win32HandleMetaData");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "allocFlags");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");

#define MAX_DEVICES 8
#define ATTR_UNIFIED_ADDRESSING 41
#define ATTR_VMM_SUPPORTED 102
#define ATTR_POSIX_FD_SUPPORTED 103
#define ATTR_RDMA_WITH_VMM 110
#define ATTR_DMA_BUF_SUPPORTED 124
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1

// ---- global state, guarded by mu ----

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progressed = PTHREAD_COND_INITIALIZER; // broadcast whenever work finishes or objects go

struct fstream;

struct fake_ctx {
	int device;
	int refs;               // primary context retains
	struct fstream *legacy; // the legacy default stream, CUstream NULL
};

struct alloc {
	CUmemGenericAllocationHandle handle;
	size_t size;
	void *mem;
	int released; // cuMemRelease called
	int maps;     // live mappings
	int fd;       // its memory file when exportable or imported, else -1
	int imported; // made by cuMemImportFromShareableHandle
	int device;   // its location's device
	int rdma;     // allocFlags.gpuDirectRDMACapable
	struct alloc *next;
};

struct mapping {
	CUdeviceptr va;
	size_t size;
	struct alloc *a;
	int access; // CUmemAccess_flags
	struct mapping *next;
};

struct reservation {
	CUdeviceptr base;
	size_t size;
	struct reservation *next;
};

enum item_kind { ITEM_MEMSET, ITEM_COPY, ITEM_KERNEL };

// item is one piece of device work queued on a stream.
struct item {
	enum item_kind kind;
	int id;             // a kernel's id, for fakecuda_finish
	uint64_t seq;       // position in its stream, from 1
	uint64_t gseq;      // position among all work, for the legacy stream's ordering
	CUdeviceptr dst;    // memset and copy: written; kernel: read and written
	CUdeviceptr src;    // copy: read
	size_t n;
	unsigned char value;
	int released;       // kernel: fakecuda_finish was called
	int faulted;        // its range was unmapped while it was unfinished
	struct item *next;
};

struct fstream {
	uintptr_t handle; // 0 for a legacy stream
	struct fake_ctx *ctx;
	unsigned flags;
	int legacy;
	int foreign; // made by fakecuda_foreign_stream
	int dead;    // destroyed; freed once drained and unwaited
	int waiters; // threads blocked in cuStreamSynchronize on it
	struct item *head, *tail;
	uint64_t queued, finished; // seq of the last item queued, finished
	CUresult err;              // fault to report at the next synchronisation
	struct fstream *next;
};

struct fevent {
	uintptr_t handle;
	struct fake_ctx *ctx;
	unsigned flags;
	int dead;
	int waiters;
	struct fstream *s; // where it was last recorded; NULL if never, or the stream is gone
	uint64_t seq;      // complete once s->finished reaches it
	struct fevent *next;
};

static int initialized;
static int stub;
static int ndevices = 1;
static int vmm_supported = 1;
static int posix_fd_supported = 1;
static int rdma_vmm = 1; // attribute 110: GPUDirect RDMA with VMM memory
static int dma_buf = 1;  // attribute 124: dma-buf export
static long dmabufs;     // dma-bufs exported
static int driver_version = 12060;
static size_t granularity = 2u << 20;
static size_t capacity = (size_t)1 << 30;
static size_t used;                       // bytes of physical memory held
static size_t va_limit = (size_t)1 << 42; // reservable bytes in all
static size_t va_used;
static CUdeviceptr va_next = 0x200000000000ull;
static struct fake_ctx ctxs[MAX_DEVICES];
static struct alloc *allocs;
static struct mapping *mappings;
static struct reservation *reservations;
static struct fstream *streams; // every stream, the legacy ones included
static struct fevent *events;
static long live_allocs, live_maps, live_resv, live_streams, live_events;
static uintptr_t next_handle = 0x1000; // stream and event handles
static size_t import_device;          // knob: 0, or 1 + the device an import reports it lives on
static int reuse_streams;              // knob: a new stream takes the handle of the stream destroyed last
static uintptr_t last_destroyed;       // that handle, or 0
static uint64_t next_gseq;
static int next_kernel;
static long faults;

static __thread CUcontext current;

// ---- call counting and fault injection ----

struct fn_stat {
	const char *name;
	long calls;
	long fail_in; // fail the fail_in-th next call; 0 = no fault armed
	CUresult fail_with;
};

static struct fn_stat stats[] = {
	{"cuInit", 0, 0, 0}, {"cuDriverGetVersion", 0, 0, 0}, {"cuDeviceGetCount", 0, 0, 0}, {"cuDeviceGet", 0, 0, 0},
	{"cuDeviceGetAttribute", 0, 0, 0}, {"cuDevicePrimaryCtxRetain", 0, 0, 0}, {"cuDevicePrimaryCtxRelease_v2", 0, 0, 0},
	{"cuCtxSetCurrent", 0, 0, 0}, {"cuCtxGetCurrent", 0, 0, 0}, {"cuCtxSynchronize", 0, 0, 0},
	{"cuMemGetAllocationGranularity", 0, 0, 0}, {"cuMemCreate", 0, 0, 0}, {"cuMemRelease", 0, 0, 0},
	{"cuMemAddressReserve", 0, 0, 0}, {"cuMemAddressFree", 0, 0, 0}, {"cuMemMap", 0, 0, 0}, {"cuMemUnmap", 0, 0, 0},
	{"cuMemSetAccess", 0, 0, 0}, {"cuMemcpyHtoD_v2", 0, 0, 0}, {"cuMemcpyDtoH_v2", 0, 0, 0},
	{"cuMemExportToShareableHandle", 0, 0, 0}, {"cuMemImportFromShareableHandle", 0, 0, 0},
	{"cuMemGetAllocationPropertiesFromHandle", 0, 0, 0},
	{"cuMemcpyDtoDAsync_v2", 0, 0, 0}, {"cuMemsetD8Async", 0, 0, 0}, {"cuMemGetInfo_v2", 0, 0, 0},
	{"cuStreamCreate", 0, 0, 0}, {"cuStreamDestroy_v2", 0, 0, 0}, {"cuStreamQuery", 0, 0, 0},
	{"cuStreamSynchronize", 0, 0, 0}, {"cuEventCreate", 0, 0, 0}, {"cuEventRecord", 0, 0, 0},
	{"cuEventQuery", 0, 0, 0}, {"cuEventSynchronize", 0, 0, 0}, {"cuEventDestroy_v2", 0, 0, 0},
	{"cuGetErrorName", 0, 0, 0}, {"cuGetErrorString", 0, 0, 0},
	{"cuMemHostAlloc", 0, 0, 0}, {"cuMemFreeHost", 0, 0, 0},
	{"cuMemGetHandleForAddressRange", 0, 0, 0},
};
#define NSTATS (sizeof(stats) / sizeof(stats[0]))

static struct fn_stat *stat_of(const char *name) {
	for (size_t i = 0; i < NSTATS; i++)
		if (strcmp(stats[i].name, name) == 0)
			return &stats[i];
	return NULL;
}

// enter counts a call of fn and returns the result to fail it with, or 0.
// Called with mu held.
static CUresult enter(const char *fn) {
	struct fn_stat *s = stat_of(fn);
	s->calls++;
	if (stub)
		return CUDA_ERROR_STUB_LIBRARY;
	if (s->fail_in > 0 && --s->fail_in == 0)
		return s->fail_with;
	return CUDA_SUCCESS;
}

static CUresult need_init(void) { return initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED; }

// need_ctx: the calling thread must have a live context current.
static CUresult need_ctx(void) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (current == NULL || current->refs == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

#define BEGIN(fn, check)               \
	pthread_mutex_lock(&mu);           \
	CUresult rc_ = enter(fn);          \
	if (rc_ == CUDA_SUCCESS)           \
		rc_ = (check);                 \
	if (rc_ != CUDA_SUCCESS) {         \
		pthread_mutex_unlock(&mu);     \
		return rc_;                    \
	}

#define END(rc)                        \
	do {                               \
		CUresult r_ = (rc);            \
		pthread_mutex_unlock(&mu);     \
		return r_;                     \
	} while (0)

static size_t env_size(const char *name, size_t def) {
	const char *v = getenv(name);
	if (v == NULL || *v == 0)
		return def;
	return (size_t)strtoull(v, NULL, 0);
}

__attribute__((constructor)) static void load(void) {
	capacity = env_size("FAKECUDA_CAPACITY", capacity);
	ndevices = (int)env_size("FAKECUDA_DEVICES", (size_t)ndevices);
	if (ndevices > MAX_DEVICES)
		ndevices = MAX_DEVICES;
	granularity = env_size("FAKECUDA_GRANULARITY", granularity);
	stub = env_size("FAKECUDA_STUB", 0) != 0;
	for (int i = 0; i < MAX_DEVICES; i++) {
		struct fstream *s = calloc(1, sizeof *s);
		s->ctx = &ctxs[i];
		s->legacy = 1;
		s->next = streams;
		streams = s;
		ctxs[i].device = i;
		ctxs[i].legacy = s;
	}
}

// ---- device work ----

static int overlap(CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn) { return a < b + bn && b < a + an; }

// touches reports whether it reads or writes [lo, lo+n).
static int touches(const struct item *it, CUdeviceptr lo, size_t n) {
	return overlap(it->dst, it->n, lo, n) || (it->kind == ITEM_COPY && overlap(it->src, it->n, lo, n));
}

// conflicts reports whether it and an access to [lo, lo+n) race: it writes
// the range, or the access writes what it reads.
static int conflicts(const struct item *it, CUdeviceptr lo, size_t n, int writes) {
	return overlap(it->dst, it->n, lo, n) || (writes && it->kind == ITEM_COPY && overlap(it->src, it->n, lo, n));
}

// blocking reports whether s is a blocking stream: created without
// CU_STREAM_NON_BLOCKING, so ordered with the legacy stream.
static int blocking(const struct fstream *s) { return !s->legacy && (s->flags & CU_STREAM_NON_BLOCKING) == 0; }

// can_start reports whether it, at the head of s, may start: work it is
// ordered after through the legacy stream has finished.
static int can_start(const struct fstream *s, const struct item *it) {
	if (!s->legacy && !blocking(s))
		return 1;
	for (struct fstream *o = streams; o != NULL; o = o->next) {
		if (o == s || o->ctx != s->ctx || o->head == NULL)
			continue;
		int ordered = s->legacy ? blocking(o) : o->legacy;
		if (ordered && o->head->gseq < it->gseq)
			return 0;
	}
	return 1;
}

// racing reports whether unfinished work conflicts with an access to
// [lo, lo+n): by it, at the head of s, or by a synchronous call (s and it
// NULL). Work on s itself, and work the legacy stream orders after it, does
// not race with it.
static int racing(const struct fstream *s, const struct item *it, CUdeviceptr lo, size_t n, int writes) {
	for (struct fstream *o = streams; o != NULL; o = o->next) {
		if (o == s)
			continue;
		int after = s != NULL && o->ctx == s->ctx && ((s->legacy && blocking(o)) || (blocking(s) && o->legacy));
		for (struct item *x = o->head; x != NULL; x = x->next)
			if (!(after && x->gseq > it->gseq) && conflicts(x, lo, n, writes))
				return 1;
	}
	return 0;
}

static struct mapping *mapping_at(CUdeviceptr va) {
	for (struct mapping *m = mappings; m != NULL; m = m->next)
		if (va >= m->va && va - m->va < m->size)
			return m;
	return NULL;
}

// host_ptr translates [va, va+n) to host memory; the whole range must be one
// mapping with at least the given access. It returns NULL if not.
static unsigned char *host_ptr(CUdeviceptr va, size_t n, int need) {
	struct mapping *m = mapping_at(va);
	if (m == NULL || (m->access & need) != need)
		return NULL;
	if (n > m->va + m->size - va)
		return NULL;
	return (unsigned char *)m->a->mem + (va - m->va);
}

// span returns how many bytes from va lie in va's mapping, or 0 if va is not
// mapped with the given access.
static size_t span(CUdeviceptr va, int need) {
	struct mapping *m = mapping_at(va);
	if (m == NULL || (m->access & need) != need)
		return 0;
	return m->va + m->size - va;
}

// check_range reports whether [va, va+n) is mapped with access throughout.
static int check_range(CUdeviceptr va, size_t n, int need) {
	while (n > 0) {
		size_t s = span(va, need);
		if (s == 0)
			return 0;
		if (s > n)
			s = n;
		va += s;
		n -= s;
	}
	return 1;
}

// read_dev and write_dev copy between host memory and a range checked with
// check_range.
static void read_dev(unsigned char *dst, CUdeviceptr src, size_t n) {
	while (n > 0) {
		size_t k = span(src, 1);
		if (k > n)
			k = n;
		memcpy(dst, host_ptr(src, k, 1), k);
		src += k;
		dst += k;
		n -= k;
	}
}

static void write_dev(CUdeviceptr dst, const unsigned char *src, size_t n) {
	while (n > 0) {
		size_t k = span(dst, 3);
		if (k > n)
			k = n;
		memcpy(host_ptr(dst, k, 3), src, k);
		dst += k;
		src += k;
		n -= k;
	}
}

static void set_dev(CUdeviceptr dst, unsigned char value, size_t n) {
	while (n > 0) {
		size_t k = span(dst, 3);
		if (k > n)
			k = n;
		memset(host_ptr(dst, k, 3), value, k);
		dst += k;
		n -= k;
	}
}

static void copy_dev(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	unsigned char *tmp = malloc(n ? n : 1);
	read_dev(tmp, src, n);
	write_dev(dst, tmp, n);
	free(tmp);
}

// run does a memset's or copy's write, at the head of s.
static void run(struct fstream *s, struct item *it) {
	int race = racing(s, it, it->dst, it->n, 1);
	if (it->kind == ITEM_COPY)
		race = race || racing(s, it, it->src, it->n, 0);
	if (race)
		faults++;
	if (it->faulted)
		return; // its memory was unmapped under it: nothing is written
	if (it->kind == ITEM_MEMSET) {
		if (check_range(it->dst, it->n, 3))
			set_dev(it->dst, it->value, it->n);
	} else if (check_range(it->src, it->n, 1) && check_range(it->dst, it->n, 3)) {
		copy_dev(it->dst, it->src, it->n);
	}
}

// pop finishes the item at the head of s.
static void pop(struct fstream *s) {
	struct item *it = s->head;
	s->head = it->next;
	if (s->head == NULL)
		s->tail = NULL;
	s->finished = it->seq;
	if (it->faulted && s->err == CUDA_SUCCESS)
		s->err = CUDA_ERROR_ILLEGAL_ADDRESS;
	free(it);
}

static void free_stream(struct fstream *s) {
	struct fstream **pp = &streams;
	while (*pp != s)
		pp = &(*pp)->next;
	*pp = s->next;
	for (struct fevent *e = events; e != NULL; e = e->next)
		if (e->s == s)
			e->s = NULL; // its work finished: the event is complete
	free(s);
}

static void free_event(struct fevent *e) {
	struct fevent **pp = &events;
	while (*pp != e)
		pp = &(*pp)->next;
	*pp = e->next;
	free(e);
}

// progress runs every item that may run, until none can, frees destroyed
// streams that have drained, and wakes the waiters. Called with mu held.
static void progress(void) {
	int changed;
	do {
		changed = 0;
		for (struct fstream *s = streams; s != NULL; s = s->next) {
			while (s->head != NULL && can_start(s, s->head)) {
				struct item *it = s->head;
				if (it->kind == ITEM_KERNEL && !it->released)
					break;
				if (it->kind != ITEM_KERNEL)
					run(s, it);
				pop(s);
				changed = 1;
			}
		}
	} while (changed);
	for (struct fstream *s = streams, *next; s != NULL; s = next) {
		next = s->next;
		if (s->dead && s->head == NULL && s->waiters == 0)
			free_stream(s);
	}
	pthread_cond_broadcast(&progressed);
}

// enqueue queues it on s.
static void enqueue(struct fstream *s, struct item *it) {
	it->seq = ++s->queued;
	it->gseq = ++next_gseq;
	if (s->tail == NULL)
		s->head = it;
	else
		s->tail->next = it;
	s->tail = it;
	progress();
}

// stream_of returns the live stream h of the current context's device, the
// legacy stream for NULL, or NULL.
static struct fstream *stream_of(CUstream h) {
	uintptr_t v = (uintptr_t)h;
	if (v == 0 || v == CU_STREAM_LEGACY)
		return current->legacy;
	for (struct fstream *s = streams; s != NULL; s = s->next)
		if (!s->legacy && !s->dead && s->handle == v)
			return s;
	return NULL;
}

static struct fevent *event_of(CUevent h) {
	uintptr_t v = (uintptr_t)h;
	for (struct fevent *e = events; e != NULL; e = e->next)
		if (!e->dead && e->handle == v)
			return e;
	return NULL;
}

static int event_complete(const struct fevent *e) { return e->s == NULL || e->s->finished >= e->seq; }

// drop_items forgets the work queued on s, unrun.
static void drop_items(struct fstream *s) {
	while (s->head != NULL) {
		struct item *it = s->head;
		s->head = it->next;
		free(it);
	}
	s->tail = NULL;
	s->finished = s->queued;
}

// reset_ctx destroys c's streams and events, as the release of a primary
// context's last reference does.
static void reset_ctx(struct fake_ctx *c) {
	for (struct fstream *s = streams; s != NULL; s = s->next) {
		if (s->ctx != c)
			continue;
		drop_items(s);
		s->err = CUDA_SUCCESS;
		if (!s->legacy && !s->dead) {
			s->dead = 1;
			live_streams--;
		}
	}
	for (struct fevent *e = events, *next; e != NULL; e = next) {
		next = e->next;
		if (e->ctx != c)
			continue;
		if (!e->dead)
			live_events--;
		e->dead = 1;
		if (e->waiters == 0)
			free_event(e);
	}
	progress();
}

// ---- initialisation, devices, contexts ----

EXPORT CUresult cuInit(unsigned int flags) {
	BEGIN("cuInit", flags != 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
	if (ndevices == 0)
		END(CUDA_ERROR_NO_DEVICE);
	initialized = 1;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuDriverGetVersion(int *v) {
	BEGIN("cuDriverGetVersion", v == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
	*v = driver_version;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetCount(int *n) {
	BEGIN("cuDeviceGetCount", need_init());
	if (n == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	*n = ndevices;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
	BEGIN("cuDeviceGet", need_init());
	if (dev == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	if (ordinal < 0 || ordinal >= ndevices)
		END(CUDA_ERROR_INVALID_DEVICE);
	*dev = ordinal;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice dev) {
	BEGIN("cuDeviceGetAttribute", need_init());
	if (v == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	if (dev < 0 || dev >= ndevices)
		END(CUDA_ERROR_INVALID_DEVICE);
	switch (attr) {
	case ATTR_VMM_SUPPORTED:
		*v = vmm_supported;
		break;
	case ATTR_POSIX_FD_SUPPORTED:
		*v = posix_fd_supported;
		break;
	case ATTR_UNIFIED_ADDRESSING:
		*v = 1;
		break;
	case ATTR_RDMA_WITH_VMM:
		*v = rdma_vmm;
		break;
	case ATTR_DMA_BUF_SUPPORTED:
		*v = dma_buf;
		break;
	default:
		END(CUDA_ERROR_INVALID_VALUE);
	}
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
	BEGIN("cuDevicePrimaryCtxRetain", need_init());
	if (ctx == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	if (dev < 0 || dev >= ndevices)
		END(CUDA_ERROR_INVALID_DEVICE);
	ctxs[dev].refs++;
	*ctx = &ctxs[dev];
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
	BEGIN("cuDevicePrimaryCtxRelease_v2", need_init());
	if (dev < 0 || dev >= ndevices)
		END(CUDA_ERROR_INVALID_DEVICE);
	if (ctxs[dev].refs == 0)
		END(CUDA_ERROR_INVALID_CONTEXT);
	if (--ctxs[dev].refs == 0)
		reset_ctx(&ctxs[dev]);
	END(CUDA_SUCCESS);
}

static int known_ctx(CUcontext c) {
	for (int i = 0; i < ndevices; i++)
		if (c == &ctxs[i])
			return 1;
	return 0;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
	BEGIN("cuCtxSetCurrent", need_init());
	if (ctx != NULL && !known_ctx(ctx))
		END(CUDA_ERROR_INVALID_CONTEXT);
	current = ctx;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
	BEGIN("cuCtxGetCurrent", need_init());
	if (ctx == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	*ctx = current;
	END(CUDA_SUCCESS);
}

// ctx_busy reports whether a stream of c has work queued at or before gseq g.
static int ctx_busy(const struct fake_ctx *c, uint64_t g) {
	for (struct fstream *s = streams; s != NULL; s = s->next)
		if (s->ctx == c && s->head != NULL && s->head->gseq <= g)
			return 1;
	return 0;
}

// cuCtxSynchronize waits for the work queued in the current context, and
// returns (and clears) the first fault its streams hold.
EXPORT CUresult cuCtxSynchronize(void) {
	BEGIN("cuCtxSynchronize", need_ctx());
	struct fake_ctx *c = current;
	uint64_t g = next_gseq;
	while (ctx_busy(c, g) && c->refs > 0)
		pthread_cond_wait(&progressed, &mu);
	CUresult rc = CUDA_SUCCESS;
	for (struct fstream *s = streams; s != NULL; s = s->next) {
		if (s->ctx != c)
			continue;
		if (rc == CUDA_SUCCESS)
			rc = s->err;
		s->err = CUDA_SUCCESS;
	}
	END(rc);
}

// ---- streams and events ----

// new_stream makes a live stream of c with flags. Called with mu held.
static struct fstream *new_stream(struct fake_ctx *c, unsigned flags) {
	struct fstream *s = calloc(1, sizeof *s);
	if (reuse_streams && last_destroyed != 0) {
		s->handle = last_destroyed;
		last_destroyed = 0;
	} else {
		next_handle += 0x10;
		s->handle = next_handle;
	}
	s->ctx = c;
	s->flags = flags;
	s->next = streams;
	streams = s;
	live_streams++;
	return s;
}

// kill_stream destroys s: its queued work still runs, and it goes when it
// has drained. Called with mu held.
static void kill_stream(struct fstream *s) {
	s->dead = 1;
	live_streams--;
	last_destroyed = s->handle;
	progress();
}

EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags) {
	BEGIN("cuStreamCreate", need_ctx());
	if (ph == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0)
		END(CUDA_ERROR_INVALID_VALUE);
	*ph = (CUstream)new_stream(current, flags)->handle;
	END(CUDA_SUCCESS);
}

// cuStreamDestroy_v2 returns at once; work still queued runs, and the stream
// goes when it has drained. A foreign stream is refused (see the top of this
// file).
EXPORT CUresult cuStreamDestroy_v2(CUstream h) {
	BEGIN("cuStreamDestroy_v2", need_ctx());
	if (h == NULL || (uintptr_t)h == CU_STREAM_LEGACY)
		END(CUDA_ERROR_INVALID_HANDLE);
	struct fstream *s = stream_of(h);
	if (s == NULL || s->foreign)
		END(CUDA_ERROR_INVALID_HANDLE);
	kill_stream(s);
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamQuery(CUstream h) {
	BEGIN("cuStreamQuery", need_ctx());
	struct fstream *s = stream_of(h);
	if (s == NULL)
		END(CUDA_ERROR_INVALID_HANDLE);
	END(s->head == NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

// cuStreamSynchronize waits for the work queued on h, and returns (and
// clears) the fault the stream holds.
EXPORT CUresult cuStreamSynchronize(CUstream h) {
	BEGIN("cuStreamSynchronize", need_ctx());
	struct fstream *s = stream_of(h);
	if (s == NULL)
		END(CUDA_ERROR_INVALID_HANDLE);
	uint64_t target = s->queued;
	s->waiters++;
	while (s->finished < target)
		pthread_cond_wait(&progressed, &mu);
	s->waiters--;
	CUresult rc = s->err;
	s->err = CUDA_SUCCESS;
	progress(); // frees s if it was destroyed meanwhile
	END(rc);
}

EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
	BEGIN("cuEventCreate", need_ctx());
	unsigned all = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
	if (ph == NULL || (flags & ~all) != 0 ||
	    ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
		END(CUDA_ERROR_INVALID_VALUE);
	struct fevent *e = calloc(1, sizeof *e);
	next_handle += 0x10;
	e->handle = next_handle;
	e->ctx = current;
	e->flags = flags;
	e->next = events;
	events = e;
	live_events++;
	*ph = (CUevent)e->handle;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuEventRecord(CUevent he, CUstream hs) {
	BEGIN("cuEventRecord", need_ctx());
	struct fevent *e = event_of(he);
	struct fstream *s = stream_of(hs);
	if (e == NULL || s == NULL || e->ctx != s->ctx)
		END(CUDA_ERROR_INVALID_HANDLE);
	e->s = s;
	e->seq = s->queued;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuEventQuery(CUevent h) {
	BEGIN("cuEventQuery", need_ctx());
	struct fevent *e = event_of(h);
	if (e == NULL)
		END(CUDA_ERROR_INVALID_HANDLE);
	END(event_complete(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

EXPORT CUresult cuEventSynchronize(CUevent h) {
	BEGIN("cuEventSynchronize", need_ctx());
	struct fevent *e = event_of(h);
	if (e == NULL)
		END(CUDA_ERROR_INVALID_HANDLE);
	e->waiters++;
	while (!event_complete(e) && !e->dead)
		pthread_cond_wait(&progressed, &mu);
	e->waiters--;
	if (e->dead && e->waiters == 0)
		free_event(e);
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuEventDestroy_v2(CUevent h) {
	BEGIN("cuEventDestroy_v2", need_ctx());
	struct fevent *e = event_of(h);
	if (e == NULL)
		END(CUDA_ERROR_INVALID_HANDLE);
	e->dead = 1;
	live_events--;
	if (e->waiters == 0)
		free_event(e);
	else
		pthread_cond_broadcast(&progressed);
	END(CUDA_SUCCESS);
}

// ---- physical memory ----

static CUresult check_prop(const CUmemAllocationProp *p) {
	const unsigned char *raw = (const unsigned char *)p;
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->type != 1) // CU_MEM_ALLOCATION_TYPE_PINNED
		return CUDA_ERROR_INVALID_VALUE;
	if (p->requestedHandleTypes != 0 && p->requestedHandleTypes != 1)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->location.type != 1) // CU_MEM_LOCATION_TYPE_DEVICE
		return CUDA_ERROR_INVALID_VALUE;
	if (p->location.id < 0 || p->location.id >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	if (p->win32HandleMetaData != NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->allocFlags.compressionType != 0 || p->allocFlags.gpuDirectRDMACapable > 1 || p->allocFlags.usage != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->allocFlags.gpuDirectRDMACapable && !rdma_vmm)
		return CUDA_ERROR_NOT_SUPPORTED;
	for (int i = 28; i < 32; i++)
		if (raw[i] != 0)
			return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop, int option) {
	BEGIN("cuMemGetAllocationGranularity", need_ctx());
	if (gran == NULL || (option != 0 && option != 1))
		END(CUDA_ERROR_INVALID_VALUE);
	CUresult rc = check_prop(prop);
	if (rc != CUDA_SUCCESS)
		END(rc);
	*gran = granularity;
	END(CUDA_SUCCESS);
}

static struct alloc *find_alloc(CUmemGenericAllocationHandle h) {
	for (struct alloc *a = allocs; a != NULL; a = a->next)
		if (a->handle == h)
			return a;
	return NULL;
}

// new_handle returns the smallest handle value not in use, so that values are
// reused after release, as a real driver may do.
static CUmemGenericAllocationHandle new_handle(void) {
	for (CUmemGenericAllocationHandle h = 0x10;; h++)
		if (find_alloc(h) == NULL)
			return h;
}

// fcntl_dup returns a close-on-exec duplicate of fd, or -1.
static int fcntl_dup(int fd);

static void free_alloc(struct alloc *a) {
	struct alloc **pp = &allocs;
	while (*pp != a)
		pp = &(*pp)->next;
	*pp = a->next;
	munmap(a->mem, a->size);
	if (a->fd >= 0)
		close(a->fd);
	if (!a->imported)
		used -= a->size;
	live_allocs--;
	free(a);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
	BEGIN("cuMemCreate", need_ctx());
	if (h == NULL || flags != 0 || size == 0 || size % granularity != 0)
		END(CUDA_ERROR_INVALID_VALUE);
	CUresult rc = check_prop(prop);
	if (rc != CUDA_SUCCESS)
		END(rc);
	if (size > capacity || used > capacity - size)
		END(CUDA_ERROR_OUT_OF_MEMORY);
	int fd = -1;
	void *mem;
	if (prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
		fd = memfd_create("fakecuda", FAKE_MFD_CLOEXEC);
		if (fd < 0)
			END(CUDA_ERROR_OUT_OF_MEMORY);
		if (ftruncate(fd, (off_t)size) != 0) {
			close(fd);
			END(CUDA_ERROR_OUT_OF_MEMORY);
		}
		mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	} else {
		mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	}
	if (mem == MAP_FAILED) {
		if (fd >= 0)
			close(fd);
		END(CUDA_ERROR_OUT_OF_MEMORY);
	}
	struct alloc *a = calloc(1, sizeof *a);
	a->fd = fd;
	a->handle = new_handle();
	a->size = size;
	a->mem = mem;
	a->device = prop->location.id;
	a->rdma = prop->allocFlags.gpuDirectRDMACapable;
	a->next = allocs;
	allocs = a;
	used += size;
	live_allocs++;
	*h = a->handle;
	END(CUDA_SUCCESS);
}

// cuMemExportToShareableHandle writes a new descriptor of the allocation's
// memory file into the int shareableHandle points to.
EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle h, int handleType,
                                             unsigned long long flags) {
	BEGIN("cuMemExportToShareableHandle", need_ctx());
	if (shareableHandle == NULL || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		END(CUDA_ERROR_INVALID_VALUE);
	struct alloc *a = find_alloc(h);
	if (a == NULL || a->released)
		END(CUDA_ERROR_INVALID_HANDLE);
	if (a->fd < 0)
		END(CUDA_ERROR_INVALID_VALUE); // not made with the handle type
	int fd = fcntl_dup(a->fd);
	if (fd < 0)
		END(CUDA_ERROR_OUT_OF_MEMORY);
	*(int *)shareableHandle = fd;
	END(CUDA_SUCCESS);
}

// cuMemImportFromShareableHandle maps the memory file osHandle names (the
// descriptor itself, cast to a pointer) as a new allocation.
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *osHandle, int handleType) {
	BEGIN("cuMemImportFromShareableHandle", need_ctx());
	if (h == NULL || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		END(CUDA_ERROR_INVALID_VALUE);
	int fd = (int)(intptr_t)osHandle;
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    (size_t)st.st_size % granularity != 0)
		END(CUDA_ERROR_INVALID_HANDLE);
	int own = fcntl_dup(fd);
	if (own < 0)
		END(CUDA_ERROR_OUT_OF_MEMORY);
	void *mem = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
	if (mem == MAP_FAILED) {
		close(own);
		END(CUDA_ERROR_INVALID_HANDLE);
	}
	struct alloc *a = calloc(1, sizeof *a);
	a->handle = new_handle();
	a->size = (size_t)st.st_size;
	a->mem = mem;
	a->fd = own;
	a->imported = 1;
	a->device = import_device > 0 ? (int)import_device - 1 : current->device;
	a->rdma = rdma_vmm;
	a->next = allocs;
	allocs = a;
	live_allocs++;
	*h = a->handle;
	END(CUDA_SUCCESS);
}

// cuMemGetAllocationPropertiesFromHandle writes the properties h was made
// with: pinned memory on its device, exportable as a descriptor when it lives
// in a memory file.
EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
	BEGIN("cuMemGetAllocationPropertiesFromHandle", need_ctx());
	struct alloc *a = find_alloc(h);
	if (prop == NULL || a == NULL || a->released)
		END(CUDA_ERROR_INVALID_VALUE);
	memset(prop, 0, sizeof *prop);
	prop->type = 1;
	prop->requestedHandleTypes = a->fd >= 0 ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
	prop->location.type = 1;
	prop->location.id = a->device;
	prop->allocFlags.gpuDirectRDMACapable = (unsigned char)a->rdma;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
	BEGIN("cuMemRelease", need_ctx());
	struct alloc *a = find_alloc(h);
	if (a == NULL || a->released)
		END(CUDA_ERROR_INVALID_VALUE);
	a->released = 1;
	if (a->maps == 0)
		free_alloc(a);
	END(CUDA_SUCCESS);
}

// ---- address space ----

static struct reservation *find_resv(CUdeviceptr va, size_t size) {
	for (struct reservation *r = reservations; r != NULL; r = r->next)
		if (va >= r->base && va - r->base < r->size && size <= r->base + r->size - va)
			return r;
	return NULL;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
	BEGIN("cuMemAddressReserve", need_ctx());
	(void)addr; // a hint; this double ignores it
	if (ptr == NULL || flags != 0 || size == 0 || size % 4096 != 0 || (alignment & (alignment - 1)) != 0)
		END(CUDA_ERROR_INVALID_VALUE);
	if (size > va_limit || va_used > va_limit - size)
		END(CUDA_ERROR_OUT_OF_MEMORY);
	size_t align = alignment > granularity ? alignment : granularity;
	CUdeviceptr base = (va_next + align - 1) & ~(CUdeviceptr)(align - 1);
	struct reservation *r = calloc(1, sizeof *r);
	r->base = base;
	r->size = size;
	r->next = reservations;
	reservations = r;
	// Leave a granule of unreserved space after each reservation, so that a
	// copy running off its end finds nothing.
	va_next = base + size + granularity;
	va_used += size;
	live_resv++;
	*ptr = base;
	END(CUDA_SUCCESS);
}

static int mapped_in(CUdeviceptr va, size_t size) {
	for (struct mapping *m = mappings; m != NULL; m = m->next)
		if (m->va < va + size && va < m->va + m->size)
			return 1;
	return 0;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
	BEGIN("cuMemAddressFree", need_ctx());
	struct reservation **pp = &reservations;
	while (*pp != NULL && !((*pp)->base == ptr && (*pp)->size == size))
		pp = &(*pp)->next;
	if (*pp == NULL || mapped_in(ptr, size))
		END(CUDA_ERROR_INVALID_VALUE);
	struct reservation *r = *pp;
	*pp = r->next;
	va_used -= r->size;
	live_resv--;
	free(r);
	END(CUDA_SUCCESS);
}

// ---- mappings ----

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
	BEGIN("cuMemMap", need_ctx());
	if (flags != 0 || offset != 0 || size == 0 || size % granularity != 0 || ptr % granularity != 0)
		END(CUDA_ERROR_INVALID_VALUE);
	struct alloc *a = find_alloc(h);
	if (a == NULL || a->released)
		END(CUDA_ERROR_INVALID_HANDLE);
	// CUDA is laxer than ACL here: part of an allocation may be mapped.
	if (size > a->size)
		END(CUDA_ERROR_INVALID_VALUE);
	if (find_resv(ptr, size) == NULL || mapped_in(ptr, size))
		END(CUDA_ERROR_INVALID_VALUE);
	struct mapping *m = calloc(1, sizeof *m);
	m->va = ptr;
	m->size = size;
	m->a = a;
	m->access = 0; // all mappings start with no access
	m->next = mappings;
	mappings = m;
	a->maps++;
	live_maps++;
	END(CUDA_SUCCESS);
}

// whole_mappings reports whether [ptr, ptr+size) is a run of whole, adjacent
// mappings.
static int whole_mappings(CUdeviceptr ptr, size_t size) {
	CUdeviceptr at = ptr, end = ptr + size;
	if (size == 0)
		return 0;
	while (at < end) {
		struct mapping *m = mapping_at(at);
		if (m == NULL || m->va != at || m->size > end - at)
			return 0;
		at += m->size;
	}
	return 1;
}

// cuMemUnmap does not wait for device work: work still touching the range is
// marked faulted, and counted.
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
	BEGIN("cuMemUnmap", need_ctx());
	if (!whole_mappings(ptr, size))
		END(CUDA_ERROR_INVALID_VALUE);
	for (struct fstream *s = streams; s != NULL; s = s->next)
		for (struct item *it = s->head; it != NULL; it = it->next)
			if (!it->faulted && touches(it, ptr, size)) {
				it->faulted = 1;
				faults++;
			}
	struct mapping **pp = &mappings;
	while (*pp != NULL) {
		struct mapping *m = *pp;
		if (m->va >= ptr && m->va < ptr + size) {
			*pp = m->next;
			live_maps--;
			if (--m->a->maps == 0 && m->a->released)
				free_alloc(m->a);
			free(m);
			continue;
		}
		pp = &m->next;
	}
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
	BEGIN("cuMemSetAccess", need_ctx());
	if (desc == NULL || count == 0 || !whole_mappings(ptr, size))
		END(CUDA_ERROR_INVALID_VALUE);
	int access = 0;
	for (size_t i = 0; i < count; i++) {
		const CUmemAccessDesc *d = &desc[i];
		if (d->location.type != 1 || (d->flags != 0 && d->flags != 1 && d->flags != 3))
			END(CUDA_ERROR_INVALID_VALUE);
		if (d->location.id < 0 || d->location.id >= ndevices)
			END(CUDA_ERROR_INVALID_DEVICE);
		if (d->location.id == current->device)
			access = d->flags;
	}
	for (CUdeviceptr at = ptr; at < ptr + size;) {
		struct mapping *m = mapping_at(at);
		m->access = access;
		at += m->size;
	}
	END(CUDA_SUCCESS);
}

// ---- dma-bufs ----

#ifndef FAKECUDA_NO_DMABUF // built without it: a driver older than CUDA 11.7
// same_props reports whether two allocations were made with identical
// properties, as a dma-buf export of both needs.
static int same_props(const struct alloc *a, const struct alloc *b) {
	return (a->fd >= 0) == (b->fd >= 0) && a->device == b->device && a->rdma == b->rdma;
}

// cuMemGetHandleForAddressRange writes, into the int handle points to, a new
// descriptor standing for the dma-buf of [dptr, dptr+size): a memory file
// of that size, which the caller owns.
EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int handleType,
                                              unsigned long long flags) {
	BEGIN("cuMemGetHandleForAddressRange", need_ctx());
	if (handle == NULL || handleType != 1 || flags != 0 || size == 0 || dptr % 4096 != 0 || size % 4096 != 0)
		END(CUDA_ERROR_INVALID_VALUE);
	if (!dma_buf)
		END(CUDA_ERROR_NOT_SUPPORTED);
	struct alloc *first = NULL;
	for (CUdeviceptr at = dptr; at < dptr + size;) {
		struct mapping *m = mapping_at(at);
		if (m == NULL)
			END(CUDA_ERROR_INVALID_VALUE); // not fully mapped
		if (first == NULL)
			first = m->a;
		else if (!same_props(first, m->a))
			END(CUDA_ERROR_INVALID_VALUE);
		at = m->va + m->size;
	}
	int fd = memfd_create("fakecuda-dmabuf", FAKE_MFD_CLOEXEC);
	if (fd < 0)
		END(CUDA_ERROR_OUT_OF_MEMORY);
	if (ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		END(CUDA_ERROR_OUT_OF_MEMORY);
	}
	*(int *)handle = fd;
	dmabufs++;
	END(CUDA_SUCCESS);
}
#endif

// ---- copies and memsets ----

// legacy_wait blocks until the work the legacy stream of the current context
// orders a new call after has finished: its own, and that of the context's
// blocking streams.
static void legacy_wait(void) {
	struct fake_ctx *c = current;
	uint64_t g = next_gseq;
	for (;;) {
		int busy = 0;
		for (struct fstream *s = streams; s != NULL && !busy; s = s->next)
			if (s->ctx == c && (s->legacy || blocking(s)) && s->head != NULL && s->head->gseq <= g)
				busy = 1;
		if (!busy || c->refs == 0)
			return;
		pthread_cond_wait(&progressed, &mu);
	}
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	BEGIN("cuMemcpyHtoD_v2", need_ctx());
	if (n > 0 && src == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	if (!check_range(dst, n, 3))
		END(CUDA_ERROR_INVALID_VALUE);
	legacy_wait();
	if (!check_range(dst, n, 3)) // unmapped while it waited
		END(CUDA_ERROR_INVALID_VALUE);
	if (racing(NULL, NULL, dst, n, 1))
		faults++;
	write_dev(dst, src, n);
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	BEGIN("cuMemcpyDtoH_v2", need_ctx());
	if (n > 0 && dst == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	if (!check_range(src, n, 1))
		END(CUDA_ERROR_INVALID_VALUE);
	legacy_wait();
	if (!check_range(src, n, 1))
		END(CUDA_ERROR_INVALID_VALUE);
	if (racing(NULL, NULL, src, n, 0))
		faults++;
	read_dev(dst, src, n);
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
	BEGIN("cuMemcpyDtoDAsync_v2", need_ctx());
	struct fstream *s = stream_of(h);
	if (s == NULL)
		END(CUDA_ERROR_INVALID_HANDLE);
	if (!check_range(src, n, 1) || !check_range(dst, n, 3))
		END(CUDA_ERROR_INVALID_VALUE);
	if (n == 0)
		END(CUDA_SUCCESS);
	struct item *it = calloc(1, sizeof *it);
	it->kind = ITEM_COPY;
	it->dst = dst;
	it->src = src;
	it->n = n;
	enqueue(s, it);
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream h) {
	BEGIN("cuMemsetD8Async", need_ctx());
	struct fstream *s = stream_of(h);
	if (s == NULL)
		END(CUDA_ERROR_INVALID_HANDLE);
	if (!check_range(dst, n, 3))
		END(CUDA_ERROR_INVALID_VALUE);
	if (n == 0)
		END(CUDA_SUCCESS);
	struct item *it = calloc(1, sizeof *it);
	it->kind = ITEM_MEMSET;
	it->dst = dst;
	it->n = n;
	it->value = value;
	enqueue(s, it);
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
	BEGIN("cuMemGetInfo_v2", need_ctx());
	if (free_ == NULL || total == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	*free_ = capacity > used ? capacity - used : 0;
	*total = capacity;
	END(CUDA_SUCCESS);
}

// ---- page-locked host memory ----

// A host buffer is ordinary malloc'd memory, kept on a list so that
// cuMemFreeHost refuses a pointer cuMemHostAlloc did not return (and a
// second free) with CUDA_ERROR_INVALID_VALUE, and fakecuda_host_live can
// count what is live. Like a driver that pools its host memory, the double
// keeps the last buffer freed and hands it back to the next cuMemHostAlloc
// of the same size, so that a freed address is reused at once, every time:
// the binding's books must never mistake the new buffer for the old.
struct hostbuf {
	void *p;
	size_t size;
	struct hostbuf *next;
};

static struct hostbuf *hostbufs;
static void *recycled;       // the last buffer freed, kept for reuse; NULL: none
static size_t recycled_size; // its size

EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
	BEGIN("cuMemHostAlloc", need_ctx());
	if (pp == NULL || size == 0 || flags > 0xf)
		END(CUDA_ERROR_INVALID_VALUE);
	struct hostbuf *b = calloc(1, sizeof *b);
	void *p;
	if (recycled != NULL && recycled_size == size) {
		p = recycled;
		recycled = NULL;
	} else {
		p = malloc(size);
	}
	if (b == NULL || p == NULL) {
		free(b);
		free(p);
		END(CUDA_ERROR_OUT_OF_MEMORY);
	}
	b->p = p;
	b->size = size;
	b->next = hostbufs;
	hostbufs = b;
	*pp = p;
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemFreeHost(void *p) {
	BEGIN("cuMemFreeHost", need_ctx());
	for (struct hostbuf **q = &hostbufs; *q != NULL; q = &(*q)->next) {
		if ((*q)->p == p) {
			struct hostbuf *b = *q;
			*q = b->next;
			free(recycled);
			recycled = b->p;
			recycled_size = b->size;
			free(b);
			END(CUDA_SUCCESS);
		}
	}
	END(CUDA_ERROR_INVALID_VALUE);
}

// fakecuda_host_live reports the host buffers cuMemHostAlloc made that
// cuMemFreeHost has not freed, and their bytes.
EXPORT void fakecuda_host_live(long *n, size_t *bytes) {
	pthread_mutex_lock(&mu);
	*n = 0;
	*bytes = 0;
	for (struct hostbuf *b = hostbufs; b != NULL; b = b->next) {
		(*n)++;
		*bytes += b->size;
	}
	pthread_mutex_unlock(&mu);
}

// ---- errors ----

static const struct {
	CUresult code;
	const char *name, *desc;
} errs[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_text(const char *fn, CUresult code, const char **out, int desc) {
	pthread_mutex_lock(&mu);
	stat_of(fn)->calls++; // never stubbed or failed: the binding needs them to report errors
	pthread_mutex_unlock(&mu);
	if (out == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		if (errs[i].code == code) {
			*out = desc ? errs[i].desc : errs[i].name;
			return CUDA_SUCCESS;
		}
	*out = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult code, const char **name) { return error_text("cuGetErrorName", code, name, 0); }

EXPORT CUresult cuGetErrorString(CUresult code, const char **desc) {
	return error_text("cuGetErrorString", code, desc, 1);
}

// ---- test controls ----

// fakecuda_fail makes the nth next call of fn (1 = the next one) fail with
// result, without effect (a synchronisation fails without waiting). It
// returns -1 if fn is not a function of the double.
EXPORT int fakecuda_fail(const char *fn, long nth, int result) {
	pthread_mutex_lock(&mu);
	struct fn_stat *s = stat_of(fn);
	if (s != NULL) {
		s->fail_in = nth;
		s->fail_with = result;
	}
	pthread_mutex_unlock(&mu);
	return s == NULL ? -1 : 0;
}

// fakecuda_calls returns how many times fn was called, or -1.
EXPORT long fakecuda_calls(const char *fn) {
	pthread_mutex_lock(&mu);
	struct fn_stat *s = stat_of(fn);
	long n = s == NULL ? -1 : s->calls;
	pthread_mutex_unlock(&mu);
	return n;
}

// fakecuda_live reports the live objects: allocations not yet freed (released
// or not), mappings, reservations, bytes of physical memory held, primary
// context references on all devices, streams and events created and not
// destroyed.
EXPORT void fakecuda_live(long *allocations, long *maps, long *resv, size_t *bytes, long *ctx_refs, long *nstreams,
                          long *nevents) {
	pthread_mutex_lock(&mu);
	*allocations = live_allocs;
	*maps = live_maps;
	*resv = live_resv;
	*bytes = used;
	long refs = 0;
	for (int i = 0; i < MAX_DEVICES; i++)
		refs += ctxs[i].refs;
	*ctx_refs = refs;
	*nstreams = live_streams;
	*nevents = live_events;
	pthread_mutex_unlock(&mu);
}

// fakecuda_set sets a knob: "capacity", "devices", "granularity", "vmm", "posix_fd",
// "rdma_vmm" (attribute 110), "dma_buf" (attribute 124),
// "version", "stub", "va_limit", "reuse_streams", "import_device" (1 + the device
// an imported allocation says it lives on; 0, the default: the importer's). It returns -1 for an
// unknown knob.
EXPORT int fakecuda_set(const char *knob, size_t value) {
	int rc = 0;
	pthread_mutex_lock(&mu);
	if (strcmp(knob, "capacity") == 0)
		capacity = value;
	else if (strcmp(knob, "devices") == 0)
		ndevices = value > MAX_DEVICES ? MAX_DEVICES : (int)value;
	else if (strcmp(knob, "granularity") == 0)
		granularity = value;
	else if (strcmp(knob, "vmm") == 0)
		vmm_supported = (int)value;
	else if (strcmp(knob, "posix_fd") == 0)
		posix_fd_supported = (int)value;
	else if (strcmp(knob, "rdma_vmm") == 0)
		rdma_vmm = (int)value;
	else if (strcmp(knob, "dma_buf") == 0)
		dma_buf = (int)value;
	else if (strcmp(knob, "version") == 0)
		driver_version = (int)value;
	else if (strcmp(knob, "stub") == 0)
		stub = value != 0;
	else if (strcmp(knob, "va_limit") == 0)
		va_limit = value;
	else if (strcmp(knob, "reuse_streams") == 0)
		reuse_streams = value != 0;
	else if (strcmp(knob, "import_device") == 0)
		import_device = value;
	else
		rc = -1;
	pthread_mutex_unlock(&mu);
	return rc;
}

// fakecuda_current returns the calling thread's current context (for tests
// of the binding's thread discipline).
EXPORT CUcontext fakecuda_current(void) { return current; }

// fakecuda_set_current binds ctx on the calling thread without counting a
// call (for tests that plant a foreign context).
EXPORT void fakecuda_set_current(CUcontext ctx) { current = ctx; }

// fakecuda_primary returns device dev's primary context, retained or not.
EXPORT CUcontext fakecuda_primary(int dev) { return dev >= 0 && dev < MAX_DEVICES ? &ctxs[dev] : NULL; }

// fakecuda_flags returns the creation flags of the live stream or event h, or
// -1 if h is neither.
EXPORT int fakecuda_flags(uintptr_t h) {
	int flags = -1;
	pthread_mutex_lock(&mu);
	for (struct fstream *s = streams; s != NULL; s = s->next)
		if (!s->legacy && !s->dead && s->handle == h)
			flags = (int)s->flags;
	for (struct fevent *e = events; e != NULL; e = e->next)
		if (!e->dead && e->handle == h)
			flags = (int)e->flags;
	pthread_mutex_unlock(&mu);
	return flags;
}

// fakecuda_foreign_stream creates a stream with flags in device dev's primary
// context, outside the binding, as the caller's own CUDA code would: it
// retains the primary context for the stream's life. It returns the CUstream,
// or 0 before cuInit or for a bad device or flags.
EXPORT uintptr_t fakecuda_foreign_stream(int dev, unsigned flags) {
	uintptr_t h = 0;
	pthread_mutex_lock(&mu);
	if (initialized && dev >= 0 && dev < ndevices && (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) == 0) {
		ctxs[dev].refs++;
		struct fstream *s = new_stream(&ctxs[dev], flags);
		s->foreign = 1;
		h = s->handle;
	}
	pthread_mutex_unlock(&mu);
	return h;
}

// fakecuda_destroy_foreign_stream destroys a stream fakecuda_foreign_stream
// made, as cuStreamDestroy_v2 would (queued work still runs), and releases
// the primary context it retained. It returns a CUresult.
EXPORT int fakecuda_destroy_foreign_stream(uintptr_t h) {
	pthread_mutex_lock(&mu);
	struct fstream *s = NULL;
	for (struct fstream *o = streams; o != NULL; o = o->next)
		if (o->foreign && !o->dead && o->handle == h)
			s = o;
	if (s == NULL) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	struct fake_ctx *c = s->ctx;
	kill_stream(s);
	if (--c->refs == 0)
		reset_ctx(c);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

// fakecuda_launch queues a stand-in kernel on stream h of the calling
// thread's context that reads and writes [p, p+n), which must be mapped with
// read-write access. The kernel starts when it reaches the head of its stream
// and stays unfinished until fakecuda_finish. It returns the kernel's id (at
// least 1), or minus the CUresult of a refusal.
EXPORT int fakecuda_launch(CUstream h, CUdeviceptr p, size_t n) {
	pthread_mutex_lock(&mu);
	CUresult rc = need_ctx();
	struct fstream *s = rc == CUDA_SUCCESS ? stream_of(h) : NULL;
	if (rc == CUDA_SUCCESS && s == NULL)
		rc = CUDA_ERROR_INVALID_HANDLE;
	if (rc == CUDA_SUCCESS && (n == 0 || !check_range(p, n, 3)))
		rc = CUDA_ERROR_INVALID_VALUE;
	if (rc != CUDA_SUCCESS) {
		pthread_mutex_unlock(&mu);
		return -rc;
	}
	struct item *it = calloc(1, sizeof *it);
	it->kind = ITEM_KERNEL;
	it->id = ++next_kernel;
	it->dst = p;
	it->n = n;
	int id = it->id;
	enqueue(s, it);
	pthread_mutex_unlock(&mu);
	return id;
}

// fakecuda_finish lets kernel id finish: at once if it has started, else when
// it reaches the head of its stream. It returns -1 if no such kernel is queued.
EXPORT int fakecuda_finish(int id) {
	int rc = -1;
	pthread_mutex_lock(&mu);
	for (struct fstream *s = streams; s != NULL && rc < 0; s = s->next)
		for (struct item *it = s->head; it != NULL; it = it->next)
			if (it->kind == ITEM_KERNEL && it->id == id) {
				it->released = 1;
				rc = 0;
				break;
			}
	if (rc == 0)
		progress();
	pthread_mutex_unlock(&mu);
	return rc;
}

// fakecuda_faults returns how many faults the double has seen (see the top
// of this file).
EXPORT long fakecuda_faults(void) {
	pthread_mutex_lock(&mu);
	long n = faults;
	pthread_mutex_unlock(&mu);
	return n;
}

#include <fcntl.h>

static int fcntl_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

// fakecuda_rdma reports whether allocation h was made GPUDirect RDMA
// capable: 1 or 0, or -1 when there is no such allocation.
EXPORT int fakecuda_rdma(CUmemGenericAllocationHandle h) {
	pthread_mutex_lock(&mu);
	struct alloc *a = find_alloc(h);
	int rc = a == NULL ? -1 : a->rdma;
	pthread_mutex_unlock(&mu);
	return rc;
}

// fakecuda_dmabufs returns how many dma-bufs cuMemGetHandleForAddressRange
// exported.
EXPORT long fakecuda_dmabufs(void) {
	pthread_mutex_lock(&mu);
	long n = dmabufs;
	pthread_mutex_unlock(&mu);
	return n;
}
