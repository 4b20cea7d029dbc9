/* Graph capture: allocations during a capture land in a private pool, no
   call that CUDA forbids during a global-mode capture is made (the emulator
   fails them and invalidates the capture, so a capture that ends cleanly
   proves it), and a private pool's memory is reused by others only after
   xseg_release_pool. */
#include <pthread.h>
#include <string.h>

#include "alloc_helpers.h"

/* Calls CUDA forbids during a global capture, and unmaps. */
static const char *const forbidden[] = {
    "cuEventQuery", "cuEventSynchronize", "cuStreamQuery",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuMemUnmap", "cuMemRelease"};
enum { N_FORBIDDEN = sizeof forbidden / sizeof *forbidden };

static void forbidden_counts(uint64_t out[N_FORBIDDEN]) {
  for (int i = 0; i < N_FORBIDDEN; i++) out[i] = xsim_call_count(forbidden[i]);
}

static void expect_none_since(const uint64_t before[N_FORBIDDEN]) {
  for (int i = 0; i < N_FORBIDDEN; i++)
    if (xsim_call_count(forbidden[i]) != before[i])
      XSEG_FAIL("%s was called during the capture", forbidden[i]);
}

XSEG_TEST(streams_capture, announced_capture_uses_a_private_pool) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new(), s0 = at_stream_new(), s1 = at_stream_new();
  enum { SIZE = 3 * 1024 * 1024 };
  void *cached, *pend, *p, *p2, *tmp, *after;
  /* A cached block of s, and a free pending on s1's work. */
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s, &cached));
  XSEG_ASSERT_OK(xseg_free(a, cached));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s0, &pend));
  XSEG_ASSERT_OK(xseg_record_stream(a, pend, s1));
  XSEG_ASSERT_OK(xseg_free(a, pend));

  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 42, s));
  XSEG_ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  uint64_t before[N_FORBIDDEN];
  forbidden_counts(before);
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s, &p));
  XSEG_EXPECT_TRUE(p != cached);            /* not the stream's cache */
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x5A, SIZE, s));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &tmp));
  XSEG_ASSERT_OK(xseg_free(a, tmp));        /* back to the private pool */
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &p2));
  XSEG_EXPECT_TRUE(p2 == tmp);
  XSEG_ASSERT_OK(xseg_record_stream(a, p2, s1));
  XSEG_ASSERT_OK(xseg_free(a, p2));         /* unrecorded: no event now */
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s0, &tmp));   /* pending waits */
  XSEG_ASSERT_OK(xseg_free(a, tmp));
  XSEG_ASSERT_OK(xseg_empty_cache(a));      /* does nothing */
  XSEG_EXPECT_STATUS(xseg_empty_cache_blocking(a), XSEG_ERR_CAPTURE);
  XSEG_EXPECT_STATUS(xseg_release_pool(a, 42), XSEG_ERR_CAPTURE);
  xseg_stats st = at_stats(a);
  XSEG_EXPECT_EQ(st.pending_free_bytes, 2 * 4096 + 0 * SIZE);
  expect_none_since(before);
  CUgraph g = NULL;
  XSEG_ASSERT_CU(cuStreamEndCapture(s, &g));   /* not invalidated */
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(a, 42));
  XSEG_EXPECT_OK(xseg_check(a));

  /* The graph's block stays the graph's: replay writes it. */
  CUgraphExec x = NULL;
  XSEG_ASSERT_CU(cuGraphInstantiate(&x, g, 0));
  XSEG_ASSERT_CU(cuGraphLaunch(x, s));
  XSEG_ASSERT_CU(cuStreamSynchronize(s));
  unsigned char byte = 0;
  XSEG_ASSERT_CU(cuMemcpyDtoH(&byte, at_dptr(p) + SIZE - 1, 1));
  XSEG_EXPECT_EQ(byte, 0x5A);

  /* Frees made during the capture get their events at the next malloc
   (recorded after the capture, so they wait for s1's work from then). */
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s0, &tmp));
  XSEG_ASSERT_OK(xseg_free(a, tmp));
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s0, &tmp));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_ASSERT_OK(xseg_free(a, tmp));

  /* Freed, p stays in the private pool: s does not get it back. */
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s, &after));
  XSEG_EXPECT_TRUE(after != p);
  XSEG_ASSERT_OK(xseg_free(a, after));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  int64_t held = at_stats(a).reserved_bytes.current;
  XSEG_EXPECT_GT(held, 0);                  /* the private pool's */
  /* Released, its memory goes back. */
  XSEG_ASSERT_OK(xseg_release_pool(a, 42));
  XSEG_EXPECT_STATUS(xseg_release_pool(a, 42), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_CU(cuGraphExecDestroy(x));
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* After release, another stream growing at the device limit takes the
   private pool's memory, its handles mapped again. */
XSEG_TEST(streams_capture, released_pool_memory_moves_to_other_streams) {
  /* A 64 MiB device on the emulator; on a GPU a 64 MiB memory-fraction cap
     stands for it. */
  if (xt_have_sim()) xsim_set_device_memory(0, 64 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = xt_have_sim() ? at_create(NULL)
                                    : at_create_capped(NULL, 64 * MiB);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s = at_stream_new(), sb = at_stream_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 7, s));
  XSEG_ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, s, &p));
  CUgraph g = NULL;
  XSEG_ASSERT_CU(cuStreamEndCapture(s, &g));
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(a, 7));
  XSEG_ASSERT_OK(xseg_free(a, p));
  /* Not released yet: the private memory is not taken. */
  XSEG_EXPECT_STATUS(xseg_malloc(a, 48 * MiB, sb, &q), XSEG_ERR_OUT_OF_MEMORY);
  XSEG_ASSERT_OK(xseg_release_pool(a, 7));
  int64_t released = at_stats(a).num_device_free;   /* handles released */
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));
  XSEG_EXPECT_EQ(at_stats(a).num_device_free, released);
  XSEG_EXPECT_TRUE(at_fill(q, 48 * MiB, 4));
  XSEG_EXPECT_TRUE(at_verify(q, 48 * MiB, 4));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(sb));
}

