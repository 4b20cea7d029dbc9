/* Conformance tests of the emulator's streams (sim/sim_stream.c) against
 * cuda.h, the driver API reference. Cross-stream orderings are forced with a
 * latch that holds a stream back; a host function records whether the latch
 * had been released when it ran, so "B ran after A" is checked, not hoped.
 *
 * A real driver runs host functions one at a time (observed on H100, driver
 * 580: with one stream held by a latch, a host function on another stream
 * never ran, and two latches on two streams never held at once), and so does
 * the emulator (host_functions_run_one_at_a_time). So "B does not wait for
 * A" is shown with device work on B (a memset) that drains while A is held,
 * never with a host function on B; and nothing here copies to pageable host
 * memory behind a held stream, which makes the host wait for the stream.
 */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "sim_helpers.h"
#include "xseg_test.h"

/* ---- helpers ----------------------------------------------------------- */

typedef struct order_log {
  atomic_int n;
  int seen[8];
} order_log;

typedef struct order_entry {
  order_log *log;
  int value;
} order_entry;

static void CUDA_CB order_append(void *arg) {
  order_entry *e = arg;
  int i = atomic_fetch_add(&e->log->n, 1);
  if (i < 8) e->log->seen[i] = e->value;
}

/* Holds `held` and runs a memset on `other`, which must not wait for it:
   `other` drains while `held` is still held. */
static void expect_not_held_back(CUstream held, CUstream other) {
  st_buf b;
  XSEG_ASSERT_TRUE(st_buf_alloc(&b));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(held, l));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr, 0x5A, 64, other));
  XSEG_EXPECT_CU(st_stream_drain(other));       /* fails rather than hangs */
  XSEG_EXPECT_CU_ERR(cuStreamQuery(held), CUDA_ERROR_NOT_READY);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(held));
  unsigned char v = 0;
  XSEG_EXPECT_CU(cuMemcpyDtoH(&v, b.ptr + 63, 1));
  XSEG_EXPECT_EQ(v, 0x5A);
  xt_latch_free(l);
  st_buf_free(&b);
}

/* Holds `held` and submits a probe to `submit`, which must wait for it;
   `check` names the same stream as `submit` (NULL and CU_STREAM_LEGACY both
   name the legacy stream) and is the one queried and synchronized. */
static void expect_held_back(CUstream held, CUstream submit, CUstream check) {
  xt_latch *l = xt_latch_new();
  atomic_int released = 0;
  st_probe p = {.released = &released};
  XSEG_EXPECT_CU(xt_latch_hold(held, l));
  XSEG_EXPECT_CU(cuLaunchHostFunc(submit, st_probe_run, &p));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(check), CUDA_ERROR_NOT_READY);
  st_release(&released, l);
  XSEG_EXPECT_CU(cuStreamSynchronize(check));
  XSEG_EXPECT_EQ(atomic_load(&p.ran), 1);
  XSEG_EXPECT_EQ(atomic_load(&p.saw_released), 1);
  xt_latch_free(l);
}

/* ---- tests ------------------------------------------------------------- */

/* cuda.h, cuLaunchHostFunc: "The function will be called after currently
   enqueued work and will block work added after it." cuStreamQuery:
   CUDA_ERROR_NOT_READY while operations are pending. */
XSEG_TEST(SimStream, host_functions_run_in_stream_order) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  xt_latch *l = xt_latch_new();
  order_log log = {0};
  order_entry e[3] = {{&log, 1}, {&log, 2}, {&log, 3}};
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  for (int i = 0; i < 3; i++)
    XSEG_EXPECT_CU(cuLaunchHostFunc(s, order_append, &e[i]));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_EQ(atomic_load(&log.n), 0);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_CU(cuStreamQuery(s));
  XSEG_EXPECT_EQ(atomic_load(&log.n), 3);
  XSEG_EXPECT_EQ(log.seen[0], 1);
  XSEG_EXPECT_EQ(log.seen[1], 2);
  XSEG_EXPECT_EQ(log.seen[2], 3);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
}

/* Whether *flag becomes set within about `ms` milliseconds: a bounded
   look for something that must not happen, so that a wrong answer fails
   the test instead of hanging it. */
static bool set_within(atomic_int *flag, int ms) {
  const struct timespec step = {0, 1000 * 1000};
  for (int i = 0; i < ms; i++) {
    if (atomic_load(flag)) return true;
    nanosleep(&step, NULL);
  }
  return atomic_load(flag) != 0;
}

