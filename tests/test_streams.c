/* Cross-stream safety of the allocator (docs/DESIGN.md section 3): record_stream,
   deferred frees, unmap guards without a host sync, and physical memory
   moving between streams at the device limit. Every race is forced: a
   stream is held back by a latch (a host function that waits), so "not
   yet" is certain, not likely. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_helpers.h"

enum { SIZE = 64 * 1024 };

/* Driver calls that wait on the host for a stream or the device. */
typedef struct sync_counts {
  uint64_t stream_sync, ctx_sync, event_sync;
} sync_counts;

static sync_counts sync_now(void) {
  return (sync_counts){xsim_call_count("cuStreamSynchronize"),
                       xsim_call_count("cuCtxSynchronize"),
                       xsim_call_count("cuEventSynchronize")};
}

XSEG_TEST(streams, record_stream_needs_a_live_block) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s1 = at_stream_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, NULL, &p));
  XSEG_EXPECT_STATUS(xseg_record_stream(a, (char *)p + 512, s1),
                     XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_STATUS(xseg_record_stream(a, NULL, s1),
                     XSEG_ERR_UNKNOWN_POINTER);
  /* Its own stream is ignored: the free is not deferred. */
  XSEG_EXPECT_OK(xseg_record_stream(a, p, NULL));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(at_stats(a).active.current, 0);
  XSEG_EXPECT_STATUS(xseg_record_stream(a, p, s1), XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "xseg_record_stream") != NULL);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* The first case: a block of s0 written on s1 while s1 is held. */
XSEG_TEST(streams, reuse_waits_for_recorded_work_and_pattern_never_lands) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s0 = at_stream_new(), s1 = at_stream_new();
  xt_latch *held = xt_latch_new();
  void *p, *q, *r;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s1, held));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0xAB, SIZE, s1));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_free(a, p));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.pending_free_bytes, SIZE);
  XSEG_EXPECT_EQ(s.allocation.current, 0);
  XSEG_EXPECT_EQ(s.active.current, 1);
  XSEG_EXPECT_EQ(s.active_bytes.current, SIZE);
  XSEG_EXPECT_OK(xseg_check(a));
  /* s1 still holds it: the new block is elsewhere. */
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &q));
  XSEG_EXPECT_TRUE(q != p);
  at_live both[2] = {{p, SIZE}, {q, SIZE}};
  XSEG_EXPECT_TRUE(at_disjoint(both, 2));
  XSEG_ASSERT_CU(cuMemsetD8(at_dptr(q), 0x11, SIZE));
  XSEG_EXPECT_STATUS(xseg_free(a, p), XSEG_ERR_UNKNOWN_POINTER);
  /* s1 runs: its memset lands in p, never in q; then p is free again. */
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &r));
  XSEG_EXPECT_TRUE(r == p);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_ASSERT_CU(cuMemsetD8(at_dptr(r), 0x22, SIZE));
  XSEG_ASSERT_CU(cuStreamSynchronize(s0));
  XSEG_EXPECT_TRUE(at_bytes_are(q, SIZE, 0x11));
  XSEG_EXPECT_TRUE(at_bytes_are(r, SIZE, 0x22));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_free(a, r));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_EQ(at_stats(a).active.current, 0);
  xseg_destroy(a);
  xt_latch_free(held);
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* active is derived from allocation plus what pending frees hold
   (segments/stats.h): its peak counts a pending block and a new one
   together, which allocation's peak never sees, and its totals count each
   block once. */
