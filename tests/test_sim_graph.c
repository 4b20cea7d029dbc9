/* Conformance tests of the emulator's stream capture and graphs
 * (sim/sim_graph.c) against cuda.h: cuStreamBeginCapture,
 * cuThreadExchangeStreamCaptureMode (which defines the global, thread-local
 * and relaxed modes), cuStreamEndCapture, cuStreamIsCapturing,
 * cuStreamGetCaptureInfo, cuGraphInstantiate and cuGraphLaunch.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "sim_helpers.h"
#include "xseg_test.h"

/* ---- helpers ----------------------------------------------------------- */

static unsigned char dev_byte(CUdeviceptr p) {
  unsigned char v = 0;
  XSEG_EXPECT_CU(cuMemcpyDtoH(&v, p, 1));
  return v;
}

static void CUDA_CB count_up(void *arg) { atomic_fetch_add((atomic_int *)arg, 1); }

/* ---- record and replay ------------------------------------------------- */

/* cuda.h, cuStreamBeginCapture: "all operations pushed into the stream will
   not be executed, but will instead be captured into a graph"; cuGraphLaunch
   executes it, on every launch. */
XSEG_TEST(SimGraph, captured_memset_runs_only_when_launched) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  st_buf b;
  XSEG_ASSERT_TRUE(st_buf_alloc(&b));
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU(cuMemsetD8(b.ptr, 0, 64));
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr, 0x5A, 64, s));
  XSEG_EXPECT_CU(cuStreamEndCapture(s, &g));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(dev_byte(b.ptr), 0);            /* captured, not run */
  XSEG_EXPECT_CU(cuGraphInstantiate(&x, g, 0));
  XSEG_EXPECT_CU(cuGraphLaunch(x, s));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(dev_byte(b.ptr + 63), 0x5A);
  XSEG_EXPECT_CU(cuMemsetD8(b.ptr, 0, 64));
  XSEG_EXPECT_CU(cuGraphLaunch(x, s));           /* runs again */
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(dev_byte(b.ptr), 0x5A);
  XSEG_EXPECT_CU(cuGraphExecDestroy(x));
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  st_buf_free(&b);
}

/* Captured host functions and copies keep their order on replay, and each
   launch "is ordered behind ... any previous work in hStream" (cuda.h,
   cuGraphLaunch): a launch onto a held stream waits. The graph copies
   nothing to pageable host memory: on H100, driver 580, this test hung
   while it did, as such a copy makes the host wait for the held stream (the
   device is read back after the stream is released instead). */
XSEG_TEST(SimGraph, replay_keeps_order_and_follows_stream_work) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  st_buf b;
  XSEG_ASSERT_TRUE(st_buf_alloc(&b));
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  atomic_int count = 0;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU(cuLaunchHostFunc(s, count_up, &count));
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr, 7, 1, s));
  XSEG_EXPECT_CU(cuMemcpyDtoDAsync(b.ptr + 1, b.ptr, 1, s));
  XSEG_EXPECT_CU(cuStreamEndCapture(s, &g));
  XSEG_EXPECT_CU(cuGraphInstantiate(&x, g, 0));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuGraphLaunch(x, s));
  XSEG_EXPECT_CU(cuGraphLaunch(x, s));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_EQ(atomic_load(&count), 0);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(atomic_load(&count), 2);
  XSEG_EXPECT_EQ(dev_byte(b.ptr + 1), 7);
  XSEG_EXPECT_CU(cuGraphExecDestroy(x));
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
  st_buf_free(&b);
}

/* cuThreadExchangeStreamCaptureMode: even a relaxed thread may not attempt
   "cuEventQuery on an event that was last recorded inside a capture
   sequence" (CUDA_ERROR_CAPTURED_EVENT). Observed on H100, driver 580: the
   query also invalidates the capture. */
