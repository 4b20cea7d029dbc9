/* Seven defects that adversarial testing found, each pinned by the test
   that would have caught it: a private pool shared by two streams, release
   passes that skipped segments of another granule, configuration values
   that crashed or wrapped, memory stuck on a destroyed stream, handles lost
   when cuMemRelease failed, huge requests that allocated host memory in
   proportion, and *ptr left unchanged by a failed malloc. (An eighth,
   another device's stream taken until a free failed on it, became
   test_alloc_devices.c when such a stream came to be recorded.) */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc/enter.h"
#include "alloc/pairs.h"
#include "alloc/types.h"
#include "alloc_helpers.h"

/* ---- 1. a private pool used by two streams ------------------------------ */

/* s1 frees a block of private pool 1 while its work on the block is held
   back; s2, allocating to the same pool, must not get that block: s1's late
   write would land in s2's live data. */
XSEG_TEST(hardening, private_pool_keeps_blocks_per_stream) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  enum { SIZE = 256 * 1024 };
  CUstream s1 = at_stream_new(), s2 = at_stream_new();
  XSEG_ASSERT_TRUE(s1 != NULL && s2 != NULL);
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 1, s1));
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 1, s2));
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s1, &p));
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(s1, l));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0xAA, SIZE, s1));   /* held */
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s2, &q));
  XSEG_EXPECT_TRUE((char *)q + SIZE <= (char *)p || (char *)p + SIZE <= (char *)q);
  XSEG_EXPECT_CU(cuMemsetD8Async(at_dptr(q), 0x55, SIZE, s2));
  XSEG_EXPECT_CU(cuStreamSynchronize(s2));
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s1));
  XSEG_EXPECT_TRUE(at_bytes_are(q, SIZE, 0x55));
  /* s1 still reuses its own free block at once (stream order). */
  void *r;
  XSEG_EXPECT_OK(xseg_malloc(a, SIZE, s1, &r));
  XSEG_EXPECT_TRUE(r == p);
  XSEG_EXPECT_OK(xseg_free(a, r));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_end_allocate_to_pool(a, 1));
  XSEG_EXPECT_OK(xseg_release_pool(a, 1));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  xseg_destroy(a);
  xt_latch_free(l);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
}

/* ---- 2. release passes across pools of different granules -------------- */

static void release_all_after_small_and_large(const char *conf) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(conf);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 100, NULL, &q));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).mapped_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

XSEG_TEST(hardening, empty_cache_releases_every_pool_classic) {
  release_all_after_small_and_large("expandable_segments:False");
}

XSEG_TEST(hardening, empty_cache_releases_every_pool_large_granule) {
  release_all_after_small_and_large("xseg_large_granule_mb:8");
}

/* Free cached segments of 40, 20 and 2 MiB on three streams, nothing
   allocated, 100 MiB device: 61 MiB fits once the cache is released. */
XSEG_TEST(hardening, out_of_memory_path_releases_every_stream) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xsim_set_device_memory(0, 100 * MiB);
  CUstream s[3] = {at_stream_new(), at_stream_new(), at_stream_new()};
  xseg_allocator *a = at_create("expandable_segments:False");
  XSEG_ASSERT_TRUE(a != NULL);
  const size_t sizes[3] = {40 * MiB, 20 * MiB, 100};
  for (int i = 0; i < 3; i++) {
    void *p;
    XSEG_ASSERT_OK(xseg_malloc(a, sizes[i], s[i], &p));
    XSEG_ASSERT_OK(xseg_free(a, p));
  }
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 62 * MiB);
  void *big;
  XSEG_EXPECT_OK(xseg_malloc(a, 61 * MiB, NULL, &big));
  XSEG_EXPECT_OK(xseg_free(a, big));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  for (int i = 0; i < 3; i++) XSEG_EXPECT_CU(cuStreamDestroy(s[i]));
}

/* ---- 3. configuration values that crashed or wrapped ------------------- */

static const char *const size_keys[] = {
    "max_split_size_mb",     "max_non_split_rounding_mb",
    "xseg_small_granule_mb", "xseg_large_granule_mb",
    "xseg_reserve_mb",       "xseg_grow_min_mb",
    "xseg_handle_max_mb",    "pinned_reserve_segment_size_mb"};
