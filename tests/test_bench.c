/* The benchmark tool's tests: the trace reader (plain and gzip, and every
   kind of malformed line), exact-mode replay of a small hand-computed trace,
   the JSON report's syntax and contract fields (docs/DESIGN.md section 7), the
   snapshot reader and the SVG's segment map. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "bench.h"
#include "bench_helpers.h"
#include "cli.h"
#include "xseg_test.h"

static void check_small_trace(const xb_trace *t) {
  XSEG_EXPECT_EQ(t->n_events, 8);
  XSEG_EXPECT_EQ(t->n_allocs, 5);
  XSEG_EXPECT_EQ(t->n_frees, 3);
  XSEG_EXPECT_EQ(t->n_slots, 3);       /* at most three blocks live at once */
  XSEG_EXPECT_EQ(t->n_streams, 2);
  XSEG_EXPECT_EQ(t->peak_live_bytes, SMALL_PEAK);
  XSEG_EXPECT_EQ(t->peak_event, 4);
  XSEG_EXPECT_EQ(t->live_bytes, SMALL_END);
  /* The free carries its block's size and slot. */
  XSEG_EXPECT_EQ(t->events[3].action, XB_EV_FREE);
  XSEG_EXPECT_EQ(t->events[3].slot, t->events[0].slot);
  XSEG_EXPECT_EQ(t->events[3].size, 1000);
}

XSEG_TEST(bench, trace_loads_plain_and_gzip) {
  const char *suffix[2] = {".csv", ".csv.gz"};
  for (int gz = 0; gz < 2; gz++) {
    char path[256];
    XSEG_ASSERT_TRUE(temp_write(path, sizeof path, suffix[gz], small_trace,
                                gz == 1));
    xb_trace t;
    xb_error err;
    bool ok = xb_trace_load(path, &t, &err);
    unlink(path);
    if (!ok) XSEG_FAIL("%s", err.text);
    XSEG_ASSERT_TRUE(ok);
    check_small_trace(&t);
    xb_trace_release(&t);
  }
}

/* Replays the small trace in exact mode; *r must be released. */
static bool replay_small_exact(xb_env *env, xb_result *r) {
  xb_trace t;
  if (!load_small_trace(&t)) return false;
  xb_error err;
  xb_replay_opts o = {.conf = NULL, .max_points = 16, .snapshot = false};
  bool ok = xb_replay(env, &t, &xb_policy_exact, &o, r, &err);
  if (!ok) XSEG_FAIL("%s", err.text);
  xb_trace_release(&t);
  return ok;
}

XSEG_TEST(bench, exact_replay_matches_hand_computed_peaks) {
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  xb_result r;
  if (replay_small_exact(&env, &r)) {
    uint64_t g = env.vmm.granularity;
    /* At the peak: b (3000000 B), c (512 B) and a' (2 MiB) are live. */
    uint64_t granules = xb_round_up(3000000, g) + xb_round_up(512, g) +
                        xb_round_up(2097152, g);
    XSEG_EXPECT_EQ(r.peak_allocated, SMALL_PEAK);
    XSEG_EXPECT_EQ(r.peak_reserved, granules);
    if (g == 2 * MIB) XSEG_EXPECT_EQ(r.peak_reserved, 8 * MIB);
    XSEG_EXPECT_EQ(r.allocated_end, SMALL_END);
    XSEG_EXPECT_EQ(r.reserved_end, xb_round_up(2097152, g) +
                                       xb_round_up(4096, g));
    XSEG_EXPECT_EQ(r.ooms, 0);
    /* One reserve, create, map and set-access per allocation; one unmap,
       release and address free per free. */
    XSEG_EXPECT_EQ(r.calls[XS_DRIVER_FN_cuMemCreate], 5);
    XSEG_EXPECT_EQ(r.calls[XS_DRIVER_FN_cuMemAddressReserve], 5);
    XSEG_EXPECT_EQ(r.calls[XS_DRIVER_FN_cuMemUnmap], 3);
    XSEG_EXPECT_EQ(r.vmm_calls, 5 * 4 + 3 * 3);
    XSEG_EXPECT_TRUE(r.n_points > 0 && r.n_points <= 16);
    xb_result_release(&r);
  }
  xb_env_close(&env);
}

