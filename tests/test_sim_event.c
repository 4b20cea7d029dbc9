/* Conformance tests of the emulator's events (sim/sim_event.c) against
 * cuda.h. Pending work is forced with a latch that holds a stream back.
 */
#include <stdatomic.h>
#include <time.h>

#include "sim_helpers.h"
#include "xseg_test.h"

static void CUDA_CB sleep_20ms(void *arg) {
  (void)arg;
  const struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

/* cuda.h, cuEventQuery: "Returns CUDA_SUCCESS if all captured work has been
   completed, or CUDA_ERROR_NOT_READY if any captured work is incomplete." */
XSEG_TEST(SimEvent, query_not_ready_then_success) {
  CUstream s;
  CUevent e;
  XSEG_ASSERT_TRUE(st_stream_event(&s, &e, CU_EVENT_DISABLE_TIMING));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuEventRecord(e, s));
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_CU(cuEventQuery(e));
  XSEG_EXPECT_CU(cuStreamQuery(s));
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
}

/* cuda.h, cuEventRecord: "Before the first call to cuEventRecord(), an event
   represents an empty set of work, so for example cuEventQuery() would
   return CUDA_SUCCESS." Synchronizing and waiting on it return at once. */
XSEG_TEST(SimEvent, never_recorded_event_is_complete) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUevent e;
  CUstream s;
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU(cuEventQuery(e));
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s, e, 0));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* cuda.h, cuEventRecord: it "can be called multiple times on the same event
   and will overwrite the previously captured state". */
XSEG_TEST(SimEvent, record_again_moves_the_event) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream held, idle;
  CUevent e;
  XSEG_ASSERT_CU(cuStreamCreate(&held, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(cuEventRecord(e, idle));
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_CU(xt_latch_hold(held, l));
  XSEG_EXPECT_CU(cuEventRecord(e, held));          /* complete -> pending */
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_CU(cuEventRecord(e, idle));          /* pending -> complete */
  XSEG_EXPECT_CU(cuStreamSynchronize(idle));
  XSEG_EXPECT_CU(cuEventQuery(e));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(held), CUDA_ERROR_NOT_READY);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(held));
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(held));
  XSEG_EXPECT_CU(cuStreamDestroy(idle));
  xt_latch_free(l);
}

/* cuda.h, cuStreamWaitEvent: "Makes all future work submitted to hStream
   wait for all work captured in hEvent." */
XSEG_TEST(SimEvent, stream_wait_event_orders_across_streams) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s0, s1;
  CUevent e;
  XSEG_ASSERT_CU(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  xt_latch *l = xt_latch_new();
  atomic_int released = 0;
  st_probe p = {.released = &released};
  XSEG_EXPECT_CU(xt_latch_hold(s0, l));
  XSEG_EXPECT_CU(cuEventRecord(e, s0));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s1, e, CU_EVENT_WAIT_DEFAULT));
  XSEG_EXPECT_CU(cuLaunchHostFunc(s1, st_probe_run, &p));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
  st_release(&released, l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s1));
  XSEG_EXPECT_EQ(atomic_load(&p.ran), 1);
  XSEG_EXPECT_EQ(atomic_load(&p.saw_released), 1);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_latch_free(l);
}

/* cuda.h, cuEventRecord: "Other APIs such as cuStreamWaitEvent() use the
   most recently captured state at the time of the API call, and are not
   affected by later calls to cuEventRecord()." */
XSEG_TEST(SimEvent, wait_uses_the_record_at_the_time_of_the_call) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s0, s1, idle;
  CUevent e;
  XSEG_ASSERT_CU(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  xt_latch *l = xt_latch_new();
  atomic_int released = 0;
  st_probe p = {.released = &released};
  XSEG_EXPECT_CU(xt_latch_hold(s0, l));
  XSEG_EXPECT_CU(cuEventRecord(e, s0));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s1, e, 0));
  XSEG_EXPECT_CU(cuEventRecord(e, idle));      /* moves e; s1 still waits */
  XSEG_EXPECT_CU(cuLaunchHostFunc(s1, st_probe_run, &p));
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
  st_release(&released, l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s1));
  XSEG_EXPECT_EQ(atomic_load(&p.saw_released), 1);
  XSEG_EXPECT_CU(cuStreamSynchronize(s0));
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_CU(cuStreamDestroy(idle));
  xt_latch_free(l);
}