enum { N_SIZE_KEYS = sizeof size_keys / sizeof size_keys[0] };

/* 2^44 - 1 MB: bytes that just fit in 64 bits, which every rounding to a
   granule used to wrap (or divide by zero). */
XSEG_TEST(hardening, huge_size_keys_are_refused_naming_the_key) {
  for (int i = 0; i < N_SIZE_KEYS; i++) {
    const char *values[] = {"17592186044415", "17592186044416", "1099511627776"};
    for (int v = 0; v < 3; v++) {
      char conf[128];
      snprintf(conf, sizeof conf, "%s:%s", size_keys[i], values[v]);
      xseg_allocator *a = (xseg_allocator *)1;
      XSEG_EXPECT_STATUS(xseg_create(0, conf, &a), XSEG_ERR_INVALID_ARGUMENT);
      XSEG_EXPECT_TRUE(a == NULL);
      if (strstr(xseg_last_error(), size_keys[i]) == NULL)
        XSEG_FAIL("%s: message does not name the key: %s", conf,
                  xseg_last_error());
    }
  }
}

/* The largest accepted value of every size key builds an allocator that
   serves (or refuses, with a message) requests without a crash. */
XSEG_TEST(hardening, largest_size_keys_work) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  for (int i = 0; i < N_SIZE_KEYS; i++) {
    char conf[128];
    snprintf(conf, sizeof conf, "%s:%s", size_keys[i], "67108864");
    xseg_allocator *a = at_create(conf);
    if (a == NULL) continue;
    const size_t sizes[] = {100, 3 * MiB, 64 * MiB};
    for (int k = 0; k < 3; k++) {
      void *p = NULL;
      xseg_status st = xseg_malloc(a, sizes[k], NULL, &p);
      if (st == XSEG_OK) {
        XSEG_EXPECT_TRUE(at_fill(p, sizes[k], 1) && at_verify(p, sizes[k], 1));
        XSEG_EXPECT_OK(xseg_free(a, p));
      } else {
        XSEG_EXPECT_TRUE(p == NULL && xseg_last_error()[0] != '\0');
      }
      XSEG_EXPECT_OK(xseg_check(a));
    }
    XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
    xseg_destroy(a);
  }
}

/* ---- 4. memory cached for a destroyed stream ---------------------------- */

XSEG_TEST(hardening, destroyed_streams_memory_moves) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xsim_set_device_memory(0, 64 * MiB);
  CUstream s1 = at_stream_new(), s2 = at_stream_new();
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, s1, &p));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x11, 48 * MiB, s1));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_OK(xseg_malloc(a, 48 * MiB, s2, &q));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).mapped_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
}

/* The same with nothing else to trigger it: empty_cache on a destroyed
   stream's memory. */
XSEG_TEST(hardening, empty_cache_after_stream_destroy) {
  XT_REQUIRE_SIM_FOR(AT_DESTROYS_A_KNOWN_STREAM);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s1 = at_stream_new();
  xseg_allocator *a = at_create(NULL);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, s1, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).mapped_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* Found by the fuzz test: a block recorded on a stream that was destroyed
   before the free could never be freed (cuEventRecord on the dead stream
   failed every time). The free completes, and the block is reused. */
