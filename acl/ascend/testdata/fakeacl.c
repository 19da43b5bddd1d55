// fakeacl.c: a test double of the Huawei Ascend ACL runtime (libascendcl.so /
// libacl_rt.so), for testing the purego binding in package acl/ascend without
// an NPU. It exports the aclrt* functions the binding uses, with the
// prototypes of acl_rt.h, and follows ACL's rules with ACL's error codes;
// where ACL's code is not documented it uses the code the host driver
// (acl/host) chose, so the conformance suite can run with ExactCodes.
//
// What it simulates:
//   - aclInit / aclFinalize, with 100002 on a repeated aclInit;
//   - devices (2 by default) with a reference-counted aclrtSetDevice /
//     aclrtResetDevice, one default context and one default stream per device;
//   - a per-thread current context: every call that needs one fails with
//     107002 on a thread that has none, as the real runtime does (the event
//     query, synchronise and destroy calls need none, as in the runtime);
//   - a per-thread aclGetRecentErrMsg that is cleared when read;
//   - the VMM calls: 2 MiB / 1 GiB granularity, exact map and unmap rules,
//     reference-counted physical memory, OOM (207001) at a per-device
//     capacity, device addresses that the host cannot dereference (they lie in
//     the SVM window at 16 TB, as on the device); physical memory is not zeroed;
//   - device work in flight, as acl/host/streams.go models it: each stream is
//     a FIFO of work that runs in order; aclrtMemsetAsync and device-to-device
//     aclrtMemcpyAsync run when they reach the head of their stream; stand-in
//     kernels (fakeacl_launch) stay at the head until a test finishes them
//     (fakeacl_finish), from any thread. Events complete when the work queued
//     before their record has run; aclrtSynchronize{Stream,Event,Device}
//     block until then;
//   - faults, counted by fakeacl_faults: unmapping a range that queued or
//     running work touches succeeds, fails that work (a memset or copy that
//     has not run then writes nothing) and gives its stream a sticky error,
//     507899, returned by its next synchronisation; a synchronous copy or
//     memset of a range that queued work touches is a race;
//   - aclrtMemcpy / aclrtMemcpyAsync / aclrtMemset through the mappings, with
//     the VMM rule that device-to-device copies of reserved memory go through
//     aclrtMemcpyAsync only, 64-byte aligned;
//   - sharing between processes, as the runtime's books keep it: one loaded
//     double is one device, and fakeacl_set_pid says which process the calls
//     that follow come from (getpid() until then). aclrtMemExportToShareableHandle
//     gives a token; aclrtMemSetPidToShareableHandle (the exporter only) sets
//     its allow-list; aclrtMemImportFromShareableHandle, from another process
//     on the list (or any, with DISABLE_PID_VALIDATION), gives a handle to the
//     same memory, and the same handle with one more reference when that
//     process imports the token again. The memory lives until every handle to
//     it is freed and unmapped. Codes: export twice, export of an import,
//     import by the exporter, import by a process not on the list, set-pid by
//     another process 507899; an unknown or freed token 107017; set-pid on an
//     export without validation 207006; export flags above 1 107000.
//
// Test-only functions (fakeacl_*) configure it, inject faults, queue and
// finish stand-in kernels, report live objects and expose the C struct
// layouts. fakeacl_foreign_stream makes a stream outside the binding, as the
// caller's own CANN code would: it sets the device (a reference of its own,
// as aclrtSetDevice takes) and creates a stream in the device's default
// context. Such a stream is not counted among the aclrtCreateStream streams
// but in fakeacl_stats_t.foreign_streams; only fakeacl_destroy_foreign_stream
// destroys it (aclrtDestroyStream refuses it, so that a binding that destroys
// a stream it did not create fails its tests). Streams are never freed, so a
// stale handle reads as destroyed, unless fakeacl_set_reuse_streams(1): then
// a new stream is the stream destroyed last, as a pointer freed and
// allocated again would be. Build variants:
//   -DFAKEACL_NO_SETACCESS   no aclrtMemSetAccess symbol (CANN before 8.5)
//   -DFAKEACL_NO_MAPMEM      no aclrtMapMem symbol (a broken install)
//   -DFAKEACL_NO_EVENTS      none of the event calls (an old runtime)
//   -DFAKEACL_NO_STREAMQUERY no aclrtStreamQuery
//   -DFAKEACL_NO_SHARE       none of the sharing calls (an old runtime)
//   -DFAKEACL_COMPAT_ONLY    no ACL symbol at all: the libascendcl.so of a
//                            split install whose aclrt* live in libacl_rt.so
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

#ifdef FAKEACL_COMPAT_ONLY
API int fakeacl_compat_stub = 1;
#else

// ---- acl_base_rt.h / acl_rt.h types, with their C layouts on LP64 ----

typedef int aclError;
typedef void *aclrtDrvMemHandle;
typedef void *aclrtContext;
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef enum { ACL_EVENT_RECORDED_STATUS_NOT_READY = 0, ACL_EVENT_RECORDED_STATUS_COMPLETE = 1 } aclrtEventRecordedStatus;
typedef enum {
    ACL_STREAM_STATUS_COMPLETE = 0, ACL_STREAM_STATUS_NOT_READY = 1, ACL_STREAM_STATUS_RESERVED = 0xFFFF,
} aclrtStreamStatus;
typedef enum { ACL_MEM_HANDLE_TYPE_NONE = 0, ACL_MEM_HANDLE_TYPE_POSIX = 2 } aclrtMemHandleType;
typedef enum { ACL_MEM_ALLOCATION_TYPE_PINNED = 0 } aclrtMemAllocationType;
typedef enum {
    ACL_MEM_LOCATION_TYPE_HOST = 0,
    ACL_MEM_LOCATION_TYPE_DEVICE = 1,
    ACL_MEM_LOCATION_TYPE_UNREGISTERED = 2,
    ACL_MEM_LOCATION_TYPE_MANAGED = 3,
    ACL_MEM_LOCATION_TYPE_HOST_NUMA = 4,
} aclrtMemLocationType;
typedef enum {
    ACL_DDR_MEM, ACL_HBM_MEM, ACL_DDR_MEM_HUGE, ACL_DDR_MEM_NORMAL, ACL_HBM_MEM_HUGE, ACL_HBM_MEM_NORMAL,
    ACL_DDR_MEM_P2P_HUGE, ACL_DDR_MEM_P2P_NORMAL, ACL_HBM_MEM_P2P_HUGE, ACL_HBM_MEM_P2P_NORMAL,
    ACL_HBM_MEM_HUGE1G, ACL_HBM_MEM_P2P_HUGE1G, ACL_MEM_NORMAL, ACL_MEM_HUGE, ACL_MEM_HUGE1G,
    ACL_MEM_P2P_NORMAL, ACL_MEM_P2P_HUGE, ACL_MEM_P2P_HUGE1G,
} aclrtMemAttr;
typedef enum {
    ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
    ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF = 0xFFFF,
} aclrtMemGranularityOptions;
typedef enum {
    ACL_RT_MEM_ACCESS_FLAGS_NONE = 0, ACL_RT_MEM_ACCESS_FLAGS_READ = 1, ACL_RT_MEM_ACCESS_FLAGS_READWRITE = 3,
} aclrtMemAccessFlags;
typedef enum {
    ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_DEVICE_TO_DEVICE,
    ACL_MEMCPY_DEFAULT, ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE, ACL_MEMCPY_INNER_DEVICE_TO_DEVICE,
    ACL_MEMCPY_INTER_DEVICE_TO_DEVICE,
} aclrtMemcpyKind;

typedef struct aclrtMemLocation {
    uint32_t id;
    aclrtMemLocationType type;
} aclrtMemLocation;

typedef struct aclrtPhysicalMemProp {
    aclrtMemHandleType handleType;
    aclrtMemAllocationType allocationType;
    aclrtMemAttr memAttr;
    aclrtMemLocation location;
    uint64_t reserve;
} aclrtPhysicalMemProp;

typedef struct {
    aclrtMemAccessFlags flags;
    aclrtMemLocation location;
    uint8_t rsv[12];
} aclrtMemAccessDesc;

_Static_assert(sizeof(aclrtMemLocation) == 8, "aclrtMemLocation is 8 bytes");
_Static_assert(sizeof(aclrtPhysicalMemProp) == 32, "aclrtPhysicalMemProp is 32 bytes");
_Static_assert(offsetof(aclrtPhysicalMemProp, reserve) == 24, "reserve at 24");
_Static_assert(sizeof(aclrtMemAccessDesc) == 24, "aclrtMemAccessDesc is 24 bytes");

// ---- error codes (acl_base_rt.h, rt_error_codes.h) ----

enum {
    ACL_SUCCESS = 0,
    ACL_ERROR_INVALID_PARAM = 100000,
    ACL_ERROR_UNINITIALIZE = 100001,
    ACL_ERROR_REPEAT_INITIALIZE = 100002,
    ACL_ERROR_REPEAT_FINALIZE = 100037,
    ACL_ERROR_RT_PARAM_INVALID = 107000,
    ACL_ERROR_RT_INVALID_DEVICEID = 107001,
    ACL_ERROR_RT_CONTEXT_NULL = 107002,
    ACL_ERROR_RT_INVALID_HANDLE = 107017,
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000,
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
    ACL_ERROR_RT_NO_PERMISSION = 207006,
    ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899,
};

#define MAXDEV 8
#define PAGE_2M ((size_t)2 << 20)
#define PAGE_1G ((size_t)1 << 30)
#define MAX_RESERVE ((size_t)128 << 30)
#define SVM_START ((uintptr_t)0x100000000000ULL) // 16 TB
#define SVM_SIZE ((uintptr_t)0x80000000000ULL)   // 8 TB

// ---- state; all of it under mu, except the thread-locals ----

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
// cv is broadcast whenever device work finishes, or a device is reset: the
// synchronise calls wait on it.
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

