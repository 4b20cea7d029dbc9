/* The device allocator on the emulator: the public API's semantics
   (docs/DESIGN.md section 3), pools and reuse, empty_cache, stats, the context,
   several devices and peers, and classic mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_helpers.h"

XSEG_TEST(alloc, create_and_destroy_leave_nothing_behind) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &p));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);   /* the fixture fails the test on anything left */
}

XSEG_TEST(alloc, config_errors_name_the_key) {
  xseg_allocator *a = NULL;
  XSEG_EXPECT_STATUS(xseg_create(0, "xseg_driver:sim,no_such_key:1", &a),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "no_such_key") != NULL);
  XSEG_EXPECT_STATUS(
      xseg_create(0, "xseg_driver:sim,max_split_size_mb:abc", &a),
      XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "max_split_size_mb") != NULL);
  XSEG_EXPECT_STATUS(
      xseg_create(0, "xseg_driver:sim,expandable_segments:maybe", &a),
      XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(a == NULL);
  XSEG_EXPECT_STATUS(xseg_create(7, "xseg_driver:sim", &a),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_create(0, "xseg_driver:/no/such/libcuda.so", &a),
                     XSEG_ERR_NO_DRIVER);
}

XSEG_TEST(alloc, config_from_the_environment) {
  setenv("XSEG_ALLOC_CONF",
         xt_driver_name() != NULL ? "xseg_driver:sim,expandable_segments:False"
                                  : "expandable_segments:False",
         1);
  xseg_allocator *a = NULL;
  xseg_status st = xseg_create(0, NULL, &a);
  unsetenv("XSEG_ALLOC_CONF");
  XSEG_ASSERT_OK(st);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, NULL, &p));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, 2 * MiB);   /* classic segment */
  XSEG_EXPECT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

/* large_segment_size_mb sizes the classic segment of a request from 1 to
   10 MiB (PyTorch's get_allocation_size), 20 MiB unless set. */
XSEG_TEST(alloc, large_segment_size_sizes_classic_segments) {
  const size_t sizes[] = {20 * MiB, 64 * MiB};
  const char *confs[] = {"expandable_segments:False",
                         "expandable_segments:False,large_segment_size_mb:64"};
  for (size_t i = 0; i < 2; i++) {
    xseg_allocator *a = at_create(confs[i]);
    void *p, *q;
    /* 10 MiB and above: the request itself, rounded to 2 MiB. */
    XSEG_ASSERT_OK(xseg_malloc(a, 11 * MiB, NULL, &q));
    XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 12 * MiB);
    /* Not in the 1 MiB left: a segment of its own. */
    XSEG_ASSERT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
    XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current,
                   (int64_t)(12 * MiB + sizes[i]));
    XSEG_EXPECT_OK(xseg_check(a));
    XSEG_EXPECT_OK(xseg_free(a, p));
    XSEG_EXPECT_OK(xseg_free(a, q));
    xseg_destroy(a);
  }
}

/* per_process_memory_fraction:0, which PyTorch accepts, lets nothing
   grow: every malloc that needs memory is out of memory, and the
   allocator stays whole. */