/* The caching modes see the same workload: the same peak allocated, no
   OOM, and every byte they map is at least what is live. The old names
   stay aliases of xseg's two modes. */
XSEG_TEST(bench, allocator_modes_replay_the_small_trace) {
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  xb_trace t;
  XSEG_ASSERT_TRUE(load_small_trace(&t));
  xb_error err;
  XSEG_EXPECT_TRUE(xb_policy_find("expandable") == xb_policy_find("xseg"));
  XSEG_EXPECT_TRUE(xb_policy_find("classic") ==
                   xb_policy_find("pytorch-native"));
  XSEG_EXPECT_TRUE(xb_policy_find("nosuch") == NULL);
  const char *modes[3] = {"xseg", "pytorch-native", "pytorch-expandable"};
  for (int i = 0; i < 3; i++) {
    const xb_policy *p = xb_policy_find(modes[i]);
    XSEG_ASSERT_TRUE(p != NULL);
    xb_replay_opts o = {.conf = NULL, .max_points = 8, .snapshot = false};
    xb_result r;
    if (!xb_replay(&env, &t, p, &o, &r, &err)) {
      XSEG_FAIL("%s: %s", modes[i], err.text);
      continue;
    }
    XSEG_EXPECT_EQ(r.peak_allocated, SMALL_PEAK);
    XSEG_EXPECT_GE(r.peak_reserved, SMALL_PEAK);
    XSEG_EXPECT_EQ(r.ooms, 0);
    XSEG_EXPECT_GT(r.vmm_calls, 0);
    xb_result_release(&r);
  }
  xb_trace_release(&t);
  xb_env_close(&env);
}

typedef struct bad_case {
  const char *line, *reason;
} bad_case;

/* Each bad line is line 3, after the header and one good row. */
static const bad_case bad_cases[] = {
    {"0,1.0,alloc,0x10,5,0", "bad action 'alloc'"},
    {"0,1.0,allocate,0xzz,5,0", "bad hex pointer '0xzz'"},
    {"0,1.0,allocate,0x10,5", "missing column"},
    {"0,1.0,allocate,0x10,-5,0", "negative size '-5'"},
    {"0,1.0,free,0x99,5,0", "free of unknown pointer 0x99"},
    {"0,1.0,allocate,0x10,5,0,9", "extra column"},
    {"0,1.0,allocate,0x1000,5,0", "live already"},
    /* Above xseg's largest request, 2^62: rounding could wrap to 0. */
    {"0,1.0,allocate,0x10,4611686018427387905,0",
     "size '4611686018427387905' out of range"},
    {"0,1.0,allocate,0x10,18446744073709551615,0",
     "size '18446744073709551615' out of range"},
};

static void check_bad_case(const bad_case *c) {
  char text[256], path[256];
  snprintf(text, sizeof text,
           "Thread,Time,Action,Pointer,Size,Stream\n"
           "0,0.0,allocate,0x1000,64,0\n%s\n0,2.0,free,0x1000,64,0\n",
           c->line);
  XSEG_ASSERT_TRUE(temp_write(path, sizeof path, ".csv", text, false));
  xb_trace t;
  xb_error err;
  bool ok = xb_trace_load(path, &t, &err);
  char where[300];
  snprintf(where, sizeof where, "%s:3: ", path);
  unlink(path);
  XSEG_EXPECT_FALSE(ok);
  if (ok) {
    xb_trace_release(&t);
    return;
  }
  if (strstr(err.text, where) == NULL || strstr(err.text, c->reason) == NULL)
    XSEG_FAIL("line '%s': got \"%s\", want \"%s\" and \"%s\"", c->line,
              err.text, where, c->reason);
}

XSEG_TEST(bench, malformed_lines_name_line_and_reason) {
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++)
    check_bad_case(&bad_cases[i]);
}