#define CTX_MAGIC 0xacc7acc7acc7acc7ULL

struct stream;

struct ctx {
    uint64_t magic; // CTX_MAGIC: contexts are never freed, so stale pointers stay checkable
    int dev;
    int alive;
    struct stream *defstream; // the default stream, which NULL names
};

enum work_kind { WORK_KERNEL, WORK_MEMSET, WORK_COPY };

// work is one piece of device work queued on a stream.
struct work {
    struct work *next;
    enum work_kind kind;
    uint64_t seq;                // its position in its stream, from 1
    int id;                      // kernels: the id fakeacl_finish takes
    int released;                // kernels: fakeacl_finish was called
    uintptr_t lo[2], hi[2];      // the ranges it touches: [lo, hi)
    int nranges;
    int value;                   // memsets
    uintptr_t dst, src;          // copies (device to device)
    size_t count;                // memsets and copies
    int faulted;                 // a range was unmapped while it was queued or running
};

// stream is a FIFO of device work. Streams are never freed, so that a stale
// handle stays checkable (it reads as destroyed, never as another stream).
struct stream {
    struct stream *next_all;     // every stream ever made
    int dev;
    int alive;
    int is_default;
    int foreign;                 // made by fakeacl_foreign_stream
    struct work *head, *tail;    // queued and not finished; head may be running
    uint64_t queued, finished;   // seq of the last work queued, finished
    aclError err;                // the first fault since the last synchronisation
};

// event is a position in a stream's queue. Events are never freed either.
struct event {
    struct event *next_all;
    int dev;
    int alive;
    struct stream *st;           // NULL until recorded
    uint64_t seq;                // complete once st->finished reaches it
};

struct handle {
    uintptr_t id;
    size_t size;
    size_t page;
    int dev;
    int refs;   // the owners' references, plus one per mapping and per import of it
    int owners; // references aclrtFreePhysical drops: one, plus one per further import
    int freed;  // aclrtFreePhysical dropped the last owner's reference
    unsigned char *mem;
    int pid;                // the process that holds it (fakeacl_set_pid)
    struct handle *origin;  // an import: the exported handle whose memory it is
    int exported;           // aclrtMemExportToShareableHandle gave token
    uint64_t token;
    uint64_t export_flags;
    int32_t allowed[16];    // the allow-list
    size_t nallowed;
};

struct mapping {
    uintptr_t addr;
    size_t size;
    struct handle *h;
};

struct resv {
    uintptr_t base;
    size_t size;
    struct mapping *maps; // sorted by addr
    int nmaps, capmaps;
};

// The live-object counts, laid out like acl.LiveCounts on LP64.
typedef struct {
    int64_t reservations;
    uint64_t reserved_bytes;
    int64_t mappings;
    uint64_t mapped_bytes;
    int64_t handles;
    uint64_t physical_bytes;
    int64_t imported;        // of handles, those imported (aclrtMemImportFromShareableHandle)
    uint64_t imported_bytes; // of physical_bytes, those of imported handles
    int64_t streams; // created with aclrtCreateStream and not destroyed
    int64_t events;  // created with aclrtCreateEvent and not destroyed
    int64_t host_buffers; // made by aclrtMallocHost and not freed
    uint64_t host_bytes;  // their bytes
} fakeacl_live_t;

// Everything else a test asserts on.
typedef struct {
    int64_t initialised;       // aclInit in effect
    int64_t init_calls;        // successful aclInit calls
    int64_t finalize_calls;    // successful aclFinalize calls
    int64_t device_refs;       // sum of the aclrtSetDevice reference counts
    int64_t contexts_alive;    // default contexts of devices that are set
    int64_t streams_alive;     // streams created and not destroyed
    int64_t sync_device_calls; // successful aclrtSynchronizeDevice calls
    int64_t pending_work;      // work queued on streams and not finished
    int64_t faults;            // what fakeacl_faults returns
    int64_t no_context_errors; // calls refused with 107002 for want of a context
    int64_t set_context_calls; // aclrtSetCurrentContext calls
    int64_t threads_seen;      // OS threads that made calls needing a context
    int64_t foreign_streams;   // streams made by fakeacl_foreign_stream and not destroyed
} fakeacl_stats_t;

static int initialised;
static int64_t init_calls, finalize_calls, sync_calls, faults, no_ctx_errors, set_ctx_calls;
static uint32_t device_count = 2;
static size_t capacity[MAXDEV];
static size_t phys[MAXDEV];
static int dev_refs[MAXDEV];
static struct ctx *dev_ctx[MAXDEV];
static struct stream *all_streams;
static struct event *all_events;
static int next_kernel;
static int no_setaccess;
static int reuse_streams;              // a new stream is the one destroyed last (last_destroyed)
static struct stream *last_destroyed;  // the stream destroyed last, or NULL
static int64_t foreign_streams;

static struct resv **resvs; // sorted by base
static int nresv, capresv;
static struct handle **handles;
static int nhandles, caphandles;
static uintptr_t next_handle = 0x7e0000000000ULL;
// Handle values freed, the last freed on top: the runtime's handles are
// pointers to its own records, whose memory its heap hands out again, so a
// freed handle's value comes back with a later allocation. new_handle_id
// hands out the last freed value first.
static uintptr_t *freed_ids;
static int nfreed_ids, capfreed_ids;
static int cur_pid; // the process the calls come from
static fakeacl_live_t live;

static aclrtPhysicalMemProp last_prop;
static aclrtMemAccessDesc last_desc[4];
static size_t last_desc_count;

static __thread struct ctx *cur;
static __thread char errmsg[512];
static __thread char errout[512];
static __thread int has_err;
static __thread int thread_seen;
static int64_t threads_seen;

#define GROW(arr, n, cap)                                                   \
    do {                                                                    \
        if ((n) == (cap)) {                                                 \
            (cap) = (cap) ? 2 * (cap) : 16;                                 \
            void *p_ = realloc((arr), (size_t)(cap) * sizeof(*(arr)));      \
            if (!p_) abort();                                               \
            (arr) = p_;                                                     \
        }                                                                   \
    } while (0)

// fail records the thread's error message and returns code.
static aclError fail(const char *fn, aclError code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static aclError fail(const char *fn, aclError code, const char *fmt, ...) {
    int n = snprintf(errmsg, sizeof errmsg, "fakeacl %s: ", fn);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg + n, sizeof errmsg - (size_t)n, fmt, ap);
    va_end(ap);
    has_err = 1;
    return code;
}

// ---- fault injection: the nth next call of a function fails with a code ----

struct inject {
    char fn[64];
    int countdown;
    aclError code;
};
static struct inject injects[16];

// injected reports the code the current call of fn must fail with, or 0.
// Caller holds mu.
static aclError injected(const char *fn) {
    for (size_t i = 0; i < sizeof injects / sizeof injects[0]; i++) {
        struct inject *in = &injects[i];
        if (in->countdown > 0 && strcmp(in->fn, fn) == 0 && --in->countdown == 0) {
            return in->code;
        }
    }
    return 0;
}

