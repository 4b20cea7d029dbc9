/* sim_helpers.h: small helpers shared by the emulator's conformance tests
 * (tests/test_sim_*.c). They call only the driver API, so the same tests run
 * on a real GPU; whatever needs the emulator's control API is marked with
 * XT_REQUIRE_SIM_FOR() in the test itself.
 */
#ifndef XSEG_SIM_HELPERS_H
#define XSEG_SIM_HELPERS_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "xseg_test.h"

/* A PINNED allocation on device `dev`, exportable as `types`. */
static inline CUmemAllocationProp st_prop(int dev,
                                          CUmemAllocationHandleType types) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = types;
  return p;
}

/* Makes device 0's primary context current; returns the minimum
   granularity, or 0 when the driver is unusable. */
static inline size_t st_setup(void) {
  if (xt_context(0) == NULL) return 0;
  CUmemAllocationProp p = st_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  size_t g = 0;
  if (cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
      CUDA_SUCCESS)
    return 0;
  return g;
}

static inline CUresult st_create(CUmemGenericAllocationHandle *h, size_t size,
                                 CUmemAllocationHandleType types) {
  CUmemAllocationProp p = st_prop(0, types);
  return cuMemCreate(h, size, &p, 0);
}

/* Read-write access for device `dev` on [ptr, ptr+size). */
static inline CUresult st_access(CUdeviceptr ptr, size_t size, int dev,
                                 CUmemAccess_flags flags) {
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev;
  d.flags = flags;
  return cuMemSetAccess(ptr, size, &d, 1);
}

/* Makes device 0's primary context current, then a non-blocking stream and
   an event created with `flags`, in that order. Each step is checked; false
   after the first that failed. */
static inline bool st_stream_event(CUstream *s, CUevent *e, unsigned flags) {
  return XSEG_EXPECT_TRUE(xt_context(0) != NULL) &&
         XSEG_EXPECT_CU(cuStreamCreate(s, CU_STREAM_NON_BLOCKING)) &&
         XSEG_EXPECT_CU(cuEventCreate(e, flags));
}

/* Device memory from the VMM API: one granule of device 0, mapped
   read-write. */
typedef struct st_buf {
  CUdeviceptr ptr;
  size_t size;
  CUmemGenericAllocationHandle handle;
} st_buf;

/* Makes *b one mapped granule; false (and *b partly set) on any failure. */
static inline bool st_buf_alloc(st_buf *b) {
  CUmemAllocationProp p = st_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  *b = (st_buf){0};
  return cuMemGetAllocationGranularity(&b->size, &p,
                                       CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
             CUDA_SUCCESS &&
         cuMemAddressReserve(&b->ptr, b->size, 0, 0, 0) == CUDA_SUCCESS &&
         st_create(&b->handle, b->size, CU_MEM_HANDLE_TYPE_NONE) ==
             CUDA_SUCCESS &&
         cuMemMap(b->ptr, b->size, 0, b->handle, 0) == CUDA_SUCCESS &&
         st_access(b->ptr, b->size, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ==
             CUDA_SUCCESS;
}

static inline void st_buf_free(st_buf *b) {
  XSEG_EXPECT_CU(cuMemUnmap(b->ptr, b->size));
  XSEG_EXPECT_CU(cuMemRelease(b->handle));
  XSEG_EXPECT_CU(cuMemAddressFree(b->ptr, b->size));
}

/* Polls s until its work is done: CUDA_SUCCESS, the error cuStreamQuery
   gave, or CUDA_ERROR_NOT_READY after about 10 s, so that a stream that
   never drains fails the test instead of hanging it. */
static inline CUresult st_stream_drain(CUstream s) {
  const struct timespec ms = {0, 1000 * 1000};
  CUresult r = cuStreamQuery(s);
  for (int i = 0; i < 10000 && r == CUDA_ERROR_NOT_READY; i++) {
    nanosleep(&ms, NULL);
    r = cuStreamQuery(s);
  }
  return r;
}

/* A host function's view of the test: did it run, and had the test
   released the held stream when it did? */
typedef struct st_probe {
  atomic_int *released;
  atomic_int ran;
  atomic_int saw_released;
} st_probe;

static inline void CUDA_CB st_probe_run(void *arg) {
  st_probe *p = arg;
  atomic_store(&p->saw_released, atomic_load(p->released));
  atomic_store(&p->ran, 1);
}

/* Opens a latch after noting that it was released. */
static inline void st_release(atomic_int *released, xt_latch *l) {
  atomic_store(released, 1);
  xt_latch_open(l);
}

/* Runs fn(arg) in a forked child; returns the signal that killed it, or
   -(exit status) when it exited (0 then means it ran to the end). The child
   puts SIGSEGV back to its default so that a sanitizer's handler does not
   turn the fault into an exit. */
static inline int st_child_run(void (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1000;
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    fn(arg);
    _exit(0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) continue;
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  return -WEXITSTATUS(status);
}

/* Sets an environment knob and makes the emulator read it again. */
static inline void st_env(const char *var, const char *value) {
  if (value) setenv(var, value, 1);
  else unsetenv(var);
  xsim_reset();
}

/* Ends a capture that is expected to have been invalidated. */
static inline void st_capture_invalidated(CUstream s) {
  CUgraph g = (CUgraph)0x1;
  XSEG_EXPECT_CU_ERR(cuStreamEndCapture(s, &g),
                     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  XSEG_EXPECT_TRUE(g == NULL);
}

/* Ends a capture expected to be valid and destroys its graph. */
static inline void st_capture_valid(CUstream s) {
  CUgraph g = NULL;
  XSEG_EXPECT_CU(cuStreamEndCapture(s, &g));
  XSEG_EXPECT_TRUE(g != NULL);
  if (g) XSEG_EXPECT_CU(cuGraphDestroy(g));
}

/* A reserved range of `granules` granules, freed by st_space_fini (the
   handles mapped in it are the caller's). */
typedef struct st_space {
  size_t g;
  CUdeviceptr va;
  size_t va_size;
} st_space;

static inline bool st_space_init(st_space *s, size_t granules) {
  s->g = st_setup();
  s->va_size = granules * s->g;
  return s->g != 0 &&
         cuMemAddressReserve(&s->va, s->va_size, 0, 0, 0) == CUDA_SUCCESS;
}

static inline void st_space_fini(st_space *s) {
  XSEG_EXPECT_CU(cuMemAddressFree(s->va, s->va_size));
}

#endif /* XSEG_SIM_HELPERS_H */
