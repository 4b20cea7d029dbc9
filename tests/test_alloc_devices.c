/* An allocator beside other devices: a block recorded on a stream of
   another device's context (PyTorch's recordStream allows it), its free
   waiting for that stream's work with events of that context, each driver
   failure on the way losing nothing; allocating on such a stream refused.
   (It began as a hardening case: such a stream was taken, and its block's
   free failed.) */
#include <string.h>

#include "alloc_helpers.h"

/* Two devices (emulated where the emulator runs), a stream `s1` of device
   1 and an allocator `a` of device 0, whose context (`mine`) is current;
   `a` NULL on failure. two_devices_close destroys the allocator, then the
   stream. */
typedef struct two_devices {
  CUstream s1;
  xseg_allocator *a;
  CUcontext mine;               /* device 0's, current */
} two_devices;

static two_devices two_devices_open(void) {
  two_devices d = {.s1 = xt_stream_of_device(1)};
  if (d.s1 != NULL && cuCtxGetCurrent(&d.mine) == CUDA_SUCCESS)
    d.a = at_create(NULL);
  return d;
}

/* A test's opening: two devices (it skips where fewer exist) and `d`. */
#define TWO_DEVICES_OPEN(d)                                                 \
  xt_emulate_devices(2);                                                    \
  XT_REQUIRE_DEVICES(2);                                                    \
  two_devices d = two_devices_open();                                       \
  XSEG_ASSERT_TRUE(d.a != NULL)

static void two_devices_close(two_devices *d) {
  xseg_destroy(d->a);
  XSEG_EXPECT_CU(cuStreamDestroy(d->s1));
  xt_emulated_devices_end();
}

/* A stream of another device's context, recorded on a block (PyTorch's
   recordStream allows it, recording its event on the stream's device):
   the free records an event of that context on it (cuda.h's cuEventRecord
   wants the event's and the stream's contexts to be one; the emulator
   refuses others) and waits for it, while the stream is held back, and the
   caller's context stays current. Allocating on such a stream is still
   refused at once, nothing changed. Forgetting the stream waits for what
   was recorded on it. */
XSEG_TEST(devices, another_devices_stream_is_recorded_and_waited_for) {
  TWO_DEVICES_OPEN(d);
  CUcontext now;
  xt_latch *held = xt_latch_new();
  void *p, *q = (void *)1, *r;
  XSEG_ASSERT_OK(xseg_malloc(d.a, MiB, NULL, &p));
  XSEG_EXPECT_STATUS(xseg_malloc(d.a, MiB, d.s1, &q),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another context") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  XSEG_ASSERT_CU(xt_latch_hold(d.s1, held));
  XSEG_ASSERT_OK(xseg_record_stream(d.a, p, d.s1));
  XSEG_ASSERT_OK(xseg_free(d.a, p));
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == d.mine);
  XSEG_EXPECT_EQ(at_stats(d.a).pending_free_bytes, MiB);
  XSEG_ASSERT_OK(xseg_malloc(d.a, MiB, NULL, &q));
  XSEG_EXPECT_TRUE(q != p);                 /* d.s1 still holds p */
  XSEG_EXPECT_OK(xseg_check(d.a));
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(d.s1));
  XSEG_ASSERT_OK(xseg_malloc(d.a, MiB, NULL, &r));
  XSEG_EXPECT_TRUE(r == p);
  XSEG_EXPECT_EQ(at_stats(d.a).pending_free_bytes, 0);
  /* Again, the queue's event of device 1 reused; then the stream is
     forgotten, which waits for it. */
  xt_latch *again = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(d.s1, again));
  XSEG_ASSERT_OK(xseg_record_stream(d.a, r, d.s1));
  XSEG_ASSERT_OK(xseg_free(d.a, r));
  XSEG_EXPECT_EQ(at_stats(d.a).pending_free_bytes, MiB);
  xt_latch_open(again);
  XSEG_ASSERT_OK(xseg_forget_stream(d.a, d.s1));
  XSEG_EXPECT_EQ(at_stats(d.a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(at_stats(d.a).active.current, 1);
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == d.mine);
  XSEG_EXPECT_OK(xseg_free(d.a, q));
  XSEG_EXPECT_EQ(at_stats(d.a).allocated_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(d.a));
  two_devices_close(&d);
  xt_latch_free(held);
  xt_latch_free(again);
}

/* The free's driver calls in the other context fail (making it current,
   creating its event, recording it): the free fails naming the call, the
   block stays live and recorded, the caller's context is current again,
   and a later free goes through. A new stream each time: its queue's pool
   has no event yet. */