XSEG_TEST(alloc, per_process_memory_fraction_zero_maps_nothing) {
  xseg_allocator *a = at_create("per_process_memory_fraction:0");
  void *p = (void *)1;
  XSEG_EXPECT_STATUS(xseg_malloc(a, 4096, NULL, &p), XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(p == NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "memory fraction") != NULL);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

XSEG_TEST(alloc, malloc_zero_gives_unique_pointers) {
  xseg_allocator *a = at_create(NULL);
  void *p = NULL, *q = NULL;
  XSEG_ASSERT_OK(xseg_malloc(a, 0, NULL, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 0, NULL, &q));
  XSEG_EXPECT_TRUE(p != NULL && q != NULL && p != q);
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_free(a, NULL));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

XSEG_TEST(alloc, sizes_that_overflow_are_invalid) {
  xseg_allocator *a = at_create(NULL);
  void *p = (void *)1;
  XSEG_EXPECT_STATUS(xseg_malloc(a, SIZE_MAX, NULL, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(p == (void *)1 || p == NULL);
  XSEG_EXPECT_STATUS(xseg_malloc(a, SIZE_MAX - 100, NULL, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "overflow") != NULL);
  XSEG_EXPECT_STATUS(xseg_malloc(a, SIZE_MAX / 2 + 1, NULL, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_malloc(a, 16, NULL, NULL),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_malloc(NULL, 16, NULL, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

XSEG_TEST(alloc, bad_frees_change_nothing) {
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 10000, NULL, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &q));
  xseg_stats before = at_stats(a);
  char want[64];
  void *bad[] = {(char *)p + 512, (char *)q + 4096, (void *)0x1000,
                 (char *)q + 3 * MiB};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    XSEG_EXPECT_STATUS(xseg_free(a, bad[i]), XSEG_ERR_UNKNOWN_POINTER);
    snprintf(want, sizeof want, "%p", bad[i]);
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), want) != NULL);
  }
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_STATUS(xseg_free(a, p), XSEG_ERR_UNKNOWN_POINTER);  /* double */
  XSEG_EXPECT_OK(xseg_malloc(a, 10000, NULL, &p));
  xseg_stats after = at_stats(a);
  XSEG_EXPECT_EQ(after.allocation.current, before.allocation.current);
  XSEG_EXPECT_EQ(after.allocated_bytes.current,
                 before.allocated_bytes.current);
  XSEG_EXPECT_EQ(after.reserved_bytes.current, before.reserved_bytes.current);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_free(a, q));
  xseg_destroy(a);
}

XSEG_TEST(alloc, pointers_are_aligned_mapped_and_keep_their_data) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  size_t sizes[] = {1, 511, 512, 513, 4096, 1 << 20, (1 << 20) + 1,
                    5 * MiB + 3, 40 * MiB};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  for (int i = 0; i < N; i++) {
    XSEG_ASSERT_OK(xseg_malloc(a, sizes[i], NULL, &p[i]));
    XSEG_EXPECT_EQ((uintptr_t)p[i] % 512, 0);
    XSEG_EXPECT_TRUE(at_fill(p[i], sizes[i], (unsigned)i));
  }
  for (int i = 0; i < N; i++) {
    XSEG_EXPECT_TRUE(at_verify(p[i], sizes[i], (unsigned)i));
    XSEG_EXPECT_OK(xseg_free(a, p[i]));
  }
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A freed block is the next one its stream gets, with no driver call. */
XSEG_TEST(alloc, freed_block_is_reused_on_its_stream_without_driver_calls) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));
  uint64_t maps = xsim_call_count("cuMemMap");
  uint64_t creates = xsim_call_count("cuMemCreate");
  uint64_t ctx = xsim_call_count("cuCtxSetCurrent") +
                 xsim_call_count("cuCtxGetCurrent");
  for (int i = 0; i < 100; i++) {
    XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB - 512 * (i % 7), NULL, &q));
    XSEG_EXPECT_TRUE(q == p);
    XSEG_ASSERT_OK(xseg_free(a, q));
  }
  XSEG_EXPECT_EQ(xsim_call_count("cuMemMap"), maps);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate"), creates);
  XSEG_EXPECT_EQ(xsim_call_count("cuCtxSetCurrent") +
                     xsim_call_count("cuCtxGetCurrent"), ctx);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

XSEG_TEST(alloc, streams_have_their_own_pools) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s1;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, NULL, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s1, &q));
  XSEG_EXPECT_TRUE(q != p);   /* free memory of NULL is not handed to s1 */
  XSEG_EXPECT_EQ(at_stats(a).segment.current, 2);
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

