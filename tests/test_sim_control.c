/* The emulator's control surface (sim/xsim.h, sim/sim_control.c): call
 * counters, fault injection (once, repeated, seeded random), modeled
 * latency, environment knobs, live-object counts and the leak report.
 * docs/DESIGN.md section 4 ("Knobs") is the reference; none of this exists in a
 * real driver, so every test requires the emulator.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sim_helpers.h"

/* xsim_call_count: "Calls of the named function since process start or the
   last reset", by the unversioned name. */
XSEG_TEST(SimControl, counters_count) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  int v;
  XSEG_EXPECT_EQ(xsim_call_count("cuDriverGetVersion"), 0);  /* reset */
  for (int i = 0; i < 3; i++) XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  XSEG_EXPECT_EQ(xsim_call_count("cuDriverGetVersion"), 3);
  XSEG_ASSERT_TRUE(st_setup() > 0);
  size_t f, t;
  XSEG_EXPECT_CU(cuMemGetInfo(&f, &t));          /* cuMemGetInfo_v2 */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemGetInfo"), 1);
  XSEG_EXPECT_EQ(xsim_call_count("cuNeverCalled"), 0);
  xsim_reset_counters();
  XSEG_EXPECT_EQ(xsim_call_count("cuDriverGetVersion"), 0);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemGetInfo"), 0);
}

/* xsim_fail_call: "The nth next call (1 = the very next) of the named
   function returns err and does nothing": calls before it succeed, the one
   after it too. */
