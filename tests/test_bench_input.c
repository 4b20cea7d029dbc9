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

/* The error of loading `len` bytes of `bytes` as a trace (a file named
   with `suffix`), into err; false (reported) when it loads. */
static bool load_fails(const char *bytes, size_t len, const char *suffix,
                       xb_error *err, char *path, size_t path_size) {
  if (!temp_write(path, path_size, suffix, "", false))
    return XSEG_FAIL("cannot write a temporary file");
  FILE *f = fopen(path, "wb");
  bool written = f != NULL && fwrite(bytes, 1, len, f) == len;
  if (f != NULL) fclose(f);
  xb_trace t;
  bool loaded = written && xb_trace_load(path, &t, err);
  unlink(path);
  if (!written) return XSEG_FAIL("cannot write %s", path);
  if (loaded) xb_trace_release(&t);
  if (loaded) return XSEG_FAIL("%s loaded", path);
  return true;
}

static void expect_error(const xb_error *err, const char *path, int line,
                         const char *reason) {
  char where[300];
  snprintf(where, sizeof where, "%s:%d: ", path, line);
  if (strstr(err->text, where) == NULL || strstr(err->text, reason) == NULL)
    XSEG_FAIL("got \"%s\", want \"%s\" and \"%s\"", err->text, where,
              reason);
}

/* A NUL byte is no text: the line is refused, whether what comes before
   it would parse or not. */
XSEG_TEST(bench_input, nul_byte_in_a_line_is_an_error) {
  static const char after_a_row[] =
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0,0,allocate,0x10,64,0\n"
      "0,1,free,0x10,64,0\0garbage\n";
  static const char mid_row[] =
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "0,0,allocate,0x10,6\0004,0\n";
  char path[256];
  xb_error err;
  if (load_fails(after_a_row, sizeof after_a_row - 1, ".csv", &err, path,
                 sizeof path))
    expect_error(&err, path, 3, "NUL byte");
  if (load_fails(mid_row, sizeof mid_row - 1, ".csv", &err, path,
                 sizeof path))
    expect_error(&err, path, 2, "NUL byte");
}

/* A gzip file cut short ends in a line cut short: the error says the file
   is truncated, not that the line lacks a column. */
XSEG_TEST(bench_input, truncated_gzip_says_truncated) {
  FILE *f = fopen(XB_TEST_TRACE_DIR "/bert_infer_varbatch.csv.gz", "rb");
  XSEG_ASSERT_TRUE(f != NULL);
  static char head[20000];
  size_t n = fread(head, 1, sizeof head, f);
  fclose(f);
  XSEG_ASSERT_EQ(n, sizeof head);
  char path[256];
  xb_error err;
  if (load_fails(head, n, ".csv.gz", &err, path, sizeof path) &&
      (strstr(err.text, "truncated") == NULL ||
       strstr(err.text, "missing column") != NULL))
    XSEG_FAIL("got \"%s\", want \"truncated\"", err.text);
}

/* A UTF-8 byte-order mark before the header (as some editors save CSV)
   is skipped: the trace loads as without it. */
XSEG_TEST(bench_input, byte_order_mark_before_the_header_is_skipped) {
  char text[1024], path[256];
  snprintf(text, sizeof text, "\xEF\xBB\xBF%s", small_trace);
  XSEG_ASSERT_TRUE(temp_write(path, sizeof path, ".csv", text, false));
  xb_trace t;
  xb_error err;
  bool ok = xb_trace_load(path, &t, &err);
  unlink(path);
  if (!ok) XSEG_FAIL("%s", err.text);
  if (ok) XSEG_EXPECT_EQ(t.n_events, 8);
  if (ok) XSEG_EXPECT_EQ(t.peak_live_bytes, SMALL_PEAK);
  if (ok) xb_trace_release(&t);
}