/* Host functions run one at a time, whatever their streams. Observed on
   H100, driver 580: while a latch blocked a host function on one stream, a
   host function on another stream never ran, and two latches were never
   seen waiting at once. The documentation allows it (cudaLaunchHostFunc:
   host functions of independent streams "execute in undefined order and
   may be serialized"). The device work of the other stream is not held
   back; its host function runs once the blocked one returns. */
XSEG_TEST(SimStream, host_functions_run_one_at_a_time) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  st_buf buf;
  XSEG_ASSERT_TRUE(st_buf_alloc(&buf));
  CUstream a, b;
  CUevent reached;
  XSEG_ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&reached, CU_EVENT_DISABLE_TIMING));
  xt_latch *la = xt_latch_new(), *lb = xt_latch_new();
  atomic_int released = 0;
  st_probe p = {.released = &released};
  XSEG_EXPECT_CU(xt_latch_hold(a, la));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(la, 1));
  XSEG_EXPECT_CU(cuMemsetD8Async(buf.ptr, 0x5A, 64, b));
  XSEG_EXPECT_CU(cuEventRecord(reached, b));
  XSEG_EXPECT_CU(cuLaunchHostFunc(b, st_probe_run, &p));
  XSEG_EXPECT_CU(xt_latch_hold(b, lb));
  XSEG_EXPECT_CU(cuEventSynchronize(reached));  /* b's host work is ready */
  XSEG_EXPECT_FALSE(set_within(&p.ran, 200));
  XSEG_EXPECT_EQ(xt_latch_waiting(lb), 0);
  XSEG_EXPECT_CU_ERR(cuStreamQuery(b), CUDA_ERROR_NOT_READY);
  st_release(&released, la);
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(lb, 1));   /* b's turn */
  XSEG_EXPECT_EQ(atomic_load(&p.ran), 1);
  XSEG_EXPECT_EQ(atomic_load(&p.saw_released), 1);
  XSEG_EXPECT_EQ(xt_latch_waiting(la), 0);
  xt_latch_open(lb);
  XSEG_EXPECT_CU(cuStreamSynchronize(b));
  XSEG_EXPECT_CU(cuStreamSynchronize(a));
  XSEG_EXPECT_CU(cuEventDestroy(reached));
  XSEG_EXPECT_CU(cuStreamDestroy(a));
  XSEG_EXPECT_CU(cuStreamDestroy(b));
  xt_latch_free(la);
  xt_latch_free(lb);
  st_buf_free(&buf);
}

/* The emulator hands host functions to its one host-function thread in the
   order they became ready, so its runs do not depend on how its threads
   are scheduled. With a blocks the thread: c's function, submitted first,
   waits for a's latch; b's and d's are ready at once, in that order. So
   they run b, d, c. The driver documents the order across streams as
   undefined, so the order is checked on the emulator only; that all three
   wait for the latch holds on any driver. */
XSEG_TEST(SimStream, host_functions_run_in_the_order_they_become_ready) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream a, b, c, d;
  CUevent e;
  XSEG_ASSERT_CU(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&d, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  xt_latch *l = xt_latch_new();
  order_log log = {0};
  order_entry in_b = {&log, 2}, in_c = {&log, 3}, in_d = {&log, 4};
  XSEG_EXPECT_CU(xt_latch_hold(a, l));
  XSEG_EXPECT_CU(cuEventRecord(e, a));
  XSEG_EXPECT_CU(cuStreamWaitEvent(c, e, 0));
  XSEG_EXPECT_CU(cuLaunchHostFunc(c, order_append, &in_c));
  XSEG_EXPECT_CU(cuLaunchHostFunc(b, order_append, &in_b));
  XSEG_EXPECT_CU(cuLaunchHostFunc(d, order_append, &in_d));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_EQ(atomic_load(&log.n), 0);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuCtxSynchronize());
  XSEG_EXPECT_EQ(atomic_load(&log.n), 3);
  if (xt_have_sim()) {
    XSEG_EXPECT_EQ(log.seen[0], 2);
    XSEG_EXPECT_EQ(log.seen[1], 4);
    XSEG_EXPECT_EQ(log.seen[2], 3);
  }
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(a));
  XSEG_EXPECT_CU(cuStreamDestroy(b));
  XSEG_EXPECT_CU(cuStreamDestroy(c));
  XSEG_EXPECT_CU(cuStreamDestroy(d));
  xt_latch_free(l);
}

