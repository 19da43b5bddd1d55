// fakenccl.c: a test double of NCCL (libnccl.so.2), for testing the purego
// binding in package acl/nccl without a GPU. It exports the calls the binding
// resolves, with the prototypes of nccl.h and the ncclResult_t values, and
// keeps the registration rules NCCL's source keeps:
//
//   - ncclCommInitAll(comms, ndev, devlist) makes ndev communicators at once;
//     ncclCommDestroy destroys one, dropping what is still registered with
//     it (as NCCL's cleanup does), which the double counts as leaked;
//   - ncclCommRegister(comm, buff, size, &handle) returns a handle of its
//     own for the buffer; with the local_register knob 0 (NCCL_LOCAL_REGISTER=0)
//     it registers nothing and returns a NULL handle, successfully;
//   - ncclCommDeregister(comm, handle): a NULL handle is accepted and does
//     nothing; a handle not registered with comm is ncclInvalidUsage (5);
//   - an unknown or destroyed communicator, or a NULL out-pointer, is
//     ncclInvalidArgument (4).
//
// Where the double is stricter than NCCL, said so that no test mistakes it
// for NCCL: a NULL buffer or a size of 0 is ncclInvalidArgument, and a
// registration overlapping one the communicator holds is ncclInvalidUsage
// (NCCL counts a buffer inside a registered one as one more reference to it,
// and registers an overlapping one as another entry): a registrar that maps
// an arena's chunks one to one never does either. NCCL reads the buffer's
// CUDA address range as it registers (cuMemGetAddressRange), so it refuses
// memory that is not mapped at its first byte (ncclUnhandledCudaError, 1);
// the double cannot see the CUDA driver's mappings, so tests pair it with a
// registration double that does (acltest.Registrations).
//
// Built with -DFAKENCCL_OLD it lacks ncclCommRegister and ncclCommDeregister,
// like an NCCL before 2.19.
//
// Test-only functions (fakenccl_*) count and fail calls, set knobs and report
// what is held. One mutex guards all state, so the double may be called from
// any number of threads.
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
} ncclResult_t;

typedef struct comm *ncclComm_t;

// ---- state, guarded by mu ----

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct reg {
	uintptr_t buff;
	size_t size;
	struct reg *next;
};

struct comm {
	int dev, rank, nranks;
	int dead;
	struct reg *regs;
	char last[256]; // ncclGetLastError
	struct comm *next;
};

static struct comm *comms; // every communicator made, dead ones too (never freed, so a stale one is recognised)
static long live_comms, leaked, skipped;
static int local_register = 1;

// ---- call counting and fault injection ----

struct fn_stat {
	const char *name;
	long calls;
	long fail_in; // fail the fail_in-th next call; 0 = no fault armed
	ncclResult_t fail_with;
};

static struct fn_stat stats[] = {
	{"ncclGetVersion", 0, 0, 0},     {"ncclCommInitAll", 0, 0, 0},   {"ncclCommDestroy", 0, 0, 0},
	{"ncclCommRegister", 0, 0, 0},   {"ncclCommDeregister", 0, 0, 0},
};
#define NSTATS (sizeof(stats) / sizeof(stats[0]))

static struct fn_stat *stat_of(const char *name) {
	for (size_t i = 0; i < NSTATS; i++)
		if (strcmp(stats[i].name, name) == 0)
			return &stats[i];
	return NULL;
}

static ncclResult_t enter(const char *fn) {
	struct fn_stat *s = stat_of(fn);
	s->calls++;
	if (s->fail_in > 0 && --s->fail_in == 0)
		return s->fail_with;
	return ncclSuccess;
}

#define BEGIN(fn)                      \
	pthread_mutex_lock(&mu);           \
	ncclResult_t rc_ = enter(fn);      \
	if (rc_ != ncclSuccess) {          \
		pthread_mutex_unlock(&mu);     \
		return rc_;                    \
	}

#define END(rc)                        \
	do {                               \
		ncclResult_t r_ = (rc);        \
		pthread_mutex_unlock(&mu);     \
		return r_;                     \
	} while (0)

static struct comm *comm_of(ncclComm_t c) {
	for (struct comm *x = comms; x != NULL; x = x->next)
		if (x == c)
			return x->dead ? NULL : x;
	return NULL;
}

// refuse records why c refused a call, for ncclGetLastError, and returns rc.
static inline ncclResult_t refuse(struct comm *c, ncclResult_t rc, const char *why) {
	if (c != NULL)
		snprintf(c->last, sizeof c->last, "%s", why);
	return rc;
}

// ---- communicators ----

EXPORT ncclResult_t ncclGetVersion(int *version) {
	BEGIN("ncclGetVersion");
	if (version == NULL)
		END(ncclInvalidArgument);
	*version = 22807; // 2.28.7
	END(ncclSuccess);
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
	BEGIN("ncclCommInitAll");
	if (comm == NULL || ndev < 1)
		END(ncclInvalidArgument);
	for (int i = 0; i < ndev; i++) {
		struct comm *c = calloc(1, sizeof *c);
		if (c == NULL)
			END(ncclSystemError);
		c->dev = devlist != NULL ? devlist[i] : i;
		c->rank = i;
		c->nranks = ndev;
		c->next = comms;
		comms = c;
		live_comms++;
		comm[i] = c;
	}
	END(ncclSuccess);
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
	BEGIN("ncclCommDestroy");
	struct comm *c = comm_of(comm);
	if (c == NULL)
		END(ncclInvalidArgument);
	while (c->regs != NULL) {
		struct reg *r = c->regs;
		c->regs = r->next;
		free(r);
		leaked++;
	}
	c->dead = 1;
	live_comms--;
	END(ncclSuccess);
}