/* cuda.h, cuEventSynchronize: "Waits until the completion of all work
   currently captured in hEvent" (here: a host function ahead of it). */
XSEG_TEST(SimEvent, synchronize_waits_for_the_recorded_work) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  CUevent e;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_BLOCKING_SYNC));
  atomic_int released = 1;
  st_probe p = {.released = &released};
  XSEG_EXPECT_CU(cuLaunchHostFunc(s, sleep_20ms, NULL));
  XSEG_EXPECT_CU(cuLaunchHostFunc(s, st_probe_run, &p));
  XSEG_EXPECT_CU(cuEventRecord(e, s));
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_EQ(atomic_load(&p.ran), 1);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* cuda.h, cuEventElapsedTime: the time between two completed records, in
   milliseconds; CUDA_ERROR_NOT_READY while one is incomplete. */
XSEG_TEST(SimEvent, elapsed_time_between_records) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  CUevent start, end;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
  XSEG_ASSERT_CU(cuEventCreate(&end, CU_EVENT_DEFAULT));
  xt_latch *l = xt_latch_new();
  float ms = -1;
  XSEG_EXPECT_CU(cuEventRecord(start, s));
  XSEG_EXPECT_CU(cuLaunchHostFunc(s, sleep_20ms, NULL));
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuEventRecord(end, s));
  XSEG_EXPECT_CU(cuEventSynchronize(start));
  XSEG_EXPECT_CU_ERR(cuEventElapsedTime(&ms, start, end), CUDA_ERROR_NOT_READY);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuEventSynchronize(end));
  XSEG_EXPECT_CU(cuEventElapsedTime(&ms, start, end));
  XSEG_EXPECT_GE(ms * 1000, 19000);            /* at least the 20 ms sleep */
  XSEG_EXPECT_LT(ms, 10000);
  XSEG_EXPECT_CU(cuEventDestroy(start));
  XSEG_EXPECT_CU(cuEventDestroy(end));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
}

/* cuda.h, cuEventElapsedTime: "If cuEventRecord() has not been called on
   either event then CUDA_ERROR_INVALID_HANDLE is returned ... If either
   event was created with the CU_EVENT_DISABLE_TIMING flag, then this
   function will return CUDA_ERROR_INVALID_HANDLE." */
