/* The bench's inputs at their edges: sizes near 2^64, NUL bytes, a
   truncated gzip file, a byte-order mark. Each is refused with the file,
   the line and the reason, or read as the same trace without it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_helpers.h"
#include "xseg_test.h"

/* Exact mode rounds to granules: a size that would wrap to 0 is refused,
   not "allocated" with nothing mapped. */
XSEG_TEST(bench_input, exact_mode_refuses_a_size_that_wraps) {
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  void *self = NULL, *ptr = (void *)1;
  XSEG_ASSERT_OK(xb_policy_exact.open(&env, NULL, 1, &self));
  XSEG_EXPECT_EQ(xb_policy_exact.malloc(self, 0, 18446744073709551000ull,
                                        NULL, &ptr),
                 XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(ptr == NULL);
  XSEG_EXPECT_OK(xb_policy_exact.free(self, 0, ptr));   /* nothing to free */
  xb_policy_exact.close(self);
  xb_env_close(&env);
}

/* 2^62, xseg's largest request, is still a size. */
XSEG_TEST(bench_input, largest_request_loads) {
  char path[256];
  XSEG_ASSERT_TRUE(temp_write(path, sizeof path, ".csv",
                              "Thread,Time,Action,Pointer,Size,Stream\n"
                              "0,0,allocate,0x10,4611686018427387904,0\n",
                              false));
  xb_trace t;
  xb_error err;
  bool ok = xb_trace_load(path, &t, &err);
  unlink(path);
  if (!ok) XSEG_FAIL("%s", err.text);
  if (ok) XSEG_EXPECT_EQ(t.peak_live_bytes, 4611686018427387904ull);
  if (ok) xb_trace_release(&t);
}

/* Whatever builds a workload (a CSV, varbatch), no size above 2^62 gets
   in: the live-byte sums round each size to 512 B. */
XSEG_TEST(bench_input, builder_refuses_a_size_above_the_largest_request) {
  xb_trace t;
  xb_trace_init(&t, "huge");
  xb_error err;
  XSEG_EXPECT_FALSE(xb_trace_alloc(&t, 0x10, UINT64_MAX, 0, &err));
  XSEG_EXPECT_TRUE(strstr(err.text, "18446744073709551615 bytes") != NULL);
  XSEG_EXPECT_EQ(t.n_events, 0);
  XSEG_EXPECT_TRUE(xb_trace_alloc(&t, 0x10, XB_MAX_SIZE, 0, &err));
  XSEG_EXPECT_EQ(t.peak_live_bytes, XB_MAX_SIZE);
  xb_trace_release(&t);
}