static const char *const names[] = {
	"no error", "unhandled cuda error", "unhandled system error", "internal error",
	"invalid argument", "invalid usage", "remote process exited or there was a network error", "NCCL operation in progress",
};

EXPORT const char *ncclGetErrorString(ncclResult_t result) {
	if ((unsigned)result < sizeof names / sizeof names[0])
		return names[result];
	return "unknown result code";
}

EXPORT const char *ncclGetLastError(ncclComm_t comm) {
	pthread_mutex_lock(&mu);
	struct comm *c = comm_of(comm);
	const char *s = c != NULL ? c->last : "";
	pthread_mutex_unlock(&mu);
	return s;
}

// ---- registration ----

#ifndef FAKENCCL_OLD // built without it: an NCCL before 2.19

EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
	BEGIN("ncclCommRegister");
	struct comm *c = comm_of(comm);
	if (c == NULL || handle == NULL)
		END(ncclInvalidArgument);
	if (buff == NULL || size == 0)
		END(refuse(c, ncclInvalidArgument, "ncclCommRegister: NULL buffer or 0 bytes"));
	if (!local_register) {
		*handle = NULL;
		skipped++;
		END(ncclSuccess);
	}
	uintptr_t b = (uintptr_t)buff;
	for (struct reg *r = c->regs; r != NULL; r = r->next)
		if (b < r->buff + r->size && r->buff < b + size)
			END(refuse(c, ncclInvalidUsage, "ncclCommRegister: the buffer overlaps a registered one"));
	struct reg *r = calloc(1, sizeof *r);
	if (r == NULL)
		END(ncclSystemError);
	r->buff = b;
	r->size = size;
	r->next = c->regs;
	c->regs = r;
	*handle = r;
	END(ncclSuccess);
}

EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
	BEGIN("ncclCommDeregister");
	struct comm *c = comm_of(comm);
	if (c == NULL)
		END(ncclInvalidArgument);
	if (handle == NULL)
		END(ncclSuccess);
	struct reg **pp = &c->regs;
	while (*pp != NULL && (void *)*pp != handle)
		pp = &(*pp)->next;
	if (*pp == NULL)
		END(refuse(c, ncclInvalidUsage, "Deregister: Could not find handle"));
	struct reg *r = *pp;
	*pp = r->next;
	free(r);
	END(ncclSuccess);
}

#endif // FAKENCCL_OLD

// ---- test controls ----

// fakenccl_fail makes the nth next call of fn (1 = the next one) fail with
// result, without effect. It returns -1 if fn is not a function of the
// double.
EXPORT int fakenccl_fail(const char *fn, long nth, int result) {
	pthread_mutex_lock(&mu);
	struct fn_stat *s = stat_of(fn);
	if (s != NULL) {
		s->fail_in = nth;
		s->fail_with = (ncclResult_t)result;
	}
	pthread_mutex_unlock(&mu);
	return s == NULL ? -1 : 0;
}

// fakenccl_calls returns how many times fn was called, or -1.
EXPORT long fakenccl_calls(const char *fn) {
	pthread_mutex_lock(&mu);
	struct fn_stat *s = stat_of(fn);
	long n = s == NULL ? -1 : s->calls;
	pthread_mutex_unlock(&mu);
	return n;
}

// fakenccl_live_t is what fakenccl_live reports.
typedef struct {
	long comms;   // communicators made and not destroyed
	long regs;    // registrations held, on every communicator
	size_t bytes; // their bytes
	long leaked;  // registrations dropped by ncclCommDestroy
	long skipped; // registrations skipped (local_register 0)
} fakenccl_live_t;

EXPORT void fakenccl_live(fakenccl_live_t *out) {
	pthread_mutex_lock(&mu);
	memset(out, 0, sizeof *out);
	out->comms = live_comms;
	for (struct comm *c = comms; c != NULL; c = c->next)
		for (struct reg *r = c->regs; r != NULL; r = r->next) {
			out->regs++;
			out->bytes += r->size;
		}
	out->leaked = leaked;
	out->skipped = skipped;
	pthread_mutex_unlock(&mu);
}

// fakenccl_set sets a knob: "local_register" (0: as NCCL_LOCAL_REGISTER=0,
// registration does nothing and returns NULL handles). It returns -1 for an
// unknown knob.
EXPORT int fakenccl_set(const char *knob, size_t value) {
	int rc = 0;
	pthread_mutex_lock(&mu);
	if (strcmp(knob, "local_register") == 0)
		local_register = value != 0;
	else
		rc = -1;
	pthread_mutex_unlock(&mu);
	return rc;
}
