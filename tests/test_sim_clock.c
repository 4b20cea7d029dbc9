/* The emulator's modeled device lag (sim/xsim.h): the virtual clock that a
 * replay drives and the wall-clock lag of XSIM_GPU_LAG. Everything here needs
 * the emulator's control API. Memsets write host buffers: the emulator's
 * device pointers are host addresses, and a buffer the test owns makes "has
 * this work run?" a plain read.
 */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "sim_helpers.h"
#include "xseg_test.h"

#pragma weak xsim_clock_enable
#pragma weak xsim_clock_disable
#pragma weak xsim_clock_advance
#pragma weak xsim_clock_now
#pragma weak xsim_set_gpu_lag

static CUdeviceptr dptr(void *p) { return (CUdeviceptr)(uintptr_t)p; }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUstream stream_new(void) {
  CUstream s = NULL;
  XSEG_EXPECT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

static CUevent event_new(void) {
  CUevent e = NULL;
  XSEG_EXPECT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  return e;
}

XSEG_TEST(SimClock, work_completes_when_the_clock_reaches_queue_time_plus_lag) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  unsigned char buf[4] = {0};
  CUstream s = stream_new();
  CUevent e = event_new();
  xsim_clock_enable(1000);
  xsim_clock_advance(100);
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(buf), 7, 1, s));
  XSEG_EXPECT_CU(cuEventRecord(e, s));
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_EQ(xsim_clock_advance(1099), 0);
  XSEG_EXPECT_EQ(buf[0], 0);
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_EQ(xsim_clock_advance(1100), 2);   /* the memset, the record */
  XSEG_EXPECT_EQ(buf[0], 7);
  XSEG_EXPECT_CU(cuEventQuery(e));
  XSEG_EXPECT_CU(cuStreamQuery(s));
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamSynchronize"), 0);
  xsim_clock_disable();
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

XSEG_TEST(SimClock, the_clock_never_goes_back) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xsim_clock_enable(10);
  XSEG_EXPECT_EQ(xsim_clock_now(), 0);
  xsim_clock_advance(500);
  xsim_clock_advance(100);
  XSEG_EXPECT_EQ(xsim_clock_now(), 500);
  xsim_clock_enable(10);                 /* a new clock starts at 0 */
  XSEG_EXPECT_EQ(xsim_clock_now(), 0);
  xsim_reset();                          /* and reset turns it off */
  XSEG_EXPECT_EQ(xsim_clock_now(), 0);
  xsim_clock_advance(500);
  XSEG_EXPECT_EQ(xsim_clock_now(), 0);
}

/* s2 waits for s1's event: its work is due by its own queue time, but runs
   only once s1's work has (a chain across streams, in one advance). */
XSEG_TEST(SimClock, cross_stream_wait_follows_the_clock) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  unsigned char a[1] = {0}, b[1] = {0};
  CUstream s1 = stream_new(), s2 = stream_new();
  CUevent e = event_new();
  xsim_clock_enable(1000);
  xsim_clock_advance(600);
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 1, 1, s1));   /* due 1600 */
  XSEG_EXPECT_CU(cuEventRecord(e, s1));
  xsim_clock_advance(100);                             /* stays at 600 */
  XSEG_EXPECT_CU(cuStreamWaitEvent(s2, e, 0));         /* due 1600 */
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(b), 2, 1, s2));
  xsim_clock_advance(1599);
  XSEG_EXPECT_EQ(a[0], 0);
  XSEG_EXPECT_EQ(b[0], 0);
  XSEG_EXPECT_EQ(xsim_clock_advance(1600), 4);
  XSEG_EXPECT_EQ(a[0], 1);
  XSEG_EXPECT_EQ(b[0], 2);
  XSEG_EXPECT_CU(cuStreamQuery(s2));
  xsim_clock_disable();
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
}

/* Host waits do not deadlock on work the clock has not reached: the device
   catches up with the awaited work (and what it waits for on other
   streams), the clock stays, and the wait is counted. */