/* cuda.h, cuMemsetD8Async / cuMemcpyDtoDAsync: stream-ordered; neither may
   touch memory before the work ahead of it completes. The memory is read
   with a synchronous copy on the legacy stream, which does not wait for the
   non-blocking stream s (on H100, driver 580, this test hung while it read
   through cuMemcpyDtoHAsync into pageable memory queued behind the latch:
   that copy returns only once done). */
XSEG_TEST(SimStream, memset_and_memcpy_run_in_stream_order) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  st_buf b;
  XSEG_ASSERT_TRUE(st_buf_alloc(&b));
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU(cuMemsetD8(b.ptr, 0x11, 2048));
  xt_latch *l = xt_latch_new();
  unsigned char host[256];
  memset(host, 0, sizeof host);
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuMemsetD8Async(b.ptr, 0xAB, 128, s));
  XSEG_EXPECT_CU(cuMemcpyDtoDAsync(b.ptr + 1024, b.ptr, sizeof host, s));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU(cuMemcpyDtoH(host, b.ptr, sizeof host));
  XSEG_EXPECT_EQ(host[0], 0x11);       /* nothing ran behind the latch */
  XSEG_EXPECT_CU(cuMemcpyDtoH(host, b.ptr + 1024, sizeof host));
  XSEG_EXPECT_EQ(host[0], 0x11);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_CU(cuMemcpyDtoH(host, b.ptr + 1024, sizeof host));
  XSEG_EXPECT_EQ(host[0], 0xAB);
  XSEG_EXPECT_EQ(host[127], 0xAB);
  XSEG_EXPECT_EQ(host[128], 0x11);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
  st_buf_free(&b);
}

/* cuda.h, cuMemcpyHtoD / DtoD / DtoH and cuMemsetD32 ("The dstDevice pointer
   must be four byte aligned"): synchronous forms return after the copy. */
XSEG_TEST(SimStream, synchronous_copies_round_trip) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  st_buf b;
  XSEG_ASSERT_TRUE(st_buf_alloc(&b));
  unsigned in[64], out[64];
  for (unsigned i = 0; i < 64; i++) in[i] = i * 2654435761u;
  XSEG_EXPECT_CU(cuMemcpyHtoD(b.ptr, in, sizeof in));
  XSEG_EXPECT_CU(cuMemcpyDtoD(b.ptr + 1024, b.ptr, sizeof in));
  XSEG_EXPECT_CU(cuMemsetD32(b.ptr + 1024, 0xDEADBEEFu, 2));
  XSEG_EXPECT_CU(cuMemcpyDtoH(out, b.ptr + 1024, sizeof out));
  XSEG_EXPECT_EQ(out[0], 0xDEADBEEFu);
  XSEG_EXPECT_EQ(out[1], 0xDEADBEEFu);
  XSEG_EXPECT_TRUE(memcmp(out + 2, in + 2, sizeof in - 8) == 0);
  XSEG_EXPECT_CU(cuMemcpy(b.ptr + 2048, b.ptr, sizeof in));
  XSEG_EXPECT_CU(cuMemcpyDtoH(out, b.ptr + 2048, sizeof out));
  XSEG_EXPECT_TRUE(memcmp(out, in, sizeof in) == 0);
  XSEG_EXPECT_CU_ERR(cuMemsetD32(b.ptr + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemsetD32Async(b.ptr + 1, 0, 1, NULL),
                     CUDA_ERROR_INVALID_VALUE);
  st_buf_free(&b);
}

/* cuda.h, cuStreamCreate: CU_STREAM_NON_BLOCKING "may run concurrently";
   separate streams are independent queues, so a held stream holds back
   nothing but itself. */
XSEG_TEST(SimStream, held_stream_does_not_block_another_stream) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream held, free_stream;
  XSEG_ASSERT_CU(cuStreamCreate(&held, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&free_stream, CU_STREAM_NON_BLOCKING));
  expect_not_held_back(held, free_stream);
  XSEG_EXPECT_CU(cuStreamDestroy(held));
  XSEG_EXPECT_CU(cuStreamDestroy(free_stream));
}

/* Two blocking streams do not order with each other either: only the legacy
   stream synchronises with them (cuda.h, CU_STREAM_NON_BLOCKING notes). */
XSEG_TEST(SimStream, blocking_streams_are_independent_of_each_other) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream a, b;
  XSEG_ASSERT_CU(cuStreamCreate(&a, CU_STREAM_DEFAULT));
  XSEG_ASSERT_CU(cuStreamCreate(&b, CU_STREAM_DEFAULT));
  expect_not_held_back(a, b);
  XSEG_EXPECT_CU(cuStreamDestroy(a));
  XSEG_EXPECT_CU(cuStreamDestroy(b));
}

