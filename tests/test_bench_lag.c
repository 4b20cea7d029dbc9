/* The benchmark tool's tests, continued from test_bench.c: replays with
   the device behind the host (--gpu-lag) and the traces varbatch writes,
   and the command line as a user meets it (legend, progress, errors). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_helpers.h"
#include "cli.h"
#include "xseg_test.h"

/* ---- device lag (--gpu-lag) and written traces ------------------------- */

/* Replays the small trace in exact mode at `lag_us` (its times are 0..7
   us); false (reported) on failure. */
static bool replay_small_exact_lag(xb_env *env, uint64_t lag_us,
                                   xb_result *r) {
  xb_trace t;
  if (!load_small_trace(&t)) return false;
  xb_error err;
  xb_replay_opts o = {.max_points = 16, .gpu_lag_us = lag_us};
  bool ok = xb_replay(env, &t, &xb_policy_exact, &o, r, &err);
  if (!ok) XSEG_FAIL("%s", err.text);
  xb_trace_release(&t);
  return ok;
}

/* Lag 0 is the replay as it was: no use of the blocks on the streams, no
   events, the hand-computed peak. Under lag a freed block stays mapped
   until the work queued before its free has run: with 2 us, a (freed at 3)
   is still mapped when a' is allocated at 4 (and c, freed at 7, is not
   released before the end); with 1000 us nothing is released during the
   trace. No run waits on the host. */
XSEG_TEST(bench, exact_mode_under_lag_releases_behind_the_clock) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  uint64_t g = env.vmm.granularity;
  uint64_t a = xb_round_up(1000, g), b = xb_round_up(3000000, g),
           c = xb_round_up(512, g), a2 = xb_round_up(2097152, g),
           d = xb_round_up(4096, g);
  const struct {
    uint64_t lag, peak_reserved, released;
  } cases[] = {{0, b + c + a2, 3},
               {2, a + b + c + a2, 2},
               {1000, a + b + c + a2 + d, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    xb_result r;
    if (!replay_small_exact_lag(&env, cases[i].lag, &r)) continue;
    XSEG_EXPECT_EQ(r.gpu_lag_us, cases[i].lag);
    XSEG_EXPECT_EQ(r.peak_allocated, SMALL_PEAK);
    XSEG_EXPECT_EQ(r.peak_reserved, cases[i].peak_reserved);
    XSEG_EXPECT_EQ(r.host_waits, 0);
    XSEG_EXPECT_EQ(r.vmm_calls, 5 * 4 + cases[i].released * 3);
    XSEG_EXPECT_EQ(xsim_call_count("cuMemsetD8Async"),
                   cases[i].lag ? 5 + 3 : 0);
    XSEG_EXPECT_EQ(r.calls[XS_DRIVER_FN_cuEventRecord], cases[i].lag ? 3 : 0);
    xb_result_release(&r);
  }
  xb_env_close(&env);
}

/* The event exact mode records at a free is not ready until the clock
   passes the free's time plus the lag, and the block stays mapped until
   then; the first call after that releases it. */