XSEG_TEST(bench, missing_header_and_missing_file_are_errors) {
  char path[256];
  XSEG_ASSERT_TRUE(temp_write(path, sizeof path, ".csv",
                              "0,0.0,allocate,0x10,5,0\n", false));
  xb_trace t;
  xb_error err;
  XSEG_EXPECT_FALSE(xb_trace_load(path, &t, &err));
  XSEG_EXPECT_TRUE(strstr(err.text, ":1: expected the header") != NULL);
  unlink(path);
  XSEG_EXPECT_FALSE(xb_trace_load(path, &t, &err));
  XSEG_EXPECT_TRUE(strstr(err.text, "cannot open") != NULL);
}

/* ---- a JSON syntax checker (RFC 8259), enough to validate the report --- */

static const char *json_value(const char *p, int depth);

static const char *json_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
  return p;
}

static const char *json_string(const char *p) {
  if (*p++ != '"') return NULL;
  for (; *p != '"'; p++) {
    if ((unsigned char)*p < 0x20) return NULL;
    if (*p == '\\' && strchr("\"\\/bfnrtu", *++p) == NULL) return NULL;
  }
  return p + 1;
}

static const char *json_number(const char *p) {
  const char *s = p;
  if (*p == '-') p++;
  if (*p < '0' || *p > '9') return NULL;
  p += strspn(p, "0123456789");
  if (*p == '.') {
    size_t n = strspn(++p, "0123456789");
    if (n == 0) return NULL;
    p += n;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    size_t n = strspn(p, "0123456789");
    if (n == 0) return NULL;
    p += n;
  }
  return p > s ? p : NULL;
}

/* Members of an object (`obj`) or elements of an array, after the bracket. */
static const char *json_items(const char *p, bool obj, int depth) {
  char close = obj ? '}' : ']';
  p = json_ws(p);
  if (*p == close) return p + 1;
  for (;;) {
    if (obj) {
      p = json_string(json_ws(p));
      if (p == NULL || *(p = json_ws(p)) != ':') return NULL;
      p++;
    }
    if ((p = json_value(p, depth + 1)) == NULL) return NULL;
    p = json_ws(p);
    if (*p == close) return p + 1;
    if (*p++ != ',') return NULL;
  }
}

static const char *json_value(const char *p, int depth) {
  if (depth > 64) return NULL;
  p = json_ws(p);
  if (*p == '{') return json_items(p + 1, true, depth);
  if (*p == '[') return json_items(p + 1, false, depth);
  if (*p == '"') return json_string(p);
  if (strncmp(p, "true", 4) == 0) return p + 4;
  if (strncmp(p, "false", 5) == 0) return p + 5;
  if (strncmp(p, "null", 4) == 0) return p + 4;
  return json_number(p);
}

static bool json_valid(const char *text) {
  const char *end = json_value(text, 0);
  return end != NULL && *json_ws(end) == '\0';
}

XSEG_TEST(bench, json_checker_rejects_bad_json) {
  XSEG_EXPECT_TRUE(json_valid("{\"a\": [1, 2.5e3, \"x\\n\", true, null]}"));
  XSEG_EXPECT_FALSE(json_valid("{\"a\": 1,}"));
  XSEG_EXPECT_FALSE(json_valid("{\"a\" 1}"));
  XSEG_EXPECT_FALSE(json_valid("[1 2]"));
  XSEG_EXPECT_FALSE(json_valid("{\"a\": nan}"));
}

static const char *const contract_fields[] = {
    "\"mode\": \"exact\"", "\"events\": 8", "\"peak_allocated_bytes\": 5097984",
    "\"peak_reserved_bytes\": ", "\"fragmentation\": ", "\"ooms\": 0",
    "\"driver_calls\": {", "\"cuMemCreate\": 5", "\"ns_per_op\": ",
    "\"reserved_end_bytes\": ", "\"malloc_ns\": {\"median\": ",
};

