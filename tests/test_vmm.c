/* vmm/: loading the driver, the counted table, error messages, and the run
 * helpers' promise never to leave a half-mapped run behind. Every test
 * initialises the driver it links and makes a context current (xt_context)
 * before its own driver calls, as a real driver requires. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/array.h"
#include "vmm/vmm.h"
#include "xseg_test.h"

static bool contains(const char *haystack, const char *needle) {
  return strstr(haystack, needle) != NULL;
}

XSEG_TEST(vmm, missing_library_names_it_and_dlerror) {
  xs_vmm v;
  XSEG_EXPECT_STATUS(xs_vmm_open(&v, "libxseg-no-such-driver.so", 0),
                     XSEG_ERR_NO_DRIVER);
  XSEG_EXPECT_TRUE(contains(xseg_last_error(), "libxseg-no-such-driver.so"));
  XSEG_EXPECT_TRUE(contains(xseg_last_error(), "cannot"));
}

XSEG_TEST(vmm, bad_device_is_an_invalid_argument) {
  xs_vmm v;
  XSEG_EXPECT_STATUS(xs_vmm_open(&v, xt_driver_name(), 99),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(contains(xseg_last_error(), "device 99"));
  XSEG_EXPECT_STATUS(xs_vmm_open(&v, xt_driver_name(), -1),
                     XSEG_ERR_INVALID_ARGUMENT);
}

XSEG_TEST(vmm, open_reads_granularity_and_memory) {
  xs_vmm v;
  XSEG_ASSERT_OK(xs_vmm_open(&v, xt_driver_name(), 0));
  XSEG_EXPECT_GT(v.granularity, 0);
  XSEG_EXPECT_EQ(v.granularity & (v.granularity - 1), 0);
  XSEG_EXPECT_GT(v.total_memory, 0);
  XSEG_EXPECT_EQ(v.n_access, 1);
  XSEG_EXPECT_EQ(v.access[0].location.id, 0);
  xs_vmm_close(&v);
}

/* The context is made current for the call and the caller's comes back. */
XSEG_TEST(vmm, ctx_enter_and_leave_restore_the_callers_context) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xs_vmm v;
  XSEG_ASSERT_OK(xs_vmm_open(&v, xt_driver_name(), 0));
  XSEG_ASSERT_CU(cuCtxSetCurrent(NULL));
  CUcontext saved, now;
  XSEG_ASSERT_OK(xs_vmm_ctx_enter(&v, &saved));
  XSEG_EXPECT_TRUE(saved == NULL);
  XSEG_EXPECT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == v.ctx);
  xs_vmm_ctx_leave(&v, saved);
  XSEG_EXPECT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == NULL);
  xs_vmm_close(&v);
}

typedef struct opened {
  xs_vmm v;
  CUcontext saved;
  uint64_t base;
  size_t size;
} opened;

static bool opened_init(opened *o, size_t granules) {
  if (xt_context(0) == NULL) return false;
  if (xs_vmm_open(&o->v, xt_driver_name(), 0) != XSEG_OK) return false;
  if (xs_vmm_ctx_enter(&o->v, &o->saved) != XSEG_OK) return false;
  o->size = granules * o->v.granularity;
  return xs_vmm_reserve(&o->v, o->size, &o->base) == XSEG_OK;
}

static void opened_fini(opened *o) {
  xs_vmm_unreserve(&o->v, o->base, o->size);
  xs_vmm_ctx_leave(&o->v, o->saved);
  xs_vmm_close(&o->v);
}

XSEG_TEST(vmm, map_run_maps_a_writable_run_and_unmap_run_returns_it) {
  opened o;
  XSEG_ASSERT_TRUE(opened_init(&o, 8));
  size_t g = o.v.granularity;
  uint64_t handles[4];
  XSEG_ASSERT_OK(xs_vmm_map_run(&o.v, o.base + g, g, 4, handles));
  XSEG_EXPECT_CU(cuMemsetD8((CUdeviceptr)(o.base + g), 0x5a, 4 * g));
  unsigned char back[16];
  XSEG_EXPECT_CU(cuMemcpyDtoH(back, (CUdeviceptr)(o.base + 5 * g - 16), 16));
  XSEG_EXPECT_EQ(back[15], 0x5a);
  XSEG_EXPECT_OK(xs_vmm_unmap_run(&o.v, o.base + g, g, 4, handles));
  opened_fini(&o);
}

/* One cuMemSetAccess for the whole run, never one per granule. */
XSEG_TEST(vmm, map_run_sets_access_once_per_run) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  opened o;
  XSEG_ASSERT_TRUE(opened_init(&o, 8));
  size_t g = o.v.granularity;
  uint64_t handles[8];
  xsim_reset_counters();
  XSEG_ASSERT_OK(xs_vmm_map_run(&o.v, o.base, g, 8, handles));
  XSEG_EXPECT_EQ(xsim_call_count("cuMemSetAccess"), 1);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate"), 8);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemMap"), 8);
  XSEG_EXPECT_OK(xs_vmm_unmap_run(&o.v, o.base, g, 8, handles));
  XSEG_EXPECT_EQ(xsim_call_count("cuMemUnmap"), 1);
  opened_fini(&o);
}

/* A failure at any driver call of a run leaves nothing created or mapped,
   and the message names the call that failed. */
