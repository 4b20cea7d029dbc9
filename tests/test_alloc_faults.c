/* Fault injection at every driver call site of growth and release: each
   failing call leaves the allocator consistent (xseg_check), loses no live
   block, and leaks no handle, mapping or reservation (the fixture checks).
   Each function fails once at its nth call, and persistently from its nth
   call on; the sweep also runs on a thread that has no current context
   (the allocator enters its own and leaves the thread as it found it). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "alloc_helpers.h"

enum { LIVE = 8 };

typedef struct fault_run {
  xseg_allocator *a;
  void *live[LIVE];
  size_t size[LIVE];
  int n;
  int failures;
  bool touch;          /* fill and verify blocks (needs a context) */
} fault_run;

/* How a sweep injects: one failing call, or every call from the nth on. */
typedef enum fault_mode { FAULT_ONCE, FAULT_PERSISTENT } fault_mode;

static void fault_check(fault_run *r, xseg_status st) {
  if (st != XSEG_OK) {
    r->failures++;
    XSEG_EXPECT_TRUE(xseg_last_error()[0] != '\0');
  }
  if (xseg_check(r->a) != XSEG_OK) XSEG_FAIL("%s", xseg_last_error());
}

static void fault_malloc(fault_run *r, size_t size) {
  void *p = NULL;
  xseg_status st = xseg_malloc(r->a, size, NULL, &p);
  if (st == XSEG_OK) {
    if (r->touch) XSEG_EXPECT_TRUE(at_fill(p, size, 3));
    r->size[r->n] = size;
    r->live[r->n++] = p;
  } else {
    XSEG_EXPECT_TRUE(p == NULL);
  }
  fault_check(r, st);
}

static void fault_free(fault_run *r, int i) {
  if (i >= r->n || r->live[i] == NULL) return;
  /* Whatever failed, a live block kept its bytes. */
  if (r->touch) XSEG_EXPECT_TRUE(at_verify(r->live[i], r->size[i], 3));
  fault_check(r, xseg_free(r->a, r->live[i]));
  r->live[i] = NULL;
}

/* Growth that reuses handles and creates more, release, a new segment. */
static int fault_scenario(const char *conf, bool touch) {
  fault_run r = {0};
  r.touch = touch;
  r.a = at_create(conf);
  if (r.a == NULL) return 0;
  fault_malloc(&r, 8 * MiB);
  fault_malloc(&r, 2 * MiB);
  fault_free(&r, 0);
  fault_malloc(&r, 10 * MiB);       /* harvests the hole, creates more */
  fault_malloc(&r, 4096);           /* the small pool's first segment */
  fault_malloc(&r, 3 * MiB);
  fault_free(&r, 1);
  fault_check(&r, xseg_empty_cache(r.a));
  fault_malloc(&r, 6 * MiB);
  for (int i = 0; i < r.n; i++) fault_free(&r, i);
  fault_check(&r, xseg_empty_cache(r.a));
  xsim_reset();        /* an injection not yet reached must not hit destroy */
  /* The driver works again: what waited (handles whose release failed)
     goes now, and everything is given back. */
  fault_check(&r, xseg_empty_cache(r.a));
  XSEG_EXPECT_EQ(at_stats(r.a).handles_awaiting_release, 0);
  XSEG_EXPECT_EQ(at_stats(r.a).mapped_bytes, 0);
  xseg_destroy(r.a);
  return r.failures;
}

static void fault_sweep_on(const char *name, CUresult err, const char *conf,
                           fault_mode mode, bool touch) {
  xsim_reset();
  fault_scenario(conf, touch);
  uint64_t calls = xsim_call_count(name);
  for (uint64_t nth = 1; nth <= calls + 1; nth++) {
    xsim_reset();
    if (mode == FAULT_ONCE) xsim_fail_call(name, nth, err);
    else xsim_fail_calls(name, nth, UINT64_MAX, err);
    int failures = fault_scenario(conf, touch);
    if (nth <= calls && failures == 0 && err != CUDA_ERROR_OUT_OF_MEMORY)
      XSEG_FAIL("%s #%llu failing%s was not reported by any call", name,
                (unsigned long long)nth,
                mode == FAULT_ONCE ? "" : " (and every call after it)");
  }
}