XSEG_TEST(bench, replay_json_parses_and_has_contract_fields) {
  char trace[256], json[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv.gz", small_trace,
                              true));
  XSEG_ASSERT_TRUE(temp_write(json, sizeof json, ".json", "", false));
  char *argv[] = {"replay", "--trace", trace, "--mode", "exact", "--json",
                  json, "--driver", (char *)test_driver(), NULL};
  int rc = xb_cmd_replay(9, argv);
  unlink(trace);
  char *text = file_read(json);
  unlink(json);
  XSEG_EXPECT_EQ(rc, 0);
  XSEG_ASSERT_TRUE(text != NULL);
  XSEG_EXPECT_TRUE(json_valid(text));
  /* One replay has the shape of many: a list of runs. */
  XSEG_EXPECT_TRUE(strncmp(text, "{\"runs\": [\n{", 12) == 0);
  for (size_t i = 0; i < sizeof contract_fields / sizeof *contract_fields; i++)
    if (strstr(text, contract_fields[i]) == NULL)
      XSEG_FAIL("JSON lacks %s:\n%s", contract_fields[i], text);
  free(text);
}

/* The default run over a folder of one trace: every built mode, a
   {"runs": [...]} JSON that parses, and an SVG document. */
XSEG_TEST(bench, default_run_writes_runs_json_and_svg) {
  const char *tmp = getenv("TMPDIR");
  char dir[256], trace[300], json[300], svg[300];
  snprintf(dir, sizeof dir, "%s/xseg_bench_XXXXXX",
           tmp != NULL && tmp[0] ? tmp : "/tmp");
  XSEG_ASSERT_TRUE(mkdtemp(dir) != NULL);
  snprintf(trace, sizeof trace, "%s/small.csv", dir);
  snprintf(json, sizeof json, "%s/out.json", dir);
  snprintf(svg, sizeof svg, "%s/out.svg", dir);
  FILE *f = fopen(trace, "w");
  XSEG_ASSERT_TRUE(f != NULL);
  fputs(small_trace, f);
  fclose(f);
  char *argv[] = {"xseg-bench", "--traces", dir, "--json", json, "--svg",
                  svg, "--driver", (char *)test_driver(), NULL};
  XSEG_EXPECT_EQ(xb_cmd_default(9, argv), 0);
  char *j = file_read(json), *s = file_read(svg);
  XSEG_EXPECT_TRUE(j != NULL && json_valid(j));
  XSEG_EXPECT_TRUE(j != NULL && strncmp(j, "{\"runs\": [", 10) == 0 &&
                   strstr(j, "\"mode\": \"exact\"") != NULL);
  XSEG_EXPECT_TRUE(j != NULL && strstr(j, "\"mode\": \"xseg\"") &&
                   strstr(j, "\"mode\": \"pytorch-native\"") &&
                   strstr(j, "\"mode\": \"pytorch-expandable\""));
  /* Each trace without and with the default lag (on the emulator, whose
     clock models it), never a host wait. */
  XSEG_EXPECT_TRUE(j != NULL && strstr(j, "\"gpu_lag_us\": 0,"));
  if (xt_have_sim())
    XSEG_EXPECT_TRUE(j != NULL && strstr(j, "\"gpu_lag_us\": 5000,"));
  XSEG_EXPECT_TRUE(j != NULL && strstr(j, "\"host_waits\": 0,") &&
                   !strstr(j, "\"host_waits\": 1"));
  XSEG_EXPECT_TRUE(s != NULL && strncmp(s, "<svg ", 5) == 0 &&
                   strstr(s, "</svg>") != NULL &&
                   strstr(s, "<polyline") != NULL);
  free(j);
  free(s);
  unlink(trace);
  unlink(json);
  unlink(svg);
  rmdir(dir);
}

/* ---- the snapshot reader and the segment map -------------------------- */

/* One expandable large reservation on the default stream: a 3 MiB run with
   a block of each state, 2 MiB unmapped, then a 2 MiB allocated run. */