XSEG_TEST(devices, another_devices_stream_failures_lose_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  static const char *const calls[] = {"cuCtxSetCurrent", "cuEventCreate",
                                      "cuEventRecord"};
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUcontext mine, now;
  XSEG_ASSERT_CU(cuCtxGetCurrent(&mine));
  xseg_allocator *a = at_create(NULL);
  for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
    CUstream s1 = xt_stream_of_device(1);
    XSEG_ASSERT_TRUE(s1 != NULL);
    void *p;
    XSEG_ASSERT_OK(xseg_malloc(a, MiB, NULL, &p));
    XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
    xsim_fail_call(calls[i], 1, CUDA_ERROR_UNKNOWN);
    XSEG_EXPECT_STATUS(xseg_free(a, p), XSEG_ERR_DRIVER);
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), calls[i]) != NULL);
    xsim_fail_call(calls[i], 0, CUDA_SUCCESS);
    XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
    XSEG_EXPECT_TRUE(now == mine);
    XSEG_EXPECT_EQ(at_stats(a).allocated_bytes.current, MiB);
    XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
    XSEG_EXPECT_OK(xseg_check(a));
    XSEG_EXPECT_OK(xseg_free(a, p));
    XSEG_EXPECT_EQ(at_stats(a).allocated_bytes.current, 0);
    XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, MiB);
    XSEG_ASSERT_OK(xseg_forget_stream(a, s1));        /* waits for it */
    XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
    XSEG_EXPECT_CU(cuStreamDestroy(s1));
  }
  XSEG_EXPECT_EQ(at_stats(a).active.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  xt_emulated_devices_end();
}

/* A cuStreamGetCtx that fails (not for a destroyed stream) is said,
   naming it, and keeps nothing: at a free's first queue for the stream
   (before, the queue took the allocator's own events for it, and every
   later free recorded on it failed), and at a malloc's first use of the
   stream (before, it was taken for the allocator's own, and its pools
   kept). Once the fault is over, frees go through, the malloc is refused
   as another context's, and the stream can be forgotten. */
