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

/* xs_pending_add_all on one stream, as a free used on one other stream
   queues its block. */
static xseg_status pending_add_one(xs_pending *p, CUstream stream,
                                   void *block) {
  xs_stream_set one = {.inline_ = {stream}, .n = 1};
  return xs_pending_add_all(p, &one, block);
}

/* The driver, the event pool and queue under test, one non-blocking
   stream, and a latch that holds it once fixture_hold was called. */
typedef struct fixture {
  xs_vmm vmm;
  CUcontext saved;
  xs_event_pool events;
  xs_pending pending;
  CUstream stream;
  xt_latch *latch;              /* NULL until fixture_hold */
} fixture;

/* A new non-blocking stream in *s; false (the failure reported) if the
   driver refused. */
static bool stream_new(CUstream *s) {
  return XSEG_EXPECT_CU(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
}

static bool fixture_open(fixture *f) {
  *f = (fixture){0};
  if (!XSEG_EXPECT_TRUE(xt_context(0) != NULL) ||
      !XSEG_EXPECT_OK(xs_vmm_open(&f->vmm, xt_driver_name(), 0)))
    return false;
  if (!XSEG_EXPECT_OK(xs_vmm_ctx_enter(&f->vmm, &f->saved))) {
    xs_vmm_close(&f->vmm);
    return false;
  }
  if (!stream_new(&f->stream)) {
    xs_vmm_ctx_leave(&f->vmm, f->saved);
    xs_vmm_close(&f->vmm);
    return false;
  }
  xs_event_pool_init(&f->events, &f->vmm);
  xs_pending_init(&f->pending, &f->events);
  return true;
}

/* Holds f's stream: what is queued on it from now on waits for
   xt_latch_open(f->latch). */
static bool fixture_hold(fixture *f) {
  f->latch = xt_latch_new();
  return XSEG_EXPECT_CU(xt_latch_hold(f->stream, f->latch));
}

/* Lets the stream go (a test that failed half-way may not have), waits
   for it, and destroys everything. */
static void fixture_close(fixture *f) {
  if (f->latch != NULL) xt_latch_open(f->latch);
  XSEG_EXPECT_CU(cuStreamSynchronize(f->stream));
  xs_pending_destroy(&f->pending);
  xs_event_pool_destroy(&f->events);
  XSEG_EXPECT_CU(cuStreamDestroy(f->stream));
  if (f->latch != NULL) xt_latch_free(f->latch);
  xs_vmm_ctx_leave(&f->vmm, f->saved);
  xs_vmm_close(&f->vmm);
}

XSEG_TEST(streams_pending, entry_fires_only_after_held_work) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s = f.stream;
  if (!fixture_hold(&f)) goto out;

  int block = 0;
  XSEG_ASSERT_OK(pending_add_one(&f.pending, s, &block));
  fired_log log = {0};
  xseg_status err;
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 0);
  XSEG_EXPECT_OK(err);
  XSEG_EXPECT_EQ(f.pending.entries, 1);

  xt_latch_open(f.latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_OK(err);
  XSEG_EXPECT_EQ(log.n, 1);
  XSEG_EXPECT_TRUE(log.blocks[0] == &block);

out:
  fixture_close(&f);
}

/* A held stream must not hold back entries of another stream. */
XSEG_TEST(streams_pending, no_head_of_line_blocking_across_streams) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream held = f.stream, idle;
  if (!stream_new(&idle)) goto out;
  if (!fixture_hold(&f)) goto out_idle;

  int a = 0, b = 0;
  XSEG_ASSERT_OK(pending_add_one(&f.pending, held, &a));
  XSEG_ASSERT_OK(pending_add_one(&f.pending, idle, &b));
  XSEG_ASSERT_CU(cuStreamSynchronize(idle));
  fired_log log = {0};
  xseg_status err;
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 1 && log.blocks[0] == &b);

  xt_latch_open(f.latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 2 && log.blocks[1] == &a);

out_idle:
  XSEG_EXPECT_CU(cuStreamDestroy(idle));
out:
  fixture_close(&f);
}

/* Entries of one stream fire in order, and work queued after an entry does
   not delay it. */
