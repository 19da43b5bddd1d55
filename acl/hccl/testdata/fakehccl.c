// fakehccl.c: a test double of HCCL (libhccl.so), for testing the purego
// binding in package acl/hccl without an NPU. It exports the calls the
// binding resolves, with the prototypes of hccl_comm.h and the HcclResult
// values of hccl_types.h, and keeps the rules the zero-copy calls keep, as
// read in the open-source HCCL (hcomm): the books of set ranges and activated
// memory are the process's, shared by every communicator, as HCCL's address
// manager is.
//
// Communicators. HcclGetRootInfo writes a root info this double recognises;
// HcclCommInitRootInfo(nRanks, root, rank, &comm) makes a communicator of
// nRanks ranks at once (the other ranks are imagined: no rendezvous) and
// HcclCommDestroy destroys it. A communicator of one rank does nothing in the
// zero-copy calls and reports success, as HCCL does.
//
// Zero-copy memory, with HCCL's codes:
//   - a NULL communicator, address or handle: HCCL_E_PTR (2);
//   - a communicator this double did not make, or destroyed: HCCL_E_PARA (1)
//     (HCCL would read freed memory);
//   - where the chip has no zero-copy (the zero_copy knob 0, an A2 instead of
//     an A3): HcclCommSetMemoryRange fails with HCCL_E_NOT_SUPPORT (5);
//   - Unset, Activate and Deactivate on a communicator that never set a
//     range: HCCL_E_PARA;
//   - HcclCommSetMemoryRange: alignment and flags must be 0 (the documented
//     values), the size not 0, and the range may overlap no set range:
//     HCCL_E_PARA otherwise;
//   - HcclCommUnsetMemoryRange: the base of a set range with nothing
//     activated in it, HCCL_E_PARA otherwise;
//   - HcclCommActivateCommMemory: offset and flags 0, inside one set range,
//     overlapping no activated memory; HCCL_E_PARA otherwise;
//   - HcclCommDeactivateCommMemory: the start of an activated block (whole
//     blocks only); HCCL_E_PARA otherwise.
//
// Where the double is stricter than the HCCL source read (said here so that
// no test mistakes it for HCCL): HCCL's peers map activated memory into a
// mirror of the set range with aclrtMapMem, which needs addresses and
// lengths in whole 2 MiB pages. HCCL does not check that on the calling
// side: a misaligned activation fails on the peers, and the caller sees the
// wait for their answers time out (HCCL_E_TCP_TRANSFER). The double refuses
// it at once with HCCL_E_PARA, as it does a set range whose base or size is
// not a multiple of 2 MiB (the align knob changes the 2 MiB). HCCL exports
// the activated handle (aclrtMemExportToShareableHandle) at every
// activation; whether the runtime accepts a second export of the same handle,
// after a deactivation, is not documented: with the export_once knob set, the
// double refuses a handle activated before with HCCL_E_RUNTIME (15), as it
// would if the runtime refused the export.
//
// Build variants: -DFAKEHCCL_NO_ZEROCOPY lacks the four zero-copy calls (a
// release before them); -DFAKEHCCL_NO_COMM lacks HcclCommInitRootInfo (not
// a usable HCCL).
//
// Test-only functions (fakehccl_*) count and fail calls, set knobs, report
// what is held, and say what is activated where. Destroying the last
// communicator drops the process's books, as HCCL drops its address manager;
// what was still set or activated then is counted as leaked. One mutex guards
// all state, so the double may be called from any number of threads.
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef enum {
	HCCL_SUCCESS = 0,
	HCCL_E_PARA = 1,
	HCCL_E_PTR = 2,
	HCCL_E_MEMORY = 3,
	HCCL_E_INTERNAL = 4,
	HCCL_E_NOT_SUPPORT = 5,
	HCCL_E_NOT_FOUND = 6,
	HCCL_E_UNAVAIL = 7,
	HCCL_E_SYSCALL = 8,
	HCCL_E_TIMEOUT = 9,
	HCCL_E_OPEN_FILE_FAILURE = 10,
	HCCL_E_TCP_CONNECT = 11,
	HCCL_E_ROCE_CONNECT = 12,
	HCCL_E_TCP_TRANSFER = 13,
	HCCL_E_ROCE_TRANSFER = 14,
	HCCL_E_RUNTIME = 15,
	HCCL_E_DRV = 16,
	HCCL_E_PROFILING = 17,
	HCCL_E_CCE = 18,
	HCCL_E_NETWORK = 19,
	HCCL_E_AGAIN = 20,
	HCCL_E_REMOTE = 21,
	HCCL_E_SUSPENDING = 22,
	HCCL_E_OPRETRY_FAIL = 23,
	HCCL_E_OOM = 24,
} HcclResult;

