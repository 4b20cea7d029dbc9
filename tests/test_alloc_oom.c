/* Out of memory: the retry after freeing cached pages, the PyTorch-style
   message, no live data lost, the memory-fraction cap and the
   garbage-collection threshold. The device limit is the memory-fraction cap
   (at_create_capped) wherever the test does not need the device's own
   out-of-memory answer, so that those tests run on a GPU as well. */
#include <stdio.h>
#include <string.h>

#include "alloc_helpers.h"

XSEG_TEST(alloc_oom, message_and_no_lost_data_and_smaller_succeeds) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  xsim_set_device_memory(0, 1 * GiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  enum { MAX = 64 };
  void *p[MAX];
  size_t n = 0;
  xseg_status st;
  while (n < MAX && (st = xseg_malloc(a, 100 * MiB, NULL, &p[n])) == XSEG_OK) {
    XSEG_ASSERT_TRUE(at_fill(p[n], 100 * MiB, (unsigned)n));
    n++;
  }
  XSEG_ASSERT_EQ(st, XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_EQ(n, 10);
  const char *msg = xseg_last_error();
  XSEG_EXPECT_TRUE(strstr(msg, "out of memory") != NULL);
  XSEG_EXPECT_TRUE(strstr(msg, "Tried to allocate 100.00 MiB") != NULL);
  XSEG_EXPECT_TRUE(strstr(msg, "total capacity of 1.00 GiB") != NULL);
  XSEG_EXPECT_TRUE(strstr(msg, "1000.00 MiB is allocated by xseg") != NULL);
  XSEG_EXPECT_TRUE(strstr(msg, "reserved by xseg but unallocated") != NULL);
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.num_ooms, 1);
  XSEG_EXPECT_EQ(s.num_alloc_retries, 1);
  XSEG_EXPECT_OK(xseg_check(a));
  void *small;
  XSEG_ASSERT_OK(xseg_malloc(a, 10 * MiB, NULL, &small));
  for (size_t i = 0; i < n; i++) {
    XSEG_EXPECT_TRUE(at_verify(p[i], 100 * MiB, (unsigned)i));
    XSEG_EXPECT_OK(xseg_free(a, p[i]));
  }
  XSEG_EXPECT_OK(xseg_free(a, small));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* Cached memory of another stream (another pool) is taken before the
   allocator gives up: at the device limit its free granules move, their
   handles mapped again (none released and created anew), without a retry
   and without a host sync (the stream is idle). */
XSEG_TEST(alloc_oom, cached_pages_are_released_before_failing) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create_capped(NULL, 1 * GiB);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s1;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 800 * MiB, s1, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));      /* cached on s1 */
  XSEG_ASSERT_OK(xseg_malloc(a, 600 * MiB, NULL, &q));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.num_alloc_retries, 0);
  XSEG_EXPECT_EQ(s.num_ooms, 0);
  XSEG_EXPECT_EQ(s.num_device_free, 0);
  XSEG_EXPECT_EQ(s.num_sync_all_streams, 0);
  XSEG_EXPECT_LE(s.reserved_bytes.current, 1 * GiB);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, q));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

XSEG_TEST(alloc_oom, memory_fraction_caps_what_is_mapped) {
  xseg_allocator *a = at_create_capped(NULL, 80 * MiB);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 60 * MiB, NULL, &p));
  XSEG_EXPECT_STATUS(xseg_malloc(a, 30 * MiB, NULL, &q),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "memory fraction") != NULL);
  XSEG_ASSERT_OK(xseg_set_memory_fraction(a, 0.5));
  XSEG_ASSERT_OK(xseg_malloc(a, 30 * MiB, NULL, &q));
  XSEG_EXPECT_STATUS(xseg_set_memory_fraction(a, 0.0),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_set_memory_fraction(a, 1.5),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_free(a, q));
  xseg_destroy(a);
}

/* A growth that reuses some free handles and creates the rest counts the
   reused ones too: they left reserved_bytes when they were taken and come
   back with the map. Here the stream's free 2 MiB handle (b) is taken for a
   4 MiB growth at the end of the segment, and one more granule would map
   10 MiB under a 9 MiB cap: the growth fails over to the out-of-memory
   path instead. One-granule handles, no minimum growth: the layout is
   a | b | c | growth. */