// enter runs the checks every call that needs a context starts with. It takes
// mu; a non-zero result means mu was released and the call fails with it.
static aclError enter(const char *fn) {
    pthread_mutex_lock(&mu);
    if (!initialised) {
        pthread_mutex_unlock(&mu);
        return fail(fn, ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    }
    if (cur == NULL || !cur->alive) {
        no_ctx_errors++;
        pthread_mutex_unlock(&mu);
        return fail(fn, ACL_ERROR_RT_CONTEXT_NULL,
                    "this thread has no current context: call aclrtSetDevice or aclrtSetCurrentContext on it first");
    }
    if (!thread_seen) {
        thread_seen = 1;
        threads_seen++;
    }
    aclError c = injected(fn);
    if (c) {
        pthread_mutex_unlock(&mu);
        return fail(fn, c, "injected fault");
    }
    return ACL_SUCCESS;
}

#define ENTER()                              \
    do {                                     \
        aclError e_ = enter(__func__);       \
        if (e_) return e_;                   \
    } while (0)

// enter_noctx is enter for the calls that the runtime serves without a
// current context (querying, synchronising and destroying an event).
__attribute__((unused)) static aclError enter_noctx(const char *fn) {
    pthread_mutex_lock(&mu);
    if (!initialised) {
        pthread_mutex_unlock(&mu);
        return fail(fn, ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    }
    aclError c = injected(fn);
    if (c) {
        pthread_mutex_unlock(&mu);
        return fail(fn, c, "injected fault");
    }
    return ACL_SUCCESS;
}

#define ENTER_NOCTX()                        \
    do {                                     \
        aclError e_ = enter_noctx(__func__); \
        if (e_) return e_;                   \
    } while (0)

// RET releases mu and returns.
#define RET(x)                               \
    do {                                     \
        aclError r_ = (x);                   \
        pthread_mutex_unlock(&mu);           \
        return r_;                           \
    } while (0)
#define FAIL(code, ...) RET(fail(__func__, (code), __VA_ARGS__))

// ---- device work ----

static int check_mapped(uintptr_t addr, size_t n);
static void dev_copy(uintptr_t addr, unsigned char *host, size_t n, int to_dev);

// new_stream makes a stream of dev. Caller holds mu.
static struct stream *new_stream(int dev, int is_default) {
    if (reuse_streams && !is_default && last_destroyed != NULL) {
        struct stream *st = last_destroyed; // drained: destroyed streams have no work
        last_destroyed = NULL;
        st->dev = dev;
        st->alive = 1;
        st->foreign = 0;
        st->err = ACL_SUCCESS;
        return st;
    }
    struct stream *st = calloc(1, sizeof *st); // never freed: see struct stream
    if (st == NULL) abort();
    st->dev = dev;
    st->alive = 1;
    st->is_default = is_default;
    st->next_all = all_streams;
    all_streams = st;
    return st;
}

// find_stream returns the stream s points to if it is one of ours, alive or
// not, without reading through a pointer that is not. Caller holds mu.
static struct stream *find_stream(aclrtStream s) {
    for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
        if (st == s) return st;
    }
    return NULL;
}

// resolve_stream returns the live stream a call on the current context names
// (NULL: the context's default stream), or records why not and returns NULL.
// Caller holds mu, after ENTER.
static struct stream *resolve_stream(const char *fn, aclrtStream s, aclError *code) {
    if (s == NULL) return cur->defstream;
    struct stream *st = find_stream(s);
    if (st == NULL || !st->alive) {
        *code = fail(fn, ACL_ERROR_RT_PARAM_INVALID, "%p is not a live stream", s);
        return NULL;
    }
    if (st->dev != cur->dev) {
        *code = fail(fn, ACL_ERROR_RT_PARAM_INVALID, "stream %p of device %d used on device %d", s, st->dev, cur->dev);
        return NULL;
    }
    return st;
}

__attribute__((unused)) static struct event *find_event(aclrtEvent e) {
    for (struct event *ev = all_events; ev != NULL; ev = ev->next_all) {
        if (ev == e) return ev;
    }
    return NULL;
}

static int overlaps(const struct work *w, uintptr_t lo, uintptr_t hi) {
    for (int i = 0; i < w->nranges; i++) {
        if (w->lo[i] < hi && lo < w->hi[i]) return 1;
    }
    return 0;
}

// enqueue puts w at the end of st's queue and runs what can run. Caller
// holds mu.
static void advance(struct stream *st);
static void enqueue(struct stream *st, struct work *w) {
    w->seq = ++st->queued;
    if (st->tail != NULL) {
        st->tail->next = w;
    } else {
        st->head = w;
    }
    st->tail = w;
    advance(st);
}

// execute runs a memset or copy that reached the head of its stream. Work
// whose range was unmapped writes nothing.
static void execute(struct work *w) {
    if (w->faulted) return;
    switch (w->kind) {
    case WORK_MEMSET: {
        if (!check_mapped(w->lo[0], w->count)) return;
        unsigned char buf[4096];
        memset(buf, w->value, sizeof buf);
        for (size_t off = 0; off < w->count; off += sizeof buf) {
            size_t k = w->count - off < sizeof buf ? w->count - off : sizeof buf;
            dev_copy(w->lo[0] + off, buf, k, 1);
        }
        break;
    }
    case WORK_COPY: {
        if (!check_mapped(w->dst, w->count) || !check_mapped(w->src, w->count)) return;
        unsigned char *tmp = malloc(w->count);
        if (tmp == NULL) abort();
        dev_copy(w->src, tmp, w->count, 0);
        dev_copy(w->dst, tmp, w->count, 1);
        free(tmp);
        break;
    }
    case WORK_KERNEL:
        break; // it touched its range while it ran
    }
}

// advance runs the work at the head of st until it meets a kernel that is
// still running. Caller holds mu.
static void advance(struct stream *st) {
    int progressed = 0;
    while (st->head != NULL) {
        struct work *w = st->head;
        if (w->kind == WORK_KERNEL && !w->released) break;
        execute(w);
        st->head = w->next;
        if (st->head == NULL) st->tail = NULL;
        st->finished = w->seq;
        if (w->faulted && st->err == ACL_SUCCESS) st->err = ACL_ERROR_RT_DRV_INTERNAL_ERROR;
        free(w);
        progressed = 1;
    }
    if (progressed) pthread_cond_broadcast(&cv);
}

// drop_work forgets the work queued on st, as a device reset does.
static void drop_work(struct stream *st) {
    while (st->head != NULL) {
        struct work *w = st->head;
        st->head = w->next;
        free(w);
    }
    st->tail = NULL;
    st->finished = st->queued;
}

// fault_unmap fails the work that touches [lo, hi), which is being unmapped:
// the work's stream reports it when the work finishes.
static void fault_unmap(uintptr_t lo, uintptr_t hi) {
    for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
        for (struct work *w = st->head; w != NULL; w = w->next) {
            if (!w->faulted && overlaps(w, lo, hi)) {
                w->faulted = 1;
                faults++; // the device would touch unmapped memory: an illegal-address fault
            }
        }
    }
}

// race_check counts a fault if queued or running work touches [lo, hi),
// which a synchronous call is about to touch: a data race on a device.
static void race_check(uintptr_t lo, size_t n) {
    for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
        for (struct work *w = st->head; w != NULL; w = w->next) {
            if (overlaps(w, lo, lo + n)) {
                faults++;
                return;
            }
        }
    }
}

// ---- init, devices, contexts ----

API aclError aclInit(const char *configPath) {
    (void)configPath;
    pthread_mutex_lock(&mu);
    aclError c = injected(__func__);
    if (c) FAIL(c, "injected fault");
    if (initialised) FAIL(ACL_ERROR_REPEAT_INITIALIZE, "aclInit was already called");
    initialised = 1;
    init_calls++;
    RET(ACL_SUCCESS);
}

API aclError aclFinalize(void) {
    pthread_mutex_lock(&mu);
    if (!initialised) FAIL(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize without aclInit");
    initialised = 0;
    finalize_calls++;
    RET(ACL_SUCCESS);
}

API const char *aclGetRecentErrMsg(void) {
    if (!has_err) return NULL;
    memcpy(errout, errmsg, sizeof errout);
    has_err = 0;
    errmsg[0] = 0;
    return errout;
}

API aclError aclrtGetDeviceCount(uint32_t *count) {
    pthread_mutex_lock(&mu);
    if (!initialised) FAIL(ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    if (count == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "count is NULL");
    aclError c = injected(__func__);
    if (c) FAIL(c, "injected fault");
    *count = device_count;
    RET(ACL_SUCCESS);
}

// acquire_device takes a reference to device dev, creating its default
// context with the first. Caller holds mu.
static void acquire_device(int dev) {
    if (dev_ctx[dev] == NULL) {
        struct ctx *c = calloc(1, sizeof *c); // never freed: see struct ctx
        if (c == NULL) abort();
        c->magic = CTX_MAGIC;
        c->dev = dev;
        c->alive = 1;
        c->defstream = new_stream(dev, 1);
        dev_ctx[dev] = c;
    }
    dev_refs[dev]++;
}

// release_device drops a reference to device dev; the last one resets it.
// Caller holds mu.
static void release_device(int dev) {
    if (--dev_refs[dev] > 0) return;
    // The default context goes, and with it the device's streams, their
    // work and its events.
    for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
        if (st->dev != dev || !st->alive) continue;
        drop_work(st);
        st->alive = 0;
        if (st->foreign) {
            foreign_streams--;
        } else if (!st->is_default) {
            live.streams--;
        }
    }
    for (struct event *ev = all_events; ev != NULL; ev = ev->next_all) {
        if (ev->dev == dev && ev->alive) {
            ev->alive = 0;
            live.events--;
        }
    }
    pthread_cond_broadcast(&cv);
    dev_ctx[dev]->alive = 0;
    if (cur == dev_ctx[dev]) cur = NULL;
    dev_ctx[dev] = NULL;
}

API aclError aclrtSetDevice(int32_t deviceId) {
    pthread_mutex_lock(&mu);
    if (!initialised) FAIL(ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    if (deviceId < 0 || (uint32_t)deviceId >= device_count)
        FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d: %u devices", deviceId, device_count);
    aclError c = injected(__func__);
    if (c) FAIL(c, "injected fault");
    acquire_device(deviceId);
    cur = dev_ctx[deviceId];
    RET(ACL_SUCCESS);
}

API aclError aclrtResetDevice(int32_t deviceId) {
    pthread_mutex_lock(&mu);
    if (!initialised) FAIL(ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    if (deviceId < 0 || (uint32_t)deviceId >= device_count)
        FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d: %u devices", deviceId, device_count);
    if (dev_refs[deviceId] == 0) FAIL(ACL_ERROR_RT_PARAM_INVALID, "device %d was not set", deviceId);
    release_device(deviceId);
    RET(ACL_SUCCESS);
}

API aclError aclrtGetDevice(int32_t *deviceId) {
    ENTER();
    if (deviceId == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "deviceId is NULL");
    *deviceId = cur->dev;
    RET(ACL_SUCCESS);
}

API aclError aclrtGetCurrentContext(aclrtContext *context) {
    ENTER();
    if (context == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "context is NULL");
    *context = cur;
    RET(ACL_SUCCESS);
}

API aclError aclrtSetCurrentContext(aclrtContext context) {
    pthread_mutex_lock(&mu);
    set_ctx_calls++;
    if (!initialised) FAIL(ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    struct ctx *c = context;
    if (c == NULL || c->magic != CTX_MAGIC) FAIL(ACL_ERROR_INVALID_PARAM, "%p is not a context", context);
    if (!c->alive) FAIL(ACL_ERROR_RT_CONTEXT_NULL, "context %p: its device was reset", context);
    aclError code = injected(__func__);
    if (code) FAIL(code, "injected fault");
    cur = c;
    RET(ACL_SUCCESS);
}

// ---- streams and events ----

API aclError aclrtCreateStream(aclrtStream *stream) {
    ENTER();
    if (stream == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "stream is NULL");
    *stream = new_stream(cur->dev, 0);
    live.streams++;
    RET(ACL_SUCCESS);
}

API aclError aclrtDestroyStream(aclrtStream stream) {
    ENTER();
    if (stream == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "stream is NULL");
    struct stream *st = find_stream(stream);
    if (st == NULL || !st->alive || st->is_default) FAIL(ACL_ERROR_RT_PARAM_INVALID, "%p is not a live stream", stream);
    if (st->foreign)
        FAIL(ACL_ERROR_RT_PARAM_INVALID, "stream %p belongs to other code (fakeacl_foreign_stream): not for this caller to destroy",
             stream);
    if (st->head != NULL)
        FAIL(ACL_ERROR_RT_PARAM_INVALID, "stream %p has %llu tasks pending: synchronise it first", stream,
             (unsigned long long)(st->queued - st->finished));
    st->alive = 0;
    live.streams--;
    last_destroyed = st;
    RET(ACL_SUCCESS);
}

// sync_err returns and clears the sticky error of st, as the error of fn.
static aclError sync_err(const char *fn, struct stream *st) {
    aclError e = st->err;
    st->err = ACL_SUCCESS;
    if (e == ACL_SUCCESS) return ACL_SUCCESS;
    return fail(fn, e, "device work on stream %p touched memory after it was unmapped (illegal address)", (void *)st);
}

API aclError aclrtSynchronizeStream(aclrtStream stream) {
    ENTER();
    aclError code = 0;
    struct stream *st = resolve_stream(__func__, stream, &code);
    if (st == NULL) RET(code);
    while (st->alive && st->head != NULL) pthread_cond_wait(&cv, &mu);
    RET(sync_err(__func__, st));
}

#ifndef FAKEACL_NO_STREAMQUERY
API aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status) {
    ENTER();
    if (status == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "status is NULL");
    aclError code = 0;
    struct stream *st = resolve_stream(__func__, stream, &code);
    if (st == NULL) RET(code);
    *status = st->head != NULL ? ACL_STREAM_STATUS_NOT_READY : ACL_STREAM_STATUS_COMPLETE;
    RET(ACL_SUCCESS);
}
#endif

API aclError aclrtSynchronizeDevice(void) {
    ENTER();
    int dev = cur->dev;
    for (;;) {
        int busy = 0;
        for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
            if (st->alive && st->dev == dev && st->head != NULL) busy = 1;
        }
        if (!busy || !cur->alive) break;
        pthread_cond_wait(&cv, &mu);
    }
    sync_calls++;
    aclError first = ACL_SUCCESS;
    for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
        if (st->dev != dev || !st->alive) continue;
        aclError e = sync_err(__func__, st);
        if (first == ACL_SUCCESS) first = e;
    }
    RET(first);
}

#ifndef FAKEACL_NO_EVENTS
API aclError aclrtCreateEvent(aclrtEvent *event) {
    ENTER();
    if (event == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "event is NULL");
    struct event *ev = calloc(1, sizeof *ev); // never freed: see struct event
    if (ev == NULL) abort();
    ev->dev = cur->dev;
    ev->alive = 1;
    ev->next_all = all_events;
    all_events = ev;
    live.events++;
    *event = ev;
    RET(ACL_SUCCESS);
}

// live_event returns the live event e, or records why not. Caller holds mu.
static struct event *live_event(const char *fn, aclrtEvent e, aclError *code) {
    if (e == NULL) {
        *code = fail(fn, ACL_ERROR_INVALID_PARAM, "event is NULL");
        return NULL;
    }
    struct event *ev = find_event(e);
    if (ev == NULL || !ev->alive) {
        *code = fail(fn, ACL_ERROR_RT_PARAM_INVALID, "%p is not a live event", e);
        return NULL;
    }
    return ev;
}

static int event_complete(const struct event *ev) { return ev->st != NULL && ev->st->finished >= ev->seq; }

API aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
    ENTER();
    aclError code = 0;
    struct event *ev = live_event(__func__, event, &code);
    if (ev == NULL) RET(code);
    struct stream *st = resolve_stream(__func__, stream, &code);
    if (st == NULL) RET(code);
    ev->st = st;
    ev->seq = st->queued;
    RET(ACL_SUCCESS);
}

API aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status) {
    ENTER_NOCTX();
    aclError code = 0;
    struct event *ev = live_event(__func__, event, &code);
    if (ev == NULL) RET(code);
    if (status == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "status is NULL");
    *status = event_complete(ev) ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    RET(ACL_SUCCESS);
}

API aclError aclrtSynchronizeEvent(aclrtEvent event) {
    ENTER_NOCTX();
    aclError code = 0;
    struct event *ev = live_event(__func__, event, &code);
    if (ev == NULL) RET(code);
    // An event never recorded returns at once, as in the runtime.
    while (ev->alive && ev->st != NULL && !event_complete(ev)) pthread_cond_wait(&cv, &mu);
    RET(ACL_SUCCESS);
}

API aclError aclrtDestroyEvent(aclrtEvent event) {
    ENTER_NOCTX();
    aclError code = 0;
    struct event *ev = live_event(__func__, event, &code);
    if (ev == NULL) RET(code);
    ev->alive = 0;
    live.events--;
    RET(ACL_SUCCESS);
}
#endif

// ---- physical memory ----

static struct handle *find_handle(aclrtDrvMemHandle h) {
    for (int i = 0; i < nhandles; i++) {
        if (handles[i]->id == (uintptr_t)h) return handles[i];
    }
    return NULL;
}

// new_handle_id returns a handle value no live handle has: the last one
// freed, else a fresh one.
static uintptr_t new_handle_id(void) {
    if (nfreed_ids > 0) return freed_ids[--nfreed_ids];
    next_handle += 0x40;
    return next_handle;
}

static void free_handle_id(uintptr_t id) {
    if (nfreed_ids == capfreed_ids) {
        capfreed_ids = capfreed_ids ? 2 * capfreed_ids : 64;
        freed_ids = realloc(freed_ids, (size_t)capfreed_ids * sizeof *freed_ids);
        if (freed_ids == NULL) abort();
    }
    freed_ids[nfreed_ids++] = id;
}

static void unref(struct handle *h) {
    if (--h->refs > 0) return;
    for (int i = 0; i < nhandles; i++) {
        if (handles[i] == h) {
            handles[i] = handles[--nhandles];
            break;
        }
    }
    free_handle_id(h->id);
    live.physical_bytes -= h->size;
    if (h->origin != NULL) { // an import: the memory is its origin's
        live.imported_bytes -= h->size;
        struct handle *o = h->origin;
        free(h);
        unref(o);
        return;
    }
    phys[h->dev] -= h->size;
    munmap(h->mem, h->size);
    free(h);
}

static int is_ddr(aclrtMemAttr a) {
    return a == ACL_DDR_MEM || a == ACL_DDR_MEM_HUGE || a == ACL_DDR_MEM_NORMAL || a == ACL_DDR_MEM_P2P_HUGE ||
           a == ACL_DDR_MEM_P2P_NORMAL;
}

static int is_huge1g(aclrtMemAttr a) {
    return a == ACL_HBM_MEM_HUGE1G || a == ACL_HBM_MEM_P2P_HUGE1G || a == ACL_MEM_HUGE1G || a == ACL_MEM_P2P_HUGE1G;
}

static int physical_supported(aclrtMemAttr a) {
    switch (a) {
    case ACL_HBM_MEM_HUGE: case ACL_HBM_MEM_NORMAL: case ACL_HBM_MEM_HUGE1G: case ACL_DDR_MEM_HUGE:
    case ACL_DDR_MEM_NORMAL: case ACL_DDR_MEM_P2P_HUGE: case ACL_DDR_MEM_P2P_NORMAL: case ACL_MEM_NORMAL:
    case ACL_MEM_HUGE: case ACL_MEM_HUGE1G: case ACL_MEM_P2P_NORMAL: case ACL_MEM_P2P_HUGE: case ACL_MEM_P2P_HUGE1G:
        return 1;
    default:
        return 0;
    }
}

// check_prop runs the ACL layer's checks of a prop (the order of
// aclrtMallocPhysical's checks in the open-source runtime), with the host
// driver's codes. Caller holds mu.
static aclError check_prop(const char *fn, const aclrtPhysicalMemProp *p) {
    if (p == NULL) return fail(fn, ACL_ERROR_INVALID_PARAM, "prop is NULL");
    last_prop = *p;
    if (p->handleType != ACL_MEM_HANDLE_TYPE_NONE)
        return fail(fn, ACL_ERROR_INVALID_PARAM, "handleType %d: only ACL_MEM_HANDLE_TYPE_NONE", p->handleType);
    if (p->allocationType != ACL_MEM_ALLOCATION_TYPE_PINNED)
        return fail(fn, ACL_ERROR_INVALID_PARAM, "allocationType %d: only PINNED", p->allocationType);
    if (p->location.type == ACL_MEM_LOCATION_TYPE_UNREGISTERED || p->location.type == ACL_MEM_LOCATION_TYPE_MANAGED)
        return fail(fn, ACL_ERROR_INVALID_PARAM, "location type %d is not allowed", p->location.type);
    if (p->location.type == ACL_MEM_LOCATION_TYPE_DEVICE && is_ddr(p->memAttr))
        return fail(fn, ACL_ERROR_INVALID_PARAM, "memAttr %d is DDR memory, not on a device location", p->memAttr);
    if (!physical_supported(p->memAttr))
        return fail(fn, ACL_ERROR_INVALID_PARAM, "memAttr %d is not supported for physical memory", p->memAttr);
    if (p->location.type != ACL_MEM_LOCATION_TYPE_DEVICE)
        return fail(fn, ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "location type %d: the double has device memory only",
                    p->location.type);
    if (p->location.id >= device_count)
        return fail(fn, ACL_ERROR_RT_INVALID_DEVICEID, "device %u: %u devices", p->location.id, device_count);
    return ACL_SUCCESS;
}

API aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, aclrtMemGranularityOptions option,
                                              size_t *granularity) {
    ENTER();
    aclError c = check_prop(__func__, prop);
    if (c) RET(c);
    if (granularity == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "granularity is NULL");
    if (option != ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM && option != ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        FAIL(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "granularity option %d", option);
    *granularity = is_huge1g(prop->memAttr) ? PAGE_1G : PAGE_2M;
    RET(ACL_SUCCESS);
}

API aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                                 uint64_t flags) {
    ENTER();
    if (handle == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "handle is NULL");
    if (prop == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "prop is NULL");
    if (size == 0) FAIL(ACL_ERROR_INVALID_PARAM, "size is 0");
    if (flags != 0) FAIL(ACL_ERROR_INVALID_PARAM, "flags %#llx: must be 0", (unsigned long long)flags);
    aclError c = check_prop(__func__, prop);
    if (c) RET(c);
    if (prop->reserve != 0) FAIL(ACL_ERROR_RT_PARAM_INVALID, "Prop reserve should be zero.");
    size_t page = is_huge1g(prop->memAttr) ? PAGE_1G : PAGE_2M;
    if (page == PAGE_1G) {
        size = (size + page - 1) & ~(page - 1);
    } else if (size % page != 0) {
        FAIL(ACL_ERROR_RT_PARAM_INVALID, "size %zu is not a multiple of the granularity %zu", size, page);
    }
    int dev = (int)prop->location.id;
    if (size > capacity[dev] || phys[dev] > capacity[dev] - size)
        FAIL(ACL_ERROR_RT_MEMORY_ALLOCATION, "out of memory: %zu bytes asked, %zu of %zu free on device %d", size,
             capacity[dev] - phys[dev], capacity[dev], dev);
    unsigned char *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) FAIL(ACL_ERROR_RT_MEMORY_ALLOCATION, "host has no memory for %zu bytes", size);
    // Physical memory is not zeroed on a device: show it (one page per 2 MiB).
    for (size_t off = 0; off < size; off += PAGE_2M) memset(mem + off, 0xA5, 4096);
    struct handle *h = calloc(1, sizeof *h);
    if (h == NULL) abort();
    h->id = new_handle_id();
    h->size = size;
    h->page = page;
    h->dev = dev;
    h->refs = 1;
    h->owners = 1;
    h->pid = cur_pid;
    h->mem = mem;
    GROW(handles, nhandles, caphandles);
    handles[nhandles++] = h;
    phys[dev] += size;
    live.handles++;
    live.physical_bytes += size;
    *handle = (aclrtDrvMemHandle)h->id;
    RET(ACL_SUCCESS);
}

API aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
    ENTER();
    if (handle == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "handle is NULL");
    struct handle *h = find_handle(handle);
    if (h == NULL) FAIL(ACL_ERROR_RT_INVALID_HANDLE, "handle %p is not a live physical allocation", handle);
    if (h->freed) FAIL(ACL_ERROR_RT_PARAM_INVALID, "Call halMemRelease too many times (handle %p is still mapped)", handle);
    if (--h->owners == 0) {
        h->freed = 1;
        live.handles--;
        if (h->origin != NULL) live.imported--;
    }
    unref(h);
    RET(ACL_SUCCESS);
}

// ---- address space ----

// find_resv returns the index of the reservation containing addr, or -1.
static int find_resv(uintptr_t addr) {
    for (int i = 0; i < nresv; i++) {
        if (addr >= resvs[i]->base && addr - resvs[i]->base < resvs[i]->size) return i;
    }
    return -1;
}

API aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags) {
    ENTER();
    if (virPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "virPtr is NULL");
    if (size == 0) FAIL(ACL_ERROR_INVALID_PARAM, "size is 0");
    if (flags > 1) FAIL(ACL_ERROR_INVALID_PARAM, "flags %#llx: must be 0 or 1", (unsigned long long)flags);
    if (alignment != 0) FAIL(ACL_ERROR_RT_PARAM_INVALID, "Alignment should be zero.");
    if (expectPtr != NULL) FAIL(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "expectPtr %p: a chosen address is not supported", expectPtr);
    if (size > MAX_RESERVE) FAIL(ACL_ERROR_RT_PARAM_INVALID, "size %zu exceeds the 128 GiB per-call limit", size);
    size = (size + PAGE_2M - 1) & ~(PAGE_2M - 1);
    uintptr_t align = size >= PAGE_1G ? PAGE_1G : PAGE_2M;
    // First fit in the SVM window; resvs is sorted by base.
    uintptr_t at = SVM_START;
    int i = 0;
    for (;; i++) {
        at = (at + align - 1) & ~(align - 1);
        uintptr_t end = i < nresv ? resvs[i]->base : SVM_START + SVM_SIZE;
        if (at <= end && end - at >= size) break;
        if (i == nresv) FAIL(ACL_ERROR_RT_MEMORY_ALLOCATION, "no address space for %zu bytes", size);
        at = resvs[i]->base + resvs[i]->size;
    }
    struct resv *r = calloc(1, sizeof *r);
    if (r == NULL) abort();
    r->base = at;
    r->size = size;
    GROW(resvs, nresv, capresv);
    memmove(&resvs[i + 1], &resvs[i], (size_t)(nresv - i) * sizeof resvs[0]);
    resvs[i] = r;
    nresv++;
    live.reservations++;
    live.reserved_bytes += size;
    *virPtr = (void *)at;
    RET(ACL_SUCCESS);
}

API aclError aclrtReleaseMemAddress(void *virPtr) {
    ENTER();
    if (virPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "virPtr is NULL");
    int i = find_resv((uintptr_t)virPtr);
    if (i < 0 || resvs[i]->base != (uintptr_t)virPtr) FAIL(ACL_ERROR_RT_PARAM_INVALID, "%p is not the base of a reservation", virPtr);
    struct resv *r = resvs[i];
    if (r->nmaps > 0) FAIL(ACL_ERROR_RT_PARAM_INVALID, "reservation %p still has %d mappings: unmap them first", virPtr, r->nmaps);
    memmove(&resvs[i], &resvs[i + 1], (size_t)(nresv - i - 1) * sizeof resvs[0]);
    nresv--;
    live.reservations--;
    live.reserved_bytes -= r->size;
    free(r->maps);
    free(r);
    RET(ACL_SUCCESS);
}

#ifdef FAKEACL_NO_MAPMEM
#define MAPMEM_API __attribute__((visibility("hidden"))) // not exported: a broken install
#else
#define MAPMEM_API API
#endif

MAPMEM_API aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags) {
    ENTER();
    if (virPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "virPtr is NULL");
    if (handle == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "handle is NULL");
    if (size == 0) FAIL(ACL_ERROR_INVALID_PARAM, "size is 0");
    if (flags != 0) FAIL(ACL_ERROR_INVALID_PARAM, "flags %#llx: must be 0", (unsigned long long)flags);
    if (offset != 0) FAIL(ACL_ERROR_RT_PARAM_INVALID, "Offset should be zero.");
    struct handle *h = find_handle(handle);
    if (h == NULL || h->freed) FAIL(ACL_ERROR_RT_INVALID_HANDLE, "handle %p is not a live physical allocation", handle);
    uintptr_t addr = (uintptr_t)virPtr;
    if (size != h->size) FAIL(ACL_ERROR_RT_PARAM_INVALID, "size %zu differs from the physical allocation's %zu", size, h->size);
    if (addr % h->page != 0) FAIL(ACL_ERROR_RT_PARAM_INVALID, "virPtr %p is not aligned to the page size %zu", virPtr, h->page);
    int ri = find_resv(addr);
    if (ri < 0 || size > resvs[ri]->base + resvs[ri]->size - addr)
        FAIL(ACL_ERROR_RT_PARAM_INVALID, "[%p, +%zu) is not inside one reservation", virPtr, size);
    struct resv *r = resvs[ri];
    int i = 0;
    while (i < r->nmaps && r->maps[i].addr + r->maps[i].size <= addr) i++;
    if (i < r->nmaps && r->maps[i].addr < addr + size)
        FAIL(ACL_ERROR_RT_PARAM_INVALID, "[%p, +%zu) overlaps the mapping at %#lx", virPtr, size, (unsigned long)r->maps[i].addr);
    GROW(r->maps, r->nmaps, r->capmaps);
    memmove(&r->maps[i + 1], &r->maps[i], (size_t)(r->nmaps - i) * sizeof r->maps[0]);
    r->maps[i] = (struct mapping){addr, size, h};
    r->nmaps++;
    h->refs++;
    live.mappings++;
    live.mapped_bytes += size;
    RET(ACL_SUCCESS);
}

API aclError aclrtUnmapMem(void *virPtr) {
    ENTER();
    if (virPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "virPtr is NULL");
    uintptr_t addr = (uintptr_t)virPtr;
    int ri = find_resv(addr);
    int i = 0;
    if (ri >= 0) {
        while (i < resvs[ri]->nmaps && resvs[ri]->maps[i].addr < addr) i++;
    }
    if (ri < 0 || i == resvs[ri]->nmaps || resvs[ri]->maps[i].addr != addr)
        FAIL(ACL_ERROR_RT_DRV_INTERNAL_ERROR, "Addr can not unmap: %p is not the start of a mapping", virPtr);
    struct resv *r = resvs[ri];
    struct mapping m = r->maps[i];
    // Like the runtime, the unmap itself does not wait for device work: work
    // that still touches the range faults.
    fault_unmap(m.addr, m.addr + m.size);
    memmove(&r->maps[i], &r->maps[i + 1], (size_t)(r->nmaps - i - 1) * sizeof r->maps[0]);
    r->nmaps--;
    live.mappings--;
    live.mapped_bytes -= m.size;
    unref(m.h);
    RET(ACL_SUCCESS);
}