XSEG_TEST(SimControl, fault_fires_on_the_nth_call_and_not_before) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUmemGenericAllocationHandle h[3], failed = 0xdead;
  xsim_live before, after;
  xsim_fail_call("cuMemCreate", 3, CUDA_ERROR_OUT_OF_MEMORY);
  XSEG_EXPECT_CU(st_create(&h[0], g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_EXPECT_CU(st_create(&h[1], g, CU_MEM_HANDLE_TYPE_NONE));
  xsim_get_live(&before);
  XSEG_EXPECT_CU_ERR(st_create(&failed, g, CU_MEM_HANDLE_TYPE_NONE),
                     CUDA_ERROR_OUT_OF_MEMORY);
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(failed, 0xdead);                 /* it did nothing */
  XSEG_EXPECT_EQ(after.handles, before.handles);
  XSEG_EXPECT_CU(st_create(&h[2], g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate"), 4);  /* failures count */
  for (int i = 0; i < 3; i++) XSEG_EXPECT_CU(cuMemRelease(h[i]));
}

/* xsim_fail_calls: "every call after it fails too, `repeat` calls in all
   (UINT64_MAX: until xsim_reset)". */
XSEG_TEST(SimControl, fault_repeat_mode) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  int v;
  xsim_fail_calls("cuDriverGetVersion", 2, 3, CUDA_ERROR_NOT_PERMITTED);
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  for (int i = 0; i < 3; i++)
    XSEG_EXPECT_CU_ERR(cuDriverGetVersion(&v), CUDA_ERROR_NOT_PERMITTED);
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  xsim_fail_calls("cuDriverGetVersion", 1, UINT64_MAX, CUDA_ERROR_UNKNOWN);
  for (int i = 0; i < 50; i++)
    XSEG_EXPECT_CU_ERR(cuDriverGetVersion(&v), CUDA_ERROR_UNKNOWN);
  xsim_reset();
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
}

/* 64 calls under xsim_fail_random, one bit per failed call. */
static uint64_t st_random_pattern(double p, uint64_t seed) {
  int v;
  uint64_t bits = 0;
  xsim_fail_random("cuDriverGetVersion", p, seed, CUDA_ERROR_UNKNOWN);
  for (int i = 0; i < 64; i++)
    if (cuDriverGetVersion(&v) != CUDA_SUCCESS) bits |= 1ull << i;
  xsim_fail_random("cuDriverGetVersion", 0.0, 0, CUDA_SUCCESS);  /* off */
  return bits;
}

/* xsim_fail_random: "Each call of the named function fails with probability
   p, drawn from a generator seeded with seed (reproducible for one sequence
   of calls)". */
XSEG_TEST(SimControl, fault_random_is_reproducible_with_a_seed) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  uint64_t a = st_random_pattern(0.5, 42), b = st_random_pattern(0.5, 42);
  uint64_t c = st_random_pattern(0.5, 43);
  XSEG_EXPECT_EQ(a, b);
  XSEG_EXPECT_NE(a, c);
  int failures = __builtin_popcountll(a);
  XSEG_EXPECT_GT(failures, 12);   /* binomial(64, 0.5): 32 +- 4 */
  XSEG_EXPECT_LT(failures, 52);
  XSEG_EXPECT_EQ(st_random_pattern(1.0, 7), UINT64_MAX);
  XSEG_EXPECT_EQ(st_random_pattern(0.0, 7), 0);
}

/* Environment, read again by xsim_reset: XSIM_FAIL is
   name:nth[:CUDA_ERROR_NAME]; without a name cuMemCreate fails with
   CUDA_ERROR_OUT_OF_MEMORY and other functions with CUDA_ERROR_UNKNOWN
   (xsim.h). */
XSEG_TEST(SimControl, env_fail_list) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  st_env("XSIM_FAIL",
         "cuDriverGetVersion:2:CUDA_ERROR_NOT_SUPPORTED,cuMemCreate:1,"
         "cuMemMap:1,bogus-entry");
  int v;
  CUmemGenericAllocationHandle h;
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  XSEG_EXPECT_CU_ERR(cuDriverGetVersion(&v), CUDA_ERROR_NOT_SUPPORTED);
  XSEG_EXPECT_CU_ERR(st_create(&h, g, CU_MEM_HANDLE_TYPE_NONE),
                     CUDA_ERROR_OUT_OF_MEMORY);
  XSEG_EXPECT_CU_ERR(cuMemMap(0, g, 0, 1, 0), CUDA_ERROR_UNKNOWN);
  st_env("XSIM_FAIL", NULL);
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  XSEG_EXPECT_CU_ERR(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
}

/* XSIM_FAIL_RATE is name:probability:seed[:CUDA_ERROR_NAME]. */
XSEG_TEST(SimControl, env_fail_rate) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  st_env("XSIM_FAIL_RATE", "cuDriverGetVersion:1.0:5:CUDA_ERROR_NOT_READY");
  int v;
  XSEG_EXPECT_CU_ERR(cuDriverGetVersion(&v), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_CU_ERR(cuDriverGetVersion(&v), CUDA_ERROR_NOT_READY);
  st_env("XSIM_FAIL_RATE", NULL);
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
}

/* XSIM_DEVICE_COUNT, XSIM_DEVICE_MEMORY (suffixes K M G T) and
   XSIM_GRANULARITY, as cuDeviceGetCount, cuDeviceTotalMem and
   cuMemGetAllocationGranularity report them. */
XSEG_TEST(SimControl, env_knobs) {
  XT_REQUIRE_SIM_FOR("tests the emulator's environment knobs");
  XSEG_ASSERT_CU(cuInit(0));
  st_env("XSIM_DEVICE_COUNT", "3");
  st_env("XSIM_DEVICE_MEMORY", "3G");
  st_env("XSIM_GRANULARITY", "64K");
  int n = 0;
  size_t total = 0, g = 0;
  CUmemAllocationProp p = st_prop(2, CU_MEM_HANDLE_TYPE_NONE);
  XSEG_EXPECT_CU(cuDeviceGetCount(&n));
  XSEG_EXPECT_EQ(n, 3);
  XSEG_EXPECT_CU(cuDeviceTotalMem(&total, 2));
  XSEG_EXPECT_EQ(total, 3ull << 30);
  XSEG_EXPECT_CU(cuMemGetAllocationGranularity(
      &g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  XSEG_EXPECT_EQ(g, 64 << 10);
  st_env("XSIM_DEVICE_MEMORY", "1T");
  XSEG_EXPECT_CU(cuDeviceTotalMem(&total, 0));
  XSEG_EXPECT_EQ(total, 1ull << 40);
  st_env("XSIM_GRANULARITY", "3000");   /* not a power of two: default */
  XSEG_EXPECT_CU(cuMemGetAllocationGranularity(
      &g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  XSEG_EXPECT_EQ(g, 2 << 20);
  st_env("XSIM_DEVICE_COUNT", NULL);
  st_env("XSIM_DEVICE_MEMORY", NULL);
  st_env("XSIM_GRANULARITY", NULL);
  XSEG_EXPECT_CU(cuDeviceGetCount(&n));
  XSEG_EXPECT_EQ(n, 1);
}

/* xsim_reset: "Back to the environment's settings: ... device capacities." */
XSEG_TEST(SimControl, reset_restores_device_memory) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  XSEG_ASSERT_CU(cuInit(0));
  size_t total = 0;
  xsim_set_device_memory(0, 1 << 30);
  XSEG_EXPECT_CU(cuDeviceTotalMem(&total, 0));
  XSEG_EXPECT_EQ(total, 1 << 30);
  xsim_reset();
  XSEG_EXPECT_CU(cuDeviceTotalMem(&total, 0));
  XSEG_EXPECT_EQ(total, 80ull << 30);
}

static uint64_t st_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* xsim_set_latency: "Modeled host-side latency of a call, in nanoseconds",
   both spun (short) and slept (long). */
XSEG_TEST(SimControl, latency_is_applied) {
  XT_REQUIRE_SIM_FOR("sets emulated latency");
  int v;
  xsim_set_latency("cuDriverGetVersion", 20000);        /* 20 us */
  uint64_t t0 = st_now_ns();
  for (int i = 0; i < 10; i++) XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  XSEG_EXPECT_GE(st_now_ns() - t0, 200000);
  xsim_set_latency("cuDriverGetVersion", 3000000);      /* 3 ms */
  t0 = st_now_ns();
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  XSEG_EXPECT_GE(st_now_ns() - t0, 3000000);
  xsim_set_latency("cuDriverGetVersion", 0);
}

/* xsim_get_live: "What is alive now, over every device". */
XSEG_TEST(SimControl, live_counts_follow_objects) {
  XT_REQUIRE_SIM_FOR("reads the emulator's live-object counts");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  xsim_live a, b;
  xsim_get_live(&a);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  XSEG_ASSERT_CU(st_create(&h, 2 * g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(va, 2 * g, 0, h, 0));
  xsim_get_live(&b);
  XSEG_EXPECT_EQ(b.handles, a.handles + 1);
  XSEG_EXPECT_EQ(b.mappings, a.mappings + 1);
  XSEG_EXPECT_EQ(b.reservations, a.reservations + 1);
  XSEG_EXPECT_EQ(b.physical_bytes, a.physical_bytes + 2 * g);
  XSEG_EXPECT_CU(cuMemUnmap(va, 2 * g));
  XSEG_EXPECT_CU(cuMemRelease(h));
  XSEG_EXPECT_CU(cuMemAddressFree(va, 2 * g));
  xsim_get_live(&b);
  XSEG_EXPECT_EQ(b.handles, a.handles);
  XSEG_EXPECT_EQ(b.mappings, a.mappings);
  XSEG_EXPECT_EQ(b.reservations, a.reservations);
}

/* xsim_report_live: "Writes one line per live handle, mapping and
   reservation to `out` (a leak report); returns how many lines it wrote." */
XSEG_TEST(SimControl, leak_report_lists_a_leaked_handle) {
  XT_REQUIRE_SIM_FOR("reads the emulator's live-object counts");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, g, CU_MEM_HANDLE_TYPE_NONE));
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  XSEG_ASSERT_TRUE(out != NULL);
  uint64_t lines = xsim_report_live(out);
  fclose(out);
  char id[64];
  snprintf(id, sizeof id, "handle 0x%llx", (unsigned long long)h);
  XSEG_EXPECT_GE(lines, 1);
  XSEG_EXPECT_TRUE(text != NULL && strstr(text, id) != NULL);
  free(text);
  XSEG_EXPECT_CU(cuMemRelease(h));
  text = NULL;
  out = open_memstream(&text, &len);
  XSEG_ASSERT_TRUE(out != NULL);
  xsim_report_live(out);
  fclose(out);
  XSEG_EXPECT_TRUE(text != NULL && strstr(text, id) == NULL);
  free(text);
}

/* Handles are opaque ids, never pointers into the emulator (a caller that
   dereferences one must fault, not read our state): they are non-canonical
   x86-64 addresses. */
XSEG_TEST(SimControl, handles_are_opaque_ids) {
  XT_REQUIRE_SIM_FOR("checks the emulator's handle values");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUmemGenericAllocationHandle a, b;
  XSEG_ASSERT_CU(st_create(&a, g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(st_create(&b, g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_EXPECT_NE(a, b);
  uint64_t top = (uint64_t)a >> 47;
  XSEG_EXPECT_TRUE(top != 0 && top != 0x1ffff);
  XSEG_EXPECT_CU(cuMemRelease(a));
  XSEG_EXPECT_CU(cuMemRelease(b));
}

/* Runs call(arg) in a forked child with knob=value in its environment and
   its stderr read back into text: true when the child died of SIGABRT. */
static bool sc_child_aborts(const char *knob, const char *value,
                            void (*call)(int), int arg, char *text,
                            size_t size) {
  int err[2];
  if (pipe(err) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(err[1], 2);
    setenv(knob, value, 1);
    call(arg);
    _exit(0);
  }
  close(err[1]);
  size_t got = 0;
  ssize_t n;
  while (pid > 0 && got < size - 1 &&
         (n = read(err[0], text + got, size - 1 - got)) > 0)
    got += (size_t)n;
  text[got] = '\0';
  close(err[0]);
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) &&
         WTERMSIG(status) == SIGABRT;
}

static const char *const sc_steering[] = {
    "xsim_set_device_memory", "xsim_fail_call",   "xsim_fail_calls",
    "xsim_fail_random",       "xsim_set_latency", "xsim_set_gpu_lag"};

/* The i-th of sc_steering, after a counter read (which is allowed). */
static void sc_steer(int i) {
  (void)xsim_call_count("cuMemCreate");
  switch (i) {
    case 0: xsim_set_device_memory(0, 1); break;
    case 1: xsim_fail_call("cuMemCreate", 1, CUDA_ERROR_UNKNOWN); break;
    case 2: xsim_fail_calls("cuMemCreate", 1, 2, CUDA_ERROR_UNKNOWN); break;
    case 3: xsim_fail_random("cuMemCreate", 1, 1, CUDA_ERROR_UNKNOWN); break;
    case 4: xsim_set_latency("cuMemCreate", 1); break;
    default: xsim_set_gpu_lag(1); break;
  }
}

/* XSIM_STEERING=refuse (the dry run of a GPU run sets it): each call that
   steers the emulator aborts, naming itself; reading the counters still
   works. */
XSEG_TEST(SimControl, steering_refused_when_asked) {
  XT_REQUIRE_SIM_FOR("checks the emulator's own entry points");
  for (int i = 0; i < 6; i++) {
    char text[512];
    XSEG_EXPECT_TRUE(sc_child_aborts("XSIM_STEERING", "refuse", sc_steer, i,
                                     text, sizeof text));
    XSEG_EXPECT_TRUE(strstr(text, sc_steering[i]) != NULL);
    XSEG_EXPECT_TRUE(strstr(text, "XT_REQUIRE_SIM_FOR") != NULL);
  }
}

static CUstream sc_destroyed;

static void sc_query_destroyed(int unused) {
  (void)unused;
  (void)cuStreamQuery(sc_destroyed);
}

/* XSIM_STALE_STREAMS=abort: a call that names a destroyed stream aborts,
   naming the knob, where it would otherwise answer
   CUDA_ERROR_INVALID_HANDLE. */
XSEG_TEST(SimControl, stale_streams_abort_when_asked) {
  XT_REQUIRE_SIM_FOR("tests the emulator's environment knobs");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  XSEG_ASSERT_CU(cuStreamCreate(&sc_destroyed, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamDestroy(sc_destroyed));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(sc_destroyed), CUDA_ERROR_INVALID_HANDLE);
  char text[512];
  XSEG_EXPECT_TRUE(sc_child_aborts("XSIM_STALE_STREAMS", "abort",
                                   sc_query_destroyed, 0, text, sizeof text));
  XSEG_EXPECT_TRUE(strstr(text, "XSIM_STALE_STREAMS=abort") != NULL);
}