XSEG_TEST(SimEvent, elapsed_time_refuses_untimed_or_unrecorded_events) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUevent timed, untimed, unrecorded;
  XSEG_ASSERT_CU(cuEventCreate(&timed, CU_EVENT_DEFAULT));
  XSEG_ASSERT_CU(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  XSEG_ASSERT_CU(cuEventCreate(&unrecorded, CU_EVENT_DEFAULT));
  XSEG_EXPECT_CU(cuEventRecord(timed, NULL));
  XSEG_EXPECT_CU(cuEventRecord(untimed, NULL));
  XSEG_EXPECT_CU(cuEventSynchronize(untimed));
  XSEG_EXPECT_CU(cuEventSynchronize(timed));
  float ms;
  XSEG_EXPECT_CU(cuEventElapsedTime(&ms, timed, timed));
  XSEG_EXPECT_CU_ERR(cuEventElapsedTime(&ms, timed, untimed),
                     CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU_ERR(cuEventElapsedTime(&ms, unrecorded, timed),
                     CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU(cuEventDestroy(timed));
  XSEG_EXPECT_CU(cuEventDestroy(untimed));
  XSEG_EXPECT_CU(cuEventDestroy(unrecorded));
}

/* cuda.h, cuEventDestroy: an event "may be destroyed before it is complete
   ... the call does not block". The leak check counts events from create to
   destroy. */
XSEG_TEST(SimEvent, destroy_while_pending_does_not_block) {
  CUstream s;
  CUevent e;
  XSEG_ASSERT_TRUE(st_stream_event(&s, &e, CU_EVENT_DEFAULT));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuEventRecord(e, s));
  XSEG_EXPECT_CU(cuEventDestroy(e));           /* returns while held */
  if (xt_have_sim()) {
    xsim_live live;
    xsim_get_live(&live);
    XSEG_EXPECT_EQ(live.events, 0);
  }
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
}

/* cuda.h, cuEventCreate: CU_EVENT_INTERPROCESS "must be specified along with
   CU_EVENT_DISABLE_TIMING"; cuEventRecordWithFlags /cuStreamWaitEvent:
   the EXTERNAL flags are "invalid outside of stream capture":
   CUDA_ERROR_ILLEGAL_STATE, observed on H100, driver 580 (cuda.h names no
   code). An unknown flag is CUDA_ERROR_INVALID_VALUE. */
XSEG_TEST(SimEvent, invalid_flags_are_refused) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUevent e;
  XSEG_EXPECT_CU_ERR(cuEventCreate(&e, CU_EVENT_INTERPROCESS),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuEventCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  XSEG_EXPECT_CU_ERR(cuEventRecordWithFlags(e, NULL, CU_EVENT_RECORD_EXTERNAL),
                     CUDA_ERROR_ILLEGAL_STATE);
  XSEG_EXPECT_CU(cuEventRecordWithFlags(e, NULL, CU_EVENT_RECORD_DEFAULT));
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_CU_ERR(cuStreamWaitEvent(NULL, e, CU_EVENT_WAIT_EXTERNAL),
                     CUDA_ERROR_ILLEGAL_STATE);
  XSEG_EXPECT_CU_ERR(cuEventRecordWithFlags(e, NULL, 0x80),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuStreamWaitEvent(NULL, e, 0x80), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuEventDestroy(e));
}

/* xsim.h: events are live from create to destroy; a destroyed event is an
   invalid handle (the emulator tells; a real driver need not). */
XSEG_TEST(SimEvent, live_count_and_stale_handles) {
  XT_REQUIRE_SIM_FOR("reads the emulator's live-object counts");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xsim_live before, during;
  xsim_get_live(&before);
  CUevent e;
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DEFAULT));
  xsim_get_live(&during);
  XSEG_EXPECT_EQ(during.events, before.events + 1);
  XSEG_EXPECT_CU_ERR(cuEventQuery(NULL), CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU_ERR(cuStreamWaitEvent(NULL, NULL, 0),
                     CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU(cuEventDestroy(e));
}

/* cuda.h, cuEventRecord: "hEvent and hStream must be from the same context
   otherwise CUDA_ERROR_INVALID_HANDLE is returned"; cuStreamGetCtx: the
   context "active in the calling thread when the stream was created", the
   current one for the special handles. */
XSEG_TEST(SimEvent, record_needs_the_streams_context) {
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUcontext c0 = xt_context(0), c1 = xt_context(1), got = NULL;
  XSEG_ASSERT_TRUE(c0 != NULL && c1 != NULL);
  CUstream s1;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU(cuStreamGetCtx(s1, &got));
  XSEG_EXPECT_TRUE(got == c1);
  XSEG_ASSERT_TRUE(xt_context(0) == c0);
  XSEG_EXPECT_CU(cuStreamGetCtx(s1, &got));       /* its creator's still */
  XSEG_EXPECT_TRUE(got == c1);
  XSEG_EXPECT_CU(cuStreamGetCtx(NULL, &got));     /* the current one */
  XSEG_EXPECT_TRUE(got == c0);
  CUevent e0;
  XSEG_ASSERT_CU(cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING));
  XSEG_EXPECT_CU_ERR(cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU(cuEventRecord(e0, NULL));
  XSEG_EXPECT_CU(cuEventSynchronize(e0));
  XSEG_EXPECT_CU(cuEventDestroy(e0));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_emulated_devices_end();
}
