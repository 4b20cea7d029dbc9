/* Multi-granule handles (xseg_handle_policy, xseg_handle_max_mb,
   xseg_handle_max_part): growth creates one handle for a run of fresh
   granules, release and harvest unmap whole handles only, and a handle that
   a live block pins stays mapped whole. Driver calls are counted by the
   emulator. */
#include <string.h>

#include "alloc_helpers.h"

/* One handle per growth, however large. */
#define ONE_HANDLE "xseg_handle_max_mb:0,xseg_handle_max_part:0"

typedef struct calls {
  uint64_t create, release, map, unmap, access;
} calls;

static calls calls_now(void) {
  return (calls){xsim_call_count("cuMemCreate"),
                 xsim_call_count("cuMemRelease"),
                 xsim_call_count("cuMemMap"), xsim_call_count("cuMemUnmap"),
                 xsim_call_count("cuMemSetAccess")};
}

static void expect_calls(calls before, uint64_t create, uint64_t release,
                         uint64_t map, uint64_t unmap, uint64_t access) {
  calls now = calls_now();
  XSEG_EXPECT_EQ(now.create - before.create, create);
  XSEG_EXPECT_EQ(now.release - before.release, release);
  XSEG_EXPECT_EQ(now.map - before.map, map);
  XSEG_EXPECT_EQ(now.unmap - before.unmap, unmap);
  XSEG_EXPECT_EQ(now.access - before.access, access);
}

static void *malloc_ok(xseg_allocator *a, size_t size) {
  void *p = NULL;
  XSEG_EXPECT_OK(xseg_malloc(a, size, NULL, &p));
  XSEG_EXPECT_TRUE(p == NULL || at_fill(p, size, 1));
  return p;
}

XSEG_TEST(alloc_handles, growth_maps_one_handle_with_three_calls) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(ONE_HANDLE);
  calls before = calls_now();
  void *p = malloc_ok(a, 100 * MiB);          /* 50 granules */
  expect_calls(before, 1, 0, 1, 0, 1);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, (int64_t)(100 * MiB));
  XSEG_EXPECT_TRUE(at_verify(p, 100 * MiB, 1));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, p));
  before = calls_now();
  XSEG_EXPECT_OK(xseg_empty_cache(a));        /* one unmap, one release */
  expect_calls(before, 0, 1, 0, 1, 0);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  xseg_destroy(a);
}

XSEG_TEST(alloc_handles, granule_policy_keeps_one_handle_per_granule) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create("xseg_handle_policy:granule");
  calls before = calls_now();
  void *p = malloc_ok(a, 20 * MiB);
  expect_calls(before, 10, 0, 10, 0, 1);
  XSEG_EXPECT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

XSEG_TEST(alloc_handles, handle_size_is_capped) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  /* pow2 under an 8 MiB cap: 22 MiB = 8 + 8 + 4 + 2. */
  xseg_allocator *a =
      at_create("xseg_handle_policy:pow2,xseg_handle_max_mb:8,"
                "xseg_handle_max_part:0");
  calls before = calls_now();
  void *p = malloc_ok(a, 22 * MiB);
  expect_calls(before, 4, 0, 4, 0, 1);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, p));
  xseg_destroy(a);
  /* The default: at most 1/32 of what is mapped, so a first growth maps
     granule-sized handles. */
  a = at_create(NULL);
  before = calls_now();
  p = malloc_ok(a, 6 * MiB);
  expect_calls(before, 3, 0, 3, 0, 1);
  XSEG_EXPECT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

/* A free block that covers only part of a handle gives nothing back: the
   driver unmaps whole handles. Once the pinning block goes, it all goes.
 *
 *     handle H (5 granules):  | g0 | g1 | g2 | g3 | g4 |
 *     blocks:                 [ y  ][  free: g2..g4 whole ]
 */