/* Legacy default stream semantics (CUDA programming guide, "Implicit
   Synchronization"; cuda.h's NON_BLOCKING flag): work on the NULL stream
   waits for all prior work of every blocking stream. */
XSEG_TEST(SimStream, legacy_stream_waits_for_blocking_stream) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  expect_held_back(s, CU_STREAM_LEGACY, NULL);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* ... and work on a blocking stream waits for prior NULL-stream work. */
XSEG_TEST(SimStream, blocking_stream_waits_for_legacy_stream) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  expect_held_back(NULL, s, s);
  XSEG_EXPECT_CU(cuStreamSynchronize(NULL));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* cuda.h, cuStreamCreate: a CU_STREAM_NON_BLOCKING stream "should perform no
   implicit synchronization with stream 0", in either direction. */
XSEG_TEST(SimStream, non_blocking_stream_ignores_legacy_stream) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  expect_not_held_back(NULL, s);
  expect_not_held_back(s, NULL);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* cuda.h, cuStreamDestroy: with work pending "the function will return
   immediately and the resources ... will be released automatically once the
   device has completed all work"; the work still runs. cuCtxSynchronize
   "Blocks until the device has completed all preceding requested tasks". */
XSEG_TEST(SimStream, destroy_with_pending_work_completes_the_work) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  xt_latch *l = xt_latch_new();
  atomic_int released = 0;
  st_probe p = {.released = &released};
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuLaunchHostFunc(s, st_probe_run, &p));
  XSEG_EXPECT_CU(cuStreamDestroy(s));          /* returns while held */
  XSEG_EXPECT_EQ(atomic_load(&p.ran), 0);
  st_release(&released, l);
  XSEG_EXPECT_CU(cuCtxSynchronize());
  XSEG_EXPECT_EQ(atomic_load(&p.ran), 1);
  XSEG_EXPECT_EQ(atomic_load(&p.saw_released), 1);
  xt_latch_free(l);
}

/* cuda.h, cuCtxSynchronize: waits for every stream of the context, the
   non-blocking ones included; cuCtxSynchronize_v2 does so for a named
   context ("If the specified context is NULL, the API will operate on the
   current context"). Both streams wait on one latch; only one of its host
   functions is seen blocked, as a real driver runs them one at a time (the
   other waits behind it, which holds its stream all the same). */