#ifndef FAKEACL_NO_SETACCESS
API aclError aclrtMemSetAccess(void *virPtr, size_t size, aclrtMemAccessDesc *desc, size_t count) {
    ENTER();
    if (desc != NULL) {
        last_desc_count = count;
        memcpy(last_desc, desc, (count < 4 ? count : 4) * sizeof desc[0]);
    }
    if (no_setaccess) FAIL(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "the driver lacks halMemSetAccess");
    if (virPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "virPtr is NULL");
    if (size == 0) FAIL(ACL_ERROR_INVALID_PARAM, "size is 0");
    if (desc == NULL || count == 0) FAIL(ACL_ERROR_INVALID_PARAM, "no access descriptor");
    for (size_t k = 0; k < count; k++) {
        aclrtMemAccessDesc *d = &desc[k];
        static const uint8_t zero[12];
        if (d->flags != ACL_RT_MEM_ACCESS_FLAGS_READWRITE)
            FAIL(ACL_ERROR_INVALID_PARAM, "access flags %#x: only READWRITE is supported", d->flags);
        if (memcmp(d->rsv, zero, sizeof zero) != 0) FAIL(ACL_ERROR_INVALID_PARAM, "reserved bytes of the descriptor must be 0");
        if (d->location.type == ACL_MEM_LOCATION_TYPE_HOST && d->location.id != 0)
            FAIL(ACL_ERROR_INVALID_PARAM, "host location id %u: must be 0", d->location.id);
        if (d->location.type == ACL_MEM_LOCATION_TYPE_DEVICE && d->location.id >= device_count)
            FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %u: %u devices", d->location.id, device_count);
        if (d->location.type != ACL_MEM_LOCATION_TYPE_HOST && d->location.type != ACL_MEM_LOCATION_TYPE_DEVICE)
            FAIL(ACL_ERROR_INVALID_PARAM, "location type %d", d->location.type);
    }
    uintptr_t addr = (uintptr_t)virPtr;
    int ri = find_resv(addr);
    if (ri >= 0) {
        struct resv *r = resvs[ri];
        for (int i = 0; i < r->nmaps; i++) {
            if (r->maps[i].addr == addr && r->maps[i].size == size) RET(ACL_SUCCESS);
        }
    }
    FAIL(ACL_ERROR_RT_PARAM_INVALID, "halMemSetAccess: ptr and size must be same with halMemMap ([%p, +%zu))", virPtr, size);
}
#endif

// ---- copies ----

// is_device reports whether addr lies in a reservation.
static int is_device(uintptr_t addr) { return find_resv(addr) >= 0; }

// check_mapped reports whether [addr, addr+n) is mapped throughout.
static int check_mapped(uintptr_t addr, size_t n) {
    int ri = find_resv(addr);
    if (ri < 0 || n > resvs[ri]->base + resvs[ri]->size - addr) return 0;
    struct resv *r = resvs[ri];
    uintptr_t at = addr;
    for (int i = 0; i < r->nmaps && at < addr + n; i++) {
        struct mapping *m = &r->maps[i];
        if (m->addr + m->size <= at) continue;
        if (m->addr > at) return 0;
        at = m->addr + m->size;
    }
    return at >= addr + n;
}

// dev_copy copies n bytes between host memory and the mapped device range at
// addr (which check_mapped accepted); to_dev gives the direction.
static void dev_copy(uintptr_t addr, unsigned char *host, size_t n, int to_dev) {
    struct resv *r = resvs[find_resv(addr)];
    for (int i = 0; i < r->nmaps && n > 0; i++) {
        struct mapping *m = &r->maps[i];
        if (m->addr + m->size <= addr) continue;
        size_t off = addr - m->addr, k = m->size - off;
        if (k > n) k = n;
        if (to_dev) {
            memmove(m->h->mem + off, host, k);
        } else {
            memmove(host, m->h->mem + off, k);
        }
        addr += k;
        host += k;
        n -= k;
    }
}

// do_copy runs one copy whose direction comes from kind: a synchronous one
// (st NULL), or one on stream st. Caller holds mu.
static aclError do_copy(const char *fn, void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                        struct stream *st) {
    if (count == 0) return ACL_SUCCESS;
    if (dst == NULL || src == NULL) return fail(fn, ACL_ERROR_INVALID_PARAM, "NULL pointer");
    if ((int)kind < 0 || kind > ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE) return fail(fn, ACL_ERROR_INVALID_PARAM, "kind %d", kind);
    if (count > destMax) return fail(fn, ACL_ERROR_RT_PARAM_INVALID, "count %zu > destMax %zu", count, destMax);
    int dd = is_device((uintptr_t)dst), sd = is_device((uintptr_t)src);
    if (kind == ACL_MEMCPY_DEFAULT || kind == ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE) {
        kind = dd ? (sd ? ACL_MEMCPY_DEVICE_TO_DEVICE : ACL_MEMCPY_HOST_TO_DEVICE)
                  : (sd ? ACL_MEMCPY_DEVICE_TO_HOST : ACL_MEMCPY_HOST_TO_HOST);
    }
    int want_dd = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    int want_sd = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    if (want_dd && !check_mapped((uintptr_t)dst, count))
        return fail(fn, ACL_ERROR_RT_PARAM_INVALID, "[%p, +%zu) is not mapped device memory", dst, count);
    if (want_sd && !check_mapped((uintptr_t)src, count))
        return fail(fn, ACL_ERROR_RT_PARAM_INVALID, "[%p, +%zu) is not mapped device memory", src, count);
    if (!want_dd && dd) return fail(fn, ACL_ERROR_RT_PARAM_INVALID, "dst %p is device memory, kind %d", dst, kind);
    if (!want_sd && sd) return fail(fn, ACL_ERROR_RT_PARAM_INVALID, "src %p is device memory, kind %d", src, kind);
    if (st == NULL) {
        // A synchronous copy is not ordered after queued work: touching what
        // it touches is a race.
        if (want_dd) race_check((uintptr_t)dst, count);
        if (want_sd) race_check((uintptr_t)src, count);
    } else if (kind != ACL_MEMCPY_DEVICE_TO_DEVICE) {
        // Host memory that is not page-locked (the double has no other) makes
        // the async copy return only once it is done: after the stream's
        // earlier work.
        while (st->alive && st->head != NULL) pthread_cond_wait(&cv, &mu);
    }
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST:
        memmove(dst, src, count);
        break;
    case ACL_MEMCPY_HOST_TO_DEVICE:
        dev_copy((uintptr_t)dst, (unsigned char *)src, count, 1);
        break;
    case ACL_MEMCPY_DEVICE_TO_HOST:
        dev_copy((uintptr_t)src, dst, count, 0);
        break;
    default: {
        // In one process, reserved memory copies device to device only with
        // aclrtMemcpyAsync, 64-byte aligned.
        if (st == NULL)
            return fail(fn, ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                        "reserved memory supports only aclrtMemcpyAsync for device-to-device copies");
        if (((uintptr_t)dst | (uintptr_t)src) % 64 != 0)
            return fail(fn, ACL_ERROR_RT_PARAM_INVALID, "device-to-device copy needs 64-byte aligned addresses (%p, %p)", dst, src);
        struct work *w = calloc(1, sizeof *w);
        if (w == NULL) abort();
        w->kind = WORK_COPY;
        w->dst = (uintptr_t)dst;
        w->src = (uintptr_t)src;
        w->count = count;
        w->lo[0] = w->dst, w->hi[0] = w->dst + count;
        w->lo[1] = w->src, w->hi[1] = w->src + count;
        w->nranges = 2;
        enqueue(st, w); // it runs when it reaches the head of the stream
    }
    }
    return ACL_SUCCESS;
}

API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) {
    ENTER();
    RET(do_copy(__func__, dst, destMax, src, count, kind, NULL));
}

API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                              aclrtStream stream) {
    ENTER();
    aclError code = 0;
    struct stream *st = resolve_stream(__func__, stream, &code);
    if (st == NULL) RET(code);
    RET(do_copy(__func__, dst, destMax, src, count, kind, st));
}

API aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
    ENTER();
    if (count == 0) RET(ACL_SUCCESS);
    if (devPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "devPtr is NULL");
    if (count > maxCount) FAIL(ACL_ERROR_RT_PARAM_INVALID, "count %zu > maxCount %zu", count, maxCount);
    if (!check_mapped((uintptr_t)devPtr, count)) FAIL(ACL_ERROR_RT_PARAM_INVALID, "[%p, +%zu) is not mapped device memory", devPtr, count);
    race_check((uintptr_t)devPtr, count); // not ordered after queued work
    unsigned char buf[4096];
    memset(buf, value, sizeof buf);
    for (size_t off = 0; off < count; off += sizeof buf) {
        size_t k = count - off < sizeof buf ? count - off : sizeof buf;
        dev_copy((uintptr_t)devPtr + off, buf, k, 1);
    }
    RET(ACL_SUCCESS);
}

API aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream) {
    ENTER();
    if (count == 0) RET(ACL_SUCCESS);
    if (devPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "devPtr is NULL");
    if (count > maxCount) FAIL(ACL_ERROR_RT_PARAM_INVALID, "count %zu > maxCount %zu", count, maxCount);
    aclError code = 0;
    struct stream *st = resolve_stream(__func__, stream, &code);
    if (st == NULL) RET(code);
    if (!check_mapped((uintptr_t)devPtr, count)) FAIL(ACL_ERROR_RT_PARAM_INVALID, "[%p, +%zu) is not mapped device memory", devPtr, count);
    struct work *w = calloc(1, sizeof *w);
    if (w == NULL) abort();
    w->kind = WORK_MEMSET;
    w->value = value;
    w->count = count;
    w->lo[0] = (uintptr_t)devPtr, w->hi[0] = (uintptr_t)devPtr + count;
    w->nranges = 1;
    enqueue(st, w); // it runs when it reaches the head of the stream
    RET(ACL_SUCCESS);
}

API aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free_, size_t *total) {
    ENTER();
    if (free_ == NULL || total == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "NULL pointer");
    if ((int)attr < ACL_DDR_MEM || attr > ACL_MEM_P2P_HUGE1G) FAIL(ACL_ERROR_INVALID_PARAM, "attr %d", attr);
    *free_ = capacity[cur->dev] - phys[cur->dev];
    *total = capacity[cur->dev];
    RET(ACL_SUCCESS);
}