XSEG_TEST(hardening, free_recorded_on_a_destroyed_stream) {
  XT_REQUIRE_SIM_FOR(AT_DESTROYS_A_KNOWN_STREAM);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s1 = at_stream_new(), s2 = at_stream_new();
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, s1, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, s1, &q));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s2));
  XSEG_ASSERT_OK(xseg_record_stream(a, q, s2));
  XSEG_ASSERT_OK(xseg_record_stream(a, q, NULL));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 7, 1 * MiB, s2));
  XSEG_ASSERT_CU(cuStreamSynchronize(s2));
  XSEG_ASSERT_CU(cuStreamDestroy(s2));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_free(a, q));          /* still waits on NULL's work */
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocation.current, 0);
  XSEG_EXPECT_EQ(s.active.current, 0);
  XSEG_EXPECT_EQ(s.pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* How to destroy a stream xseg has seen: free every block allocated or
   recorded on it, xseg_forget_stream, cuStreamDestroy. xseg never names
   the stream again: on the emulator a call that does aborts
   (XSIM_STALE_STREAMS=abort), as a real driver may crash. Other streams
   then allocate, grow (asking every known stream for captures) and
   release, and the statistics, the check and destroy run. The stream's
   memory went back to the driver. A block of another stream, recorded on
   the forgotten one and freed, waits on the event recorded there, which
   outlives the stream: the blocking release completes it. */
XSEG_TEST(hardening, a_forgotten_stream_is_never_named_again) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream gone = at_stream_new(), other = at_stream_new();
  void *p, *q, *r, *big;
  XSEG_ASSERT_OK(xseg_malloc(a, 24 * MiB, gone, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, gone, &q));
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, other, &r));
  XSEG_ASSERT_OK(xseg_record_stream(a, r, gone));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 1, 24 * MiB, gone));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(r), 2, 1 * MiB, gone));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_free(a, r));             /* pending on `gone` */
  int64_t before = at_stats(a).reserved_bytes.current;
  XSEG_ASSERT_OK(xseg_forget_stream(a, gone));
  XSEG_EXPECT_LE(at_stats(a).reserved_bytes.current, before - 24 * MiB);
  XSEG_ASSERT_CU(cuStreamDestroy(gone));
  XSEG_ASSERT_TRUE(setenv("XSIM_STALE_STREAMS", "abort", 1) == 0);
  for (int round = 0; round < 3; round++) {
    XSEG_EXPECT_OK(xseg_malloc(a, 40 * MiB, other, &big));
    XSEG_EXPECT_OK(xseg_malloc(a, 512, other, &q));
    XSEG_EXPECT_OK(xseg_free(a, q));
    XSEG_EXPECT_OK(xseg_free(a, big));
    XSEG_EXPECT_OK(round == 1 ? xseg_empty_cache_blocking(a)
                              : xseg_empty_cache(a));
  }
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocation.current, 0);
  XSEG_EXPECT_EQ(s.pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_TRUE(unsetenv("XSIM_STALE_STREAMS") == 0);
  XSEG_EXPECT_CU(cuStreamDestroy(other));
}

/* The forget is the stream's alone: another stream, held back by a latch
   with free memory whose unmapping waits on its held work, keeps its
   cache, and the forget returns while that stream is still held (waiting
   on it would never return here: the latch opens after). The forgotten
   stream's own memory goes, its own pending free (a block of it used on
   the held stream) included: that one it must wait for, so it is freed
   before the hold. */
XSEG_TEST(hardening, forget_stream_waits_for_its_own_work_alone) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream gone = at_stream_new(), held = at_stream_new();
  void *p, *q, *h;
  XSEG_ASSERT_OK(xseg_malloc(a, 24 * MiB, gone, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, gone, &q));
  XSEG_ASSERT_OK(xseg_record_stream(a, q, held));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(q), 3, 1 * MiB, held));
  XSEG_ASSERT_OK(xseg_free(a, q));             /* pending on `held` */
  XSEG_ASSERT_CU(cuStreamSynchronize(held));
  xt_latch *latch = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(held, latch));
  XSEG_ASSERT_TRUE(xt_latch_wait_for_holders(latch, 1));
  XSEG_ASSERT_OK(xseg_malloc(a, 40 * MiB, held, &h));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(h), 4, 40 * MiB, held));
  XSEG_ASSERT_OK(xseg_free(a, h));     /* free, unmapping waits on `held` */
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 1, 24 * MiB, gone));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_EXPECT_GE(at_stats(a).reserved_bytes.current, 64 * MiB);
  XSEG_ASSERT_OK(xseg_forget_stream(a, gone));
  XSEG_EXPECT_EQ(xt_latch_waiting(latch), 1);      /* still held */
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, 40 * MiB);   /* the held one's */
  XSEG_EXPECT_EQ(s.pending_free_bytes, 0);
  XSEG_EXPECT_EQ(s.num_sync_all_streams, 0);
  XSEG_ASSERT_CU(cuStreamDestroy(gone));
  XSEG_ASSERT_TRUE(setenv("XSIM_STALE_STREAMS", "abort", 1) == 0);
  /* The held stream's cache serves it again, without a growth. */
  XSEG_EXPECT_OK(xseg_malloc(a, 40 * MiB, held, &h));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 40 * MiB);
  XSEG_EXPECT_OK(xseg_free(a, h));
  xt_latch_open(latch);
  XSEG_ASSERT_CU(cuStreamSynchronize(held));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_TRUE(unsetenv("XSIM_STALE_STREAMS") == 0);
  xt_latch_free(latch);
  XSEG_EXPECT_CU(cuStreamDestroy(held));
}