/* An unannounced capture is seen on the slow path: the allocation goes to
   the capture's implicit pool, and nothing forbidden is called. */
XSEG_TEST(streams_capture, unannounced_capture_is_detected_on_the_slow_path) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new(), s1 = at_stream_new();
  void *warm, *p, *q, *pend;
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * MiB, s, &warm));
  XSEG_ASSERT_OK(xseg_free(a, warm));      /* s's cache holds 2 MiB */
  XSEG_ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus status;
  cuuint64_t id = 0;
  XSEG_ASSERT_CU(cuStreamGetCaptureInfo(s, &status, &id, NULL, NULL, NULL,
                                        NULL));
  uint64_t before[N_FORBIDDEN];
  forbidden_counts(before);
  uint64_t infos = xsim_call_count("cuStreamGetCaptureInfo");
  XSEG_ASSERT_OK(xseg_malloc(a, 16 * MiB, s, &p));   /* slow path */
  XSEG_EXPECT_GT(xsim_call_count("cuStreamGetCaptureInfo"), infos);
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &pend));
  XSEG_ASSERT_OK(xseg_record_stream(a, pend, s1));
  XSEG_ASSERT_OK(xseg_free(a, pend));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_empty_cache(a));      /* sees the capture: nothing */
  XSEG_ASSERT_OK(xseg_malloc(a, 16 * MiB, s, &q));
  XSEG_EXPECT_TRUE(q == p);                 /* the private pool's cache */
  XSEG_ASSERT_OK(xseg_free(a, q));
  expect_none_since(before);
  CUgraph g = NULL;
  XSEG_ASSERT_CU(cuStreamEndCapture(s, &g));
  /* Ended: s allocates from its own pools again; the pool stays private
     until released by its id. */
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * MiB, s, &q));
  XSEG_EXPECT_TRUE(q == warm);
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_GE(at_stats(a).reserved_bytes.current, 16 * MiB);
  XSEG_ASSERT_OK(xseg_release_pool(a, XSEG_CAPTURE_POOL(id)));
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* A capture whose stream the application destroys once the capture ended
   (or while it still runs: cuStreamDestroy abandons it), before xseg
   hears of the end. The capture's entry goes like any ended capture's:
   cached and fresh mallocs on other streams, empty_cache and the pool's
   release all work, and the pool's memory goes back. `announce`: the
   capture was announced (xseg_begin_allocate_to_pool), else xseg
   detected it on the slow path. */