XSEG_TEST(streams, active_peak_counts_pending_and_live_together) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s0 = at_stream_new(), s1 = at_stream_new();
  xt_latch *held = xt_latch_new();
  void *p, *q, *r;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &p));
  XSEG_ASSERT_OK(xseg_reset_peak_stats(a));
  XSEG_ASSERT_CU(xt_latch_hold(s1, held));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * SIZE, s0, &q));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocated_bytes.peak, 2 * SIZE);
  XSEG_EXPECT_EQ(s.active_bytes.current, 3 * SIZE);
  XSEG_EXPECT_EQ(s.active_bytes.peak, 3 * SIZE);
  XSEG_EXPECT_EQ(s.active.peak, 2);
  XSEG_EXPECT_EQ(s.active.allocated, 2);
  XSEG_EXPECT_EQ(s.active.freed, 0);
  XSEG_EXPECT_OK(xseg_free(a, q));
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &r));   /* completes p */
  XSEG_EXPECT_OK(xseg_free(a, r));
  s = at_stats(a);
  XSEG_EXPECT_EQ(s.active.current, 0);
  XSEG_EXPECT_EQ(s.active.allocated, 3);
  XSEG_EXPECT_EQ(s.active.freed, 3);
  XSEG_EXPECT_EQ(s.active_bytes.peak, 3 * SIZE);
  XSEG_EXPECT_EQ(s.active_bytes.freed, 4 * SIZE);
  XSEG_ASSERT_OK(xseg_reset_peak_stats(a));
  XSEG_EXPECT_EQ(at_stats(a).active_bytes.peak, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_latch_free(held);
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* Mallocs on `stream` until one returns `want` (freeing the others) or
   about 5 s pass. */
static bool malloc_until(xseg_allocator *a, CUstream stream, void *want) {
  for (int i = 0; i < 5000; i++) {
    void *p;
    if (xseg_malloc(a, SIZE, stream, &p) != XSEG_OK) return false;
    if (p == want) return true;
    xseg_free(a, p);
    usleep(1000);
  }
  return false;
}

XSEG_TEST(streams, work_queued_after_the_free_does_not_delay_reuse) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s0 = at_stream_new(), s1 = at_stream_new();
  xt_latch *before = xt_latch_new(), *after = xt_latch_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s1, before));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0xAB, SIZE, s1));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_CU(xt_latch_hold(s1, after));   /* later work on s1 */
  xt_latch_open(before);
  XSEG_EXPECT_TRUE(malloc_until(a, s0, p));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(after, 1));  /* still held */
  XSEG_EXPECT_TRUE(at_bytes_are(p, SIZE, 0xAB));      /* s1's write landed */
  xt_latch_open(after);
  XSEG_EXPECT_CU(cuStreamSynchronize(s1));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_latch_free(before);
  xt_latch_free(after);
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

XSEG_TEST(streams, two_recorded_streams_reuse_only_after_both) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s0 = at_stream_new(), s1 = at_stream_new(), s2 = at_stream_new();
  xt_latch *l1 = xt_latch_new(), *l2 = xt_latch_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s1, l1));
  XSEG_ASSERT_CU(xt_latch_hold_behind(s2, s1, l2));   /* s2 outlasts s1 */
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s2));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));   /* once is enough */
  XSEG_ASSERT_OK(xseg_free(a, p));
  xt_latch_open(l1);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &q));
  XSEG_EXPECT_TRUE(q != p);                     /* s2 still holds it */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, SIZE);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, q));
  xt_latch_open(l2);
  XSEG_ASSERT_CU(cuStreamSynchronize(s2));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s0, &q));
  XSEG_EXPECT_TRUE(q == p);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_latch_free(l1);
  xt_latch_free(l2);
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
}

/* Past the two inline slots the set spills to the heap; ASan would see a
   leak or an overrun. */
XSEG_TEST(streams, many_recorded_streams) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  enum { N = 9 };
  CUstream s[N];
  for (int i = 0; i < N; i++) s[i] = at_stream_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, NULL, &p));
  for (int i = 0; i < N; i++) XSEG_ASSERT_OK(xseg_record_stream(a, p, s[i]));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  for (int i = 0; i < N; i++) XSEG_ASSERT_CU(cuStreamSynchronize(s[i]));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, NULL, &q));
  XSEG_EXPECT_TRUE(q == p);
  /* A live block destroyed with recorded streams frees its array too. */
  XSEG_ASSERT_OK(xseg_record_stream(a, q, s[N - 1]));
  for (int i = 0; i < N; i++) XSEG_ASSERT_OK(xseg_record_stream(a, q, s[i]));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  for (int i = 0; i < N; i++) XSEG_EXPECT_CU(cuStreamDestroy(s[i]));
}

/* xseg_destroy with frees still pending waits on their events alone. */
XSEG_TEST(streams, destroy_with_pending_frees) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s1 = at_stream_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, NULL, &p));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_free(a, p));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* A failed event record leaves the block live, as if free was not called. */
XSEG_TEST(streams, failed_event_record_keeps_the_block_live) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s1 = at_stream_new(), s2 = at_stream_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, NULL, &p));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s2));
  xsim_fail_call("cuEventRecord", 2, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_free(a, p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuEventRecord") != NULL);
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocation.current, 1);
  XSEG_EXPECT_EQ(s.pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, p));               /* now it works */
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_CU(cuStreamSynchronize(s2));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
}

