/* streams/: the event pool and the per-stream queues of recorded frees.
 * Streams are held back with a latch, so "not yet" is certain, not likely.
 * The fixture checks every driver call it makes, so that a failure names
 * its cause instead of showing up later on a stream that does not exist. */
#include <stdint.h>
#include <string.h>

#include "streams/pending.h"
#include "xseg_test.h"

typedef struct fired_log {
  void *blocks[64];
  int n;
} fired_log;

static void log_fired(void *ctx, void *block) {
  fired_log *log = ctx;
  if (log->n < 64) log->blocks[log->n++] = block;
}

typedef struct fixture {
  xs_vmm vmm;
  CUcontext saved;
  xs_event_pool events;
  xs_pending pending;
} fixture;

static bool fixture_open(fixture *f) {
  if (!XSEG_EXPECT_TRUE(xt_context(0) != NULL) ||
      !XSEG_EXPECT_OK(xs_vmm_open(&f->vmm, xt_driver_name(), 0)))
    return false;
  if (!XSEG_EXPECT_OK(xs_vmm_ctx_enter(&f->vmm, &f->saved))) {
    xs_vmm_close(&f->vmm);
    return false;
  }
  xs_event_pool_init(&f->events, &f->vmm);
  xs_pending_init(&f->pending, &f->events);
  return true;
}

static void fixture_close(fixture *f) {
  xs_pending_destroy(&f->pending);
  xs_event_pool_destroy(&f->events);
  xs_vmm_ctx_leave(&f->vmm, f->saved);
  xs_vmm_close(&f->vmm);
}

/* A new non-blocking stream in *s; false (the failure reported) if the
   driver refused. */
static bool stream_new(CUstream *s) {
  return XSEG_EXPECT_CU(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
}

XSEG_TEST(streams_pending, entry_fires_only_after_held_work) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s;
  if (!stream_new(&s)) {
    fixture_close(&f);
    return;
  }
  xt_latch *latch = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(s, latch));

  int block = 0;
  XSEG_ASSERT_OK(xs_pending_add(&f.pending, s, &block));
  fired_log log = {0};
  xseg_status err;
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 0);
  XSEG_EXPECT_OK(err);
  XSEG_EXPECT_EQ(f.pending.entries, 1);

  xt_latch_open(latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_OK(err);
  XSEG_EXPECT_EQ(log.n, 1);
  XSEG_EXPECT_TRUE(log.blocks[0] == &block);

  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(latch);
  fixture_close(&f);
}

/* A held stream must not hold back entries of another stream. */
XSEG_TEST(streams_pending, no_head_of_line_blocking_across_streams) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream held, idle;
  if (!stream_new(&held)) {
    fixture_close(&f);
    return;
  }
  if (!stream_new(&idle)) {
    XSEG_EXPECT_CU(cuStreamDestroy(held));
    fixture_close(&f);
    return;
  }
  xt_latch *latch = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(held, latch));

  int a = 0, b = 0;
  XSEG_ASSERT_OK(xs_pending_add(&f.pending, held, &a));
  XSEG_ASSERT_OK(xs_pending_add(&f.pending, idle, &b));
  XSEG_ASSERT_CU(cuStreamSynchronize(idle));
  fired_log log = {0};
  xseg_status err;
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 1 && log.blocks[0] == &b);

  xt_latch_open(latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 2 && log.blocks[1] == &a);

  XSEG_EXPECT_CU(cuStreamSynchronize(held));
  XSEG_EXPECT_CU(cuStreamDestroy(held));
  XSEG_EXPECT_CU(cuStreamDestroy(idle));
  xt_latch_free(latch);
  fixture_close(&f);
}

/* Entries of one stream fire in order, and work queued after an entry does
   not delay it. */
XSEG_TEST(streams_pending, later_work_does_not_delay_an_entry) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s;
  if (!stream_new(&s)) {
    fixture_close(&f);
    return;
  }
  int first = 0;
  XSEG_ASSERT_OK(xs_pending_add(&f.pending, s, &first));
  xt_latch *latch = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(s, latch));  /* queued after the entry */
  int second = 0;
  XSEG_ASSERT_OK(xs_pending_add(&f.pending, s, &second));

  fired_log log = {0};
  xseg_status err;
  /* The first entry's event precedes the held host function: once the
     stream's worker is inside the latch, the event has fired. */
  XSEG_ASSERT_TRUE(xt_latch_wait_for_holders(latch, 1));
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 1 && log.blocks[0] == &first);

  xt_latch_open(latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 2 && log.blocks[1] == &second);

  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(latch);
  fixture_close(&f);
}

/* A steady stream of frees reuses events: the pool creates as many as were
   ever in flight at once, not one per free. */
XSEG_TEST(streams_pending, events_are_reused_in_steady_state) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s;
  if (!stream_new(&s)) {
    fixture_close(&f);
    return;
  }
  int block = 0;
  fired_log log = {0};
  xseg_status err;
  for (int i = 0; i < 1000; i++) {
    XSEG_ASSERT_OK(xs_pending_add(&f.pending, s, &block));
    XSEG_ASSERT_OK(xs_pending_add(&f.pending, s, &block));
    xs_pending_drain(&f.pending, log_fired, &log, &err);
    XSEG_ASSERT_OK(err);
  }
  XSEG_EXPECT_EQ(f.events.created, 2);
  XSEG_EXPECT_EQ(f.events.in_flight, 0);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  fixture_close(&f);
}

/* A failing cuEventRecord queues nothing and loses no event. */
XSEG_TEST(streams_pending, record_failure_queues_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s;
  if (!stream_new(&s)) {
    fixture_close(&f);
    return;
  }
  int block = 0;
  xsim_fail_call("cuEventRecord", 1, CUDA_ERROR_LAUNCH_FAILED);
  XSEG_EXPECT_STATUS(xs_pending_add(&f.pending, s, &block), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuEventRecord") != NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "CUDA_ERROR_LAUNCH_FAILED") !=
                   NULL);
  XSEG_EXPECT_EQ(f.pending.entries, 0);
  XSEG_EXPECT_EQ(f.events.in_flight, 0);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  fixture_close(&f);
}

/* Frees that outrun a held stream share its newest event past the bound:
   no more events than XS_PENDING_MAX_EVENTS, every block still reported,
   in order. */
XSEG_TEST(streams_pending, events_per_stream_are_bounded) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s;
  if (!stream_new(&s)) {
    fixture_close(&f);
    return;
  }
  xt_latch *latch = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(s, latch));
  static int blocks[100];
  for (int i = 0; i < 100; i++)
    XSEG_ASSERT_OK(xs_pending_add(&f.pending, s, &blocks[i]));
  XSEG_EXPECT_EQ(f.events.created, XS_PENDING_MAX_EVENTS);
  XSEG_EXPECT_EQ(f.pending.entries, 100);
  fired_log log = {0};
  xseg_status err;
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 0);
  xt_latch_open(latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 100);
  XSEG_EXPECT_OK(err);
  for (int i = 0; i < 64; i++) XSEG_EXPECT_TRUE(log.blocks[i] == &blocks[i]);
  XSEG_EXPECT_EQ(f.events.in_flight, 0);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(latch);
  fixture_close(&f);
}
