/* xseg_test.h: a C test harness that reports through GoogleTest.
 *
 * Test bodies are C:
 *
 *   XSEG_TEST(segments, split_keeps_tiling) {
 *     XSEG_ASSERT_TRUE(x != NULL);
 *     XSEG_EXPECT_EQ(a, b);
 *   }
 *
 * Each XSEG_TEST registers itself before main(); harness.cc hands every one to
 * testing::RegisterTest, so ctest, --gtest_filter and gtest_discover_tests
 * work as usual. EXPECT_* records a failure and goes on; ASSERT_* records it
 * and returns from the enclosing function (so use ASSERT_* only in functions
 * returning void).
 *
 * The fixture around every test resets the emulator (counters, injected
 * faults, capacities) and fails the test when it ends with more live handles,
 * mappings, reservations, streams or events than it started with. On a real
 * driver (-DXSEG_TEST_DRIVER=system) the xsim_* symbols are absent: they are
 * declared weak here, tests that need them start with
 * XT_REQUIRE_SIM_FOR(why), and the leak check is skipped.
 */
#ifndef XSEG_TEST_H
#define XSEG_TEST_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>
#include "xsim.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma weak xsim_get_live
#pragma weak xsim_set_device_memory
#pragma weak xsim_fail_call
#pragma weak xsim_fail_calls
#pragma weak xsim_fail_random
#pragma weak xsim_set_latency
#pragma weak xsim_set_gpu_lag
#pragma weak xsim_clock_enable
#pragma weak xsim_clock_disable
#pragma weak xsim_call_count
#pragma weak xsim_reset_counters
#pragma weak xsim_reset
#pragma weak xsim_report_live

typedef void (*xt_body_fn)(void);
void xt_register(const char *suite, const char *name, xt_body_fn body,
                 const char *file, int line);