/* ---- unmap guards -------------------------------------------------------- */

/* empty_cache while s0 is held with work queued before the free of a block
   on s0: the granules stay mapped and nothing waits; released s0, a later
   call releases them. */
XSEG_TEST(streams, empty_cache_leaves_guarded_granules_and_never_blocks) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s0 = at_stream_new();
  xt_latch *held = xt_latch_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, s0, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s0, held));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x5A, 8 * MiB, s0));
  XSEG_ASSERT_OK(xseg_free(a, p));
  sync_counts before = sync_now();
  uint64_t unmaps = xsim_call_count("cuMemUnmap");
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 8 * MiB);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemUnmap"), unmaps);
  XSEG_EXPECT_EQ(xsim_call_count("cuEventRecord") >= 1, 1);
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s0));
  before.stream_sync++;                       /* the test's own */
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  sync_counts after = sync_now();
  XSEG_EXPECT_EQ(after.stream_sync, before.stream_sync);
  XSEG_EXPECT_EQ(after.ctx_sync, before.ctx_sync);
  XSEG_EXPECT_EQ(after.event_sync, before.event_sync);
  XSEG_EXPECT_EQ(at_stats(a).num_sync_all_streams, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_latch_free(held);
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
}

typedef struct call_thread {
  xseg_allocator *a;
  CUstream stream;
  size_t size;
  void *p;
  xseg_status st;
  _Atomic int done;
} call_thread;

static void *empty_blocking_thread(void *arg) {
  call_thread *t = arg;
  xt_context(0);
  t->st = xseg_empty_cache_blocking(t->a);
  t->done = 1;
  return NULL;
}

/* Waits up to 100 ms for t to finish; true if it did. */
static bool finishes_soon(call_thread *t) {
  for (int i = 0; i < 100 && !t->done; i++) usleep(1000);
  return t->done;
}

/* The blocking form waits for that work (on its event), then releases. */
XSEG_TEST(streams, empty_cache_blocking_waits_on_the_guard_event_only) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s0 = at_stream_new(), other = at_stream_new();
  xt_latch *held = xt_latch_new(), *unrelated = xt_latch_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, s0, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s0, held));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x5A, 8 * MiB, s0));
  XSEG_ASSERT_OK(xseg_free(a, p));
  /* A device sync would hang on `other`, held once s0's latch opens. */
  XSEG_ASSERT_CU(xt_latch_hold_behind(other, s0, unrelated));
  sync_counts before = sync_now();
  call_thread t = {.a = a};
  pthread_t th;
  XSEG_ASSERT_EQ(pthread_create(&th, NULL, empty_blocking_thread, &t), 0);
  /* It holds the allocator's mutex while it waits: ask the emulator. */
  xsim_live live;
  xsim_get_live(&live);
  uint64_t bytes = live.physical_bytes;
  XSEG_EXPECT_FALSE(finishes_soon(&t));
  xsim_get_live(&live);
  XSEG_EXPECT_EQ(live.physical_bytes, bytes);
  xt_latch_open(held);
  pthread_join(th, NULL);
  XSEG_EXPECT_OK(t.st);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_EQ(at_stats(a).num_sync_all_streams, 1);
  sync_counts after = sync_now();
  XSEG_EXPECT_EQ(after.stream_sync, before.stream_sync);
  XSEG_EXPECT_EQ(after.ctx_sync, before.ctx_sync);
  XSEG_EXPECT_GE(after.event_sync, before.event_sync + 1);
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(unrelated, 1));
  xt_latch_open(unrelated);
  XSEG_EXPECT_CU(cuStreamSynchronize(other));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_latch_free(held);
  xt_latch_free(unrelated);
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(other));
}

/* A freshly mapped, never-used block needs no guard at all. */
XSEG_TEST(streams, never_used_memory_is_released_without_a_query) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xseg_allocator *a = at_create("xseg_reserve_mb:64");
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, NULL, &q));
  XSEG_ASSERT_OK(xseg_free(a, p));
  uint64_t queries = xsim_call_count("cuStreamQuery");
  XSEG_ASSERT_OK(xseg_empty_cache(a));       /* p was used: one query */
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamQuery"), queries + 1);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 4 * MiB);
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  xseg_destroy(a);
}

