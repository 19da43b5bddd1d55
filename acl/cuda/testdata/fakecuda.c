// fakecuda.c: a test double of the CUDA driver library (libcuda.so.1) for the
// tests of package acl/cuda. It exports the symbols the binding resolves, with
// the prototypes, struct layouts and enum values of cuda.h (backends.md §B),
// and models the semantics the binding depends on:
//
//   - cuInit must come first (CUDA_ERROR_NOT_INITIALIZED otherwise);
//   - the current context is per thread; calls that need one fail with
//     CUDA_ERROR_INVALID_CONTEXT (201) without it, or when it is a primary
//     context whose last reference was released;
//   - cuMemMap maps only unmapped reserved address space, at offset 0, and
//     gives no access: copies into a mapping fail until cuMemSetAccess;
//   - cuMemUnmap takes whole mappings only; cuMemRelease is legal while the
//     allocation is mapped, and the memory goes when the last mapping does;
//   - cuMemCreate fails with CUDA_ERROR_OUT_OF_MEMORY past a capacity;
//   - structs are checked field by field at their cuda.h offsets, so a binding
//     that lays one out wrongly gets CUDA_ERROR_INVALID_VALUE.
//
// It is deliberately laxer than ACL where CUDA is (a mapping may be smaller
// than its allocation; one cuMemUnmap may cover several adjacent mappings), so
// the tests prove the binding enforces the ACL rules itself.
//
// "Device memory" is host memory from mmap; device addresses are the double's
// own integers, translated through its mapping table on every copy.
//
// Test controls (exported, prefixed fakecuda_), and environment variables read
// at load: FAKECUDA_CAPACITY (bytes), FAKECUDA_DEVICES (count),
// FAKECUDA_GRANULARITY (bytes), FAKECUDA_STUB=1 (behave as the toolkit's stub
// library: every call returns CUDA_ERROR_STUB_LIBRARY).

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef uint64_t CUmemGenericAllocationHandle;
typedef struct fake_ctx *CUcontext;

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
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

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
#define MAX_FAULTS 16
#define ATTR_UNIFIED_ADDRESSING 41
#define ATTR_VMM_SUPPORTED 102

// ---- global state, guarded by mu ----

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct fake_ctx {
	int device;
	int refs; // primary context retains
};