XSEG_TEST(SimGraph, querying_a_captured_event_invalidates_the_capture) {
  CUstream s;
  CUevent e;
  XSEG_ASSERT_TRUE(st_stream_event(&s, &e, CU_EVENT_DISABLE_TIMING));
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  XSEG_EXPECT_CU(cuEventRecord(e, s));
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
  st_capture_invalidated(s);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* cuda.h, CU_EVENT_RECORD_EXTERNAL: "When using stream capture, create an
   event record node instead of the default behavior" (a plain record is a
   dependency inside the capture only); each launch of the graph records the
   event, in stream order behind the work ahead of the launch. */
XSEG_TEST(SimGraph, external_event_record_replays_on_launch) {
  CUstream s;
  CUevent e;
  XSEG_ASSERT_TRUE(st_stream_event(&s, &e, CU_EVENT_DISABLE_TIMING));
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  XSEG_EXPECT_CU(cuEventRecordWithFlags(e, s, CU_EVENT_RECORD_EXTERNAL));
  XSEG_EXPECT_CU(cuStreamEndCapture(s, &g));
  XSEG_EXPECT_CU(cuGraphInstantiate(&x, g, 0));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuGraphLaunch(x, s));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_CU(cuEventQuery(e));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_CU(cuGraphExecDestroy(x));
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
}

/* cuda.h, CU_EVENT_WAIT_EXTERNAL: "Event is captured in the graph as an
   external event node when performing stream capture": a wait on an event
   outside the capture, which without the flag is refused
   (waiting_across_the_capture_boundary_is_refused). A launch waits for the
   event's record made before it, here on a held stream. Neither cuda.h's
   reading nor the emulator's has been run on a GPU yet. */
XSEG_TEST(SimGraph, external_event_wait_replays_on_launch) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  st_buf b;
  XSEG_ASSERT_TRUE(st_buf_alloc(&b));
  CUstream s, outside;
  CUevent e;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&outside, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  XSEG_EXPECT_CU(cuMemsetD8(b.ptr, 0, 1));
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s, e, CU_EVENT_WAIT_EXTERNAL));
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr, 0x3C, 1, s));
  XSEG_EXPECT_CU(cuStreamEndCapture(s, &g));
  XSEG_EXPECT_CU(cuGraphInstantiate(&x, g, 0));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(outside, l));
  XSEG_EXPECT_CU(cuEventRecord(e, outside));
  XSEG_EXPECT_CU(cuGraphLaunch(x, s));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_EQ(dev_byte(b.ptr), 0);            /* the launch waits */
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(dev_byte(b.ptr), 0x3C);
  XSEG_EXPECT_CU(cuStreamSynchronize(outside));
  XSEG_EXPECT_CU(cuGraphExecDestroy(x));
  XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(outside));
  xt_latch_free(l);
  st_buf_free(&b);
}

/* ---- status and id ----------------------------------------------------- */

/* cuda.h, cuStreamIsCapturing / cuStreamGetCaptureInfo: NONE, ACTIVE, and an
   id "unique over the lifetime of the process". */