static const char hand_snapshot[] =
    "{\"segments\": [\n"
    " {\"device\": 0, \"address\": 1048576, \"total_size\": 3145728,"
    "  \"stream\": 0, \"segment_type\": \"large\", \"segment_pool_id\": [0, 0],"
    "  \"is_expandable\": true, \"frames\": [], \"blocks\": ["
    "  {\"address\": 1048576, \"size\": 1048576, \"requested_size\": 1000000,"
    "   \"state\": \"active_allocated\", \"frames\": []},"
    "  {\"address\": 2097152, \"size\": 1048576, \"requested_size\": 1048576,"
    "   \"state\": \"active_pending_free\", \"frames\": []},"
    "  {\"address\": 3145728, \"size\": 1048576, \"requested_size\": 0,"
    "   \"state\": \"inactive\", \"frames\": []}]},\n"
    " {\"device\": 0, \"address\": 6291456, \"total_size\": 2097152,"
    "  \"stream\": 0, \"segment_type\": \"large\", \"is_expandable\": true,"
    "  \"blocks\": [{\"address\": 6291456, \"size\": 2097152,"
    "  \"requested_size\": 2097152, \"state\": \"active_allocated\"}]}],\n"
    "\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 1, \"size\": 2,"
    " \"stream\": 0, \"time_us\": -1.5e3, \"frames\": [null, true]}]]}\n";

XSEG_TEST(bench, snapshot_reader_reads_segments_and_blocks) {
  xb_snapshot s;
  xb_error err;
  XSEG_ASSERT_TRUE(xb_snapshot_read(hand_snapshot, &s, &err));
  XSEG_ASSERT_EQ(s.n_segments, 2);
  XSEG_EXPECT_EQ(s.segments[0].address, 1048576);
  XSEG_EXPECT_EQ(s.segments[0].total_size, 3 * MIB);
  XSEG_EXPECT_TRUE(s.segments[0].large && s.segments[0].expandable);
  XSEG_ASSERT_EQ(s.segments[0].n_blocks, 3);
  XSEG_EXPECT_EQ(s.segments[0].blocks[0].requested, 1000000);
  XSEG_EXPECT_EQ(s.segments[0].blocks[0].state, XB_BLOCK_ALLOCATED);
  XSEG_EXPECT_EQ(s.segments[0].blocks[1].state, XB_BLOCK_PENDING);
  XSEG_EXPECT_EQ(s.segments[0].blocks[2].state, XB_BLOCK_INACTIVE);
  XSEG_EXPECT_EQ(s.segments[1].blocks[0].size, 2 * MIB);
  xb_snapshot_release(&s);
  /* Malformed text and unknown states are errors with an offset. */
  XSEG_EXPECT_FALSE(xb_snapshot_read("{\"segments\": [}", &s, &err));
  XSEG_EXPECT_TRUE(strstr(err.text, "at offset") != NULL);
  XSEG_EXPECT_FALSE(xb_snapshot_read(
      "{\"segments\": [{\"blocks\": [{\"state\": \"gone\"}]}]}", &s, &err));
  XSEG_EXPECT_TRUE(strstr(err.text, "unknown block state") != NULL);
  XSEG_EXPECT_FALSE(xb_snapshot_read("{\"segments\": []} x", &s, &err));
}

/* The allocator's own snapshot at the small trace's peak (event 4): b, c
   and a' are live, with the sizes the trace asked for; the runs' blocks
   tile each run. */
XSEG_TEST(bench, snapshot_of_a_replay_reads_back) {
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  xb_trace t;
  XSEG_ASSERT_TRUE(load_small_trace(&t));
  xb_error err;
  xb_replay_opts o = {.conf = NULL, .max_points = 8, .snapshot = true};
  xb_result r;
  XSEG_ASSERT_TRUE(xb_replay(&env, &t, xb_policy_find("xseg"), &o, &r,
                             &err));
  XSEG_ASSERT_TRUE(r.snapshot != NULL);
  xb_snapshot s;
  XSEG_ASSERT_TRUE(xb_snapshot_read(r.snapshot, &s, &err));
  uint64_t requested = 0, live = 0;
  for (size_t i = 0; i < s.n_segments; i++) {
    const xb_snap_segment *g = &s.segments[i];
    uint64_t at = g->address;
    XSEG_EXPECT_TRUE(g->expandable);
    for (size_t k = 0; k < g->n_blocks; k++) {
      XSEG_EXPECT_EQ(g->blocks[k].address, at);
      at += g->blocks[k].size;
      if (g->blocks[k].state != XB_BLOCK_ALLOCATED) continue;
      live++;
      requested += g->blocks[k].requested;
    }
    XSEG_EXPECT_EQ(at, g->address + g->total_size);
  }
  XSEG_EXPECT_EQ(live, 3);
  XSEG_EXPECT_EQ(requested, 3000000 + 512 + 2097152);
  xb_snapshot_release(&s);
  xb_result_release(&r);
  xb_trace_release(&t);
  xb_env_close(&env);
}