XSEG_TEST(SimStream, ctx_synchronize_waits_for_every_stream) {
  CUcontext ctx = xt_context(0);
  XSEG_ASSERT_TRUE(ctx != NULL);
  CUstream a, b;
  XSEG_ASSERT_CU(cuStreamCreate(&a, CU_STREAM_DEFAULT));
  XSEG_ASSERT_CU(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  xt_latch *l = xt_latch_new();
  atomic_int released = 0;
  st_probe pa = {.released = &released}, pb = {.released = &released};
  XSEG_EXPECT_CU(xt_latch_hold(a, l));
  XSEG_EXPECT_CU(xt_latch_hold(b, l));
  XSEG_EXPECT_CU(cuLaunchHostFunc(a, st_probe_run, &pa));
  XSEG_EXPECT_CU(cuLaunchHostFunc(b, st_probe_run, &pb));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  st_release(&released, l);
  XSEG_EXPECT_CU(cuCtxSynchronize());
  XSEG_EXPECT_EQ(atomic_load(&pa.ran) + atomic_load(&pb.ran), 2);
  XSEG_EXPECT_CU(cuLaunchHostFunc(b, st_probe_run, &pa));
  XSEG_EXPECT_CU(cuCtxSynchronize_v2(ctx));
  XSEG_EXPECT_CU(cuCtxSynchronize_v2(NULL));
  XSEG_EXPECT_CU(cuStreamDestroy(a));
  XSEG_EXPECT_CU(cuStreamDestroy(b));
  xt_latch_free(l);
}

/* cuda.h, cuStreamCreate: "Valid values for Flags are CU_STREAM_DEFAULT,
   CU_STREAM_NON_BLOCKING" (else CUDA_ERROR_INVALID_VALUE); cuStreamGetFlags
   returns them; cuStreamCreateWithPriority clamps the priority into
   cuCtxGetStreamPriorityRange's range (lower is higher, 0 the default). */
XSEG_TEST(SimStream, flags_and_priority) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s, p;
  unsigned flags = 99;
  int prio = 99;
  XSEG_EXPECT_CU_ERR(cuStreamCreate(&s, 0x80), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuStreamCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU(cuStreamGetFlags(s, &flags));
  XSEG_EXPECT_EQ(flags, CU_STREAM_NON_BLOCKING);
  XSEG_EXPECT_CU(cuStreamCreateWithPriority(&p, CU_STREAM_DEFAULT, -1000));
  XSEG_EXPECT_CU(cuStreamGetPriority(p, &prio));
  XSEG_EXPECT_LT(prio, 0);
  XSEG_EXPECT_GT(prio, -1000);
  XSEG_EXPECT_CU(cuStreamGetFlags(p, &flags));
  XSEG_EXPECT_EQ(flags, CU_STREAM_DEFAULT);
  unsigned long long id_s = 0, id_p = 0;
  XSEG_EXPECT_CU(cuStreamGetId(s, &id_s));
  XSEG_EXPECT_CU(cuStreamGetId(p, &id_p));
  XSEG_EXPECT_NE(id_s, id_p);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_CU(cuStreamDestroy(p));
}

/* xsim.h: streams are live from create to destroy; the legacy stream is not
   counted. A destroyed handle is refused (CUDA_ERROR_INVALID_HANDLE). */
XSEG_TEST(SimStream, live_count_and_stale_handles) {
  XT_REQUIRE_SIM_FOR("reads the emulator's live-object counts");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xsim_live before, during, after;
  XSEG_EXPECT_CU(cuStreamSynchronize(NULL));   /* the legacy stream exists */
  xsim_get_live(&before);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  xsim_get_live(&during);
  XSEG_EXPECT_EQ(during.streams, before.streams + 1);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(after.streams, before.streams);
  XSEG_EXPECT_CU_ERR(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU_ERR(cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU_ERR(cuLaunchHostFunc(NULL, NULL, NULL),
                     CUDA_ERROR_INVALID_VALUE);
}

/* xsim.h: every cu* call is counted under its unversioned name and honours
   injected faults before it does anything. */
XSEG_TEST(SimStream, calls_are_counted_and_faults_injected) {
  XT_REQUIRE_SIM_FOR("counts driver calls and injects faults");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  xsim_fail_call("cuStreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  XSEG_EXPECT_CU_ERR(cuStreamCreate(&s, 0), CUDA_ERROR_OUT_OF_MEMORY);
  XSEG_ASSERT_CU(cuStreamCreate(&s, 0));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamCreate"), 2);
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamSynchronize"), 1);
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamDestroy"), 1);
}

/* cuda.h, cuStreamSynchronize on the NULL stream ("note_null_stream"): it
   covers the blocking streams' prior work, which the NULL stream waits on. */
XSEG_TEST(SimStream, legacy_synchronize_covers_blocking_streams) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s;
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
  atomic_int released = 1;
  st_probe p = {.released = &released};
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_CU(cuLaunchHostFunc(s, st_probe_run, &p));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  if (xt_have_sim())   /* the emulator's query covers them as its sync does */
    XSEG_EXPECT_CU_ERR(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(NULL));
  XSEG_EXPECT_EQ(atomic_load(&p.ran), 1);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
}

/* ---- a forked child ----------------------------------------------------- */

static void CUDA_CB fork_child_mark(void *arg) { *(int *)arg = 1; }

/* The child of a process whose stream workers wait runs streams of its
   own: a host function on a new stream runs and the stream synchronizes
   (the parent's waiters must not be counted in the child's condition
   variable). */
static void fork_child_uses_a_stream(void *arg) {
  (void)arg;
  CUstream s;
  int ran = 0;
  if (xt_context(0) == NULL ||
      cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    _exit(10);
  if (cuLaunchHostFunc(s, fork_child_mark, &ran) != CUDA_SUCCESS) _exit(11);
  if (st_stream_drain(s) != CUDA_SUCCESS || !ran) _exit(12);
  if (cuStreamDestroy(s) != CUDA_SUCCESS) _exit(13);
}

XSEG_TEST(SimStream, forked_child_runs_streams_of_its_own) {
  XT_REQUIRE_SIM_FOR("uses the emulator in a forked child");
  XT_REQUIRE_NO_TSAN_FOR_FORKED_THREADS();
  CUstream held, idle;
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  XSEG_ASSERT_CU(cuStreamCreate(&held, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(held, l));   /* workers wait meanwhile */
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_EQ(st_child_run(fork_child_uses_a_stream, NULL), 0);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(held));
  XSEG_EXPECT_CU(cuStreamDestroy(held));
  XSEG_EXPECT_CU(cuStreamDestroy(idle));
  xt_latch_free(l);
}