XSEG_TEST(alloc_oom, reused_handles_count_against_the_cap) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create_capped(
      "xseg_handle_policy:granule,xseg_grow_min_mb:0", 8 * MiB);
  XSEG_ASSERT_TRUE(a != NULL);
  size_t cap = 9 * MiB;           /* at_create_capped's margin */
  void *pa, *pb, *pc, *pd;
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * MiB, NULL, &pa));
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * MiB, NULL, &pb));
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, NULL, &pc));
  XSEG_ASSERT_EQ(at_stats(a).reserved_bytes.current, 8 * MiB);
  XSEG_ASSERT_OK(xseg_free(a, pb));
  XSEG_EXPECT_STATUS(xseg_malloc(a, 4 * MiB, NULL, &pd),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "memory fraction") != NULL);
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_LE(s.reserved_bytes.peak, cap);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, 6 * MiB);   /* b released */
  XSEG_EXPECT_OK(xseg_check(a));
  /* 8 MiB live fits. */
  XSEG_ASSERT_OK(xseg_free(a, pa));
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, NULL, &pd));
  s = at_stats(a);
  XSEG_EXPECT_LE(s.reserved_bytes.peak, cap);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, pc));
  XSEG_ASSERT_OK(xseg_free(a, pd));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* Lowering the fraction under what is mapped limits growth only, as
   PyTorch's: nothing is unmapped for it, cached memory still serves, new
   memory fails, and once usage is back under the cap growth is held to it
   again. */
XSEG_TEST(alloc_oom, lowering_the_fraction_under_usage_limits_growth_only) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create_capped(NULL, 64 * MiB);
  XSEG_ASSERT_TRUE(a != NULL);
  CUdevice dev;
  size_t total = 0;
  XSEG_ASSERT_CU(cuDeviceGet(&dev, 0));
  XSEG_ASSERT_CU(cuDeviceTotalMem(&total, dev));
  void *p, *q, *r;
  XSEG_ASSERT_OK(xseg_malloc(a, 40 * MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 20 * MiB, NULL, &q));
  XSEG_ASSERT_OK(xseg_free(a, q));                 /* cached */
  XSEG_ASSERT_OK(xseg_set_memory_fraction(a, (double)(17 * MiB) / total));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 60 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));                  /* over a lowered cap */
  int64_t created = at_stats(a).num_device_alloc;
  XSEG_ASSERT_OK(xseg_malloc(a, 20 * MiB, NULL, &q));   /* the cache */
  XSEG_EXPECT_EQ(at_stats(a).num_device_alloc, created);
  XSEG_EXPECT_STATUS(xseg_malloc(a, 4 * MiB, NULL, &r),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "memory fraction") != NULL);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_ASSERT_OK(xseg_malloc(a, 16 * MiB, NULL, &r));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_LE(s.reserved_bytes.current, 17 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_STATUS(xseg_malloc(a, 4 * MiB, NULL, &p),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_ASSERT_OK(xseg_free(a, r));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* With garbage_collection_threshold, growth first releases cached memory
   down to the threshold (oldest frees first), and that is enough here:
   no failed growth, no retry. */
XSEG_TEST(alloc_oom, garbage_collection_threshold_releases_first) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a =
      at_create_capped("garbage_collection_threshold:0.5", 1 * GiB);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s1;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  void *p[3], *q;
  for (int i = 0; i < 3; i++)
    XSEG_ASSERT_OK(xseg_malloc(a, 300 * MiB, s1, &p[i]));
  for (int i = 0; i < 3; i++) XSEG_ASSERT_OK(xseg_free(a, p[i]));
  XSEG_ASSERT_OK(xseg_malloc(a, 200 * MiB, NULL, &q));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.num_alloc_retries, 0);
  /* Down to 512 MiB, then the 200 MiB: some of the cache survived. */
  XSEG_EXPECT_GT(s.reserved_bytes.current, 200 * MiB);
  XSEG_EXPECT_LE(s.reserved_bytes.current, 712 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, q));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

XSEG_TEST(alloc_oom, classic_mode_oom_releases_free_segments) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create_capped("expandable_segments:False", 1 * GiB);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 700 * MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, 800 * MiB, NULL, &q));
  XSEG_EXPECT_EQ(at_stats(a).segment.current, 1);
  XSEG_EXPECT_STATUS(xseg_malloc(a, 800 * MiB, NULL, &p),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, q));
  xseg_destroy(a);
}

/* Allocates a block of each size, then frees them all: each is cached
   in a segment of its own. */
static void oom_cache_blocks(xseg_allocator *a, const size_t *sizes,
                             size_t n) {
  void *p[4];
  XSEG_ASSERT_TRUE(n <= 4);
  for (size_t i = 0; i < n; i++)
    XSEG_ASSERT_OK(xseg_malloc(a, sizes[i], NULL, &p[i]));
  for (size_t i = 0; i < n; i++) XSEG_ASSERT_OK(xseg_free(a, p[i]));
}

/* Classic segments, max_split_size_mb:40, a 200 MiB cap: the oversize
   step's cases. */
static xseg_allocator *oom_classic_oversize_create(void) {
  return at_create_capped("expandable_segments:False,max_split_size_mb:40",
                          200 * MiB);
}

/* Caches a block of each of three sizes (`cached` bytes reserved then),
   then asks for `request` bytes, which do not fit under the cap: the
   oversize step must make room without a retry, leaving `reserved` bytes
   in `segments` segments. The request's block in *p. */