XSEG_TEST(alloc_handles, a_pinned_handle_stays_mapped_whole) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(ONE_HANDLE);
  void *x = malloc_ok(a, 10 * MiB);
  XSEG_EXPECT_OK(xseg_free(a, x));
  void *y = malloc_ok(a, 4 * MiB);            /* in H's first granules */
  XSEG_EXPECT_TRUE(y == x);
  calls before = calls_now();
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  expect_calls(before, 0, 0, 0, 0, 0);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, (int64_t)(10 * MiB));
  XSEG_EXPECT_TRUE(at_verify(y, 4 * MiB, 1));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, y));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  expect_calls(before, 0, 1, 0, 1, 0);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* Growth moves a whole free handle with one unmap and one map, and creates
   only the rest.
 *
 *     before:  [ free: H1, 10 granules ][ b: H2 ][ unmapped tail ...
 *     after:   [ unmapped .............][ b: H2 ][ c: H1 + H3 (5) ]
 */
XSEG_TEST(alloc_handles, growth_moves_whole_free_handles) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(ONE_HANDLE);
  void *x = malloc_ok(a, 20 * MiB);
  void *b = malloc_ok(a, 2 * MiB);
  XSEG_EXPECT_OK(xseg_free(a, x));
  calls before = calls_now();
  void *c = malloc_ok(a, 30 * MiB);
  expect_calls(before, 1, 0, 2, 1, 1);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, (int64_t)(32 * MiB));
  XSEG_EXPECT_TRUE(at_verify(b, 2 * MiB, 1));
  XSEG_EXPECT_TRUE(at_verify(c, 30 * MiB, 1));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, b));
  XSEG_EXPECT_OK(xseg_free(a, c));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  xseg_destroy(a);
}

/* Free handles are moved whole even where the last one gives more than
   the need: the rest is free mapped space at the growth point, not new
   memory, and the next request fits there without a driver call.
 *
 *     before:  [ free: H1 (20) ][ b1 ][ free: H3 (4) ][ b2 ][ tail ...
 *     after:   [ unmapped .....][ b1 ][ unmapped ....][ b2 ][ c: 21 | 3 ]
 */
XSEG_TEST(alloc_handles, a_larger_free_handle_moves_whole) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(ONE_HANDLE);
  void *x = malloc_ok(a, 40 * MiB);
  void *b1 = malloc_ok(a, 2 * MiB);
  void *y = malloc_ok(a, 8 * MiB);
  void *b2 = malloc_ok(a, 2 * MiB);
  XSEG_EXPECT_OK(xseg_free(a, x));
  XSEG_EXPECT_OK(xseg_free(a, y));
  calls before = calls_now();
  void *c = malloc_ok(a, 42 * MiB);           /* 21 granules: H1 + H3 */
  expect_calls(before, 0, 0, 2, 2, 1);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, (int64_t)(52 * MiB));
  before = calls_now();
  void *d = malloc_ok(a, 6 * MiB);            /* in the 3 spare granules */
  expect_calls(before, 0, 0, 0, 0, 0);
  XSEG_EXPECT_TRUE(at_verify(c, 42 * MiB, 1) && at_verify(d, 6 * MiB, 1));
  XSEG_EXPECT_OK(xseg_check(a));
  void *all[] = {b1, b2, c, d};
  for (int i = 0; i < 4; i++) XSEG_EXPECT_OK(xseg_free(a, all[i]));
  xseg_destroy(a);
}

XSEG_TEST(alloc_handles, grow_min_maps_ahead_at_the_end) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(ONE_HANDLE ",xseg_grow_min_mb:20");
  calls before = calls_now();
  void *p[10];
  for (int i = 0; i < 10; i++) p[i] = malloc_ok(a, 2 * MiB);
  expect_calls(before, 1, 0, 1, 0, 1);        /* one 20 MiB growth */
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, (int64_t)(20 * MiB));
  XSEG_EXPECT_OK(xseg_check(a));
  for (int i = 0; i < 10; i++) XSEG_EXPECT_OK(xseg_free(a, p[i]));
  xseg_destroy(a);
}