/* ---- physical memory moving between streams ------------------------------ */

/* B grows at the device limit by taking A's free memory: A is idle, so no
   host sync at all, and A's handles are mapped again (none released or
   created). */
XSEG_TEST(streams, growth_at_the_limit_takes_an_idle_streams_memory) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  xsim_set_device_memory(0, 64 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream sa = at_stream_new(), sb = at_stream_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x77, 48 * MiB, sa));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_CU(cuStreamSynchronize(sa));
  sync_counts before = sync_now();
  uint64_t created = xsim_call_count("cuMemCreate");
  uint64_t released = xsim_call_count("cuMemRelease");
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));
  XSEG_EXPECT_TRUE(at_fill(q, 48 * MiB, 5));
  XSEG_EXPECT_TRUE(at_verify(q, 48 * MiB, 5));
  sync_counts after = sync_now();
  XSEG_EXPECT_EQ(after.stream_sync, before.stream_sync);
  XSEG_EXPECT_EQ(after.ctx_sync, before.ctx_sync);
  XSEG_EXPECT_EQ(after.event_sync, before.event_sync);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemRelease"), released);
  XSEG_EXPECT_LE(xsim_call_count("cuMemCreate") - created, 8);
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.num_sync_all_streams, 0);
  XSEG_EXPECT_EQ(s.num_ooms, 0);
  XSEG_EXPECT_LE(s.reserved_bytes.current, 64 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, q));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(sa));
  XSEG_EXPECT_CU(cuStreamDestroy(sb));
}

static void *malloc_thread(void *arg) {
  call_thread *t = arg;
  xt_context(0);
  t->st = xseg_malloc(t->a, t->size, t->stream, &t->p);
  t->done = 1;
  return NULL;
}

/* A is busy with work queued before its free. B's growth at the limit
   used to block the host on A's guard event; now B takes A's memory at
   once and B's stream waits on that event (cuStreamWaitEvent): no host
   wait, and B's work runs only after A's. (This test used to expect one
   cuEventSynchronize; the steal rule in alloc/flow.c made it
   obsolete.) */
XSEG_TEST(streams, growth_at_the_limit_makes_the_stream_wait_not_the_host) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xsim_set_device_memory(0, 64 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream sa = at_stream_new(), sb = at_stream_new(), sc = at_stream_new();
  xt_latch *la = xt_latch_new(), *lc = xt_latch_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_CU(xt_latch_hold(sa, la));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x77, 48 * MiB, sa));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_CU(xt_latch_hold_behind(sc, sa, lc));   /* held throughout */
  sync_counts before = sync_now();
  call_thread t = {.a = a, .stream = sb, .size = 48 * MiB};
  pthread_t th;
  XSEG_ASSERT_EQ(pthread_create(&th, NULL, malloc_thread, &t), 0);
  XSEG_EXPECT_TRUE(finishes_soon(&t));        /* nobody waits on the host */
  pthread_join(th, NULL);
  XSEG_ASSERT_OK(t.st);
  unsigned char v = at_byte(t.p, 6);
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(t.p), v, 48 * MiB, sb));
  usleep(20000);
  XSEG_EXPECT_EQ(cuStreamQuery(sb), CUDA_ERROR_NOT_READY);  /* behind A */
  xt_latch_open(la);
  XSEG_EXPECT_CU(cuStreamSynchronize(sb));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(lc, 1));   /* C never held it up */
  XSEG_EXPECT_TRUE(at_verify(t.p, 48 * MiB, 6));  /* A's 0x77 never lands */
  sync_counts after = sync_now();
  XSEG_EXPECT_EQ(after.stream_sync, before.stream_sync + 1);  /* the test's */
  XSEG_EXPECT_EQ(after.ctx_sync, before.ctx_sync);
  XSEG_EXPECT_EQ(after.event_sync, before.event_sync);
  XSEG_EXPECT_EQ(at_stats(a).num_ooms, 0);
  XSEG_EXPECT_LE(at_stats(a).reserved_bytes.current, 64 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  xt_latch_open(lc);
  XSEG_EXPECT_CU(cuStreamSynchronize(sc));
  XSEG_EXPECT_OK(xseg_free(a, t.p));
  xseg_destroy(a);
  xt_latch_free(la);
  xt_latch_free(lc);
  XSEG_EXPECT_CU(cuStreamDestroy(sa));
  XSEG_EXPECT_CU(cuStreamDestroy(sb));
  XSEG_EXPECT_CU(cuStreamDestroy(sc));
}