static void map_run_fails_cleanly(const char *fn, uint64_t nth) {
  opened o;
  XSEG_ASSERT_TRUE(opened_init(&o, 4));
  size_t g = o.v.granularity;
  xsim_live before, after;
  xsim_get_live(&before);
  xsim_fail_call(fn, nth, CUDA_ERROR_OUT_OF_MEMORY);
  uint64_t handles[4];
  XSEG_EXPECT_STATUS(xs_vmm_map_run(&o.v, o.base, g, 4, handles),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(contains(xseg_last_error(), fn));
  XSEG_EXPECT_TRUE(contains(xseg_last_error(), "CUDA_ERROR_OUT_OF_MEMORY"));
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(after.handles, before.handles);
  XSEG_EXPECT_EQ(after.mappings, before.mappings);
  XSEG_EXPECT_EQ(after.physical_bytes, before.physical_bytes);
  /* The range is whole and unmapped again: a full run maps into it. */
  XSEG_EXPECT_OK(xs_vmm_map_run(&o.v, o.base, g, 4, handles));
  XSEG_EXPECT_OK(xs_vmm_unmap_run(&o.v, o.base, g, 4, handles));
  opened_fini(&o);
}

XSEG_TEST(vmm, map_run_rolls_back_on_every_failing_call) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  for (uint64_t nth = 1; nth <= 4; nth++) {
    map_run_fails_cleanly("cuMemCreate", nth);
    map_run_fails_cleanly("cuMemMap", nth);
  }
  map_run_fails_cleanly("cuMemSetAccess", 1);
}

XSEG_TEST(vmm, failed_unmap_keeps_the_handles) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  opened o;
  XSEG_ASSERT_TRUE(opened_init(&o, 2));
  size_t g = o.v.granularity;
  uint64_t handles[2];
  XSEG_ASSERT_OK(xs_vmm_map_run(&o.v, o.base, g, 2, handles));
  xsim_reset_counters();
  xsim_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xs_vmm_unmap_run(&o.v, o.base, g, 2, handles),
                     XSEG_ERR_DRIVER);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemRelease"), 0);
  XSEG_EXPECT_OK(xs_vmm_unmap_run(&o.v, o.base, g, 2, handles));
  opened_fini(&o);
}

XSEG_TEST(vmm, driver_calls_are_counted_in_the_table) {
  xs_vmm v;
  XSEG_ASSERT_OK(xs_vmm_open(&v, xt_driver_name(), 0));
  xs_driver_reset_counts(v.drv);
  size_t free_b = 0, total_b = 0;
  CUcontext saved;
  XSEG_ASSERT_OK(xs_vmm_ctx_enter(&v, &saved));
  XSEG_EXPECT_OK(xs_vmm_mem_info(&v, &free_b, &total_b));
  XSEG_EXPECT_OK(xs_vmm_mem_info(&v, &free_b, &total_b));
  XSEG_EXPECT_EQ(xs_driver_call_count(v.drv, XS_DRIVER_FN_cuMemGetInfo), 2);
  XSEG_EXPECT_STREQ(xs_driver_fn_name(XS_DRIVER_FN_cuMemGetInfo),
                    "cuMemGetInfo");
  XSEG_EXPECT_LE(free_b, total_b);
  xs_vmm_ctx_leave(&v, saved);
  xs_vmm_close(&v);
}

XSEG_TEST(vmm, peers_join_the_access_list_once) {
  xs_vmm v;
  XSEG_ASSERT_OK(xs_vmm_open(&v, xt_driver_name(), 0));
  XSEG_EXPECT_OK(xs_vmm_add_peer(&v, 1));
  XSEG_EXPECT_OK(xs_vmm_add_peer(&v, 1));
  XSEG_EXPECT_EQ(v.n_access, 2);
  XSEG_EXPECT_EQ(v.access[1].location.id, 1);
  xs_vmm_close(&v);
}

/* vmm/array.h: the one growth rule of the small arrays. */
XSEG_TEST(vmm, array_grows_by_doubling_and_keeps_its_items) {
  uint64_t *items = NULL;
  size_t n = 0, cap = 0;
  for (uint64_t i = 0; i < 100; i++) {
    XSEG_ASSERT_TRUE(XS_ARRAY_RESERVE(items, cap, n + 1, 4));
    items[n++] = i * 7;
  }
  XSEG_EXPECT_EQ(cap, (size_t)128);    /* 4, 8, ..., 128 */
  for (uint64_t i = 0; i < 100; i++) XSEG_EXPECT_EQ(items[i], i * 7);
  /* Room for many at once: doubled until it fits, in one realloc. */
  XSEG_ASSERT_TRUE(XS_ARRAY_RESERVE(items, cap, 1000, 4));
  XSEG_EXPECT_EQ(cap, (size_t)1024);
  XSEG_EXPECT_EQ(items[99], (uint64_t)693);
  free(items);
}

XSEG_TEST(vmm, array_that_cannot_grow_is_left_as_it_was) {
  uint64_t *items = NULL;
  size_t cap = 0;
  XSEG_ASSERT_TRUE(XS_ARRAY_RESERVE(items, cap, 3, 4));
  items[0] = 42;
  uint64_t *before = items;
  /* A size whose bytes overflow size_t is refused before any realloc. */
  XSEG_EXPECT_FALSE(XS_ARRAY_RESERVE(items, cap, SIZE_MAX / 4, 4));
  XSEG_EXPECT_TRUE(items == before);
  XSEG_EXPECT_EQ(cap, (size_t)4);
  XSEG_EXPECT_EQ(items[0], (uint64_t)42);
  free(items);
}