XSEG_TEST(bench, freed_block_waits_for_the_clock) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  CUstream s = NULL;
  XSEG_ASSERT_OK(xb_env_stream_create(&env, &s));
  XSEG_ASSERT_TRUE(xb_env_clock_start(&env, 1000 * 1000));
  env.gpu_lag_us = 1000;
  void *self = NULL, *p = NULL, *none = NULL;
  XSEG_ASSERT_OK(xb_policy_exact.open(&env, NULL, 2, &self));
  xb_usage u;
  XSEG_EXPECT_OK(xb_policy_exact.malloc(self, 0, 4096, s, &p));
  XSEG_EXPECT_CU(env.memset_async((CUdeviceptr)(uintptr_t)p, 1, 1, s));
  xb_env_clock_advance(&env, 10 * 1000);
  XSEG_EXPECT_OK(xb_policy_exact.free(self, 0, p));
  xb_policy_exact.usage(self, &u);
  XSEG_EXPECT_EQ(u.reserved, env.vmm.granularity);   /* still mapped */
  xb_env_clock_advance(&env, 1009 * 1000);
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_OK(xb_policy_exact.malloc(self, 1, 0, s, &none));   /* polls */
  xb_policy_exact.usage(self, &u);
  XSEG_EXPECT_EQ(u.reserved, env.vmm.granularity);
  xb_env_clock_advance(&env, 1010 * 1000);
  XSEG_EXPECT_CU(cuStreamQuery(s));
  XSEG_EXPECT_OK(xb_policy_exact.malloc(self, 1, 0, s, &none));
  xb_policy_exact.usage(self, &u);
  XSEG_EXPECT_EQ(u.reserved, 0);
  XSEG_EXPECT_EQ(xb_env_host_waits(&env), 0);
  xb_policy_exact.close(self);
  xb_env_clock_stop(&env);
  xb_env_stream_destroy(&env, s);
  xb_env_close(&env);
}

/* A small varbatch server on 2 streams, its events 20 us apart. */
static bool small_varbatch(xb_trace *t, const char *write_to) {
  char *argv[] = {"varbatch", "--layers", "2", "--hidden", "256",
                  "--requests", "8", "--streams", "2", "--decode-steps", "2",
                  "--mode", "exact", "--driver", (char *)test_driver(),
                  "--write-trace", (char *)write_to, NULL};
  if (xb_cmd_varbatch(17, argv) != 0) return XSEG_FAIL("varbatch failed");
  xb_error err;
  if (xb_trace_load(write_to, t, &err)) return true;
  return XSEG_FAIL("%s", err.text);
}

/* What varbatch writes reads back as the same workload: two created
   streams with their real ids, times 20 us apart, and the same peak
   allocated bytes when replayed. */
XSEG_TEST(bench, varbatch_written_trace_round_trips) {
  char path[256];
  XSEG_ASSERT_TRUE(temp_write(path, sizeof path, ".csv.gz", "", false));
  xb_trace t;
  bool loaded = small_varbatch(&t, path);
  gzFile gz = gzopen(path, "rb");
  char head[64] = "";
  if (gz != NULL) gzgets(gz, head, sizeof head);
  if (gz != NULL) gzclose(gz);
  unlink(path);
  XSEG_ASSERT_TRUE(loaded);
  XSEG_EXPECT_TRUE(strncmp(head, "Thread,Time,Action,Pointer,Size,Stream",
                           38) == 0);
  XSEG_EXPECT_EQ(t.n_streams, 2);
  XSEG_EXPECT_EQ(t.stream_ids[0], 1);
  XSEG_EXPECT_EQ(t.stream_ids[1], 2);
  XSEG_EXPECT_EQ(t.events[1].time_ns - t.events[0].time_ns, 20000);
  /* The same workload built in memory (the bench's own builder). */
  char *argv[] = {"varbatch", "--layers", "2", "--hidden", "256",
                  "--requests", "8", "--streams", "2", "--decode-steps", "2",
                  "--mode", "exact", "--driver", (char *)test_driver(),
                  "--json", NULL, NULL};
  char json[256];
  XSEG_ASSERT_TRUE(temp_write(json, sizeof json, ".json", "", false));
  argv[16] = json;
  XSEG_EXPECT_EQ(xb_cmd_varbatch(17, argv), 0);
  char *text = file_read(json);
  unlink(json);
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  xb_error err;
  xb_result r;
  xb_replay_opts o = {.max_points = 0};
  if (xb_replay(&env, &t, &xb_policy_exact, &o, &r, &err)) {
    char want[64];
    snprintf(want, sizeof want, "\"peak_allocated_bytes\": %llu,",
             (unsigned long long)r.peak_allocated);
    XSEG_EXPECT_TRUE(text != NULL && strstr(text, want) != NULL);
    XSEG_EXPECT_EQ(r.peak_allocated, t.peak_live_bytes);
    xb_result_release(&r);
  } else {
    XSEG_FAIL("%s", err.text);
  }
  free(text);
  xb_trace_release(&t);
  xb_env_close(&env);
}

