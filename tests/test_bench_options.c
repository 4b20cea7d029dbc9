/* The bench's command line refusing what it cannot do well: values whose
   sizes would wrap, options a command would ignore, --json paths that would
   destroy a trace or an earlier result. Each case names the option in its
   message and runs nothing. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* ---- --json: nothing lost on failure ----------------------------------- */

/* A fresh temporary folder in `dir`; false (reported) when none. */
static bool temp_dir(char *dir, size_t size) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, size, "%s/xseg_bench_XXXXXX",
           tmp != NULL && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(dir) != NULL) return true;
  return XSEG_FAIL("cannot make a temporary folder");
}

static size_t dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  size_t n = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
    n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  if (d != NULL) closedir(d);
  return n;
}

/* Writes `text` to dir/name, its path in path[size]; false on failure. */
static bool file_put(const char *dir, const char *name, const char *text,
                     char *path, size_t size) {
  snprintf(path, size, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f == NULL) return false;
  bool ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}

/* A run that fails after --json was opened leaves the file as it was (an
   earlier run's results) and nothing beside it; one that succeeds writes
   it in place: a hard link to it sees the results (a temporary renamed
   over it left the link with the old contents and the file with another
   owner), and a folder that cannot be written is no bar to a file in it
   that can (root ignores the folder's mode: then only the file is seen). */