static xseg_allocator *oom_oversize_case(const size_t sizes[3],
                                         size_t cached, size_t request,
                                         size_t reserved, int64_t segments,
                                         void **p) {
  xseg_allocator *a = oom_classic_oversize_create();
  if (!XSEG_EXPECT_TRUE(a != NULL)) return NULL;
  oom_cache_blocks(a, sizes, 3);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, cached);
  XSEG_EXPECT_OK(xseg_malloc(a, request, NULL, p));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.num_alloc_retries, 0);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, reserved);
  XSEG_EXPECT_EQ(s.segment.current, segments);
  XSEG_EXPECT_OK(xseg_check(a));
  return a;
}

/* With max_split_size_mb set, PyTorch's ladder first gives back the
   smallest free oversize block that holds the request
   (release_available_cached_blocks), and counts no retry when that is
   enough: the other cached segments stay. Here 60 MiB, 100 MiB and a
   small segment are cached; 80 MiB may not take the 100 MiB block (20 MiB
   over is too much for an oversize block), so the 100 MiB segment goes,
   the rest stays. */
XSEG_TEST(alloc_oom, classic_oversize_block_released_alone) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  const size_t sizes[] = {60 * MiB, 100 * MiB, 1024};
  void *p, *q;
  xseg_allocator *a =
      oom_oversize_case(sizes, 162 * MiB, 80 * MiB, 142 * MiB, 3, &p);
  XSEG_ASSERT_TRUE(a != NULL);
  /* The 60 MiB segment is still cached. */
  XSEG_ASSERT_OK(xseg_malloc(a, 60 * MiB, NULL, &q));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 142 * MiB);
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_free(a, q));
  xseg_destroy(a);
}

/* No single oversize block holds the request: they go from the largest
   down until as many bytes went (60 then 50 MiB for 90), and the small
   segment, not oversize, stays; no retry. */
XSEG_TEST(alloc_oom, classic_oversize_blocks_released_largest_first) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  const size_t sizes[] = {60 * MiB, 50 * MiB, 1024};
  void *p;
  xseg_allocator *a =
      oom_oversize_case(sizes, 112 * MiB, 90 * MiB, 92 * MiB, 2, &p);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_EXPECT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

/* The next cases' start: a 100 MiB block (*p) and a 60 MiB one (*r)
   allocated on `stream`. */
static xseg_allocator *oom_oversize_two_blocks(CUstream stream, void **p,
                                               void **r) {
  xseg_allocator *a = oom_classic_oversize_create();
  if (!XSEG_EXPECT_TRUE(a != NULL) ||
      !XSEG_EXPECT_OK(xseg_malloc(a, 100 * MiB, stream, p)) ||
      !XSEG_EXPECT_OK(xseg_malloc(a, 60 * MiB, stream, r))) {
    if (a != NULL) xseg_destroy(a);
    return NULL;
  }
  return a;
}

/* The oversize block still waits on its own stream's work (a kernel the
   emulator's clock holds back): PyTorch's cudaFree of it would wait for
   the device, so the step waits for the stream's recorded work and still
   releases that block alone. Without the wait it released nothing, and
   the ladder later released everything and counted a retry. */
XSEG_TEST(alloc_oom, classic_oversize_block_waits_for_its_stream) {
  XT_REQUIRE_SIM_FOR("holds the stream's work back with the emulator's "
                     "clock");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s = at_stream_new();
  void *p, *r, *q;
  xseg_allocator *a = oom_oversize_two_blocks(s, &p, &r);
  XSEG_ASSERT_TRUE(a != NULL);
  xsim_clock_enable(1000000);
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 1, 1024, s));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_free(a, r));
  XSEG_ASSERT_OK(xseg_malloc(a, 80 * MiB, s, &q));
  xseg_stats st = at_stats(a);
  XSEG_EXPECT_EQ(st.num_alloc_retries, 0);
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 140 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  xsim_clock_disable();
  XSEG_EXPECT_OK(xseg_free(a, q));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* During a capture nothing is released, and PyTorch's ladder stops before
   its retry: none is counted. */
XSEG_TEST(alloc_oom, no_retry_is_counted_during_a_capture) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s1 = at_stream_new();
  void *p, *r, *q;
  xseg_allocator *a = oom_oversize_two_blocks(NULL, &p, &r);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 9, s1));
  XSEG_ASSERT_CU(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  uint64_t released = at_stats(a).num_device_free;
  XSEG_EXPECT_STATUS(xseg_malloc(a, 80 * MiB, NULL, &q),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_EQ(at_stats(a).num_alloc_retries, 0);
  XSEG_EXPECT_EQ(at_stats(a).num_device_free, released);
  CUgraph g;
  XSEG_EXPECT_CU(cuStreamEndCapture(s1, &g));
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_OK(xseg_end_allocate_to_pool(a, 9));
  XSEG_EXPECT_OK(xseg_release_pool(a, 9));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, r));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}