/* Failure reporting (harness.cc). Return false so macros can chain. */
bool xt_fail(const char *file, int line, bool fatal, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool xt_check_int(const char *file, int line, bool fatal, const char *op,
                  long long a, long long b, const char *sa, const char *sb);
bool xt_check_cu(const char *file, int line, bool fatal, CUresult got,
                 CUresult want, const char *expr);
bool xt_check_status(const char *file, int line, bool fatal, int got,
                     int want, const char *expr);
bool xt_check_str(const char *file, int line, bool fatal, const char *a,
                  const char *b, const char *sa, const char *sb);
/* Marks the running test skipped; the body must return after it. */
void xt_skip(const char *file, int line, const char *why);


/* The fixture's leak check, exposed so that a test can prove it catches a
   leak: compares `now` against `before`, writes what leaked to msg and
   returns false when something did. */
bool xt_live_unchanged(const xsim_live *before, const xsim_live *now,
                       char *msg, size_t msg_size);

/* The driver library for xs_vmm_open / xs_driver_load in tests: "sim" (the
   emulator) unless the tests run on a real GPU (XSEG_TEST_DRIVER=system);
   then NULL, the default libcuda.so.1, which is the driver the test binary
   itself links, so that the test's own driver calls and xseg's reach the
   same driver. */
static inline const char *xt_driver_name(void) {
  const char *d = getenv("XSEG_TEST_DRIVER");
  return d != NULL && strcmp(d, "system") == 0 ? NULL : "sim";
}

/* True when the tests may steer the emulator: its control API is present,
   and the tests were not told they run on a real driver. With
   XSEG_TEST_DRIVER=system on the emulator (-DXSEG_TEST_DRIVER=sim-as-system)
   every test takes the path it takes on a GPU: a dry run of a GPU run. */
static inline bool xt_have_sim(void) {
  return xsim_get_live != NULL && xt_driver_name() != NULL;
}

/* On the emulator, `n` devices from here on (XSIM_DEVICE_COUNT, then a
   reset); on a real driver nothing: the test asks XT_REQUIRE_DEVICES.
   xt_emulated_devices_end() goes back to the emulator's default. */
static inline void xt_emulate_devices(int n) {
  if (!xt_have_sim()) return;
  char count[16];
  snprintf(count, sizeof count, "%d", n);
  setenv("XSIM_DEVICE_COUNT", count, 1);
  xsim_reset();
}
static inline void xt_emulated_devices_end(void) {
  if (!xt_have_sim()) return;
  unsetenv("XSIM_DEVICE_COUNT");
  xsim_reset();
}

/* A context on device `dev` made current on the calling thread (the primary
   context, retained once per process and never released: the driver keeps it
   for the process's lifetime anyway). */
CUcontext xt_context(int dev);

/* A non-blocking stream of device `dev`'s context, device 0's context
   current again afterwards (another device's stream, for an allocator of
   device 0); NULL when a call failed. */
static inline CUstream xt_stream_of_device(int dev) {
  CUstream s = NULL;
  if (xt_context(dev) == NULL ||
      cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    s = NULL;
  return xt_context(0) != NULL ? s : NULL;
}

/* A latch that holds a stream back (latch.c): xt_latch_hold enqueues a host
   function that blocks the stream until xt_latch_open. Open every latch
   before the test ends, then synchronise, then free it. On a real driver
   host functions run one at a time (observed on H100, driver 580), and so
   they do on the emulator: while one latch blocks, no other host function
   of the process runs. So a test holds at most one stream by a blocked
   latch at a time (a second stream with xt_latch_hold_behind); "stream B is
   not held back" is shown with device work on B, not a host function; and
   a latch that starts waiting only once another opened is awaited with
   xt_latch_wait_for_holders, not read at once with xt_latch_waiting.
   Nothing the test thread does between hold and open
   may wait for the held stream: no synchronising call, no copy into
   pageable host memory on it or on the legacy stream behind a blocking
   stream it holds. */
typedef struct xt_latch xt_latch;
xt_latch *xt_latch_new(void);
CUresult  xt_latch_hold(CUstream stream, xt_latch *l);
/* Holds a second stream without a second host function blocked at once:
   `stream` first waits (an event) for the work queued so far on `held`, its
   latch included, then is held by l. So l's host function becomes ready only
   after held's latch opened, whatever order the driver gives host functions
   of different streams; until then `stream` is held by the wait. */
CUresult  xt_latch_hold_behind(CUstream stream, CUstream held, xt_latch *l);
void      xt_latch_open(xt_latch *l);
int       xt_latch_waiting(xt_latch *l);   /* host functions blocked now */
/* Waits (up to 10 s) until n host functions are blocked on the latch. */
bool      xt_latch_wait_for_holders(xt_latch *l, int n);
/* Opens l 100 ms from now, on a thread of its own (*opener, for the
   caller to join): a call that must wait for the held stream returns
   then, and one that should not have waited is caught without a hang.
   False when the thread could not start. */
bool      xt_latch_open_later(xt_latch *l, pthread_t *opener);
void      xt_latch_free(xt_latch *l);

#define XT_CONCAT_(a, b) a##b
#define XT_CONCAT(a, b) XT_CONCAT_(a, b)

#define XSEG_TEST(suite, name)                                              \
  static void xt_body_##suite##_##name(void);                               \
  __attribute__((constructor)) static void xt_reg_##suite##_##name(void) {  \
    xt_register(#suite, #name, xt_body_##suite##_##name, __FILE__,          \
                __LINE__);                                                  \
  }                                                                         \
  static void xt_body_##suite##_##name(void)

#define XT_CHECK_(fatal, ok)                                                \
  do {                                                                      \
    if (!(ok) && (fatal)) return;                                           \
  } while (0)

#define XSEG_EXPECT_TRUE(c)                                                 \
  ((c) ? true : xt_fail(__FILE__, __LINE__, false, "expected true: %s", #c))
#define XSEG_ASSERT_TRUE(c)                                                 \
  XT_CHECK_(true, (c) ? true                                                \
                      : xt_fail(__FILE__, __LINE__, true,                   \
                                "expected true: %s", #c))
#define XSEG_EXPECT_FALSE(c) XSEG_EXPECT_TRUE(!(c))
#define XSEG_ASSERT_FALSE(c) XSEG_ASSERT_TRUE(!(c))

#define XT_INT_(fatal, op, a, b)                                            \
  xt_check_int(__FILE__, __LINE__, fatal, op, (long long)(a),               \
               (long long)(b), #a, #b)
#define XSEG_EXPECT_EQ(a, b) XT_INT_(false, "==", a, b)
#define XSEG_EXPECT_NE(a, b) XT_INT_(false, "!=", a, b)
#define XSEG_EXPECT_LT(a, b) XT_INT_(false, "<", a, b)
#define XSEG_EXPECT_LE(a, b) XT_INT_(false, "<=", a, b)
#define XSEG_EXPECT_GT(a, b) XT_INT_(false, ">", a, b)
#define XSEG_EXPECT_GE(a, b) XT_INT_(false, ">=", a, b)
#define XSEG_ASSERT_EQ(a, b) XT_CHECK_(true, XT_INT_(true, "==", a, b))
#define XSEG_ASSERT_NE(a, b) XT_CHECK_(true, XT_INT_(true, "!=", a, b))
#define XSEG_ASSERT_LT(a, b) XT_CHECK_(true, XT_INT_(true, "<", a, b))
#define XSEG_ASSERT_LE(a, b) XT_CHECK_(true, XT_INT_(true, "<=", a, b))
#define XSEG_ASSERT_GT(a, b) XT_CHECK_(true, XT_INT_(true, ">", a, b))
#define XSEG_ASSERT_GE(a, b) XT_CHECK_(true, XT_INT_(true, ">=", a, b))

#define XSEG_EXPECT_STREQ(a, b)                                             \
  xt_check_str(__FILE__, __LINE__, false, a, b, #a, #b)
#define XSEG_ASSERT_STREQ(a, b)                                             \
  XT_CHECK_(true, xt_check_str(__FILE__, __LINE__, true, a, b, #a, #b))

/* Driver calls: CUDA_SUCCESS, or a given CUresult. */
#define XSEG_EXPECT_CU(call)                                                \
  xt_check_cu(__FILE__, __LINE__, false, (call), CUDA_SUCCESS, #call)
#define XSEG_ASSERT_CU(call)                                                \
  XT_CHECK_(true, xt_check_cu(__FILE__, __LINE__, true, (call),             \
                              CUDA_SUCCESS, #call))
#define XSEG_EXPECT_CU_ERR(call, err)                                       \
  xt_check_cu(__FILE__, __LINE__, false, (call), (err), #call)
#define XSEG_ASSERT_CU_ERR(call, err)                                       \
  XT_CHECK_(true, xt_check_cu(__FILE__, __LINE__, true, (call), (err), #call))

/* xseg calls: XSEG_OK, or a given xseg_status (the message is printed). */
#define XSEG_EXPECT_OK(call)                                                \
  xt_check_status(__FILE__, __LINE__, false, (int)(call), 0, #call)
#define XSEG_ASSERT_OK(call)                                                \
  XT_CHECK_(true, xt_check_status(__FILE__, __LINE__, true, (int)(call), 0, \
                                  #call))
#define XSEG_EXPECT_STATUS(call, st)                                        \
  xt_check_status(__FILE__, __LINE__, false, (int)(call), (int)(st), #call)
#define XSEG_ASSERT_STATUS(call, st)                                        \
  XT_CHECK_(true, xt_check_status(__FILE__, __LINE__, true, (int)(call),    \
                                  (int)(st), #call))

#define XSEG_FAIL(...) xt_fail(__FILE__, __LINE__, false, __VA_ARGS__)

/* Skips the test on a real driver, where xsim_* does not exist. */
#define XT_REQUIRE_SIM()                                                    \
  do {                                                                      \
    if (!xt_have_sim()) {                                                   \
      xt_skip(__FILE__, __LINE__, "needs the emulator's control API");      \
      return;                                                               \
    }                                                                       \
  } while (0)

/* The same, saying what of the emulator the test needs, so that a run on a
   GPU lists why each test skipped: XT_REQUIRE_SIM_FOR("injects driver
   faults"). `what` is a string literal. */
#define XT_REQUIRE_SIM_FOR(what)                                            \
  do {                                                                      \
    if (!xt_have_sim()) {                                                   \
      xt_skip(__FILE__, __LINE__, "needs the emulator: " what);             \
      return;                                                               \
    }                                                                       \
  } while (0)

/* Skips the test under ThreadSanitizer, which stops a forked child that
   starts a thread after a multi-threaded fork: the emulator's streams are
   threads, in the child as in the parent. */
#if defined(__SANITIZE_THREAD__)
#define XT_REQUIRE_NO_TSAN_FOR_FORKED_THREADS()                              \
  do {                                                                      \
    xt_skip(__FILE__, __LINE__, "ThreadSanitizer: no new thread after a "   \
            "multi-threaded fork");                                         \
    return;                                                                 \
  } while (0)
#else
#define XT_REQUIRE_NO_TSAN_FOR_FORKED_THREADS() ((void)0)
#endif

/* Skips the test unless the driver has at least n devices (n a literal).
   On the emulator the test first asks for them (XSIM_DEVICE_COUNT), on a
   real driver the machine must have them. */
#define XT_REQUIRE_DEVICES(n)                                               \
  do {                                                                      \
    if (!xt_devices_at_least(n)) {                                          \
      xt_skip(__FILE__, __LINE__, "needs " #n " devices; this machine has " \
                                  "fewer");                                 \
      return;                                                               \
    }                                                                       \
  } while (0)
/* The device count, after cuInit, is at least n. */
bool xt_devices_at_least(int n);

#ifdef __cplusplus
}
#endif
#endif /* XSEG_TEST_H */