XSEG_TEST(alloc, small_and_large_pools_split_at_one_mib) {
  xseg_allocator *a = at_create(NULL);
  void *s, *l;
  XSEG_ASSERT_OK(xseg_malloc(a, 1 << 20, NULL, &s));
  XSEG_ASSERT_OK(xseg_malloc(a, (1 << 20) + 1, NULL, &l));
  FILE *f = tmpfile();
  XSEG_ASSERT_OK(xseg_stats_json(a, f));
  rewind(f);
  char buf[16384];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  XSEG_EXPECT_TRUE(strstr(buf, "\"allocation.small_pool.current\": 1,") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"allocation.large_pool.current\": 1,") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"allocated_bytes.all.current\": 2097664,") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"requested_bytes.all.current\": 2097153,") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"num_alloc_retries\": 0,") != NULL);
  XSEG_EXPECT_OK(xseg_free(a, s));
  XSEG_EXPECT_OK(xseg_free(a, l));
  xseg_destroy(a);
}

/* The cached malloc rounds every size itself when its interval has no
   roundup_power2_divisions; a large size in an interval that has some is
   rounded to the next division, on the first malloc (every lock) and on
   the cached ones after it alike. [1:1,>:4]: none up to 2 MiB, 4 above. */
XSEG_TEST(alloc, large_sizes_round_by_their_own_interval) {
  xseg_allocator *a = at_create("roundup_power2_divisions:[1:1,>:4]");
  const size_t want[][2] = {{1000, 1024},
                            {MiB + MiB / 2 + 1, MiB + MiB / 2 + 512},
                            {2 * MiB + 1, 2 * MiB + MiB / 2},
                            {3 * MiB + 1, 3 * MiB + MiB / 2}};
  for (int round = 0; round < 3; round++)
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
      void *p;
      XSEG_ASSERT_OK(xseg_malloc(a, want[i][0], NULL, &p));
      xseg_stats s = at_stats(a);
      XSEG_EXPECT_EQ(s.allocated_bytes.current, (int64_t)want[i][1]);
      XSEG_EXPECT_EQ(s.requested_bytes.current, (int64_t)want[i][0]);
      XSEG_ASSERT_OK(xseg_free(a, p));
    }
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

XSEG_TEST(alloc, stats_follow_pytorch_meanings) {
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 1000, NULL, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB + 5, NULL, &q));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocation.current, 2);
  XSEG_EXPECT_EQ(s.allocated_bytes.current, 1024 + 3 * MiB + 512);
  XSEG_EXPECT_EQ(s.requested_bytes.current, 1000 + 3 * MiB + 5);
  XSEG_EXPECT_EQ(s.active_bytes.current, s.allocated_bytes.current);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, 2 * MiB + 4 * MiB);
  XSEG_EXPECT_EQ(s.mapped_bytes, s.reserved_bytes.current);
  XSEG_EXPECT_EQ(s.segment.current, 2);
  /* The two remainders are free pieces of expandable segments, which
     PyTorch leaves out of inactive_split (any free granule of one can be
     unmapped): 0, and never above, growth included. */
  XSEG_EXPECT_EQ(s.inactive_split.current, 0);
  XSEG_EXPECT_EQ(s.inactive_split.peak, 0);
  XSEG_EXPECT_EQ(s.inactive_split_bytes.peak, 0);
  XSEG_EXPECT_EQ(s.num_device_alloc, 3);
  XSEG_ASSERT_OK(xseg_free(a, q));
  s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocated_bytes.peak, 1024 + 3 * MiB + 512);
  XSEG_EXPECT_EQ(s.allocated_bytes.freed, 3 * MiB + 512);
  XSEG_EXPECT_EQ(s.allocation.allocated, 2);
  XSEG_ASSERT_OK(xseg_reset_peak_stats(a));
  s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocated_bytes.peak, 1024);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  s = at_stats(a);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, 0);
  XSEG_EXPECT_EQ(s.segment.current, 0);
  XSEG_EXPECT_EQ(s.num_device_free, 3);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* Classic segments count their free pieces in inactive_split, as PyTorch:
   a small request's 2 MiB segment leaves one, until it is freed. */