static void capture_then_destroy_stream(bool announce, bool end_first) {
  XT_REQUIRE_SIM_FOR(AT_DESTROYS_A_KNOWN_STREAM);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new(), s1 = at_stream_new();
  void *warm, *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * MiB, s1, &warm));
  XSEG_ASSERT_OK(xseg_free(a, warm));      /* s1's cache holds 2 MiB */
  if (announce) XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 9, s));
  XSEG_ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  cuuint64_t id = 0;
  CUstreamCaptureStatus status;
  XSEG_ASSERT_CU(cuStreamGetCaptureInfo(s, &status, &id, NULL, NULL, NULL,
                                        NULL));
  xseg_pool_id pool = announce ? 9 : XSEG_CAPTURE_POOL(id);
  XSEG_ASSERT_OK(xseg_malloc(a, 16 * MiB, s, &p));   /* slow path */
  XSEG_ASSERT_OK(xseg_free(a, p));
  CUgraph g = NULL;
  if (end_first) XSEG_ASSERT_CU(cuStreamEndCapture(s, &g));
  XSEG_ASSERT_CU(cuStreamDestroy(s));
  if (announce) XSEG_ASSERT_OK(xseg_end_allocate_to_pool(a, 9));
  XSEG_EXPECT_OK(xseg_malloc(a, 2 * MiB, s1, &q));   /* cached */
  XSEG_EXPECT_TRUE(q == warm);
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_malloc(a, 32 * MiB, s1, &q));  /* grows */
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_GE(at_stats(a).reserved_bytes.current, 16 * MiB);
  XSEG_EXPECT_OK(xseg_release_pool(a, pool));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  if (g != NULL) XSEG_EXPECT_CU(cuGraphDestroy(g));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

XSEG_TEST(streams_capture, detected_capture_on_a_destroyed_stream_ends) {
  capture_then_destroy_stream(false, true);
}

XSEG_TEST(streams_capture, detected_capture_abandoned_by_stream_destroy) {
  capture_then_destroy_stream(false, false);
}

XSEG_TEST(streams_capture, announced_capture_on_a_destroyed_stream_ends) {
  capture_then_destroy_stream(true, true);
}

