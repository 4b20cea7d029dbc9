/* An allocator beside other devices: a block recorded on a stream of
   another device's context (PyTorch's recordStream allows it), its free
   waiting for that stream's work with events of that context, each driver
   failure on the way losing nothing; allocating on such a stream refused.
   (It began as a hardening case: such a stream was taken, and its block's
   free failed.) */
#include <string.h>

#include "alloc_helpers.h"

/* A stream of another device's context, recorded on a block (PyTorch's
   recordStream allows it, recording its event on the stream's device):
   the free records an event of that context on it (cuda.h's cuEventRecord
   wants the event's and the stream's contexts to be one; the emulator
   refuses others) and waits for it, while the stream is held back, and the
   caller's context stays current. Allocating on such a stream is still
   refused at once, nothing changed. Forgetting the stream waits for what
   was recorded on it. */
XSEG_TEST(devices, another_devices_stream_is_recorded_and_waited_for) {
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUstream s1 = xt_stream_of_device(1);
  XSEG_ASSERT_TRUE(s1 != NULL);
  CUcontext mine, now;
  XSEG_ASSERT_CU(cuCtxGetCurrent(&mine));
  xseg_allocator *a = at_create(NULL);
  xt_latch *held = xt_latch_new();
  void *p, *q = (void *)1, *r;
  XSEG_ASSERT_OK(xseg_malloc(a, MiB, NULL, &p));
  XSEG_EXPECT_STATUS(xseg_malloc(a, MiB, s1, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another context") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  XSEG_ASSERT_CU(xt_latch_hold(s1, held));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == mine);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, MiB);
  XSEG_ASSERT_OK(xseg_malloc(a, MiB, NULL, &q));
  XSEG_EXPECT_TRUE(q != p);                 /* s1 still holds p */
  XSEG_EXPECT_OK(xseg_check(a));
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XSEG_ASSERT_OK(xseg_malloc(a, MiB, NULL, &r));
  XSEG_EXPECT_TRUE(r == p);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  /* Again, the queue's event of device 1 reused; then the stream is
     forgotten, which waits for it. */
  xt_latch *again = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(s1, again));
  XSEG_ASSERT_OK(xseg_record_stream(a, r, s1));
  XSEG_ASSERT_OK(xseg_free(a, r));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, MiB);
  xt_latch_open(again);
  XSEG_ASSERT_OK(xseg_forget_stream(a, s1));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(at_stats(a).active.current, 1);
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == mine);
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_EQ(at_stats(a).allocated_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_latch_free(held);
  xt_latch_free(again);
  xt_emulated_devices_end();
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

/* A cuStreamGetCtx that fails (not a destroyed stream) when a free's queue
   for the stream is made: the free fails naming it, and nothing is kept
   (before, the queue took the allocator's own events for the stream, and
   every later free recorded on it failed); once the fault is over, frees
   go through and the stream can be forgotten. */
XSEG_TEST(devices, a_failed_context_query_is_said_and_kept_nowhere) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUstream s1 = xt_stream_of_device(1);
  XSEG_ASSERT_TRUE(s1 != NULL);
  xseg_allocator *a = at_create(NULL);
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  xsim_fail_call("cuStreamGetCtx", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_free(a, p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuStreamGetCtx") != NULL);
  xsim_fail_call("cuStreamGetCtx", 0, CUDA_SUCCESS);
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, MiB, NULL, &q));
  XSEG_ASSERT_OK(xseg_record_stream(a, q, s1));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_forget_stream(a, s1));
  XSEG_EXPECT_EQ(at_stats(a).active.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_emulated_devices_end();
}

/* The same fault at a malloc's first use of another device's stream: the
   malloc fails naming it (before, the stream was taken as the allocator's
   own, and its pools kept), and the next is refused as another context's
   stream. */
XSEG_TEST(devices, a_failed_context_query_lets_no_stream_allocate) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUstream s1 = xt_stream_of_device(1);
  XSEG_ASSERT_TRUE(s1 != NULL);
  xseg_allocator *a = at_create(NULL);
  void *p = (void *)1;
  xsim_fail_call("cuStreamGetCtx", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_malloc(a, MiB, s1, &p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuStreamGetCtx") != NULL);
  XSEG_EXPECT_TRUE(p == NULL);
  xsim_fail_call("cuStreamGetCtx", 0, CUDA_SUCCESS);
  XSEG_EXPECT_STATUS(xseg_malloc(a, MiB, s1, &p), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another context") != NULL);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_emulated_devices_end();
}

/* A private pool allocates on another device's stream no more than the
   stream's own pools do: announcing it, or naming the pool at a malloc,
   is refused (before, its pools grew there and their unmap guard failed
   at empty_cache). */
XSEG_TEST(devices, private_pools_refuse_another_devices_stream) {
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUstream s1 = xt_stream_of_device(1);
  XSEG_ASSERT_TRUE(s1 != NULL);
  xseg_allocator *a = at_create(NULL);
  void *p = (void *)1;
  XSEG_EXPECT_STATUS(xseg_begin_allocate_to_pool(a, 1, s1),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(),
                          "xseg_begin_allocate_to_pool") != NULL);
  XSEG_EXPECT_STATUS(xseg_malloc_from_pool(a, MiB, s1, 1, &p),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another context") != NULL);
  XSEG_EXPECT_TRUE(p == NULL);
  XSEG_EXPECT_STATUS(xseg_malloc(a, MiB, s1, &p), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_emulated_devices_end();
}

/* Making the caller's context current again fails once: the free says so,
   and the allocator's next call makes it current (before, the thread
   stayed in the other device's context). */
XSEG_TEST(devices, a_failed_return_to_the_callers_context_is_retried) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUstream s1 = xt_stream_of_device(1);
  XSEG_ASSERT_TRUE(s1 != NULL);
  CUcontext mine, now;
  XSEG_ASSERT_CU(cuCtxGetCurrent(&mine));
  xseg_allocator *a = at_create(NULL);
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, MiB, NULL, &p));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, s1));
  xsim_fail_call("cuCtxSetCurrent", 2, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_free(a, p), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "the caller's context") != NULL);
  xsim_fail_call("cuCtxSetCurrent", 0, CUDA_SUCCESS);
  XSEG_ASSERT_CU(cuCtxGetCurrent(&now));
  XSEG_EXPECT_TRUE(now == mine);
  XSEG_EXPECT_EQ(at_stats(a).allocated_bytes.current, MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_forget_stream(a, s1));
  XSEG_EXPECT_EQ(at_stats(a).active.current, 0);
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_emulated_devices_end();
}