XSEG_TEST(alloc, classic_segments_count_inactive_split) {
  xseg_allocator *a = at_create("expandable_segments:False");
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 1000, NULL, &p));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.inactive_split.current, 1);
  XSEG_EXPECT_EQ(s.inactive_split_bytes.current, 2 * MiB - 1024);
  XSEG_ASSERT_OK(xseg_free(a, p));
  s = at_stats(a);
  XSEG_EXPECT_EQ(s.inactive_split.current, 0);
  XSEG_EXPECT_EQ(s.inactive_split.peak, 1);
  XSEG_EXPECT_EQ(s.inactive_split_bytes.peak, 2 * MiB - 1024);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* empty_cache gives back every whole free granule, and only those: xseg's
   mapped bytes fall to the granules live blocks touch. Device-wide free
   memory (cuMemGetInfo) is not used: on a GPU other processes change it.
   On the emulator the driver's own count of this process's physical bytes
   must agree exactly. */
XSEG_TEST(alloc, empty_cache_returns_every_whole_free_granule) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  xsim_live before, now;
  if (xt_have_sim()) xsim_get_live(&before);
  enum { N = 12 };
  void *p[N];
  for (int i = 0; i < N; i++)
    XSEG_ASSERT_OK(xseg_malloc(a, (size_t)(i + 1) * 1536 * 1024, NULL, &p[i]));
  for (int i = 0; i < N; i += 2) XSEG_ASSERT_OK(xseg_free(a, p[i]));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.mapped_bytes, s.reserved_bytes.current);
  if (xt_have_sim()) {
    xsim_get_live(&now);
    XSEG_EXPECT_EQ(now.physical_bytes - before.physical_bytes,
                   s.reserved_bytes.current);
  }
  /* Every granule still mapped touches a live block. */
  size_t live = 0;
  for (int i = 1; i < N; i += 2) live += (size_t)(i + 1) * 1536 * 1024;
  XSEG_EXPECT_LE(s.reserved_bytes.current, live + (N / 2 + 1) * 2 * MiB);
  XSEG_EXPECT_GE(s.reserved_bytes.current, live);
  for (int i = 1; i < N; i += 2) XSEG_ASSERT_OK(xseg_free(a, p[i]));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  s = at_stats(a);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, 0);
  XSEG_EXPECT_EQ(s.mapped_bytes, 0);
  if (xt_have_sim()) {
    xsim_get_live(&now);
    XSEG_EXPECT_EQ(now.physical_bytes, before.physical_bytes);
  }
  xseg_destroy(a);
}

/* Sizes proportional to a batch size N that changes per request. In
   `chain` mode every second tensor dies as soon as the next one exists
   (activations); otherwise all die when the request ends. Returns the peak
   of reserved bytes and sets the peak of live (rounded) bytes. */
static int64_t varbatch_reserved(const char *conf, bool chain,
                                 int64_t *peak_live) {
  enum { T = 6 };
  static const size_t unit[T] = {300 * 1024, 1000, 700 * 1024, 64 * 1024,
                                 2 * MiB, 150 * 1024};
  xseg_allocator *a = at_create(conf);
  uint64_t seed = 42;
  void *t[T];
  *peak_live = 0;
  for (int req = 0; req < 200; req++) {
    size_t n = 1 + at_rand(&seed) % 64;
    int64_t live = 0;
    for (int i = 0; i < T; i++) {
      if (xseg_malloc(a, unit[i] * n, NULL, &t[i]) != XSEG_OK)
        XSEG_FAIL("%s", xseg_last_error());
      live += (int64_t)((unit[i] * n + 511) / 512 * 512);
      if (live > *peak_live) *peak_live = live;
      if (chain && i % 2 == 1) {
        xseg_free(a, t[i - 1]);
        t[i - 1] = NULL;
        live -= (int64_t)((unit[i - 1] * n + 511) / 512 * 512);
      }
    }
    for (int i = 0; i < T; i++)
      if (t[i] != NULL) xseg_free(a, t[i]);
  }
  xseg_stats s = at_stats(a);
  if (xseg_check(a) != XSEG_OK) XSEG_FAIL("%s", xseg_last_error());
  xseg_destroy(a);
  return s.reserved_bytes.peak;
}