API const char *aclrtGetSocName(void) { return "FakeAscend910B"; }

// ---- page-locked host memory ----

// A host buffer is ordinary memory with a 64-byte-aligned start, as ACL
// promises, kept on a list so that aclrtFreeHost refuses a pointer
// aclrtMallocHost did not return (and a second free); fakeacl_live counts
// the live ones. Like a runtime that pools its host memory, the double keeps
// the last buffer freed and hands it back to the next aclrtMallocHost of the
// same size, so that a freed address is reused at once, every time: the
// binding's books must never mistake the new buffer for the old.
struct hostbuf {
    void *p;
    size_t size;
    struct hostbuf *next;
};

static struct hostbuf *hostbufs;
static void *recycled;       // the last buffer freed, kept for reuse; NULL: none
static size_t recycled_size; // its size

API aclError aclrtMallocHost(void **hostPtr, size_t size) {
    ENTER();
    if (hostPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "hostPtr is NULL");
    if (size == 0) FAIL(ACL_ERROR_INVALID_PARAM, "size is 0");
    struct hostbuf *b = calloc(1, sizeof *b);
    void *p = NULL;
    if (b != NULL && recycled != NULL && recycled_size == size) {
        p = recycled;
        recycled = NULL;
    } else if (b == NULL || posix_memalign(&p, 64, size) != 0) {
        free(b);
        FAIL(ACL_ERROR_RT_MEMORY_ALLOCATION, "%zu bytes of host memory", size);
    }
    b->p = p;
    b->size = size;
    b->next = hostbufs;
    hostbufs = b;
    live.host_buffers++;
    live.host_bytes += size;
    *hostPtr = p;
    RET(ACL_SUCCESS);
}

API aclError aclrtFreeHost(void *hostPtr) {
    ENTER();
    if (hostPtr == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "hostPtr is NULL");
    for (struct hostbuf **q = &hostbufs; *q != NULL; q = &(*q)->next) {
        if ((*q)->p == hostPtr) {
            struct hostbuf *b = *q;
            *q = b->next;
            live.host_buffers--;
            live.host_bytes -= b->size;
            free(recycled);
            recycled = b->p;
            recycled_size = b->size;
            free(b);
            RET(ACL_SUCCESS);
        }
    }
    FAIL(ACL_ERROR_RT_PARAM_INVALID, "%p is not host memory from aclrtMallocHost", hostPtr);
}

// ---- sharing between processes ----

#ifndef FAKEACL_NO_SHARE
static uint64_t next_token = 0x5a5a000000000000ULL;

// find_token returns the live exported handle whose token is t, or NULL.
static struct handle *find_token(uint64_t t) {
    for (int i = 0; i < nhandles; i++) {
        struct handle *h = handles[i];
        if (h->exported && h->token == t && !h->freed) return h;
    }
    return NULL;
}

API aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle, aclrtMemHandleType handleType, uint64_t flags,
                                             uint64_t *shareableHandle) {
    ENTER();
    if (handle == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "handle is NULL");
    if (shareableHandle == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "shareableHandle is NULL");
    if (handleType != ACL_MEM_HANDLE_TYPE_NONE) FAIL(ACL_ERROR_INVALID_PARAM, "handleType %d: only NONE", handleType);
    if (flags > 1) FAIL(ACL_ERROR_RT_PARAM_INVALID, "flags %#llx", (unsigned long long)flags);
    struct handle *h = find_handle(handle);
    if (h == NULL || h->freed) FAIL(ACL_ERROR_RT_INVALID_HANDLE, "handle %p is not a live physical allocation", handle);
    if (h->origin != NULL) FAIL(ACL_ERROR_RT_DRV_INTERNAL_ERROR, "handle %p was imported: it cannot be exported", handle);
    if (h->exported) FAIL(ACL_ERROR_RT_DRV_INTERNAL_ERROR, "handle %p is exported already", handle);
    h->exported = 1;
    h->token = ++next_token;
    h->export_flags = flags;
    *shareableHandle = h->token;
    RET(ACL_SUCCESS);
}

API aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid, size_t pidNum) {
    ENTER();
    if (pid == NULL || pidNum == 0) FAIL(ACL_ERROR_INVALID_PARAM, "no pid");
    struct handle *h = find_token(shareableHandle);
    if (h == NULL) FAIL(ACL_ERROR_RT_INVALID_HANDLE, "shareable handle %#llx is unknown or freed", (unsigned long long)shareableHandle);
    if (h->pid != cur_pid) FAIL(ACL_ERROR_RT_DRV_INTERNAL_ERROR, "process %d is not the exporter (%d)", cur_pid, h->pid);
    if (h->export_flags & 1) FAIL(ACL_ERROR_RT_NO_PERMISSION, "exported with DISABLE_PID_VALIDATION: no allow-list");
    if (pidNum > sizeof h->allowed / sizeof h->allowed[0]) FAIL(ACL_ERROR_RT_PARAM_INVALID, "%zu pids", pidNum);
    memcpy(h->allowed, pid, pidNum * sizeof *pid);
    h->nallowed = pidNum;
    RET(ACL_SUCCESS);
}

// aclrtMemGetAllocationPropertiesFromHandle rebuilds the properties of a
// handle from its page size and device, as the runtime does from the page and
// memory types: HBM, 2 MiB or 1 GiB pages.
API aclError aclrtMemGetAllocationPropertiesFromHandle(aclrtDrvMemHandle handle, aclrtPhysicalMemProp *prop) {
    ENTER();
    if (prop == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "prop is NULL");
    struct handle *h = find_handle(handle);
    if (h == NULL || h->freed) FAIL(ACL_ERROR_RT_INVALID_HANDLE, "handle %p is not a live physical allocation", handle);
    memset(prop, 0, sizeof *prop);
    prop->allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    prop->memAttr = h->page == PAGE_1G ? ACL_HBM_MEM_HUGE1G : ACL_HBM_MEM_HUGE;
    prop->location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = (uint32_t)h->dev;
    RET(ACL_SUCCESS);
}

API aclError aclrtMemImportFromShareableHandle(uint64_t shareableHandle, int32_t deviceId, aclrtDrvMemHandle *handle) {
    ENTER();
    if (handle == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "handle is NULL");
    if (deviceId < 0 || (uint32_t)deviceId >= device_count) FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d", deviceId);
    struct handle *x = find_token(shareableHandle);
    if (x == NULL) FAIL(ACL_ERROR_RT_INVALID_HANDLE, "shareable handle %#llx is unknown or freed", (unsigned long long)shareableHandle);
    if (x->pid == cur_pid) FAIL(ACL_ERROR_RT_DRV_INTERNAL_ERROR, "process %d exported it: import in the exporting process", cur_pid);
    if (!(x->export_flags & 1)) {
        int ok = 0;
        for (size_t i = 0; i < x->nallowed; i++) ok |= x->allowed[i] == cur_pid;
        if (!ok) FAIL(ACL_ERROR_RT_DRV_INTERNAL_ERROR, "process %d is not on the allow-list", cur_pid);
    }
    for (int i = 0; i < nhandles; i++) {
        struct handle *h = handles[i];
        if (h->origin == x && h->pid == cur_pid && !h->freed) { // imported again: one more reference
            h->owners++;
            h->refs++;
            *handle = (aclrtDrvMemHandle)h->id;
            RET(ACL_SUCCESS);
        }
    }
    struct handle *h = calloc(1, sizeof *h);
    if (h == NULL) abort();
    h->id = new_handle_id();
    h->size = x->size;
    h->page = x->page;
    h->dev = x->dev;
    h->refs = 1;
    h->owners = 1;
    h->pid = cur_pid;
    h->mem = x->mem;
    h->origin = x;
    x->refs++;
    GROW(handles, nhandles, caphandles);
    handles[nhandles++] = h;
    live.handles++;
    live.imported++;
    live.physical_bytes += h->size;
    live.imported_bytes += h->size;
    *handle = (aclrtDrvMemHandle)h->id;
    RET(ACL_SUCCESS);
}

API aclError aclrtDeviceGetBareTgid(int32_t *pid) {
    ENTER();
    if (pid == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "pid is NULL");
    *pid = cur_pid;
    RET(ACL_SUCCESS);
}
#endif

// ---- test-only functions ----

__attribute__((constructor)) static void setup(void) {
    for (int i = 0; i < MAXDEV; i++) capacity[i] = (size_t)1 << 30;
    cur_pid = (int)getpid();
}

// fakeacl_set_pid makes the calls that follow come from process pid, as
// the sharing calls see it (aclrtDeviceGetBareTgid gives it).
API void fakeacl_set_pid(int pid) {
    pthread_mutex_lock(&mu);
    cur_pid = pid;
    pthread_mutex_unlock(&mu);
}

// fakeacl_set_device_count sets how many devices there are (at most 8).
API void fakeacl_set_device_count(uint32_t n) {
    pthread_mutex_lock(&mu);
    device_count = n > MAXDEV ? MAXDEV : n;
    pthread_mutex_unlock(&mu);
}

// fakeacl_set_capacity sets the device memory of dev; 207001 past it.
API void fakeacl_set_capacity(int32_t dev, size_t bytes) {
    pthread_mutex_lock(&mu);
    if (dev >= 0 && dev < MAXDEV) capacity[dev] = bytes;
    pthread_mutex_unlock(&mu);
}

// fakeacl_set_no_setaccess makes aclrtMemSetAccess return 207000, as with a
// driver that lacks halMemSetAccess.
API void fakeacl_set_no_setaccess(int on) {
    pthread_mutex_lock(&mu);
    no_setaccess = on;
    pthread_mutex_unlock(&mu);
}