XSEG_TEST(SimClock, host_waits_run_the_awaited_work_at_once) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  unsigned char a[1] = {0}, b[1] = {0}, c[1] = {0};
  CUstream s1 = stream_new(), s2 = stream_new();
  CUevent e = event_new(), f = event_new();
  xsim_clock_enable(UINT64_MAX);
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 1, 1, s1));
  XSEG_EXPECT_CU(cuEventRecord(e, s1));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s2, e, 0));
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(b), 2, 1, s2));
  XSEG_EXPECT_CU(cuStreamSynchronize(s2));   /* pulls s1's work in too */
  XSEG_EXPECT_EQ(a[0], 1);
  XSEG_EXPECT_EQ(b[0], 2);
  XSEG_EXPECT_CU(cuEventQuery(e));
  XSEG_EXPECT_EQ(xsim_clock_now(), 0);

  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(c), 3, 1, s1));
  XSEG_EXPECT_CU(cuEventRecord(f, s1));
  XSEG_EXPECT_CU_ERR(cuEventQuery(f), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_CU(cuEventSynchronize(f));
  XSEG_EXPECT_EQ(c[0], 3);

  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 4, 1, s1));
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(b), 5, 1, s2));
  XSEG_EXPECT_CU(cuCtxSynchronize());
  XSEG_EXPECT_EQ(a[0], 4);
  XSEG_EXPECT_EQ(b[0], 5);

  XSEG_EXPECT_CU(cuMemsetD8(dptr(c), 6, 1));   /* synchronous form */
  XSEG_EXPECT_EQ(c[0], 6);
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamSynchronize"), 1);
  XSEG_EXPECT_EQ(xsim_call_count("cuEventSynchronize"), 1);
  XSEG_EXPECT_EQ(xsim_call_count("cuCtxSynchronize"), 1);
  XSEG_EXPECT_EQ(xsim_clock_now(), 0);
  xsim_clock_disable();
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuEventDestroy(f));
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
}

/* A latch still holds a stream under the clock (host functions are not
   clocked), and advancing past work queued behind it does not block. */
XSEG_TEST(SimClock, a_latch_holds_a_clocked_stream) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  unsigned char a[1] = {0};
  CUstream s = stream_new();
  xt_latch *l = xt_latch_new();
  xsim_clock_enable(100);
  XSEG_EXPECT_CU(xt_latch_hold(s, l));
  XSEG_EXPECT_TRUE(xt_latch_wait_for_holders(l, 1));
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 9, 1, s));
  XSEG_EXPECT_EQ(xsim_clock_advance(1000), 0);
  XSEG_EXPECT_EQ(a[0], 0);
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(a[0], 9);
  xsim_clock_disable();
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xt_latch_free(l);
}

/* Disabling the clock hands clocked work back to the workers, and so does
   destroying a stream whose work the clock has not reached. */
XSEG_TEST(SimClock, disable_lets_clocked_work_run) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  unsigned char a[1] = {0};
  CUstream s = stream_new(), gone = stream_new();
  CUevent e = event_new();
  xsim_clock_enable(UINT64_C(1000000000));
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 5, 1, gone));
  XSEG_EXPECT_CU(cuEventRecord(e, gone));
  XSEG_EXPECT_CU(cuStreamDestroy(gone));      /* drains later */
  XSEG_EXPECT_CU(cuStreamWaitEvent(s, e, 0));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  xsim_clock_disable();
  while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) continue;
  XSEG_EXPECT_EQ(a[0], 5);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamSynchronize"), 1);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* XSIM_GPU_LAG's wall-clock form: an operation never completes before its
   queue time plus the lag (a lower bound, so no timing flake). */
XSEG_TEST(SimClock, wall_lag_delays_completion) {
  XT_REQUIRE_SIM_FOR("models device lag");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  enum { LAG_US = 50000 };
  unsigned char a[1] = {0};
  CUstream s = stream_new();
  xsim_set_gpu_lag(LAG_US);
  uint64_t t0 = now_ns();
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 3, 1, s));
  CUresult q = cuStreamQuery(s);
  if (q == CUDA_SUCCESS) XSEG_EXPECT_TRUE(now_ns() - t0 >= LAG_US * 1000ull);
  else XSEG_EXPECT_CU_ERR(q, CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_TRUE(now_ns() - t0 >= LAG_US * 1000ull);
  XSEG_EXPECT_EQ(a[0], 3);
  xsim_set_gpu_lag(0);
  t0 = now_ns();
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 4, 1, s));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(a[0], 4);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* XSIM_GPU_LAG is read by xsim_reset like every knob; a malformed value is
   reported and means no lag. */
XSEG_TEST(SimClock, gpu_lag_comes_from_the_environment) {
  XT_REQUIRE_SIM_FOR("models device lag");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  enum { LAG_US = 30000 };
  unsigned char a[1] = {0};
  CUstream s = stream_new();
  setenv("XSIM_GPU_LAG", "30000", 1);
  xsim_reset();
  uint64_t t0 = now_ns();
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 1, 1, s));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_TRUE(now_ns() - t0 >= LAG_US * 1000ull);
  XSEG_EXPECT_EQ(a[0], 1);
  setenv("XSIM_GPU_LAG", "30ms", 1);      /* whole microseconds only */
  xsim_reset();
  t0 = now_ns();
  XSEG_EXPECT_CU(cuMemsetD8Async(dptr(a), 2, 1, s));
  XSEG_EXPECT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_EQ(a[0], 2);
  unsetenv("XSIM_GPU_LAG");
  xsim_reset();
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}