struct alloc {
	CUmemGenericAllocationHandle handle;
	size_t size;
	void *mem;
	int released; // cuMemRelease called
	int maps;     // live mappings
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

static int initialized;
static int stub;
static int ndevices = 1;
static int vmm_supported = 1;
static int driver_version = 12060;
static size_t granularity = 2u << 20;
static size_t capacity = (size_t)1 << 30;
static size_t used;           // bytes of physical memory held
static size_t va_limit = (size_t)1 << 42; // reservable bytes in all
static size_t va_used;
static CUdeviceptr va_next = 0x200000000000ull;
static struct fake_ctx ctxs[MAX_DEVICES];
static struct alloc *allocs;
static struct mapping *mappings;
static struct reservation *reservations;
static long live_allocs, live_maps, live_resv;

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
	{"cuMemSetAccess", 0, 0, 0}, {"cuMemcpyHtoD_v2", 0, 0, 0}, {"cuMemcpyDtoH_v2", 0, 0, 0}, {"cuMemcpyDtoD_v2", 0, 0, 0},
	{"cuMemsetD8_v2", 0, 0, 0}, {"cuMemGetInfo_v2", 0, 0, 0}, {"cuGetErrorName", 0, 0, 0}, {"cuGetErrorString", 0, 0, 0},
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

#define BEGIN(fn, check)                         \
	pthread_mutex_lock(&mu);                     \
	CUresult rc_ = enter(fn);                    \
	if (rc_ == CUDA_SUCCESS)                     \
		rc_ = (check);                           \
	if (rc_ != CUDA_SUCCESS) {                   \
		pthread_mutex_unlock(&mu);               \
		return rc_;                              \
	}

#define END(rc)                  \
	do {                         \
		CUresult r_ = (rc);      \
		pthread_mutex_unlock(&mu); \
		return r_;               \
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
	for (int i = 0; i < MAX_DEVICES; i++)
		ctxs[i].device = i;
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
	case ATTR_UNIFIED_ADDRESSING:
		*v = 1;
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
	ctxs[dev].refs--;
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

EXPORT CUresult cuCtxSynchronize(void) {
	BEGIN("cuCtxSynchronize", need_ctx());
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

static void free_alloc(struct alloc *a) {
	struct alloc **pp = &allocs;
	while (*pp != a)
		pp = &(*pp)->next;
	*pp = a->next;
	munmap(a->mem, a->size);
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
	void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (mem == MAP_FAILED)
		END(CUDA_ERROR_OUT_OF_MEMORY);
	struct alloc *a = calloc(1, sizeof *a);
	a->handle = new_handle();
	a->size = size;
	a->mem = mem;
	a->next = allocs;
	allocs = a;
	used += size;
	live_allocs++;
	*h = a->handle;
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

static struct mapping *mapping_at(CUdeviceptr va) {
	for (struct mapping *m = mappings; m != NULL; m = m->next)
		if (va >= m->va && va - m->va < m->size)
			return m;
	return NULL;
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

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
	BEGIN("cuMemUnmap", need_ctx());
	if (!whole_mappings(ptr, size))
		END(CUDA_ERROR_INVALID_VALUE);
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

// ---- copies ----

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

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	BEGIN("cuMemcpyHtoD_v2", need_ctx());
	if (n > 0 && src == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	if (!check_range(dst, n, 3))
		END(CUDA_ERROR_INVALID_VALUE);
	const unsigned char *s = src;
	while (n > 0) {
		size_t k = span(dst, 3);
		if (k > n)
			k = n;
		memcpy(host_ptr(dst, k, 3), s, k);
		dst += k;
		s += k;
		n -= k;
	}
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	BEGIN("cuMemcpyDtoH_v2", need_ctx());
	if (n > 0 && dst == NULL)
		END(CUDA_ERROR_INVALID_VALUE);
	if (!check_range(src, n, 1))
		END(CUDA_ERROR_INVALID_VALUE);
	unsigned char *d = dst;
	while (n > 0) {
		size_t k = span(src, 1);
		if (k > n)
			k = n;
		memcpy(d, host_ptr(src, k, 1), k);
		src += k;
		d += k;
		n -= k;
	}
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
	BEGIN("cuMemcpyDtoD_v2", need_ctx());
	if (!check_range(src, n, 1) || !check_range(dst, n, 3))
		END(CUDA_ERROR_INVALID_VALUE);
	unsigned char *tmp = malloc(n ? n : 1);
	size_t left = n;
	unsigned char *t = tmp;
	for (CUdeviceptr at = src; left > 0;) {
		size_t k = span(at, 1);
		if (k > left)
			k = left;
		memcpy(t, host_ptr(at, k, 1), k);
		at += k;
		t += k;
		left -= k;
	}
	left = n;
	t = tmp;
	for (CUdeviceptr at = dst; left > 0;) {
		size_t k = span(at, 3);
		if (k > left)
			k = left;
		memcpy(host_ptr(at, k, 3), t, k);
		at += k;
		t += k;
		left -= k;
	}
	free(tmp);
	END(CUDA_SUCCESS);
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
	BEGIN("cuMemsetD8_v2", need_ctx());
	if (!check_range(dst, n, 3))
		END(CUDA_ERROR_INVALID_VALUE);
	while (n > 0) {
		size_t k = span(dst, 3);
		if (k > n)
			k = n;
		memset(host_ptr(dst, k, 3), value, k);
		dst += k;
		n -= k;
	}
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
// result, without effect. It returns -1 if fn is not a function of the double.
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
// or not), mappings, reservations, bytes of physical memory held and primary
// context references on all devices.
EXPORT void fakecuda_live(long *allocations, long *maps, long *resv, size_t *bytes, long *ctx_refs) {
	pthread_mutex_lock(&mu);
	*allocations = live_allocs;
	*maps = live_maps;
	*resv = live_resv;
	*bytes = used;
	long refs = 0;
	for (int i = 0; i < MAX_DEVICES; i++)
		refs += ctxs[i].refs;
	*ctx_refs = refs;
	pthread_mutex_unlock(&mu);
}

// fakecuda_set sets a knob: "capacity", "devices", "granularity", "vmm",
// "version", "stub", "va_limit". It returns -1 for an unknown knob.
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
	else if (strcmp(knob, "version") == 0)
		driver_version = (int)value;
	else if (strcmp(knob, "stub") == 0)
		stub = value != 0;
	else if (strcmp(knob, "va_limit") == 0)
		va_limit = value;
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