XSEG_TEST(alloc, variable_batch_reserved_stays_near_peak_live) {
  const int64_t granule = 2 * MiB;
  int64_t live, live2;
  int64_t exp = varbatch_reserved(NULL, false, &live);
  int64_t classic = varbatch_reserved("expandable_segments:False", false,
                                      &live2);
  XSEG_EXPECT_EQ(live, live2);
  /* One granule per pool (both pools are in use). */
  XSEG_EXPECT_LE(exp, live + 2 * granule);
  XSEG_EXPECT_GT(classic, live + 2 * granule);
  printf("request-scoped: peak live %lld, reserved: expandable %lld, "
         "classic %lld\n", (long long)live, (long long)exp,
         (long long)classic);
  /* Out-of-order deaths leave holes whose partial granules stay mapped:
     a little more slack, still far below classic. */
  exp = varbatch_reserved(NULL, true, &live);
  classic = varbatch_reserved("expandable_segments:False", true, &live2);
  XSEG_EXPECT_LE(exp, live + 4 * granule);
  XSEG_EXPECT_GT(classic, live + 4 * granule);
  printf("chained: peak live %lld, reserved: expandable %lld, classic "
         "%lld\n", (long long)live, (long long)exp, (long long)classic);
}

XSEG_TEST(alloc, classic_mode_maps_whole_segments_and_releases_them) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xseg_allocator *a = at_create("expandable_segments:False");
  void *p, *q, *r;
  XSEG_ASSERT_OK(xseg_malloc(a, 100, NULL, &p));           /* 2 MiB */
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &q));       /* 20 MiB */
  XSEG_ASSERT_OK(xseg_malloc(a, 30 * MiB + 1, NULL, &r));  /* 32 MiB */
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, (2 + 20 + 32) * MiB);
  XSEG_EXPECT_EQ(s.segment.current, 3);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate"), 3);
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  s = at_stats(a);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, (2 + 32) * MiB);
  XSEG_EXPECT_EQ(s.segment.current, 2);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_free(a, r));
  xseg_destroy(a);
}

/* A hole left in the middle is filled again before the end grows, and its
   physical handles are reused rather than created anew. */
XSEG_TEST(alloc, growth_reuses_whole_free_granules) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xseg_allocator *a = at_create(NULL);
  void *x, *y, *z;
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, NULL, &x));
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * MiB, NULL, &y));
  XSEG_ASSERT_OK(xseg_free(a, x));      /* 4 free granules below y */
  uint64_t created = xsim_call_count("cuMemCreate");
  XSEG_ASSERT_OK(xseg_malloc(a, 10 * MiB, NULL, &z));  /* does not fit */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate") - created, 1);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 12 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, y));
  XSEG_ASSERT_OK(xseg_free(a, z));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

XSEG_TEST(alloc, a_full_reservation_gets_another_range) {
  xseg_allocator *a = at_create("xseg_reserve_mb:8");
  void *p[5];
  for (int i = 0; i < 5; i++) {
    XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &p[i]));
    XSEG_EXPECT_OK(xseg_check(a));
  }
  XSEG_EXPECT_GE(at_stats(a).segment.current, 2);
  void *big;
  XSEG_ASSERT_OK(xseg_malloc(a, 20 * MiB, NULL, &big));  /* > a reservation */
  for (int i = 0; i < 5; i++) XSEG_ASSERT_OK(xseg_free(a, p[i]));
  XSEG_ASSERT_OK(xseg_free(a, big));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).segment.current, 0);
  xseg_destroy(a);
}

/* The caller's current context (another device's) is restored, and the
   allocator's driver work happens in its own device's context. */