XSEG_TEST(bench_options, failed_run_keeps_the_earlier_json) {
  char dir[256], trace[300], bad[300], json[300];
  XSEG_ASSERT_TRUE(temp_dir(dir, sizeof dir));
  XSEG_ASSERT_TRUE(
      file_put(dir, "small.csv", small_trace, trace, sizeof trace) &&
      file_put(dir, "bad.csv",
               "Thread,Time,Action,Pointer,Size,Stream\n0,0,free,0x10,5,0\n",
               bad, sizeof bad) &&
      file_put(dir, "out.json", "earlier results", json, sizeof json));
  char link_path[300];
  snprintf(link_path, sizeof link_path, "%s/link.json", dir);
  XSEG_ASSERT_TRUE(link(json, link_path) == 0);
  char *argv[] = {"replay", "--trace", bad, "--mode", "exact", "--json",
                  json, "--driver", (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_replay, argv);
  char *kept = file_read(json);
  size_t entries = dir_entries(dir);
  argv[2] = trace;
  XSEG_ASSERT_TRUE(chmod(dir, 0555) == 0);
  captured ok = run_argv(xb_cmd_replay, argv);
  XSEG_ASSERT_TRUE(chmod(dir, 0755) == 0);
  char *written = file_read(link_path);
  XSEG_EXPECT_STREQ(kept, "earlier results");
  XSEG_EXPECT_EQ(entries, 4);
  XSEG_EXPECT_EQ(ok.rc, 0);
  XSEG_EXPECT_TRUE(written != NULL &&
                   strncmp(written, "{\"runs\": [", 10) == 0);
  XSEG_EXPECT_EQ(dir_entries(dir), 4);
  expect_refused(&c, 1, "free of unknown pointer 0x10");
  captured_release(&ok);
  free(kept);
  free(written);
  unlink(link_path);
  unlink(trace);
  unlink(bad);
  unlink(json);
  rmdir(dir);
}

/* micro's --json too: a failed run (here a device too small for the
   growth case) keeps the earlier file. */
XSEG_TEST(bench_options, failed_micro_keeps_the_earlier_json) {
  XT_REQUIRE_SIM_FOR("shrinks the emulated device");
  char dir[256], json[300];
  XSEG_ASSERT_TRUE(temp_dir(dir, sizeof dir));
  snprintf(json, sizeof json, "%s/out.json", dir);
  FILE *f = fopen(json, "w");
  XSEG_ASSERT_TRUE(f != NULL);
  fputs("earlier results", f);
  fclose(f);
  char *argv[] = {"micro", "--only", "growth", "--device-memory", "64M",
                  "--json", json, "--driver", (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_micro, argv);
  char *kept = file_read(json);
  XSEG_EXPECT_STREQ(kept, "earlier results");
  XSEG_EXPECT_EQ(dir_entries(dir), 1);
  XSEG_EXPECT_EQ(c.rc, 1);
  captured_release(&c);
  free(kept);
  unlink(json);
  rmdir(dir);
}

/* --layers whose arrays' counts would wrap is refused by name, before
   anything is built. */
XSEG_TEST(bench_options, varbatch_layers_too_many_is_refused) {
  char *argv[] = {"varbatch", "--layers", "9223372036854775808", "--driver",
                  (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_varbatch, argv);
  expect_refused(&c, 2, "--layers (at most 4294967295)");
}

/* A cached row whose allocations fail names itself and xseg's message,
   once (no line about the cached path as a whole that could repeat an
   older message). */
XSEG_TEST(bench_options, failed_cached_row_names_itself) {
  XT_REQUIRE_SIM_FOR("shrinks the emulated device");
  char *argv[] = {"micro", "--only", "cached-mixed", "--mixed-live", "3000",
                  "--pairs", "100", "--rounds", "1", "--device-memory", "64M",
                  "--driver", (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_micro, argv);
  XSEG_ASSERT_TRUE(c.err != NULL);
  XSEG_EXPECT_EQ(c.rc, 1);
  if (strstr(c.err, "xseg-bench micro: cached-mixed failed: ") == NULL ||
      strstr(c.err, "out of memory") == NULL)
    XSEG_FAIL("stderr lacks the row and xseg's message:\n%s", c.err);
  XSEG_EXPECT_EQ(count_of(c.err, "xseg-bench micro:"), 1);
  captured_release(&c);
}

/* --json naming the trace being replayed (by another path too) is refused
   before anything is opened: the trace is left as it was. */
XSEG_TEST(bench_options, json_that_is_a_trace_is_refused) {
  char dir[256], trace[300], other[300];
  XSEG_ASSERT_TRUE(temp_dir(dir, sizeof dir));
  snprintf(trace, sizeof trace, "%s/victim.csv", dir);
  snprintf(other, sizeof other, "%s/../%s/victim.csv", dir,
           strrchr(dir, '/') + 1);
  FILE *f = fopen(trace, "w");
  XSEG_ASSERT_TRUE(f != NULL);
  fputs(small_trace, f);
  fclose(f);
  char *one[] = {"replay", "--trace", trace, "--json", other, "--driver",
                 (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_replay, one);
  char *kept = file_read(trace);
  XSEG_EXPECT_STREQ(kept, small_trace);
  free(kept);
  expect_refused(&c, 2, "is the trace");
  char *all[] = {"xseg-bench", "--traces", dir, "--json", trace, "--driver",
                 (char *)test_driver(), NULL};
  c = run_argv(xb_cmd_default, all);
  kept = file_read(trace);
  XSEG_EXPECT_STREQ(kept, small_trace);
  free(kept);
  expect_refused(&c, 2, "is the trace");
  unlink(trace);
  rmdir(dir);
}

/* --traces: a bad trace among good ones fails the run before the first
   replay, with its file:line, rather than after the replays before it. */
XSEG_TEST(bench_options, bad_trace_in_a_folder_fails_before_any_replay) {
  char dir[256], good[300], bad[300];
  XSEG_ASSERT_TRUE(temp_dir(dir, sizeof dir));
  snprintf(good, sizeof good, "%s/a_good.csv", dir);
  snprintf(bad, sizeof bad, "%s/b_bad.csv", dir);
  FILE *f = fopen(good, "w"), *g = fopen(bad, "w");
  XSEG_ASSERT_TRUE(f != NULL && g != NULL);
  fputs(small_trace, f);
  fputs("Thread,Time,Action,Pointer,Size,Stream\n0,0,allocate,0x10,5,0\n"
        "0,1,free,0x10,5,0\n0,2,free,0x10,5,0\n", g);
  fclose(f);
  fclose(g);
  char *argv[] = {"xseg-bench", "--traces", dir, "--mode", "exact",
                  "--driver", (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_default, argv);
  XSEG_ASSERT_TRUE(c.err != NULL);
  XSEG_EXPECT_TRUE(strstr(c.err, "[1/") == NULL);
  expect_refused(&c, 1, "b_bad.csv:4: free of unknown pointer 0x10");
  unlink(good);
  unlink(bad);
  rmdir(dir);
}

/* A lag whose nanoseconds wrap is out of range, whatever the driver: not
   a driver without a virtual clock. */
XSEG_TEST(bench_options, gpu_lag_too_large_is_out_of_range) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", small_trace,
                              false));
  char *argv[] = {"replay", "--trace", trace, "--mode", "exact",
                  "--gpu-lag", "18446744073709552", "--driver",
                  (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_replay, argv);
  unlink(trace);
  XSEG_ASSERT_TRUE(c.err != NULL);
  XSEG_EXPECT_TRUE(strstr(c.err, "virtual clock") == NULL);
  expect_refused(&c, 1, "--gpu-lag 18446744073709552 is out of range");
}

/* varbatch run with argv is refused (exit 2, naming `needle`), and the
   file at `trace`, which holds "kept", is untouched. */
static void expect_varbatch_refused_keeping(char **argv, const char *trace,
                                            const char *needle) {
  captured c = run_argv(xb_cmd_varbatch, argv);
  char *kept = file_read(trace);
  XSEG_EXPECT_STREQ(kept, "kept");
  free(kept);
  expect_refused(&c, 2, needle);
}

/* varbatch: sizes that would wrap (or pass 2^62) are refused, naming the
   options that make them, before anything is built or written. */
XSEG_TEST(bench_options, varbatch_sizes_too_large_are_refused) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", "kept", false));
  char *wide[] = {"varbatch", "--hidden", "4294967296", "--layers", "1",
                  "--requests", "1", "--decode-steps", "0", "--batch", "1:1",
                  "--seq", "1:1", "--mode", "exact", "--write-trace", trace,
                  "--driver", (char *)test_driver(), NULL};
  expect_varbatch_refused_keeping(wide, trace, "--hidden");
  char *long_seq[] = {"varbatch", "--hidden", "64", "--requests", "1",
                      "--batch", "1:65536", "--seq", "1:4294967296",
                      "--mode", "exact", "--driver", (char *)test_driver(),
                      NULL};
  captured c = run_argv(xb_cmd_varbatch, long_seq);
  expect_refused(&c, 2, "--batch, --heads and --seq");
  char *decode[] = {"varbatch", "--requests", "1", "--decode-steps",
                    "18446744073709551615", "--mode", "exact", "--driver",
                    (char *)test_driver(), NULL};
  c = run_argv(xb_cmd_varbatch, decode);
  expect_refused(&c, 2, "--decode-steps");
  unlink(trace);
}

/* varbatch --write-trace F --json F: the results would replace the trace
   just written; refused before anything is written. */
XSEG_TEST(bench_options, varbatch_trace_and_json_in_one_file_are_refused) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", "kept", false));
  char *same[] = {"varbatch", "--requests", "1", "--decode-steps", "0",
                  "--mode", "exact", "--write-trace", trace, "--json", trace,
                  "--driver", (char *)test_driver(), NULL};
  expect_varbatch_refused_keeping(same, trace, "same file");
  unlink(trace);
}

/* ---- options a mode or a command would ignore ------------------------- */

/* A --conf that turns expandable_segments against the mode would print
   the other mode's numbers under this one's name: refused, naming the key
   and the mode that runs it. Setting it the mode's own way is fine. */
XSEG_TEST(bench_options, conf_against_the_mode_is_refused) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", small_trace,
                              false));
  const struct {
    const char *mode, *conf, *why;
    int rc;
  } cases[] = {
      {"xseg", "expandable_segments:False", "--mode pytorch-native", 1},
      {"pytorch-native", "expandable_segments:True", "--mode xseg", 1},
      {"xseg", "expandable_segments:True", "", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *argv[] = {"replay", "--trace", trace, "--mode",
                    (char *)cases[i].mode, "--conf", (char *)cases[i].conf,
                    "--quiet", "--driver", (char *)test_driver(), NULL};
    captured c = run_argv(xb_cmd_replay, argv);
    XSEG_ASSERT_TRUE(c.err != NULL);
    XSEG_EXPECT_TRUE(cases[i].rc == 0 || strstr(c.err, cases[i].conf));
    expect_refused(&c, cases[i].rc, cases[i].why);
  }
  unlink(trace);
}