XSEG_TEST(SimGraph, capture_status_and_unique_id) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  cuuint64_t id1 = 0, id2 = 0;
  XSEG_EXPECT_CU(cuStreamIsCapturing(s, &st));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
  XSEG_EXPECT_CU(cuStreamGetCaptureInfo(s, &st, NULL, NULL, NULL, NULL, NULL));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU(cuStreamIsCapturing(s, &st));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph graph = NULL;
  XSEG_EXPECT_CU(cuStreamGetCaptureInfo(s, &st, &id1, &graph, NULL, NULL, NULL));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  XSEG_EXPECT_TRUE(graph != NULL);
  st_capture_valid(s);
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU(cuStreamGetCaptureInfo(s, &st, &id2, NULL, NULL, NULL, NULL));
  st_capture_valid(s);
  XSEG_EXPECT_NE(id1, 0);
  XSEG_EXPECT_NE(id1, id2);
  XSEG_EXPECT_CU_ERR(cuStreamIsCapturing(s, NULL), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* cuda.h, CU_STREAM_CAPTURE_STATUS_INVALIDATED: "Stream is part of a
   capture sequence that has been invalidated, but not terminated", until
   cuStreamEndCapture; then NONE. xseg reads an invalidated capture as still
   under way (alloc/capture.c). Querying the capturing stream invalidates
   the capture in every mode (on H100, driver 580, too: see
   waiting_on_the_capturing_stream_is_illegal). cuStreamGetCaptureInfo:
   "Valid data (other than capture status) is returned only if ... the
   returned capture status is CU_STREAM_CAPTURE_STATUS_ACTIVE", so that the
   id stays the same is the emulator's answer only. */
XSEG_TEST(SimGraph, capture_info_shows_an_invalidated_capture_until_it_ends) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0, later = 0;
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  XSEG_EXPECT_CU(cuStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  XSEG_EXPECT_CU(
      cuStreamGetCaptureInfo(s, &st, &later, NULL, NULL, NULL, NULL));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  if (xt_have_sim()) XSEG_EXPECT_EQ(later, id);
  st_capture_invalidated(s);
  XSEG_EXPECT_CU(cuStreamGetCaptureInfo(s, &st, NULL, NULL, NULL, NULL, NULL));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* ---- illegal in every mode --------------------------------------------- */

/* Querying or synchronizing the capturing stream itself conflicts with
   capture in every mode (cuda.h: relaxed threads are "still prohibited from
   API calls which necessarily conflict with stream capture"). */
XSEG_TEST(SimGraph, waiting_on_the_capturing_stream_is_illegal) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  st_capture_invalidated(s);
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  XSEG_EXPECT_CU_ERR(cuStreamSynchronize(s),
                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  st_capture_invalidated(s);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* cuda.h, cuStreamIsCapturing: "When a blocking stream is capturing, the
   legacy stream is in an unusable state"; querying it answers
   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and "The blocking stream capture is not
   invalidated"; work on it is an implicit dependency on the capture
   (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), which invalidates it. A
   non-blocking capture leaves the legacy stream usable. */
XSEG_TEST(SimGraph, legacy_stream_during_blocking_capture) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream blocking, non_blocking;
  XSEG_ASSERT_CU(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  XSEG_ASSERT_CU(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING));
  atomic_int count = 0;
  CUstreamCaptureStatus st;
  XSEG_EXPECT_CU(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
  XSEG_EXPECT_CU_ERR(cuStreamIsCapturing(NULL, &st),
                     CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  XSEG_EXPECT_CU(cuStreamIsCapturing(blocking, &st));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  XSEG_EXPECT_CU_ERR(cuLaunchHostFunc(NULL, count_up, &count),
                     CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  st_capture_invalidated(blocking);

  XSEG_EXPECT_CU(cuStreamBeginCapture(non_blocking,
                                      CU_STREAM_CAPTURE_MODE_RELAXED));
  XSEG_EXPECT_CU(cuLaunchHostFunc(NULL, count_up, &count));
  XSEG_EXPECT_CU(cuStreamSynchronize(NULL));
  XSEG_EXPECT_EQ(atomic_load(&count), 1);
  st_capture_valid(non_blocking);
  XSEG_EXPECT_CU(cuStreamDestroy(blocking));
  XSEG_EXPECT_CU(cuStreamDestroy(non_blocking));
}

/* cuda.h, cuStreamBeginCapture: "Capture may not be initiated if stream is
   CU_STREAM_LEGACY ... it may only be initiated if the stream is not already
   in capture mode"; cuStreamEndCapture needs a capture begun on that stream.
   The exact codes are the driver's, hence sim-only. */
XSEG_TEST(SimGraph, begin_and_end_misuse) {
  XT_REQUIRE_SIM_FOR("checks the emulator's error codes for misuse");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  CUgraph g = NULL;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU_ERR(cuStreamBeginCapture(CU_STREAM_LEGACY,
                                          CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  XSEG_EXPECT_CU_ERR(cuStreamBeginCapture(s, (CUstreamCaptureMode)9),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU_ERR(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_ERROR_ILLEGAL_STATE);
  XSEG_EXPECT_CU_ERR(cuStreamEndCapture(s, NULL), CUDA_ERROR_INVALID_VALUE);
  st_capture_valid(s);
  XSEG_EXPECT_CU_ERR(cuGraphInstantiate(NULL, NULL, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* ---- fork and join ----------------------------------------------------- */

/* CUDA programming guide, "Cross-stream dependencies and events": a stream
   that waits on an event recorded in a capture joins it (fork); it must be
   joined back before cuStreamEndCapture, else
   CUDA_ERROR_STREAM_CAPTURE_UNJOINED ("the capture sequence contains a fork
   that was not joined to the primary stream"). */
XSEG_TEST(SimGraph, fork_and_join_capture_other_streams) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  st_buf b;
  XSEG_ASSERT_TRUE(st_buf_alloc(&b));
  CUstream s0, s1;
  CUevent fork, join;
  XSEG_ASSERT_CU(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  XSEG_ASSERT_CU(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  XSEG_EXPECT_CU(cuMemsetD8(b.ptr, 0, 2));
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  CUstreamCaptureStatus st;
  XSEG_EXPECT_CU(cuStreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr, 1, 1, s0));
  XSEG_EXPECT_CU(cuEventRecord(fork, s0));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s1, fork, 0));
  XSEG_EXPECT_CU(cuStreamIsCapturing(s1, &st));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr + 1, 2, 1, s1));
  XSEG_EXPECT_CU(cuEventRecord(join, s1));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s0, join, 0));
  XSEG_EXPECT_CU(cuStreamEndCapture(s0, &g));
  XSEG_EXPECT_CU(cuStreamIsCapturing(s1, &st));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
  XSEG_EXPECT_EQ(dev_byte(b.ptr + 1), 0);
  XSEG_EXPECT_CU(cuGraphInstantiate(&x, g, 0));
  XSEG_EXPECT_CU(cuGraphLaunch(x, s0));
  XSEG_EXPECT_CU(cuStreamSynchronize(s0));
  XSEG_EXPECT_EQ(dev_byte(b.ptr), 1);
  XSEG_EXPECT_EQ(dev_byte(b.ptr + 1), 2);
  XSEG_EXPECT_CU(cuGraphExecDestroy(x));
  XSEG_EXPECT_CU(cuGraphDestroy(g));

  /* The same fork without the join. */
  XSEG_EXPECT_CU(cuStreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU(cuEventRecord(fork, s0));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s1, fork, 0));
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr + 1, 3, 1, s1));
  g = (CUgraph)0x1;
  XSEG_EXPECT_CU_ERR(cuStreamEndCapture(s0, &g),
                     CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  XSEG_EXPECT_TRUE(g == NULL);
  XSEG_EXPECT_CU(cuStreamIsCapturing(s1, &st));
  XSEG_EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);

  XSEG_EXPECT_CU(cuEventDestroy(fork));
  XSEG_EXPECT_CU(cuEventDestroy(join));
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  st_buf_free(&b);
}

/* A capturing stream may not wait on work outside its capture: "a
   dependency would have been created which crosses the capture sequence
   boundary" (CUDA_ERROR_STREAM_CAPTURE_ISOLATION). */
XSEG_TEST(SimGraph, waiting_across_the_capture_boundary_is_refused) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s, outside;
  CUevent e;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&outside, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(outside, l));
  XSEG_EXPECT_CU(cuEventRecord(e, outside));
  XSEG_EXPECT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_CU_ERR(cuStreamWaitEvent(s, e, 0),
                     CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  st_capture_invalidated(s);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(outside));
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(outside));
  xt_latch_free(l);
}