XSEG_TEST(alloc, caller_context_on_another_device_is_kept) {
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUcontext c1 = xt_context(1);
  XSEG_ASSERT_TRUE(c1 != NULL);
  xseg_allocator *a = at_create(NULL);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
  CUcontext now = NULL;
  XSEG_EXPECT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == c1);
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == c1);
  xseg_destroy(a);
  xt_emulated_devices_end();
}

XSEG_TEST(alloc, one_allocator_per_device_and_peer_access) {
  XT_REQUIRE_SIM_FOR("counts driver calls on a second emulated device");
  xt_emulate_devices(2);
  xseg_allocator *a0 = at_create(NULL), *a1 = NULL;
  XSEG_ASSERT_OK(xseg_create(1, "xseg_driver:sim", &a1));
  void *p0, *p1, *p2;
  XSEG_ASSERT_OK(xseg_malloc(a0, 5 * MiB, NULL, &p0));
  XSEG_ASSERT_OK(xseg_malloc(a1, 5 * MiB, NULL, &p1));
  XSEG_EXPECT_TRUE(p0 != p1);
  uint64_t access = xsim_call_count("cuMemSetAccess");
  XSEG_ASSERT_OK(xseg_enable_peer_access(a0, 1));
  /* One contiguous mapped run: one call. */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemSetAccess") - access, 1);
  XSEG_ASSERT_OK(xseg_enable_peer_access(a0, 1));   /* idempotent */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemSetAccess") - access, 1);
  XSEG_EXPECT_STATUS(xseg_enable_peer_access(a0, 5),
                     XSEG_ERR_INVALID_ARGUMENT);
  access = xsim_call_count("cuMemSetAccess");
  XSEG_ASSERT_OK(xseg_malloc(a0, 9 * MiB, NULL, &p2));  /* growth: 1 call */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemSetAccess") - access, 1);
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  unsigned long long flags = 0;
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  XSEG_EXPECT_CU(cuMemGetAccess(&flags, &loc, (CUdeviceptr)(uintptr_t)p2));
  XSEG_EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  XSEG_EXPECT_CU(cuMemGetAccess(&flags, &loc, (CUdeviceptr)(uintptr_t)p0));
  XSEG_EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  XSEG_EXPECT_OK(xseg_check(a0));
  XSEG_EXPECT_OK(xseg_check(a1));
  XSEG_ASSERT_OK(xseg_free(a0, p0));
  XSEG_ASSERT_OK(xseg_free(a0, p2));
  XSEG_ASSERT_OK(xseg_free(a1, p1));
  xseg_destroy(a0);
  xseg_destroy(a1);
  xt_emulated_devices_end();
}

XSEG_TEST(alloc, destroy_with_live_blocks_reports_and_releases) {
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 1234, NULL, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 30 * MiB, NULL, &q));
  xseg_destroy(a);   /* reports 2 live blocks; the fixture checks leaks */
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "2 live blocks") != NULL);
}

/* PyTorch's max_split_size rules, in the classic policy they were made
   for (in expandable mode the mapped end merges with a free block there). */
XSEG_TEST(alloc, max_split_size_keeps_oversize_blocks_whole) {
  xseg_allocator *a =
      at_create("expandable_segments:False,max_split_size_mb:20");
  void *big, *small, *again;
  XSEG_ASSERT_OK(xseg_malloc(a, 40 * MiB, NULL, &big));
  XSEG_ASSERT_OK(xseg_free(a, big));
  /* A request under max_split_size never takes an oversize block. */
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &small));
  XSEG_EXPECT_TRUE(small != big);
  /* An oversize request takes it if it wastes < max_non_split_rounding. */
  XSEG_ASSERT_OK(xseg_malloc(a, 39 * MiB, NULL, &again));
  XSEG_EXPECT_TRUE(again == big);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, small));
  XSEG_ASSERT_OK(xseg_free(a, again));
  xseg_destroy(a);
}