XSEG_TEST(streams_capture, pool_calls_check_their_arguments) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new();
  XSEG_EXPECT_STATUS(xseg_begin_allocate_to_pool(a, 0, s),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_begin_allocate_to_pool(NULL, 1, s),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_end_allocate_to_pool(a, 1),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_release_pool(a, 1), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 1, s));
  XSEG_EXPECT_STATUS(xseg_begin_allocate_to_pool(a, 2, s),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_release_pool(a, 1), XSEG_ERR_CAPTURE);
  /* Announced without a driver capture: still a private pool. */
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &p));
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(a, 1));
  XSEG_ASSERT_OK(xseg_release_pool(a, 1));
  XSEG_ASSERT_OK(xseg_free(a, p));          /* into the released pool */
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_EQ(at_stats(a).segment.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* xseg_malloc_from_pool: the caller's choice wins over the stream's
   announcement. On a stream announced to pool 1, pool 0 names the stream's
   own pools (the block, freed, is taken back by a plain malloc after the
   end); pool 2, never announced, gets a pair for the stream, whose block
   is not handed to the stream until pool 2 is released; bad arguments are
   refused naming the call. */
XSEG_TEST(streams_capture, malloc_from_pool_takes_the_pools_it_names) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new();
  enum { SIZE = 3 * 1024 * 1024 };
  void *in_1, *own, *in_2, *plain, *again;
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(a, 1, s));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s, &in_1));
  XSEG_ASSERT_OK(xseg_malloc_from_pool(a, SIZE, s, 0, &own));
  XSEG_ASSERT_OK(xseg_malloc_from_pool(a, SIZE, s, 2, &in_2));
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(a, 1));
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, in_1));
  XSEG_ASSERT_OK(xseg_free(a, own));
  XSEG_ASSERT_OK(xseg_free(a, in_2));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s, &plain));
  XSEG_EXPECT_TRUE(plain == own);
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, s, &again));
  XSEG_EXPECT_TRUE(again != in_1 && again != in_2);
  XSEG_ASSERT_OK(xseg_free(a, plain));
  XSEG_ASSERT_OK(xseg_free(a, again));
  XSEG_ASSERT_OK(xseg_release_pool(a, 1));
  XSEG_ASSERT_OK(xseg_release_pool(a, 2));
  void *p = (void *)1;
  XSEG_EXPECT_STATUS(xseg_malloc_from_pool(NULL, 8, s, 0, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "xseg_malloc_from_pool") !=
                   NULL);
  XSEG_EXPECT_TRUE(p == NULL);
  XSEG_EXPECT_STATUS(xseg_malloc_from_pool(a, SIZE_MAX, s, 2, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* A global-mode capture on another thread, on a stream xseg never saw. */
typedef struct foreign_capture {
  CUstream stream;
  pthread_barrier_t begun, done;
  CUresult began, ended;
} foreign_capture;

static void *foreign_capture_run(void *arg) {
  foreign_capture *f = arg;
  f->began = CUDA_ERROR_INVALID_CONTEXT;
  if (xt_context(0) != NULL)
    f->began = cuStreamBeginCapture(f->stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
  pthread_barrier_wait(&f->begun);
  pthread_barrier_wait(&f->done);
  CUgraph g = NULL;
  f->ended = f->began == CUDA_SUCCESS ? cuStreamEndCapture(f->stream, &g)
                                      : f->began;
  if (g != NULL) cuGraphDestroy(g);
  return NULL;
}

/* Starts f's capture on its thread and waits until it has begun. */
static bool foreign_capture_start(foreign_capture *f, pthread_t *t) {
  pthread_barrier_init(&f->begun, NULL, 2);
  pthread_barrier_init(&f->done, NULL, 2);
  if (pthread_create(t, NULL, foreign_capture_run, f) != 0) return false;
  pthread_barrier_wait(&f->begun);
  return true;
}

/* Lets f's capture end; it must have begun and ended valid. */
static void foreign_capture_finish(foreign_capture *f, pthread_t t) {
  pthread_barrier_wait(&f->done);
  pthread_join(t, NULL);
  XSEG_EXPECT_CU(f->began);
  XSEG_EXPECT_CU(f->ended);                 /* not invalidated */
  pthread_barrier_destroy(&f->begun);
  pthread_barrier_destroy(&f->done);
}

/* xseg queries its events and streams while another thread captures in
   global mode, into no allocator xseg knows of. In global mode those
   queries would be "potentially unsafe" calls, which the driver refuses
   (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and which invalidate the other
   thread's capture (cuda.h, cuThreadExchangeStreamCaptureMode; observed on
   H100, driver 580). xseg makes them in relaxed mode: its calls succeed,
   the capture ends valid. The pending free waits on a held stream, so the
   queries are real ones (the event has not fired). */
XSEG_TEST(streams_capture, queries_leave_another_threads_capture_valid) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s = at_stream_new(), held = at_stream_new(), captured = at_stream_new();
  XSEG_ASSERT_TRUE(s != NULL && held != NULL && captured != NULL);
  xt_latch *latch = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(held, latch));
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, s, &p));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, held));
  XSEG_ASSERT_OK(xseg_free(a, p));          /* pending on held's work */

  foreign_capture f = {.stream = captured};
  pthread_t t;
  XSEG_ASSERT_TRUE(foreign_capture_start(&f, &t));
  XSEG_EXPECT_OK(xseg_malloc(a, 4 * MiB, s, &q));   /* polls the event */
  XSEG_EXPECT_OK(xseg_empty_cache(a));      /* queries streams, the event */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 4 * MiB);
  foreign_capture_finish(&f, t);

  xt_latch_open(latch);
  XSEG_EXPECT_CU(cuStreamSynchronize(held));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_latch_free(latch);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(held));
  XSEG_EXPECT_CU(cuStreamDestroy(captured));
}