/* cached-random's live sets run from --live-min up to --live-max: a
   minimum above the maximum would run none and exit 0 with no rows. */
XSEG_TEST(bench_options, micro_live_min_above_live_max_is_refused) {
  char *argv[] = {"micro", "--only", "cached-random", "--live-min", "5000",
                  "--live-max", "1000", "--pairs", "100", "--rounds", "1",
                  "--driver", (char *)test_driver(), NULL};
  captured c = run_argv(xb_cmd_micro, argv);
  expect_refused(&c, 2, "--live-min 5000 is above --live-max 1000");
}

/* Each command refuses the shared options it would ignore, naming the
   option and the command, before it runs anything. */
XSEG_TEST(bench_options, options_a_command_ignores_are_refused) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", small_trace,
                              false));
  char *drv = (char *)test_driver();
  char *dflt[] = {"xseg-bench", "--traces", "/nonexistent-dir", "--trace",
                  trace, "--driver", drv, NULL};
  captured c = run_argv(xb_cmd_default, dflt);
  expect_refused(&c, 2, "--trace does not apply to the default run");
  char *replay[] = {"replay", "--trace", trace, "--traces", "/tmp",
                    "--driver", drv, NULL};
  c = run_argv(xb_cmd_replay, replay);
  expect_refused(&c, 2, "--traces does not apply to replay");
  char *varbatch[] = {"varbatch", "--requests", "1", "--trace", trace,
                      "--driver", drv, NULL};
  c = run_argv(xb_cmd_varbatch, varbatch);
  expect_refused(&c, 2, "--trace does not apply to varbatch");
  const char *micro_ignores[][2] = {{"--svg", "x.svg"}, {"--points", "9"},
                                    {"--trace", trace}, {"--traces", "/tmp"},
                                    {"--gpu-lag", "5"}};
  for (size_t i = 0; i < 5; i++) {
    char *micro[] = {"micro", "--only", "cached-repeat", "--pairs", "10",
                     "--rounds", "1", (char *)micro_ignores[i][0],
                     (char *)micro_ignores[i][1], "--driver", drv, NULL};
    char why[64];
    snprintf(why, sizeof why, "%s does not apply to micro",
             micro_ignores[i][0]);
    c = run_argv(xb_cmd_micro, micro);
    XSEG_ASSERT_TRUE(c.out != NULL);
    XSEG_EXPECT_STREQ(c.out, "");
    expect_refused(&c, 2, why);
  }
  unlink(trace);
}