XSEG_TEST(streams_pending, later_work_does_not_delay_an_entry) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s = f.stream;
  int first = 0;
  XSEG_ASSERT_OK(pending_add_one(&f.pending, s, &first));
  if (!fixture_hold(&f)) goto out;          /* queued after the entry */
  int second = 0;
  XSEG_ASSERT_OK(pending_add_one(&f.pending, s, &second));

  fired_log log = {0};
  xseg_status err;
  /* The first entry's event precedes the held host function: once the
     stream's worker is inside the latch, the event has fired. */
  XSEG_ASSERT_TRUE(xt_latch_wait_for_holders(f.latch, 1));
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 1 && log.blocks[0] == &first);

  xt_latch_open(f.latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 1);
  XSEG_EXPECT_TRUE(log.n == 2 && log.blocks[1] == &second);

out:
  fixture_close(&f);
}

/* A steady stream of frees reuses events: the pool creates as many as were
   ever in flight at once, not one per free. */
XSEG_TEST(streams_pending, events_are_reused_in_steady_state) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s = f.stream;
  int block = 0;
  fired_log log = {0};
  xseg_status err;
  for (int i = 0; i < 1000; i++) {
    XSEG_ASSERT_OK(pending_add_one(&f.pending, s, &block));
    XSEG_ASSERT_OK(pending_add_one(&f.pending, s, &block));
    xs_pending_drain(&f.pending, log_fired, &log, &err);
    XSEG_ASSERT_OK(err);
  }
  XSEG_EXPECT_EQ(f.events.created, 2);
  XSEG_EXPECT_EQ(f.events.in_flight, 0);
  fixture_close(&f);
}

/* A failing cuEventRecord queues nothing and leaks no event: the one it
   failed on is destroyed, not kept for the next record (the failure may
   be the event's own), and the next record takes a new one. */
XSEG_TEST(streams_pending, record_failure_queues_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s = f.stream;
  int block = 0;
  xsim_fail_call("cuEventRecord", 1, CUDA_ERROR_LAUNCH_FAILED);
  XSEG_EXPECT_STATUS(pending_add_one(&f.pending, s, &block), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuEventRecord") != NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "CUDA_ERROR_LAUNCH_FAILED") !=
                   NULL);
  XSEG_EXPECT_EQ(f.pending.entries, 0);
  XSEG_EXPECT_EQ(f.events.in_flight, 0);
  XSEG_EXPECT_EQ(f.events.n_idle, 0);
  XSEG_EXPECT_OK(pending_add_one(&f.pending, s, &block));
  XSEG_EXPECT_EQ(f.events.created, 2);
  XSEG_EXPECT_EQ(f.pending.entries, 1);
  fired_log log = {0};
  xseg_status err;
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  xs_pending_drain(&f.pending, log_fired, &log, &err);
  XSEG_EXPECT_OK(err);
  fixture_close(&f);
}

/* Frees that outrun a held stream share its newest event past the bound:
   no more events than XS_PENDING_MAX_EVENTS, every block still reported,
   in order. */
XSEG_TEST(streams_pending, events_per_stream_are_bounded) {
  fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f));
  CUstream s = f.stream;
  if (!fixture_hold(&f)) goto out;
  static int blocks[100];
  for (int i = 0; i < 100; i++)
    XSEG_ASSERT_OK(pending_add_one(&f.pending, s, &blocks[i]));
  XSEG_EXPECT_EQ(f.events.created, XS_PENDING_MAX_EVENTS);
  XSEG_EXPECT_EQ(f.pending.entries, 100);
  fired_log log = {0};
  xseg_status err;
  XSEG_EXPECT_EQ(xs_pending_poll(&f.pending, log_fired, &log, &err), 0);
  xt_latch_open(f.latch);
  XSEG_EXPECT_EQ(xs_pending_drain(&f.pending, log_fired, &log, &err), 100);
  XSEG_EXPECT_OK(err);
  for (int i = 0; i < 64; i++) XSEG_EXPECT_TRUE(log.blocks[i] == &blocks[i]);
  XSEG_EXPECT_EQ(f.events.in_flight, 0);
out:
  fixture_close(&f);
}