/* A cached free whose event cannot be recorded (cuEventRecord fails) asks
   whether the block's streams still exist (cuStreamQuery) in relaxed mode
   too: another thread's global-mode capture, on a stream xseg never saw,
   ends valid. The free fails, naming the call, and the block stays live. */
XSEG_TEST(streams_capture, failed_event_record_leaves_another_capture_valid) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s = at_stream_new(), held = at_stream_new(), captured = at_stream_new();
  XSEG_ASSERT_TRUE(s != NULL && held != NULL && captured != NULL);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, s, &p));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, held));
  foreign_capture f = {.stream = captured};
  pthread_t t;
  XSEG_ASSERT_TRUE(foreign_capture_start(&f, &t));
  xsim_fail_call("cuEventRecord", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_EQ(xseg_free(a, p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuEventRecord") != NULL);
  XSEG_EXPECT_EQ(at_stats(a).allocation.current, 1);     /* still live */
  foreign_capture_finish(&f, t);
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_CU(cuCtxSynchronize());
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(held));
  XSEG_EXPECT_CU(cuStreamDestroy(captured));
}

/* A graph of private pool 7 captured on `s` (its block written by the
   graph, then freed in the capture, as a temporary) and replayed on `r`,
   held back by latch `l`, as PyTorch replays on the current stream, not
   the capture's; then the pool released (PyTorch's graph reset). */
typedef struct held_replay {
  xseg_allocator *a;
  CUstream s, r;
  xt_latch *l;
  CUgraph g;
  CUgraphExec exec;
} held_replay;

static held_replay held_replay_open(xseg_allocator *a, size_t size) {
  held_replay h = {.a = a, .s = at_stream_new(), .r = at_stream_new(),
                   .l = xt_latch_new()};
  void *p;
  XSEG_EXPECT_OK(xseg_begin_allocate_to_pool(a, 7, h.s));
  XSEG_EXPECT_CU(cuStreamBeginCapture(h.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_OK(xseg_malloc(a, size, h.s, &p));
  XSEG_EXPECT_CU(cuMemsetD8Async(at_dptr(p), 0x5A, size, h.s));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_CU(cuStreamEndCapture(h.s, &h.g));
  XSEG_EXPECT_OK(xseg_end_allocate_to_pool(a, 7));
  XSEG_EXPECT_CU(cuGraphInstantiate(&h.exec, h.g, 0));
  XSEG_EXPECT_CU(xt_latch_hold(h.r, h.l));
  XSEG_EXPECT_CU(cuGraphLaunch(h.exec, h.r));
  XSEG_EXPECT_OK(xseg_release_pool(a, 7));
  return h;
}

/* The allocator consistent, then everything destroyed. */
static void held_replay_close(held_replay *h) {
  XSEG_EXPECT_OK(xseg_check(h->a));
  XSEG_EXPECT_CU(cuGraphExecDestroy(h->exec));
  XSEG_EXPECT_CU(cuGraphDestroy(h->g));
  xseg_destroy(h->a);
  xt_latch_free(h->l);
  XSEG_EXPECT_CU(cuStreamDestroy(h->s));
  XSEG_EXPECT_CU(cuStreamDestroy(h->r));
}

/* The pool is released while a replay is queued on a stream no event of
   xseg's covers: empty_cache waits for the device before it unmaps the
   pool's memory, as PyTorch's cudaFree of it would (before, it unmapped
   at once under the replay, which then wrote into unmapped memory). The
   wait failing leaves the memory mapped, named. */
XSEG_TEST(streams_capture, released_pool_waits_for_a_replay_elsewhere) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  held_replay h = held_replay_open(at_create(NULL), 3 * MiB);
  int64_t reserved = at_stats(h.a).reserved_bytes.current;
  XSEG_EXPECT_TRUE(reserved > 0);
  if (xt_have_sim()) {
    xsim_fail_call("cuCtxSynchronize", 1, CUDA_ERROR_UNKNOWN);
    XSEG_EXPECT_STATUS(xseg_empty_cache(h.a), XSEG_ERR_DRIVER);
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuCtxSynchronize") != NULL);
    XSEG_EXPECT_EQ(at_stats(h.a).reserved_bytes.current, reserved);
    XSEG_EXPECT_OK(xseg_check(h.a));
  }
  pthread_t opener;
  XSEG_ASSERT_TRUE(xt_latch_open_later(h.l, &opener));
  XSEG_EXPECT_OK(xseg_empty_cache(h.a));
  XSEG_EXPECT_CU(cuStreamQuery(h.r));       /* the replay ran first */
  XSEG_EXPECT_EQ(at_stats(h.a).reserved_bytes.current, 0);
  pthread_join(opener, NULL);
  held_replay_close(&h);
}

/* The same with another stream growing at the device limit: the growth
   waits for the device, then takes the pool's memory (before, it took it
   under the replay, whose write then landed in the new block). */
XSEG_TEST(streams_capture, released_pool_moves_after_a_replay_elsewhere) {
  if (xt_have_sim()) xsim_set_device_memory(0, 64 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = xt_have_sim() ? at_create(NULL)
                                    : at_create_capped(NULL, 64 * MiB);
  XSEG_ASSERT_TRUE(a != NULL);
  held_replay h = held_replay_open(a, 48 * MiB);
  CUstream sb = at_stream_new();
  void *q;
  pthread_t opener;
  XSEG_ASSERT_TRUE(xt_latch_open_later(h.l, &opener));
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));
  XSEG_EXPECT_CU(cuStreamQuery(h.r));       /* the replay ran first */
  XSEG_EXPECT_TRUE(at_fill(q, 48 * MiB, 4));
  pthread_join(opener, NULL);
  XSEG_EXPECT_CU(cuCtxSynchronize());
  XSEG_EXPECT_TRUE(at_verify(q, 48 * MiB, 4));
  XSEG_ASSERT_OK(xseg_free(a, q));
  held_replay_close(&h);
  XSEG_EXPECT_CU(cuStreamDestroy(sb));
}

/* The limit of that wait (xseg.h, xseg_release_pool): CUDA forbids it
   during any capture, so a capture on another thread that xseg was not
   told of does not survive it. The release says so, naming the wait, and
   keeps the memory, which a later one gives back. */
XSEG_TEST(streams_capture, released_pool_wait_fails_beside_an_unknown_capture) {
  XT_REQUIRE_SIM_FOR("the emulator's rule for a device wait in a capture");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  held_replay h = held_replay_open(at_create(NULL), 3 * MiB);
  xt_latch_open(h.l);
  int64_t reserved = at_stats(h.a).reserved_bytes.current;
  CUstream other = at_stream_new();
  foreign_capture f = {.stream = other};
  pthread_t t;
  XSEG_ASSERT_TRUE(foreign_capture_start(&f, &t));
  XSEG_EXPECT_STATUS(xseg_empty_cache(h.a), XSEG_ERR_CAPTURE);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuCtxSynchronize") != NULL);
  XSEG_EXPECT_EQ(at_stats(h.a).reserved_bytes.current, reserved);
  pthread_barrier_wait(&f.done);
  pthread_join(t, NULL);
  XSEG_EXPECT_EQ(f.ended, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  pthread_barrier_destroy(&f.begun);
  pthread_barrier_destroy(&f.done);
  XSEG_EXPECT_OK(xseg_empty_cache(h.a));
  XSEG_EXPECT_EQ(at_stats(h.a).reserved_bytes.current, 0);
  held_replay_close(&h);
  XSEG_EXPECT_CU(cuStreamDestroy(other));
}