static void fault_sweep_mode(const char *name, CUresult err,
                             const char *conf, fault_mode mode) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  fault_sweep_on(name, err, conf, mode, true);
}

static void fault_sweep(const char *name, CUresult err, const char *conf) {
  fault_sweep_mode(name, err, conf, FAULT_ONCE);
}

/* The sweep on a thread that never made a context current. */
typedef struct fault_thread_arg {
  const char *name;
  CUresult err;
  bool ctx_stayed_null;
} fault_thread_arg;

static void *fault_thread(void *p) {
  fault_thread_arg *t = p;
  fault_sweep_on(t->name, t->err, NULL, FAULT_PERSISTENT, false);
  CUcontext ctx = (CUcontext)1;
  t->ctx_stayed_null = cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx == NULL;
  return NULL;
}

static void fault_sweep_no_context(const char *name, CUresult err) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);     /* loads the driver here */
  fault_thread_arg t = {name, err, false};
  pthread_t th;
  XSEG_ASSERT_EQ(pthread_create(&th, NULL, fault_thread, &t), 0);
  pthread_join(th, NULL);
  XSEG_EXPECT_TRUE(t.ctx_stayed_null);
}

#define FAULT_TEST(fn, err)                                                 \
  XSEG_TEST(alloc_faults, fn##_expandable) {                                \
    XT_REQUIRE_SIM_FOR("injects driver faults");                            \
    fault_sweep(#fn, err, NULL);                                            \
  }                                                                         \
  XSEG_TEST(alloc_faults, fn##_classic) {                                   \
    XT_REQUIRE_SIM_FOR("injects driver faults");                            \
    fault_sweep(#fn, err, "expandable_segments:False");                     \
  }                                                                         \
  XSEG_TEST(alloc_faults, fn##_multi_granule_handles) {                     \
    XT_REQUIRE_SIM_FOR("injects driver faults");                            \
    fault_sweep(#fn, err, "xseg_handle_max_mb:0,xseg_handle_max_part:0");   \
  }                                                                         \
  XSEG_TEST(alloc_faults, fn##_persistent_expandable) {                     \
    XT_REQUIRE_SIM_FOR("injects driver faults");                            \
    fault_sweep_mode(#fn, err, NULL, FAULT_PERSISTENT);                     \
  }                                                                         \
  XSEG_TEST(alloc_faults, fn##_persistent_classic) {                        \
    XT_REQUIRE_SIM_FOR("injects driver faults");                            \
    fault_sweep_mode(#fn, err, "expandable_segments:False",                 \
                     FAULT_PERSISTENT);                                     \
  }                                                                         \
  XSEG_TEST(alloc_faults, fn##_persistent_granules) {                       \
    XT_REQUIRE_SIM_FOR("injects driver faults");                            \
    fault_sweep_mode(#fn, err,                                              \
                     "xseg_handle_policy:granule,xseg_large_granule_mb:4",  \
                     FAULT_PERSISTENT);                                     \
  }                                                                         \
  XSEG_TEST(alloc_faults, fn##_thread_without_context) {                    \
    XT_REQUIRE_SIM_FOR("injects driver faults");                            \
    fault_sweep_no_context(#fn, err);                                       \
  }

FAULT_TEST(cuMemAddressReserve, CUDA_ERROR_UNKNOWN)
FAULT_TEST(cuMemCreate, CUDA_ERROR_UNKNOWN)
FAULT_TEST(cuMemMap, CUDA_ERROR_UNKNOWN)
FAULT_TEST(cuMemSetAccess, CUDA_ERROR_UNKNOWN)
FAULT_TEST(cuMemUnmap, CUDA_ERROR_UNKNOWN)
FAULT_TEST(cuMemRelease, CUDA_ERROR_UNKNOWN)
FAULT_TEST(cuStreamQuery, CUDA_ERROR_UNKNOWN)
FAULT_TEST(cuCtxGetCurrent, CUDA_ERROR_UNKNOWN)

/* Out of memory from cuMemCreate is retried after releasing the cache. */
XSEG_TEST(alloc_faults, create_out_of_memory_is_retried) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  fault_sweep("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, NULL);
  xseg_allocator *a = at_create(NULL);
  xsim_fail_call("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
  XSEG_EXPECT_EQ(at_stats(a).num_alloc_retries, 1);
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A failure in the middle of a growth rolls back every granule it mapped,
   and the reservation it made. */
XSEG_TEST(alloc_faults, failed_growth_rolls_back_mapped_granules) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xseg_allocator *a = at_create(NULL);
  xsim_live before;
  xsim_get_live(&before);
  xsim_fail_call("cuMemMap", 3, CUDA_ERROR_UNKNOWN);
  void *p;
  XSEG_EXPECT_STATUS(xseg_malloc(a, 9 * MiB, NULL, &p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuMemMap") != NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "CUDA_ERROR_UNKNOWN") != NULL);
  xsim_live after;
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(after.mappings, before.mappings);
  XSEG_EXPECT_EQ(after.handles, before.handles);
  /* The reservation made for the growth goes with it: no segment of
     nothing stays counted (the classic growth's rule too). */
  XSEG_EXPECT_EQ(after.reservations, before.reservations);
  XSEG_EXPECT_EQ(at_stats(a).segment.current, 0);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_malloc(a, 9 * MiB, NULL, &p));
  XSEG_EXPECT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

/* Two failures in a row (found by the fuzz test): cuMemSetAccess fails
   after the growth mapped its handles, and so does the first unmap that
   rolls the mapping back. The rollback tries again: nothing stays mapped
   where the allocator believes nothing is. */
XSEG_TEST(alloc_faults, failed_rollback_unmap_is_tried_again) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xseg_allocator *a = at_create(NULL);
  xsim_live before;
  xsim_get_live(&before);
  xsim_fail_call("cuMemSetAccess", 1, CUDA_ERROR_UNKNOWN);
  xsim_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  void *p;
  XSEG_EXPECT_STATUS(xseg_malloc(a, 6 * MiB, NULL, &p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuMemSetAccess") != NULL);
  xsim_live after;
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(after.mappings, before.mappings);
  XSEG_EXPECT_EQ(after.handles, before.handles);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_malloc(a, 6 * MiB, NULL, &p));
  XSEG_EXPECT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

/* An allocator's first cuMemUnmap at destroy fails once: the unmap is
   tried again, and its segment's handles, mapping and range all go
   (before, all three were lost); so does a range whose cuMemAddressFree
   fails once there (kept, and freed by the destroy's last retry). */
XSEG_TEST(alloc_faults, a_destroy_whose_unmap_fails_once_loses_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  for (int fail = 0; fail < 2; fail++) {
    xsim_live before, after;
    xsim_get_live(&before);
    xseg_allocator *a = at_create(NULL);
    XSEG_ASSERT_TRUE(a != NULL);
    void *p;
    XSEG_ASSERT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
    xsim_fail_call(fail == 0 ? "cuMemUnmap" : "cuMemAddressFree", 1,
                   CUDA_ERROR_UNKNOWN);
    xseg_destroy(a);
    xsim_fail_call(fail == 0 ? "cuMemUnmap" : "cuMemAddressFree", 0,
                   CUDA_SUCCESS);
    xsim_get_live(&after);
    XSEG_EXPECT_EQ(after.reservations, before.reservations);
    XSEG_EXPECT_EQ(after.mappings, before.mappings);
    XSEG_EXPECT_EQ(after.handles, before.handles);
  }
}