/* Under --gpu-lag the virtual clock, not thread scheduling, decides what
   has completed: two replays of a multi-stream workload give the same
   numbers, driver call for driver call, in every mode. */
XSEG_TEST(bench, gpu_lag_replays_are_deterministic) {
  XT_REQUIRE_SIM_FOR("runs on the emulator's virtual clock");
  char path[256];
  XSEG_ASSERT_TRUE(temp_write(path, sizeof path, ".csv", "", false));
  xb_trace t;
  bool loaded = small_varbatch(&t, path);
  unlink(path);
  XSEG_ASSERT_TRUE(loaded);
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  for (size_t m = 0; m < XB_N_MODES; m++) {
    const xb_policy *p = xb_policy_find(xb_modes[m]);
    xb_replay_opts o = {.max_points = 0, .gpu_lag_us = 500};
    xb_result r[2];
    xb_error err;
    bool ok = xb_replay(&env, &t, p, &o, &r[0], &err) &&
              xb_replay(&env, &t, p, &o, &r[1], &err);
    if (!ok) {
      XSEG_FAIL("%s: %s", xb_modes[m], err.text);
      continue;
    }
    XSEG_EXPECT_EQ(r[0].peak_reserved, r[1].peak_reserved);
    XSEG_EXPECT_EQ(r[0].reserved_end, r[1].reserved_end);
    XSEG_EXPECT_EQ(r[0].host_waits, 0);
    for (int f = 0; f < XS_DRIVER_FN_COUNT; f++)
      if (r[0].calls[f] != r[1].calls[f])
        XSEG_FAIL("%s: %s called %llu then %llu times", xb_modes[m],
                  xs_driver_fn_name((xs_driver_fn)f),
                  (unsigned long long)r[0].calls[f],
                  (unsigned long long)r[1].calls[f]);
    xb_result_release(&r[0]);
    xb_result_release(&r[1]);
  }
  xb_trace_release(&t);
  xb_env_close(&env);
}

/* ---- the command line as a user meets it ------------------------------- */

/* A replay prints a legend after its table and a line of progress per
   replay on stderr, also when stderr is not a terminal (as here); --quiet
   prints neither. */
XSEG_TEST(bench_cli, legend_after_the_table_and_progress_per_replay) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", small_trace,
                              false));
  char *argv[] = {"replay", "--trace", trace, "--mode", "all", "--driver",
                  (char *)test_driver(), "--quiet", NULL};
  captured loud = run_captured(xb_cmd_replay, 7, argv);
  captured quiet = run_captured(xb_cmd_replay, 8, argv);
  unlink(trace);
  XSEG_ASSERT_TRUE(loud.out != NULL && loud.err != NULL);
  XSEG_ASSERT_TRUE(quiet.out != NULL && quiet.err != NULL);
  XSEG_EXPECT_EQ(loud.rc, 0);
  XSEG_EXPECT_EQ(quiet.rc, 0);
  const char *table = strstr(loud.out, "4 replays in ");
  const char *legend = strstr(loud.out, "frag           peak reserved / peak");
  XSEG_EXPECT_TRUE(table != NULL && legend != NULL && legend > table);
  XSEG_EXPECT_TRUE(strstr(loud.out, "median host time") != NULL);
  XSEG_EXPECT_EQ(count_of(loud.err, "\n"), XB_N_MODES);
  XSEG_EXPECT_TRUE(strncmp(loud.err, "[1/4] xseg_bench_", 17) == 0);
  XSEG_EXPECT_TRUE(strstr(loud.err, ", xseg, lag 0 us\n[2/4] ") != NULL);
  XSEG_EXPECT_TRUE(strstr(loud.err, ", exact, lag 0 us\n") != NULL);
  XSEG_EXPECT_TRUE(strstr(quiet.out, "4 replays in ") != NULL);
  XSEG_EXPECT_TRUE(strstr(quiet.out, "peak reserved / peak") == NULL);
  XSEG_EXPECT_STREQ(quiet.err, "");
  captured_release(&loud);
  captured_release(&quiet);
}