/* A pending free's memory is not moved to another stream before its
   events fired, even at the limit; after they fire it is. */
XSEG_TEST(streams, pending_memory_moves_only_after_its_events) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create_capped(NULL, 64 * MiB);   /* the limit */
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream sa = at_stream_new(), sb = at_stream_new(), s1 = at_stream_new();
  xt_latch *l1 = xt_latch_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s1, l1));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x33, 48 * MiB, s1));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_free(a, p));
  call_thread t = {.a = a, .stream = sb, .size = 48 * MiB};
  pthread_t th;
  XSEG_ASSERT_EQ(pthread_create(&th, NULL, malloc_thread, &t), 0);
  XSEG_EXPECT_FALSE(finishes_soon(&t));
  xt_latch_open(l1);
  pthread_join(th, NULL);
  XSEG_ASSERT_OK(t.st);
  q = t.p;
  XSEG_EXPECT_TRUE(at_fill(q, 48 * MiB, 8));
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_EXPECT_TRUE(at_verify(q, 48 * MiB, 8));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, q));
  xseg_destroy(a);
  xt_latch_free(l1);
  XSEG_EXPECT_CU(cuStreamDestroy(sa));
  XSEG_EXPECT_CU(cuStreamDestroy(sb));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* ---- garbage collection ---------------------------------------------------- */

/* Above the threshold, growth first releases the oldest free memory: the
   block freed first goes, the one freed last stays cached. */
XSEG_TEST(streams, garbage_collection_releases_oldest_first) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xsim_set_device_memory(0, 100 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create("garbage_collection_threshold:0.5");
  CUstream s[3] = {at_stream_new(), at_stream_new(), at_stream_new()};
  void *p[3], *q, *again;
  for (int i = 0; i < 3; i++)
    XSEG_ASSERT_OK(xseg_malloc(a, 20 * MiB, s[i], &p[i]));
  for (int i = 0; i < 3; i++) XSEG_ASSERT_OK(xseg_free(a, p[i]));  /* 60 MiB */
  XSEG_ASSERT_OK(xseg_malloc(a, 10 * MiB, NULL, &q));  /* over 50: collect */
  xseg_stats st = at_stats(a);
  XSEG_EXPECT_LE(st.reserved_bytes.current, 60 * MiB);
  XSEG_EXPECT_EQ(st.num_ooms, 0);
  /* s[2]'s block (freed last) is still cached: no growth to get it back. */
  uint64_t created = xsim_call_count("cuMemCreate");
  XSEG_ASSERT_OK(xseg_malloc(a, 20 * MiB, s[2], &again));
  XSEG_EXPECT_TRUE(again == p[2]);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate"), created);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_free(a, again));
  xseg_destroy(a);
  for (int i = 0; i < 3; i++) XSEG_EXPECT_CU(cuStreamDestroy(s[i]));
}

/* ---- the event pool ---------------------------------------------------------- */

/* A steady state of cross-stream frees creates a bounded number of events:
   the pool reuses them. XSEG_TEST_CROSS_FREES sets the loop's length
   (10^6 for the figure in the report; 10^5 by default). */
XSEG_TEST(streams, steady_cross_stream_frees_create_bounded_events) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  const char *env = getenv("XSEG_TEST_CROSS_FREES");
  long n = env != NULL ? atol(env) : 100000;
  xseg_allocator *a = at_create(NULL);
  CUstream s0 = at_stream_new(), s1 = at_stream_new();
  uint64_t created0 = xsim_call_count("cuEventCreate");
  uint64_t created_at_half = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    void *p;
    XSEG_ASSERT_OK(xseg_malloc(a, 4096, s0, &p));
    XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
    XSEG_ASSERT_OK(xseg_free(a, p));
    if (i == n / 2) created_at_half = xsim_call_count("cuEventCreate");
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  uint64_t created = xsim_call_count("cuEventCreate") - created0;
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
  printf("%ld cross-stream frees: %llu events created (%llu by the half), "
         "%.0f ns per malloc+record_stream+free\n", n,
         (unsigned long long)created,
         (unsigned long long)(created_at_half - created0), s * 1e9 / n);
  XSEG_EXPECT_LE(created, 64);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}
