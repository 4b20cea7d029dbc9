/* `xseg-bench micro`'s cases of models' patterns and its thread scaling
   beside glibc's: each runs and reports the rows and fields that
   bench/README.md and bench/callgrind.sh read. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "micro.h"
#include "xseg_test.h"

/* The JSON of `xseg-bench micro ARGS --json FILE` (malloc'd), or NULL when
   the command fails. */
static char *micro_json(const char *const *args, int n_args) {
  const char *dir = getenv("TMPDIR");
  char path[256];
  snprintf(path, sizeof path, "%s/xseg_micro_XXXXXX",
           dir != NULL && dir[0] ? dir : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  close(fd);
  const char *d = getenv("XSEG_TEST_DRIVER");
  char *argv[24] = {"micro"};
  int argc = 1;
  for (int i = 0; i < n_args; i++) argv[argc++] = (char *)args[i];
  argv[argc++] = "--json";
  argv[argc++] = path;
  argv[argc++] = "--driver";
  argv[argc++] = d != NULL && strcmp(d, "system") == 0 ? "cuda" : "sim";
  argv[argc] = NULL;
  int rc = xb_cmd_micro(argc, argv);
  char *text = calloc(1, 1 << 16);
  FILE *f = fopen(path, "rb");
  if (f != NULL && text != NULL) {
    size_t got = fread(text, 1, (1 << 16) - 1, f);
    text[got] = '\0';
  }
  if (f != NULL) fclose(f);
  unlink(path);
  if (rc != 0 || f == NULL) {
    free(text);
    return NULL;
  }
  return text;
}

/* The JSON of `micro ARGS` has the cached row that starts with `row`, and
   no row of the case named `absent` (not selected by --only). */
static void expect_row(const char *const *args, int n_args, const char *row,
                       const char *absent) {
  char *text = micro_json(args, n_args);
  XSEG_ASSERT_TRUE(text != NULL);
  if (strstr(text, row) == NULL) XSEG_FAIL("no row %s in:\n%s", row, text);
  XSEG_EXPECT_TRUE(strstr(text, absent) == NULL);
  free(text);
}

/* A batch of 8 tensors: 83 pairs are 10 whole batches, 80 pairs. */
XSEG_TEST(bench_micro, layers_counts_whole_batches) {
  const char *args[] = {"--only", "cached-layers", "--pairs", "83",
                        "--rounds", "1"};
  expect_row(args, 6,
             "{\"name\": \"cached-layers\", \"live\": 8, \"pairs\": 80, ",
             "cached-repeat");
}

/* cached-random's live sets are not run with --only cached-mixed. */
XSEG_TEST(bench_micro, mixed_keeps_its_own_live_set) {
  const char *args[] = {"--only", "cached-mixed", "--mixed-live", "300",
                        "--pairs", "500", "--rounds", "1"};
  expect_row(args, 8,
             "{\"name\": \"cached-mixed\", \"live\": 300, \"pairs\": 500, ",
             "cached-random");
}

XSEG_TEST(bench_micro, mixed_live_of_zero_is_refused) {
  const char *args[] = {"--only", "cached-mixed", "--mixed-live", "0"};
  XSEG_EXPECT_TRUE(micro_json(args, 4) == NULL);
}

/* cached-mixed's sizes: each pool's range, and both pools' together. */
XSEG_TEST(bench_micro, mixed_sizes_stay_in_their_pools) {
  const uint32_t mib = 1u << 20;
  uint64_t s = 1;
  uint32_t lo[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX}, hi[3] = {0, 0, 0};
  const char *pools[] = {"small", "large", "both"};
  for (int p = 0; p < 3; p++)
    for (int i = 0; i < 20000; i++) {
      uint32_t size = xb_mixed_size(pools[p], &s);
      if (size < lo[p]) lo[p] = size;
      if (size > hi[p]) hi[p] = size;
    }
  XSEG_EXPECT_TRUE(lo[0] >= 1024 && hi[0] < mib);        /* small pool */
  XSEG_EXPECT_TRUE(lo[1] > mib && hi[1] < 2 * mib);      /* large pool */
  XSEG_EXPECT_TRUE(lo[2] < 2048 && hi[2] > mib && hi[2] < 2 * mib);
}

/* --mixed-pools runs one pool's sizes alone; any other name is refused. */
XSEG_TEST(bench_micro, mixed_pools_run_one_pool_alone) {
  const char *pools[] = {"small", "large", "both"};
  for (size_t i = 0; i < 3; i++) {
    const char *args[] = {"--only", "cached-mixed", "--mixed-live", "50",
                          "--mixed-pools", pools[i], "--pairs", "200",
                          "--rounds", "1"};
    expect_row(args, 10,
               "{\"name\": \"cached-mixed\", \"live\": 50, \"pairs\": 200, ",
               "cached-random");
  }
  const char *bad[] = {"--only", "cached-mixed", "--mixed-pools", "tiny"};
  XSEG_EXPECT_TRUE(micro_json(bad, 4) == NULL);
}

XSEG_TEST(bench_micro, threads_report_glibc_beside) {
  const char *args[] = {"--only", "threads", "--pairs", "2000"};
  char *text = micro_json(args, 4);
  XSEG_ASSERT_TRUE(text != NULL);
  static const char *const fields[] = {
      "\"threads_1_pairs_per_s\": ", "\"glibc_threads_1_pairs_per_s\": ",
      "\"threads_2_pairs_per_s\": ", "\"glibc_threads_2_pairs_per_s\": ",
      "\"glibc_speedup_2\": ", "\"glibc_speedup_4\": "};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
    if (strstr(text, fields[i]) == NULL)
      XSEG_FAIL("threads JSON lacks %s:\n%s", fields[i], text);
  /* glibc's rates are measured: none is 0. */
  XSEG_EXPECT_TRUE(strstr(text, "\"glibc_threads_1_pairs_per_s\": 0,") ==
                   NULL);
  XSEG_EXPECT_TRUE(strstr(text, "\"pinned\": false") != NULL);
  XSEG_EXPECT_TRUE(strstr(text, "\"threads_2_shared_a_core\": ") != NULL);
  free(text);
}

/* --pin: every worker on a core of its own, so no two of them share one
   (sysfs says which CPUs are one core's; with fewer cores than workers
   they take turns on the same CPUs, which is no sharing of a core). */
XSEG_TEST(bench_micro, threads_pinned_to_cores_of_their_own) {
  const char *args[] = {"--only", "threads", "--pairs", "2000", "--pin"};
  char *text = micro_json(args, 5);
  XSEG_ASSERT_TRUE(text != NULL);
  XSEG_EXPECT_TRUE(strstr(text, "\"pinned\": true") != NULL);
  XSEG_EXPECT_TRUE(strstr(text, "\"threads_2_shared_a_core\": false") !=
                   NULL);
  XSEG_EXPECT_TRUE(strstr(text, "\"glibc_threads_2_shared_a_core\": false") !=
                   NULL);
  free(text);
}