typedef void *HcclComm;
typedef void *aclrtDrvMemHandle;

#define HCCL_ROOT_INFO_BYTES 4108
typedef struct HcclRootInfoDef {
	char internal[HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

_Static_assert(sizeof(HcclRootInfo) == 4108, "HcclRootInfo");

static const char root_magic[] = "fakehccl-root";

// ---- state, guarded by mu ----

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct comm {
	uint32_t nranks, rank;
	int agent; // HcclCommSetMemoryRange was called on it (HCCL makes its zero-copy agent then)
	int dead;
	struct comm *next;
};

struct range {
	uintptr_t base;
	size_t size;
	struct range *next;
};

struct block {
	uintptr_t ptr;
	size_t size;
	uintptr_t handle;
	struct block *next;
};

struct exported {
	uintptr_t handle;
	struct exported *next;
};

static struct comm *comms; // every communicator made, dead ones too (never freed, so a stale one is recognised)
static struct range *ranges;
static struct block *blocks;
static struct exported *exports; // handles activated at least once (export_once)
static long live_comms, leaked;
static int zero_copy = 1;
static int export_once;
static size_t align = (size_t)2 << 20;
static unsigned root_seq;

// ---- call counting and fault injection ----

struct fn_stat {
	const char *name;
	long calls;
	long fail_in; // fail the fail_in-th next call; 0 = no fault armed
	HcclResult fail_with;
};

static struct fn_stat stats[] = {
	{"HcclGetRootInfo", 0, 0, 0},
	{"HcclCommInitRootInfo", 0, 0, 0},
	{"HcclCommDestroy", 0, 0, 0},
	{"HcclGetErrorString", 0, 0, 0},
	{"HcclCommSetMemoryRange", 0, 0, 0},
	{"HcclCommUnsetMemoryRange", 0, 0, 0},
	{"HcclCommActivateCommMemory", 0, 0, 0},
	{"HcclCommDeactivateCommMemory", 0, 0, 0},
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
static HcclResult enter(const char *fn) {
	struct fn_stat *s = stat_of(fn);
	s->calls++;
	if (s->fail_in > 0 && --s->fail_in == 0)
		return s->fail_with;
	return HCCL_SUCCESS;
}

#define BEGIN(fn)                      \
	pthread_mutex_lock(&mu);           \
	HcclResult rc_ = enter(fn);        \
	if (rc_ != HCCL_SUCCESS) {         \
		pthread_mutex_unlock(&mu);     \
		return rc_;                    \
	}

#define END(rc)                        \
	do {                               \
		HcclResult r_ = (rc);          \
		pthread_mutex_unlock(&mu);     \
		return r_;                     \
	} while (0)

static struct comm *comm_of(HcclComm c) {
	for (struct comm *x = comms; x != NULL; x = x->next)
		if ((void *)x == c)
			return x->dead ? NULL : x;
	return NULL;
}

static inline int overlap(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

static inline int aligned(uintptr_t v) { return align == 0 || v % align == 0; }

// drop_books forgets every range and block (the last communicator went),
// counting them as leaked.
static void drop_books(void) {
	while (ranges != NULL) {
		struct range *r = ranges;
		ranges = r->next;
		free(r);
		leaked++;
	}
	while (blocks != NULL) {
		struct block *b = blocks;
		blocks = b->next;
		free(b);
		leaked++;
	}
}

// ---- communicators ----

EXPORT HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
	BEGIN("HcclGetRootInfo");
	if (rootInfo == NULL)
		END(HCCL_E_PTR);
	memset(rootInfo, 0, sizeof *rootInfo);
	snprintf(rootInfo->internal, sizeof rootInfo->internal, "%s-%u", root_magic, ++root_seq);
	END(HCCL_SUCCESS);
}

#ifndef FAKEHCCL_NO_COMM
EXPORT HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm) {
	BEGIN("HcclCommInitRootInfo");
	if (rootInfo == NULL || comm == NULL)
		END(HCCL_E_PTR);
	if (nRanks == 0 || rank >= nRanks || strncmp(rootInfo->internal, root_magic, sizeof root_magic - 1) != 0)
		END(HCCL_E_PARA);
	struct comm *c = calloc(1, sizeof *c);
	if (c == NULL)
		END(HCCL_E_MEMORY);
	c->nranks = nRanks;
	c->rank = rank;
	c->next = comms;
	comms = c;
	live_comms++;
	*comm = c;
	END(HCCL_SUCCESS);
}
#endif

EXPORT HcclResult HcclCommDestroy(HcclComm comm) {
	BEGIN("HcclCommDestroy");
	if (comm == NULL)
		END(HCCL_E_PTR);
	struct comm *c = comm_of(comm);
	if (c == NULL)
		END(HCCL_E_PARA);
	c->dead = 1;
	if (--live_comms == 0)
		drop_books();
	END(HCCL_SUCCESS);
}

static const char *const names[] = {
	"HCCL_SUCCESS",        "HCCL_E_PARA",         "HCCL_E_PTR",           "HCCL_E_MEMORY",
	"HCCL_E_INTERNAL",     "HCCL_E_NOT_SUPPORT",  "HCCL_E_NOT_FOUND",     "HCCL_E_UNAVAIL",
	"HCCL_E_SYSCALL",      "HCCL_E_TIMEOUT",      "HCCL_E_OPEN_FILE_FAILURE", "HCCL_E_TCP_CONNECT",
	"HCCL_E_ROCE_CONNECT", "HCCL_E_TCP_TRANSFER", "HCCL_E_ROCE_TRANSFER", "HCCL_E_RUNTIME",
	"HCCL_E_DRV",          "HCCL_E_PROFILING",    "HCCL_E_CCE",           "HCCL_E_NETWORK",
	"HCCL_E_AGAIN",        "HCCL_E_REMOTE",       "HCCL_E_SUSPENDING",    "HCCL_E_OPRETRY_FAIL",
	"HCCL_E_OOM",
};

EXPORT const char *HcclGetErrorString(HcclResult code) {
	pthread_mutex_lock(&mu);
	stat_of("HcclGetErrorString")->calls++;
	pthread_mutex_unlock(&mu);
	if ((unsigned)code < sizeof names / sizeof names[0])
		return names[code];
	return "unknown HcclResult";
}

// ---- zero-copy memory ----

#ifndef FAKEHCCL_NO_ZEROCOPY

// zc_comm makes the checks every zero-copy call but Set makes: comm is a
// live communicator whose zero-copy agent exists. It returns the
// communicator, or NULL with *rc set.
static struct comm *zc_comm(HcclComm comm, int need_agent, HcclResult *rc) {
	struct comm *c = comm_of(comm);
	if (c == NULL) {
		*rc = HCCL_E_PARA;
		return NULL;
	}
	if (need_agent && !c->agent) {
		*rc = HCCL_E_PARA; // "not call HcclCommSetMemoryRange()"
		return NULL;
	}
	*rc = HCCL_SUCCESS;
	return c;
}

EXPORT HcclResult HcclCommSetMemoryRange(HcclComm comm, void *baseVirPtr, size_t size, size_t alignment,
                                         uint64_t flags) {
	BEGIN("HcclCommSetMemoryRange");
	if (comm == NULL || baseVirPtr == NULL)
		END(HCCL_E_PTR);
	HcclResult rc;
	struct comm *c = zc_comm(comm, 0, &rc);
	if (c == NULL)
		END(rc);
	if (!zero_copy)
		END(HCCL_E_NOT_SUPPORT);
	c->agent = 1;
	if (c->nranks == 1)
		END(HCCL_SUCCESS);
	uintptr_t base = (uintptr_t)baseVirPtr;
	if (size == 0 || alignment != 0 || flags != 0 || !aligned(base) || !aligned(size) || base + size < base)
		END(HCCL_E_PARA);
	for (struct range *r = ranges; r != NULL; r = r->next)
		if (overlap(base, size, r->base, r->size))
			END(HCCL_E_PARA);
	struct range *r = calloc(1, sizeof *r);
	if (r == NULL)
		END(HCCL_E_MEMORY);
	r->base = base;
	r->size = size;
	r->next = ranges;
	ranges = r;
	END(HCCL_SUCCESS);
}

EXPORT HcclResult HcclCommUnsetMemoryRange(HcclComm comm, void *baseVirPtr) {
	BEGIN("HcclCommUnsetMemoryRange");
	if (comm == NULL || baseVirPtr == NULL)
		END(HCCL_E_PTR);
	HcclResult rc;
	struct comm *c = zc_comm(comm, 1, &rc);
	if (c == NULL)
		END(rc);
	if (c->nranks == 1)
		END(HCCL_SUCCESS);
	uintptr_t base = (uintptr_t)baseVirPtr;
	struct range **pp = &ranges;
	while (*pp != NULL && (*pp)->base != base)
		pp = &(*pp)->next;
	if (*pp == NULL)
		END(HCCL_E_PARA);
	struct range *r = *pp;
	for (struct block *b = blocks; b != NULL; b = b->next)
		if (overlap(b->ptr, b->size, r->base, r->size))
			END(HCCL_E_PARA); // memory still activated in it
	*pp = r->next;
	free(r);
	END(HCCL_SUCCESS);
}

EXPORT HcclResult HcclCommActivateCommMemory(HcclComm comm, void *virPtr, size_t size, size_t offset,
                                             aclrtDrvMemHandle handle, uint64_t flags) {
	BEGIN("HcclCommActivateCommMemory");
	if (comm == NULL || virPtr == NULL || handle == NULL)
		END(HCCL_E_PTR);
	HcclResult rc;
	struct comm *c = zc_comm(comm, 1, &rc);
	if (c == NULL)
		END(rc);
	if (c->nranks == 1)
		END(HCCL_SUCCESS);
	uintptr_t ptr = (uintptr_t)virPtr;
	if (size == 0 || offset != 0 || flags != 0 || ptr + size < ptr)
		END(HCCL_E_PARA);
	struct range *in = NULL;
	for (struct range *r = ranges; r != NULL; r = r->next)
		if (ptr >= r->base && ptr - r->base < r->size && size <= r->base + r->size - ptr)
			in = r;
	if (in == NULL)
		END(HCCL_E_PARA); // not in a set range
	for (struct block *b = blocks; b != NULL; b = b->next)
		if (overlap(b->ptr, b->size, ptr, size))
			END(HCCL_E_PARA); // overlaps activated memory
	if (!aligned(ptr) || !aligned(size))
		END(HCCL_E_PARA); // the peers could not map it (see the header)
	if (export_once)
		for (struct exported *e = exports; e != NULL; e = e->next)
			if (e->handle == (uintptr_t)handle)
				END(HCCL_E_RUNTIME); // the runtime refused a second export
	struct block *b = calloc(1, sizeof *b);
	struct exported *e = calloc(1, sizeof *e);
	if (b == NULL || e == NULL) {
		free(b);
		free(e);
		END(HCCL_E_MEMORY);
	}
	b->ptr = ptr;
	b->size = size;
	b->handle = (uintptr_t)handle;
	b->next = blocks;
	blocks = b;
	e->handle = (uintptr_t)handle;
	e->next = exports;
	exports = e;
	END(HCCL_SUCCESS);
}

EXPORT HcclResult HcclCommDeactivateCommMemory(HcclComm comm, void *virPtr) {
	BEGIN("HcclCommDeactivateCommMemory");
	if (comm == NULL || virPtr == NULL)
		END(HCCL_E_PTR);
	HcclResult rc;
	struct comm *c = zc_comm(comm, 1, &rc);
	if (c == NULL)
		END(rc);
	if (c->nranks == 1)
		END(HCCL_SUCCESS);
	struct block **pp = &blocks;
	while (*pp != NULL && (*pp)->ptr != (uintptr_t)virPtr)
		pp = &(*pp)->next;
	if (*pp == NULL)
		END(HCCL_E_PARA); // not the start of an activated block
	struct block *b = *pp;
	*pp = b->next;
	free(b);
	END(HCCL_SUCCESS);
}

#endif // FAKEHCCL_NO_ZEROCOPY

// ---- test controls ----

// fakehccl_fail makes the nth next call of fn (1 = the next one) fail with
// result, without effect. It returns -1 if fn is not a function of the
// double.
EXPORT int fakehccl_fail(const char *fn, long nth, int result) {
	pthread_mutex_lock(&mu);
	struct fn_stat *s = stat_of(fn);
	if (s != NULL) {
		s->fail_in = nth;
		s->fail_with = (HcclResult)result;
	}
	pthread_mutex_unlock(&mu);
	return s == NULL ? -1 : 0;
}

// fakehccl_calls returns how many times fn was called, or -1.
EXPORT long fakehccl_calls(const char *fn) {
	pthread_mutex_lock(&mu);
	struct fn_stat *s = stat_of(fn);
	long n = s == NULL ? -1 : s->calls;
	pthread_mutex_unlock(&mu);
	return n;
}

// fakehccl_live_t is what fakehccl_live reports.
typedef struct {
	long comms;    // communicators made and not destroyed
	long ranges;   // set memory ranges
	long blocks;   // activated blocks
	size_t bytes;  // bytes activated
	long leaked;   // ranges and blocks dropped with the last communicator
	long exported; // handles ever activated (exported)
} fakehccl_live_t;

EXPORT void fakehccl_live(fakehccl_live_t *out) {
	pthread_mutex_lock(&mu);
	memset(out, 0, sizeof *out);
	out->comms = live_comms;
	for (struct range *r = ranges; r != NULL; r = r->next)
		out->ranges++;
	for (struct block *b = blocks; b != NULL; b = b->next) {
		out->blocks++;
		out->bytes += b->size;
	}
	out->leaked = leaked;
	for (struct exported *e = exports; e != NULL; e = e->next)
		out->exported++;
	pthread_mutex_unlock(&mu);
}

// fakehccl_active returns the handle activated at ptr, and its size through
// size, or NULL when no block starts there.
EXPORT void *fakehccl_active(void *ptr, size_t *size) {
	pthread_mutex_lock(&mu);
	void *h = NULL;
	for (struct block *b = blocks; b != NULL; b = b->next)
		if (b->ptr == (uintptr_t)ptr) {
			h = (void *)b->handle;
			*size = b->size;
		}
	pthread_mutex_unlock(&mu);
	return h;
}

// fakehccl_set sets a knob: "zero_copy" (0: the chip has none),
// "export_once" (1: a handle activated once is refused again), "align" (the
// alignment the peers map with, 2 MiB; 0 for none). It returns -1 for an
// unknown knob.
EXPORT int fakehccl_set(const char *knob, size_t value) {
	int rc = 0;
	pthread_mutex_lock(&mu);
	if (strcmp(knob, "zero_copy") == 0)
		zero_copy = value != 0;
	else if (strcmp(knob, "export_once") == 0)
		export_once = value != 0;
	else if (strcmp(knob, "align") == 0)
		align = value;
	else
		rc = -1;
	pthread_mutex_unlock(&mu);
	return rc;
}
