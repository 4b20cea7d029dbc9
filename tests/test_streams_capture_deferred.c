/* Graph capture and frees that wait on other streams' work (deferred.c):
   no event is recorded on a stream while it captures, announced or not, so
   none is ever queried there (cuEventQuery of an event last recorded
   inside a capture fails with CUDA_ERROR_CAPTURED_EVENT and invalidates
   that capture: observed on H100, driver 580; the emulator does the same).
   A capture that ends cleanly proves it. */
#include "alloc_helpers.h"

/* The streams of one case: `home` allocates the block, which is used on
   `captured` (that later captures, unannounced) and on `held` (whose
   latch keeps the free pending until the end). */
typedef struct capture_case {
  xseg_allocator *a;
  CUstream home, captured, held;
  xt_latch *latch;
} capture_case;

static void capture_case_open(capture_case *c) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  c->a = at_create(NULL);
  XSEG_ASSERT_TRUE(c->a != NULL);
  c->home = at_stream_new();
  c->captured = at_stream_new();
  c->held = at_stream_new();
  XSEG_ASSERT_TRUE(c->home != NULL && c->captured != NULL && c->held != NULL);
  c->latch = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(c->held, c->latch));
}

/* A 4 MiB block of home's, used on `captured` and `held`. */
static void *capture_case_shared_block(capture_case *c) {
  void *p = NULL;
  XSEG_EXPECT_OK(xseg_malloc(c->a, 4 * MiB, c->home, &p));
  XSEG_EXPECT_OK(xseg_record_stream(c->a, p, c->captured));
  XSEG_EXPECT_OK(xseg_record_stream(c->a, p, c->held));
  return p;
}

/* After the capture: the free still waits on held's work, then completes;
   `pool` (the detected capture's, 0 when xseg never saw it) is released
   and everything goes back. */
static void capture_case_close(capture_case *c, xseg_pool_id pool) {
  void *q;
  XSEG_EXPECT_OK(xseg_malloc(c->a, 8 * MiB, c->home, &q));  /* records */
  XSEG_EXPECT_OK(xseg_free(c->a, q));
  XSEG_EXPECT_EQ(at_stats(c->a).pending_free_bytes, 4 * MiB);
  xt_latch_open(c->latch);
  XSEG_EXPECT_CU(cuStreamSynchronize(c->held));
  XSEG_EXPECT_CU(cuStreamSynchronize(c->captured));
  XSEG_EXPECT_OK(xseg_malloc(c->a, 8 * MiB, c->home, &q));  /* completes */
  XSEG_EXPECT_OK(xseg_free(c->a, q));
  XSEG_EXPECT_EQ(at_stats(c->a).pending_free_bytes, 0);
  if (pool != 0) XSEG_EXPECT_OK(xseg_release_pool(c->a, pool));
  XSEG_EXPECT_OK(xseg_empty_cache(c->a));
  XSEG_EXPECT_EQ(at_stats(c->a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(c->a));
  xseg_destroy(c->a);
  xt_latch_free(c->latch);
  XSEG_EXPECT_CU(cuStreamDestroy(c->home));
  XSEG_EXPECT_CU(cuStreamDestroy(c->captured));
  XSEG_EXPECT_CU(cuStreamDestroy(c->held));
}

/* Begins an unannounced global-mode capture on c->captured; its pool id. */
static xseg_pool_id capture_case_begin(capture_case *c) {
  XSEG_EXPECT_CU(cuStreamBeginCapture(c->captured,
                                      CU_STREAM_CAPTURE_MODE_GLOBAL));
  cuuint64_t id = 0;
  CUstreamCaptureStatus status;
  XSEG_EXPECT_CU(cuStreamGetCaptureInfo(c->captured, &status, &id, NULL, NULL,
                                        NULL, NULL));
  return XSEG_CAPTURE_POOL(id);
}

/* Ends the capture, which must still be valid; a malloc on the captured
   stream made its pool. */
static void capture_case_end(capture_case *c) {
  CUgraph g = NULL;
  XSEG_EXPECT_CU(cuStreamEndCapture(c->captured, &g));   /* not invalidated */
  if (g != NULL) XSEG_EXPECT_CU(cuGraphDestroy(g));
}

/* A free made while an announced capture was under way (on no stream of
   the block's) waits, unrecorded, in a->deferred. An unannounced capture
   then begins on one of the block's streams, and a malloc misses the
   cache before xseg has seen that capture: the malloc must neither record
   the unrecorded free's event on the capturing stream nor query it.
   `on_captured`: the malloc is the capturing stream's own (which detects
   the capture only when it grows), else home's. */
static void unrecorded_free_meets_capture(bool on_captured) {
  capture_case c;
  capture_case_open(&c);
  void *p = capture_case_shared_block(&c);
  CUstream announced = at_stream_new();
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(c.a, 5, announced));
  XSEG_ASSERT_OK(xseg_free(c.a, p));         /* unrecorded: no event */
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(c.a, 5));
  XSEG_EXPECT_EQ(at_stats(c.a).pending_free_bytes, 4 * MiB);

  xseg_pool_id pool = capture_case_begin(&c);
  void *q;
  XSEG_EXPECT_OK(
      xseg_malloc(c.a, 16 * MiB, on_captured ? c.captured : c.home, &q));
  XSEG_EXPECT_EQ(at_stats(c.a).pending_free_bytes, 4 * MiB);
  XSEG_EXPECT_OK(xseg_free(c.a, q));
  capture_case_end(&c);
  XSEG_EXPECT_OK(xseg_release_pool(c.a, 5));
  /* The capture has a pool when its own stream's malloc detected it. */
  capture_case_close(&c, on_captured ? pool : 0);
  XSEG_EXPECT_CU(cuStreamDestroy(announced));
}

