/* The bench's command line refusing what it cannot do well: values whose
   sizes would wrap, options a command would ignore, --json paths that would
   destroy a trace or an earlier result. Each case names the option in its
   message and runs nothing. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_helpers.h"
#include "cli.h"
#include "micro.h"
#include "xseg_test.h"

/* `cmd` run with a NULL-terminated argv, its output captured. */
static captured run_argv(int (*cmd)(int, char **), char **argv) {
  int argc = 0;
  while (argv[argc] != NULL) argc++;
  return run_captured(cmd, argc, argv);
}

/* The command failed with exit code `rc` and said `why` on stderr. */
static void expect_refused(captured *c, int rc, const char *why) {
  XSEG_ASSERT_TRUE(c->out != NULL && c->err != NULL);
  XSEG_EXPECT_EQ(c->rc, rc);
  if (strstr(c->err, why) == NULL)
    XSEG_FAIL("stderr lacks \"%s\":\n%s", why, c->err);
  captured_release(c);
}

/* --points large enough that its samples' bytes wrap size_t is refused by
   name, before any replay. */
XSEG_TEST(bench_options, points_too_large_is_refused) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", small_trace,
                              false));
  char *argv[] = {"replay", "--trace", trace, "--points",
                  "2305843009213693952", "--driver", (char *)test_driver(),
                  NULL};
  captured c = run_argv(xb_cmd_replay, argv);
  unlink(trace);
  expect_refused(&c, 2, "--points 2305843009213693952 is out of range");
}

/* A replay called with such a bound directly samples what it can: one
   point per event at most. */
XSEG_TEST(bench_options, replay_samples_at_most_one_point_per_event) {
  xb_trace t;
  XSEG_ASSERT_TRUE(load_small_trace(&t));
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  xb_replay_opts o = {.max_points = SIZE_MAX / 8};
  xb_result r;
  xb_error err;
  bool ok = xb_replay(&env, &t, &xb_policy_exact, &o, &r, &err);
  if (!ok) XSEG_FAIL("%s", err.text);
  if (ok) XSEG_EXPECT_EQ(r.n_points, t.n_events);
  if (ok) xb_result_release(&r);
  xb_trace_release(&t);
  xb_env_close(&env);
}

/* strtoull skips leading white space and takes a sign: " -1" would be
   2^64 - 1. A whole number is digits only. */
XSEG_TEST(bench_options, whole_numbers_are_digits_only) {
  const char *bad[] = {" -1", "+5", " 5", "-1", "", "5 ", "0x10"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    uint64_t v = 7;
    XSEG_EXPECT_FALSE(xb_cli_u64("--points", bad[i], &v));
    XSEG_EXPECT_EQ(v, 7);
  }
  uint64_t v = 0;
  XSEG_EXPECT_TRUE(xb_cli_u64("--points", "18446744073709551615", &v));
  XSEG_EXPECT_EQ(v, UINT64_MAX);
  XSEG_EXPECT_FALSE(xb_cli_u64("--points", "18446744073709551616", &v));
}

/* --pairs whose arrays' bytes would wrap is refused by name before any
   round. */
XSEG_TEST(bench_options, micro_pairs_too_large_is_refused) {
  char *argv[] = {"micro", "--only", "cached-random", "--pairs",
                  "4611686018427387904", "--live-min", "1000", "--live-max",
                  "1000", "--rounds", "1", "--driver", (char *)test_driver(),
                  NULL};
  captured c = run_argv(xb_cmd_micro, argv);
  XSEG_ASSERT_TRUE(c.out != NULL);
  XSEG_EXPECT_STREQ(c.out, "");
  expect_refused(&c, 2, "--pairs 4611686018427387904 is out of range");
}