/* --json that cannot be written fails before the first replay. */
XSEG_TEST(bench_cli, unwritable_json_fails_before_the_run) {
  char trace[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", small_trace,
                              false));
  char *argv[] = {"replay", "--trace", trace, "--json",
                  "/nonexistent-dir/out.json", "--driver",
                  (char *)test_driver(), NULL};
  captured c = run_captured(xb_cmd_replay, 7, argv);
  unlink(trace);
  XSEG_ASSERT_TRUE(c.out != NULL && c.err != NULL);
  XSEG_EXPECT_EQ(c.rc, 1);
  XSEG_EXPECT_TRUE(strstr(c.err, "--json /nonexistent-dir/out.json: No such "
                                 "file or directory") != NULL);
  XSEG_EXPECT_TRUE(strstr(c.err, "[1/") == NULL);
  XSEG_EXPECT_TRUE(strstr(c.out, "peak alloc") == NULL);
  captured_release(&c);
}

/* micro's --json that cannot be written fails before the first round
   too: nothing runs, nothing is printed. */
XSEG_TEST(bench_cli, micro_unwritable_json_fails_before_the_run) {
  char *argv[] = {"micro", "--only", "cached-repeat", "--pairs", "1000",
                  "--rounds", "1", "--json", "/nonexistent-dir/out.json",
                  "--driver", (char *)test_driver(), NULL};
  captured c = run_captured(xb_cmd_micro, 11, argv);
  XSEG_ASSERT_TRUE(c.out != NULL && c.err != NULL);
  XSEG_EXPECT_EQ(c.rc, 1);
  XSEG_EXPECT_TRUE(strstr(c.err, "--json /nonexistent-dir/out.json: No such "
                                 "file or directory") != NULL);
  XSEG_EXPECT_STREQ(c.out, "");
  captured_release(&c);
}

/* Help lists what README documents; a bad value is named. */
XSEG_TEST(bench_cli, help_lists_options_and_errors_name_the_value) {
  char *help[] = {"replay", "--help", NULL};
  captured h = run_captured(xb_cmd_replay, 2, help);
  XSEG_ASSERT_TRUE(h.out != NULL);
  XSEG_EXPECT_EQ(h.rc, 0);
  const char *want[] = {"--gpu-lag US", "--json OUT", "{\"runs\": [",
                        "--quiet", "pytorch-expandable", "--points N"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    if (strstr(h.out, want[i]) == NULL)
      XSEG_FAIL("replay --help lacks %s:\n%s", want[i], h.out);
  captured_release(&h);
  char *micro[] = {"micro", "--only", "nosuch", NULL};
  captured m = run_captured(xb_cmd_micro, 3, micro);
  XSEG_ASSERT_TRUE(m.err != NULL);
  XSEG_EXPECT_EQ(m.rc, 2);
  XSEG_EXPECT_TRUE(strstr(m.err, "--only 'nosuch'") != NULL);
  captured_release(&m);
  char *mode[] = {"replay", "--trace", "x.csv", "--mode", "nosuch", NULL};
  captured r = run_captured(xb_cmd_replay, 5, mode);
  XSEG_ASSERT_TRUE(r.err != NULL);
  XSEG_EXPECT_EQ(r.rc, 2);
  XSEG_EXPECT_TRUE(strstr(r.err, "unknown mode 'nosuch'") != NULL);
  captured_release(&r);
}