XSEG_TEST(streams_capture_deferred,
          unrecorded_free_waits_out_its_streams_capture) {
  unrecorded_free_meets_capture(true);
}

XSEG_TEST(streams_capture_deferred,
          unrecorded_free_waits_out_a_capture_elsewhere) {
  unrecorded_free_meets_capture(false);
}

/* The free itself comes while one of the block's streams captures, and
   xseg has not seen that capture (no malloc of that stream's missed the
   cache): its event must not go into the capture either. */
XSEG_TEST(streams_capture_deferred, free_during_an_unseen_capture_waits) {
  capture_case c;
  capture_case_open(&c);
  void *p = capture_case_shared_block(&c);
  capture_case_begin(&c);
  XSEG_EXPECT_OK(xseg_free(c.a, p));
  void *q;
  XSEG_EXPECT_OK(xseg_malloc(c.a, 16 * MiB, c.home, &q));   /* polls */
  XSEG_EXPECT_OK(xseg_free(c.a, q));
  XSEG_EXPECT_OK(xseg_empty_cache(c.a));
  XSEG_EXPECT_EQ(at_stats(c.a).pending_free_bytes, 4 * MiB);
  capture_case_end(&c);
  capture_case_close(&c, 0);
}

/* A stream may not be forgotten while a free recorded on it waits for a
   capture on another of the block's streams (unseen by xseg) to end: its
   event would later be recorded on the stream, destroyed by then. The
   forget is refused, naming the capture; once the capture ended and the
   free was recorded, the stream's work is done and it is forgotten. */
XSEG_TEST(streams_capture_deferred, forget_waits_for_an_unrecorded_free) {
  capture_case c;
  capture_case_open(&c);
  void *p = capture_case_shared_block(&c);
  capture_case_begin(&c);
  XSEG_EXPECT_OK(xseg_free(c.a, p));              /* unrecorded */
  XSEG_EXPECT_EQ(xseg_forget_stream(c.a, c.held), XSEG_ERR_CAPTURE);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "waits for a graph capture") !=
                   NULL);
  capture_case_end(&c);
  capture_case_close(&c, 0);
}

/* The driver's capture queries failing: a growth asks whether its stream
   captures (cuStreamGetCaptureInfo), a free used on other streams whether
   one of them does (cuStreamIsCapturing). Each failure is the call's
   status, named; the malloc hands nothing out, the free leaves its block
   live (the caller may free it again), and the allocator stays
   consistent. */
XSEG_TEST(streams_capture_deferred, failed_capture_queries_lose_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s = at_stream_new(), other = at_stream_new();
  XSEG_ASSERT_TRUE(s != NULL && other != NULL);
  void *p = (void *)1;
  xsim_fail_call("cuStreamGetCaptureInfo", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_EQ(xseg_malloc(a, 5 * MiB, s, &p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuStreamGetCaptureInfo") !=
                   NULL);
  XSEG_EXPECT_TRUE(p == NULL);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_EQ(at_stats(a).allocation.current, 0);
  XSEG_ASSERT_OK(xseg_malloc(a, 5 * MiB, s, &p));
  XSEG_EXPECT_OK(xseg_record_stream(a, p, other));
  xsim_fail_call("cuStreamIsCapturing", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_EQ(xseg_free(a, p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuStreamIsCapturing") != NULL);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_EQ(at_stats(a).allocation.current, 1);     /* still live */
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_CU(cuCtxSynchronize());
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).allocation.current, 0);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(other));
}