XSEG_TEST(devices, a_failed_context_query_is_said_and_keeps_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  TWO_DEVICES_OPEN(d);
  void *p, *q = (void *)1;
  XSEG_ASSERT_OK(xseg_malloc(d.a, MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_record_stream(d.a, p, d.s1));
  xsim_fail_call("cuStreamGetCtx", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_free(d.a, p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuStreamGetCtx") != NULL);
  xsim_fail_call("cuStreamGetCtx", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_malloc(d.a, MiB, d.s1, &q), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuStreamGetCtx") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  xsim_fail_call("cuStreamGetCtx", 0, CUDA_SUCCESS);
  XSEG_EXPECT_STATUS(xseg_malloc(d.a, MiB, d.s1, &q),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another context") != NULL);
  XSEG_EXPECT_OK(xseg_free(d.a, p));
  XSEG_ASSERT_OK(xseg_malloc(d.a, MiB, NULL, &q));
  XSEG_ASSERT_OK(xseg_record_stream(d.a, q, d.s1));
  XSEG_EXPECT_OK(xseg_free(d.a, q));
  XSEG_EXPECT_OK(xseg_forget_stream(d.a, d.s1));
  XSEG_EXPECT_EQ(at_stats(d.a).active.current, 0);
  XSEG_EXPECT_OK(xseg_check(d.a));
  two_devices_close(&d);
}

/* A private pool allocates on another device's stream no more than the
   stream's own pools do: announcing it, or naming the pool at a malloc,
   is refused (before, its pools grew there and their unmap guard failed
   at empty_cache). */
XSEG_TEST(devices, private_pools_refuse_another_devices_stream) {
  TWO_DEVICES_OPEN(d);
  void *p = (void *)1;
  XSEG_EXPECT_STATUS(xseg_begin_allocate_to_pool(d.a, 1, d.s1),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(),
                          "xseg_begin_allocate_to_pool") != NULL);
  XSEG_EXPECT_STATUS(xseg_malloc_from_pool(d.a, MiB, d.s1, 1, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another context") != NULL);
  XSEG_EXPECT_TRUE(p == NULL);
  XSEG_EXPECT_STATUS(xseg_malloc(d.a, MiB, d.s1, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_OK(xseg_empty_cache(d.a));
  XSEG_EXPECT_OK(xseg_check(d.a));
  two_devices_close(&d);
}

/* Making the caller's context current again, after an event of the other
   device's context was made, fails twice (once is tried again at once:
   devices_switch_back_fails): the free says so, and the allocator's leave
   makes the caller's context current (before, the thread stayed in the
   other device's context). */
XSEG_TEST(devices, a_failed_return_to_the_callers_context_is_retried) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  TWO_DEVICES_OPEN(d);
  CUcontext now;
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(d.a, MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_record_stream(d.a, p, d.s1));
  xsim_fail_calls("cuCtxSetCurrent", 2, 2, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_free(d.a, p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "the caller's context") !=
                   NULL);
  xsim_fail_call("cuCtxSetCurrent", 0, CUDA_SUCCESS);
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == d.mine);
  XSEG_EXPECT_EQ(at_stats(d.a).allocated_bytes.current, MiB);
  XSEG_EXPECT_OK(xseg_check(d.a));
  XSEG_EXPECT_OK(xseg_free(d.a, p));
  XSEG_ASSERT_OK(xseg_forget_stream(d.a, d.s1));
  XSEG_EXPECT_EQ(at_stats(d.a).active.current, 0);
  two_devices_close(&d);
}

/* Making the caller's context current again at the end of a call fails
   once (the leave, which has no status to say it): it is tried again at
   once, and the caller's context is current after the call (before, the
   thread was left in the allocator's context). Failing twice leaves it
   there: a later call cannot tell that from a context the caller chose
   (cudaSetDevice makes the allocator's own current), which stays. */
XSEG_TEST(devices, a_failed_leave_is_tried_again_at_once) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  TWO_DEVICES_OPEN(d);
  CUcontext theirs, now;
  void *p;
  XSEG_ASSERT_CU(cuStreamGetCtx(d.s1, &theirs));
  XSEG_ASSERT_OK(xseg_malloc(d.a, MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_free(d.a, p));
  XSEG_ASSERT_CU(cuCtxSetCurrent(theirs));
  /* The enter's switch is the first call, the leave's the second. */
  xsim_fail_call("cuCtxSetCurrent", 2, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_OK(xseg_empty_cache(d.a));
  xsim_fail_call("cuCtxSetCurrent", 0, CUDA_SUCCESS);
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == theirs);          /* the retry gave it back */
  xsim_fail_calls("cuCtxSetCurrent", 2, 2, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_OK(xseg_empty_cache(d.a));
  xsim_fail_call("cuCtxSetCurrent", 0, CUDA_SUCCESS);
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == d.mine);          /* left there */
  /* The caller now chooses device 0's context itself: it stays. */
  XSEG_ASSERT_CU(cuCtxSetCurrent(d.mine));
  XSEG_EXPECT_OK(xseg_empty_cache(d.a));
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == d.mine);
  XSEG_EXPECT_OK(xseg_check(d.a));
  two_devices_close(&d);
}

/* Two frees waiting, unrecorded, behind an announced capture: one
   recorded on a stream of device 1, one on another stream of device 0.
   The release that records them makes an event of device 1's context,
   then one of device 0's. When the switch back from device 1's context
   fails (once, or `repeat` times in a row from call `nth` of
   cuCtxSetCurrent), the release fails naming cuCtxSetCurrent (once is
   tried again at once, and goes on), and once the driver works again
   nothing is left behind: no event of the wrong context kept in device
   0's pool (each later record of it failed, and the free never completed),
   both frees complete, and a later cross-stream free works. *reached:
   whether call `nth` came. */
static void devices_switch_back_fails(uint64_t nth, uint64_t repeat,
                                      bool *reached) {
  *reached = false;
  TWO_DEVICES_OPEN(d);
  CUstream s0 = at_stream_new(), s2 = at_stream_new();
  void *p, *q, *r;
  XSEG_ASSERT_OK(xseg_malloc(d.a, 4096, s0, &p));
  XSEG_ASSERT_OK(xseg_malloc(d.a, 8192, s0, &q));
  XSEG_ASSERT_OK(xseg_record_stream(d.a, p, d.s1));
  XSEG_ASSERT_OK(xseg_record_stream(d.a, q, s2));
  XSEG_ASSERT_OK(xseg_begin_allocate_to_pool(d.a, 7, s0));
  XSEG_ASSERT_OK(xseg_free(d.a, p));
  XSEG_ASSERT_OK(xseg_free(d.a, q));
  XSEG_ASSERT_OK(xseg_end_allocate_to_pool(d.a, 7));
  uint64_t before = xsim_call_count("cuCtxSetCurrent");
  xsim_fail_calls("cuCtxSetCurrent", nth, repeat, CUDA_ERROR_UNKNOWN);
  xseg_status st = xseg_empty_cache(d.a);
  *reached = xsim_call_count("cuCtxSetCurrent") - before >= nth;
  xsim_fail_call("cuCtxSetCurrent", 0, CUDA_SUCCESS);
  if (st != XSEG_OK)
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuCtxSetCurrent") != NULL);
  XSEG_ASSERT_CU(cuCtxSetCurrent(d.mine));
  XSEG_ASSERT_CU(cuStreamSynchronize(d.s1));
  XSEG_ASSERT_CU(cuStreamSynchronize(s2));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(d.a));
  xseg_stats s = at_stats(d.a);
  XSEG_EXPECT_EQ(s.pending_free_bytes, 0);
  XSEG_EXPECT_EQ(s.active.current, 0);
  XSEG_ASSERT_OK(xseg_malloc(d.a, 4096, s0, &r));
  XSEG_EXPECT_OK(xseg_record_stream(d.a, r, s2));
  XSEG_EXPECT_OK(xseg_free(d.a, r));
  XSEG_EXPECT_OK(xseg_check(d.a));
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
  two_devices_close(&d);
}

XSEG_TEST(devices, a_failed_switch_back_from_another_device_loses_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  for (uint64_t repeat = 1; repeat <= 3; repeat += 2) {
    bool reached = true;
    for (uint64_t nth = 1; reached; nth++)
      devices_switch_back_fails(nth, repeat, &reached);
  }
}