/* The hand snapshot drawn: a rect per run of one state (two allocated,
   one pending, one free) over one unmapped background, labelled. */
XSEG_TEST(bench, svg_draws_the_segment_map_by_state) {
  char svg[256];
  XSEG_ASSERT_TRUE(temp_write(svg, sizeof svg, ".svg", "", false));
  xb_result r;
  memset(&r, 0, sizeof r);
  snprintf(r.trace, sizeof r.trace, "hand");
  snprintf(r.mode, sizeof r.mode, "xseg");
  r.peak_allocated = r.peak_reserved = 5 * MIB;
  r.events = 1;
  r.snapshot = (char *)hand_snapshot;
  xb_error err;
  XSEG_ASSERT_TRUE(xb_svg_write(svg, &r, 1, &err));
  char *s = file_read(svg);
  unlink(svg);
  XSEG_ASSERT_TRUE(s != NULL);
  XSEG_EXPECT_TRUE(strstr(s, "segment map at the allocated peak") != NULL);
  XSEG_EXPECT_EQ(count_of(s, "class=\"seg-allocated\""), 2);
  XSEG_EXPECT_EQ(count_of(s, "class=\"seg-pending\""), 1);
  XSEG_EXPECT_EQ(count_of(s, "class=\"seg-inactive\""), 1);
  XSEG_EXPECT_EQ(count_of(s, "class=\"seg-unmapped\""), 1);
  XSEG_EXPECT_TRUE(strstr(s, "pending free (active_pending_free)") != NULL);
  XSEG_EXPECT_TRUE(strstr(s, "reserved, unmapped") != NULL);
  XSEG_EXPECT_TRUE(strstr(s, "large, default: 5.0 MiB mapped over 7.0 MiB") !=
                   NULL);
  free(s);
}

/* A real replay's SVG carries each allocator mode's map; exact's has none. */
XSEG_TEST(bench, replay_svg_has_a_map_per_allocator_mode) {
  char trace[256], svg[256];
  XSEG_ASSERT_TRUE(temp_write(trace, sizeof trace, ".csv", small_trace,
                              false));
  XSEG_ASSERT_TRUE(temp_write(svg, sizeof svg, ".svg", "", false));
  char *argv[] = {"replay", "--trace", trace, "--mode", "all", "--svg", svg,
                  "--driver", (char *)test_driver(), NULL};
  XSEG_EXPECT_EQ(xb_cmd_replay(9, argv), 0);
  unlink(trace);
  char *s = file_read(svg);
  unlink(svg);
  XSEG_ASSERT_TRUE(s != NULL);
  XSEG_EXPECT_EQ(count_of(s, "segment map at the allocated peak"), 1);
  /* Labels name the mode and the lag (the default run has two lags). */
  XSEG_EXPECT_TRUE(strstr(s, "font-weight=\"bold\">xseg, lag 0 us</text>") &&
                   strstr(s, "font-weight=\"bold\">pytorch-native, lag 0 us"
                             "</text>"));
  XSEG_EXPECT_TRUE(strstr(s, ">xseg, lag 0 us: reserved ") != NULL);
  XSEG_EXPECT_TRUE(strstr(s, ">pytorch-expandable, lag 0 us: reserved ") !=
                   NULL);
  XSEG_EXPECT_FALSE(strstr(s, "font-weight=\"bold\">exact"));
  XSEG_EXPECT_GE(count_of(s, "class=\"seg-allocated\""), 2);
  XSEG_EXPECT_TRUE(strstr(s, "mapped in 1 segment") != NULL ||
                   strstr(s, "segments</text>") != NULL);
  free(s);
}