// fakeacl_inject makes the nth next call of fn fail with code (nth ≥ 1), for
// calls that get past the context check. nth 0 disarms fn. It returns 0, or -1
// when fn is too long or the table is full.
API int fakeacl_inject(const char *fn, int nth, int code) {
    if (strlen(fn) >= sizeof injects[0].fn) return -1;
    pthread_mutex_lock(&mu);
    struct inject *slot = NULL;
    for (size_t i = 0; i < sizeof injects / sizeof injects[0]; i++) {
        if (strcmp(injects[i].fn, fn) == 0 || (slot == NULL && injects[i].countdown == 0)) slot = &injects[i];
        if (strcmp(injects[i].fn, fn) == 0) break;
    }
    if (slot == NULL) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    strcpy(slot->fn, fn);
    slot->countdown = nth;
    slot->code = code;
    pthread_mutex_unlock(&mu);
    return 0;
}

// fakeacl_clear_context leaves the calling thread with no current context,
// as a thread that never set one.
API void fakeacl_clear_context(void) { cur = NULL; }

// fakeacl_foreign_stream creates a stream on device dev outside the binding,
// as the caller's own CANN code would: it takes a reference to the device
// (as aclrtSetDevice does, without touching the thread's context) and makes
// the stream in the device's default context. It returns an aclError.
API aclError fakeacl_foreign_stream(int32_t dev, void **stream) {
    pthread_mutex_lock(&mu);
    if (!initialised) FAIL(ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    if (dev < 0 || (uint32_t)dev >= device_count || dev >= MAXDEV)
        FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d: %u devices", dev, device_count);
    if (stream == NULL) FAIL(ACL_ERROR_INVALID_PARAM, "stream is NULL");
    acquire_device(dev);
    struct stream *st = new_stream(dev, 0);
    st->foreign = 1;
    foreign_streams++;
    *stream = st;
    RET(ACL_SUCCESS);
}

// fakeacl_destroy_foreign_stream destroys a stream fakeacl_foreign_stream
// made, which must have no work pending, and drops its device reference.
// It returns an aclError.
API aclError fakeacl_destroy_foreign_stream(void *stream) {
    pthread_mutex_lock(&mu);
    struct stream *st = find_stream(stream);
    if (st == NULL || !st->alive || !st->foreign) FAIL(ACL_ERROR_RT_PARAM_INVALID, "%p is not a live foreign stream", stream);
    if (st->head != NULL) FAIL(ACL_ERROR_RT_PARAM_INVALID, "stream %p has tasks pending: synchronise it first", stream);
    st->alive = 0;
    foreign_streams--;
    last_destroyed = st;
    release_device(st->dev);
    RET(ACL_SUCCESS);
}

// fakeacl_set_reuse_streams makes a new stream reuse the stream destroyed
// last (on != 0), as a freed pointer allocated again would, or not.
API void fakeacl_set_reuse_streams(int on) {
    pthread_mutex_lock(&mu);
    reuse_streams = on;
    pthread_mutex_unlock(&mu);
}

// fakeacl_launch queues a stand-in kernel on stream (NULL: dev's default
// stream) that touches [ptr, ptr+n) and stays running until fakeacl_finish
// is called with the id it returns. The range must be mapped. It returns the
// id (> 0), or minus the aclError and sets the thread's error message.
API int fakeacl_launch(int32_t dev, void *stream, void *ptr, size_t n) {
    pthread_mutex_lock(&mu);
    int r;
    struct stream *st = stream == NULL ? NULL : find_stream(stream);
    if (!initialised) {
        r = -fail(__func__, ACL_ERROR_UNINITIALIZE, "aclInit has not been called");
    } else if (dev < 0 || dev >= MAXDEV || dev_ctx[dev] == NULL) {
        r = -fail(__func__, ACL_ERROR_RT_INVALID_DEVICEID, "device %d is not set", dev);
    } else if (stream != NULL && (st == NULL || !st->alive || st->dev != dev)) {
        r = -fail(__func__, ACL_ERROR_RT_PARAM_INVALID, "%p is not a live stream of device %d", stream, dev);
    } else if (n == 0 || ptr == NULL) {
        r = -fail(__func__, ACL_ERROR_INVALID_PARAM, "empty range");
    } else if (!check_mapped((uintptr_t)ptr, n)) {
        r = -fail(__func__, ACL_ERROR_RT_PARAM_INVALID, "[%p, +%zu) is not mapped device memory", ptr, n);
    } else {
        if (st == NULL) st = dev_ctx[dev]->defstream;
        struct work *w = calloc(1, sizeof *w);
        if (w == NULL) abort();
        w->kind = WORK_KERNEL;
        w->id = r = ++next_kernel;
        w->lo[0] = (uintptr_t)ptr, w->hi[0] = (uintptr_t)ptr + n;
        w->nranges = 1;
        enqueue(st, w);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

// fakeacl_finish lets the kernel id finish; the work queued behind it runs.
// It returns 0, or -1 when no queued kernel has that id.
API int fakeacl_finish(int id) {
    pthread_mutex_lock(&mu);
    int r = -1;
    for (struct stream *st = all_streams; st != NULL && r != 0; st = st->next_all) {
        for (struct work *w = st->head; w != NULL; w = w->next) {
            if (w->kind == WORK_KERNEL && w->id == id && !w->released) {
                w->released = 1;
                advance(st);
                r = 0;
                break;
            }
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

// fakeacl_faults returns how many times device work touched a range after it
// was unmapped, or a synchronous copy or memset touched a range that queued
// work touches.
API int64_t fakeacl_faults(void) {
    pthread_mutex_lock(&mu);
    int64_t n = faults;
    pthread_mutex_unlock(&mu);
    return n;
}

// fakeacl_drain finishes every kernel, so that all queued work runs.
API void fakeacl_drain(void) {
    pthread_mutex_lock(&mu);
    for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
        for (struct work *w = st->head; w != NULL; w = w->next) w->released = 1;
        advance(st);
    }
    pthread_mutex_unlock(&mu);
}

// fakeacl_live reports the live reservations, mappings and physical memory.
API void fakeacl_live(fakeacl_live_t *out) {
    pthread_mutex_lock(&mu);
    *out = live;
    pthread_mutex_unlock(&mu);
}

// fakeacl_stats reports the runtime's other state.
API void fakeacl_stats(fakeacl_stats_t *out) {
    pthread_mutex_lock(&mu);
    memset(out, 0, sizeof *out);
    out->initialised = initialised;
    out->init_calls = init_calls;
    out->finalize_calls = finalize_calls;
    for (int i = 0; i < MAXDEV; i++) {
        out->device_refs += dev_refs[i];
        out->contexts_alive += dev_ctx[i] != NULL;
    }
    out->streams_alive = live.streams;
    for (struct stream *st = all_streams; st != NULL; st = st->next_all) {
        out->pending_work += (int64_t)(st->queued - st->finished);
    }
    out->sync_device_calls = sync_calls;
    out->faults = faults;
    out->no_context_errors = no_ctx_errors;
    out->set_context_calls = set_ctx_calls;
    out->threads_seen = threads_seen;
    out->foreign_streams = foreign_streams;
    pthread_mutex_unlock(&mu);
}

// fakeacl_layout writes the sizes and offsets of the C structs, in the order
// the Go test lists them, and returns how many it wrote (at most n).
API size_t fakeacl_layout(uint64_t *out, size_t n) {
    const uint64_t v[] = {
        sizeof(aclrtMemLocation),
        offsetof(aclrtMemLocation, id),
        offsetof(aclrtMemLocation, type),
        sizeof(aclrtPhysicalMemProp),
        offsetof(aclrtPhysicalMemProp, handleType),
        offsetof(aclrtPhysicalMemProp, allocationType),
        offsetof(aclrtPhysicalMemProp, memAttr),
        offsetof(aclrtPhysicalMemProp, location),
        offsetof(aclrtPhysicalMemProp, reserve),
        sizeof(aclrtMemAccessDesc),
        offsetof(aclrtMemAccessDesc, flags),
        offsetof(aclrtMemAccessDesc, location),
        offsetof(aclrtMemAccessDesc, rsv),
        sizeof(fakeacl_live_t),
        sizeof(aclrtMemGranularityOptions),
        sizeof(aclrtMemcpyKind),
    };
    size_t k = sizeof v / sizeof v[0];
    if (k > n) k = n;
    memcpy(out, v, k * sizeof v[0]);
    return k;
}

// fakeacl_last_prop writes the fields of the last aclrtPhysicalMemProp a
// call was handed, read by name: handleType, allocationType, memAttr,
// location.id, location.type, reserve.
API void fakeacl_last_prop(uint64_t out[6]) {
    pthread_mutex_lock(&mu);
    out[0] = (uint64_t)(int64_t)last_prop.handleType;
    out[1] = (uint64_t)(int64_t)last_prop.allocationType;
    out[2] = (uint64_t)(int64_t)last_prop.memAttr;
    out[3] = last_prop.location.id;
    out[4] = (uint64_t)(int64_t)last_prop.location.type;
    out[5] = last_prop.reserve;
    pthread_mutex_unlock(&mu);
}

// fakeacl_last_desc writes the fields of descriptor i of the last
// aclrtMemSetAccess call (flags, location.id, location.type, rsv[0],
// rsv[11]) and returns that call's count.
API size_t fakeacl_last_desc(size_t i, uint64_t out[5]) {
    pthread_mutex_lock(&mu);
    size_t n = last_desc_count;
    if (i < 4) {
        out[0] = (uint64_t)(int64_t)last_desc[i].flags;
        out[1] = last_desc[i].location.id;
        out[2] = (uint64_t)(int64_t)last_desc[i].location.type;
        out[3] = last_desc[i].rsv[0];
        out[4] = last_desc[i].rsv[11];
    }
    pthread_mutex_unlock(&mu);
    return n;
}

#endif // FAKEACL_COMPAT_ONLY