/* Whether the pair of `stream`'s own pools is marked forgotten. */
static bool hd_forgotten(xseg_allocator *a, CUstream stream) {
  xs_alloc_enter(a);
  xs_pair *pair = xs_pairs_own_locked(a, stream);
  bool forgotten = pair != NULL && pair->forgotten;
  xs_alloc_leave(a);
  return forgotten;
}

/* xseg_forget_stream refuses, changing nothing, while the stream still
   has live blocks (allocated on it, or recorded on it), while a private
   pool allocates on it, during a capture, and for the legacy stream. Once they are freed
   (and the pool released) it forgets; a later malloc on the same handle
   is a new stream's. */
XSEG_TEST(hardening, forget_stream_refuses_while_the_stream_is_in_use) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new(), other = at_stream_new();
  void *p, *r, *g;
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, s, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, other, &r));
  XSEG_ASSERT_OK(xseg_record_stream(a, r, s));
  XSEG_EXPECT_STATUS(xseg_forget_stream(a, s), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "1 blocks allocated on it "
                          "are live") != NULL);
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_EXPECT_STATUS(xseg_forget_stream(a, s), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "recorded on it") != NULL);
  XSEG_ASSERT_OK(xseg_free(a, r));
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 7, s));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &g));
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(a, 7));
  XSEG_ASSERT_OK(xseg_free(a, g));
  XSEG_EXPECT_STATUS(xseg_forget_stream(a, s), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "private pool 7") != NULL);
  XSEG_ASSERT_OK(xseg_release_pool(a, 7));
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 8, other));  /* a capture */
  XSEG_EXPECT_STATUS(xseg_forget_stream(a, s), XSEG_ERR_CAPTURE);
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(a, 8));
  XSEG_ASSERT_OK(xseg_release_pool(a, 8));
  XSEG_EXPECT_STATUS(xseg_forget_stream(a, NULL), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_forget_stream(NULL, s), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_forget_stream(a, s));
  XSEG_ASSERT_OK(xseg_forget_stream(a, s));            /* again: nothing */
  XSEG_EXPECT_TRUE(hd_forgotten(a, s));
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, s, &p));      /* the same handle */
  XSEG_EXPECT_FALSE(hd_forgotten(a, s));    /* asked about captures again */
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(other));
}

/* A forget refused because a free recorded on the stream waits,
   unrecorded, for a capture on another of its block's streams: refused
   before any wait, nothing changed (before, it first waited on the host,
   every lock held, for the other frees recorded on the stream: here until
   another thread opened their latch). */
XSEG_TEST(hardening, forget_refused_for_a_capture_waits_for_nothing) {
  XT_REQUIRE_SIM_FOR("counts the driver's calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream home = at_stream_new(), captured = at_stream_new(),
           held = at_stream_new();
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(held, l));
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, MiB, home, &p));          /* recorded */
  XSEG_ASSERT_OK(xseg_record_stream(a, p, held));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, home, &q));      /* unrecorded */
  XSEG_ASSERT_OK(xseg_record_stream(a, q, captured));
  XSEG_ASSERT_OK(xseg_record_stream(a, q, held));
  XSEG_ASSERT_CU(cuStreamBeginCapture(captured,
                                      CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 5 * MiB);
  pthread_t opener;          /* a regression waits, and fails, not hangs */
  XSEG_ASSERT_TRUE(xt_latch_open_later(l, &opener));
  uint64_t syncs = xsim_call_count("cuEventSynchronize");
  XSEG_EXPECT_STATUS(xseg_forget_stream(a, held), XSEG_ERR_CAPTURE);
  XSEG_EXPECT_EQ(xsim_call_count("cuEventSynchronize") - syncs, 0);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 5 * MiB);
  pthread_join(opener, NULL);
  CUgraph g = NULL;
  XSEG_EXPECT_CU(cuStreamEndCapture(captured, &g));
  if (g != NULL) XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_CU(cuStreamSynchronize(held));
  XSEG_EXPECT_OK(xseg_forget_stream(a, held));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_latch_free(l);
  XSEG_EXPECT_CU(cuStreamDestroy(home));
  XSEG_EXPECT_CU(cuStreamDestroy(captured));
  XSEG_EXPECT_CU(cuStreamDestroy(held));
}

/* ---- 5. a failed cuMemRelease ------------------------------------------ */

static int64_t awaiting(xseg_allocator *a) {
  return at_stats(a).handles_awaiting_release;
}

/* cuMemRelease fails persistently: the handles wait (counted in stats and
   JSON), the message names the call, a later pass releases them. */
XSEG_TEST(hardening, failed_release_keeps_handle_for_retry) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create("xseg_handle_policy:granule");
  xsim_live before;
  xsim_get_live(&before);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));
  xsim_fail_calls("cuMemRelease", 1, UINT64_MAX, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_empty_cache_blocking(a), XSEG_ERR_DRIVER);
  const char *msg = xseg_last_error();
  XSEG_EXPECT_TRUE(strstr(msg, "cuMemRelease") == msg);
  XSEG_EXPECT_TRUE(strstr(msg, "CUDA_ERROR_UNKNOWN") != NULL);
  XSEG_EXPECT_EQ(awaiting(a), 4);
  XSEG_EXPECT_EQ(at_stats(a).mapped_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  char *json = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&json, &len);
  XSEG_EXPECT_OK(xseg_stats_json(a, f));
  fclose(f);
  XSEG_EXPECT_TRUE(strstr(json, "\"handles_awaiting_release\": 4") != NULL);
  free(json);
  /* Still failing: still waiting, still reported. */
  XSEG_EXPECT_STATUS(xseg_empty_cache(a), XSEG_ERR_DRIVER);
  XSEG_EXPECT_EQ(awaiting(a), 4);
  xsim_reset();
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(awaiting(a), 0);
  xsim_live after;
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(after.handles, before.handles);
  XSEG_EXPECT_EQ(after.physical_bytes, before.physical_bytes);
  xseg_destroy(a);
}

/* Still failing when xseg_destroy comes: destroy tries them again (the
   fixture checks that nothing leaked). */
XSEG_TEST(hardening, destroy_releases_waiting_handles) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));
  xsim_fail_call("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_empty_cache(a), XSEG_ERR_DRIVER);
  XSEG_EXPECT_EQ(awaiting(a), 1);
  xseg_destroy(a);
}

/* ---- 6. huge requests --------------------------------------------------- */

XSEG_TEST(hardening, requests_beyond_the_device_are_refused_first) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create("xseg_memory_fraction:0.5");
  xsim_reset_counters();
  const size_t sizes[] = {(size_t)1 << 62, (size_t)1 << 50, 41 * GiB};
  for (int i = 0; i < 3; i++) {
    void *p = (void *)1;
    XSEG_EXPECT_STATUS(xseg_malloc(a, sizes[i], NULL, &p),
                       XSEG_ERR_OUT_OF_MEMORY);
    XSEG_EXPECT_TRUE(p == NULL);
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "out of memory. Tried to "
                                               "allocate") != NULL);
  }
  XSEG_EXPECT_EQ(xsim_call_count("cuMemAddressReserve"), 0);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate"), 0);
  XSEG_EXPECT_EQ(at_stats(a).num_ooms, 3);
  void *p;
  XSEG_EXPECT_OK(xseg_malloc(a, 39 * GiB, NULL, &p));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* ---- 7. *ptr on failure ------------------------------------------------- */

XSEG_TEST(hardening, failed_malloc_sets_ptr_to_null) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p = (void *)0x1234;
  XSEG_EXPECT_STATUS(xseg_malloc(a, SIZE_MAX, NULL, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(p == NULL);
  p = (void *)0x1234;
  XSEG_EXPECT_STATUS(xseg_malloc(NULL, 1, NULL, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(p == NULL);
  xseg_destroy(a);
}
