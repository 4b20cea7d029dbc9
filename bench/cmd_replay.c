/* cmd_replay.c: `xseg-bench replay` (one trace) and the default run (every
 * bundled trace in every mode, without and with device lag, one table).
 *
 * Every trace is loaded (and so checked) before the first replay, then
 * replayed by each mode at each lag in turn, on a fresh policy instance
 * with the driver counters reset, so rows are independent.
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#ifndef XB_TRACE_DIR
#define XB_TRACE_DIR "bench/traces"
#endif

static void print_intro(FILE *out, xb_env *env) {
  char mem[32];
  fprintf(out, "driver: %s (%s), granularity %s\n", env->driver,
          xb_env_is_sim(env) ? "emulator" : "no emulator control",
          xb_format_bytes(env->vmm.granularity, mem, sizeof mem));
}

/* "[k/n] trace, mode, lag N us" on stderr before each replay, one line
   each (a redirected run shows its progress too), unless --quiet. */
static void progress(bool quiet, size_t k, size_t n, const char *trace,
                     const char *mode, uint64_t lag) {
  if (quiet) return;
  fprintf(stderr, "[%zu/%zu] %s, %s, lag %llu us\n", k, n, trace, mode,
          (unsigned long long)lag);
  fflush(stderr);
}

typedef struct xb_batch {
  xb_env env;
  const xb_policy *policies[XB_N_MODES];
  size_t n_policies;
  xb_replay_opts opts;
  uint64_t lags[2];                 /* replayed at each, in this order */
  size_t n_lags;
  xb_result *results;
  size_t n_results, cap_results;
  bool quiet;
  xb_json_out json;                 /* --json's file, opened first */
} xb_batch;

/* Replays one loaded trace in every policy of the batch at every lag. */
static bool batch_trace(xb_batch *b, const xb_trace *t, size_t *done,
                        size_t total) {
  for (size_t k = 0; k < b->n_policies * b->n_lags; k++) {
    const xb_policy *p = b->policies[k / b->n_lags];
    b->opts.gpu_lag_us = b->lags[k % b->n_lags];
    progress(b->quiet, ++*done, total, t->name, p->name, b->opts.gpu_lag_us);
    xb_error err;
    xb_result *r = &b->results[b->n_results];
    if (!xb_replay(&b->env, t, p, &b->opts, r, &err)) {
      fprintf(stderr, "xseg-bench: %s\n", err.text);
      return false;
    }
    b->n_results++;
  }
  return true;
}

static void traces_release(xb_trace *t, size_t n) {
  for (size_t i = 0; i < n; i++) xb_trace_release(&t[i]);
  free(t);
}

/* Loads the n trace files, every one before the first replay, so that a
   bad trace fails the run at once with its file:line rather than after
   the replays before it; false (printed) at the first that fails. */
static bool traces_load(char **paths, size_t n, xb_trace **out) {
  xb_trace *t = calloc(n ? n : 1, sizeof *t);
  if (t == NULL) {
    fprintf(stderr, "xseg-bench: out of host memory\n");
    return false;
  }
  xb_error err;
  size_t loaded = 0;
  while (loaded < n && xb_trace_load(paths[loaded], &t[loaded], &err))
    loaded++;
  if (loaded == n) return *out = t, true;
  fprintf(stderr, "xseg-bench: %s\n", err.text);
  traces_release(t, loaded);
  return false;
}

static void batch_release(xb_batch *b) {
  for (size_t i = 0; i < b->n_results; i++) xb_result_release(&b->results[i]);
  free(b->results);
  xb_cli_json_close(&b->json);
}

/* Chooses the policies and lags, opens the driver and sizes the results
   for n traces (and `extra` more rows); an exit code on failure (printed),
   else -1. With `compare`, every trace runs without lag and with c's lag
   (XB_DEFAULT_GPU_LAG_US unless given; on a driver without the emulator's
   clock, whose device lags for real, without lag only unless given); else
   at c's lag only. */
static int batch_open(xb_batch *b, const xb_cli *c, size_t n, bool compare,
                      size_t extra) {
  /* extra: built workloads replayed after the n trace files */
  b->opts = (xb_replay_opts){.conf = c->conf, .max_points = c->points,
                             .snapshot = c->svg != NULL};
  b->quiet = c->quiet;
  b->n_policies = xb_cli_policies(c->mode, b->policies);
  if (b->n_policies == 0) return 2;
  if (!xb_cli_json_open(c, &b->json)) return 1;
  if (!xb_cli_env_open(c, &b->env)) {
    xb_cli_json_close(&b->json);
    return 1;
  }
  b->n_lags = 1;
  b->lags[0] = c->gpu_lag_us;
  if (compare) {
    b->lags[0] = 0;
    b->lags[1] = c->gpu_lag_set ? c->gpu_lag_us : XB_DEFAULT_GPU_LAG_US;
    bool clock = b->env.sim_clock_enable != NULL || c->gpu_lag_set;
    b->n_lags = b->lags[1] > 0 && clock ? 2 : 1;
  }
  print_intro(xb_cli_table_out(c), &b->env);
  b->cap_results = (n + extra) * b->n_policies * b->n_lags;
  b->results = calloc(b->cap_results ? b->cap_results : 1, sizeof *b->results);
  if (b->results != NULL) return -1;
  fprintf(stderr, "xseg-bench: out of host memory\n");
  xb_cli_json_close(&b->json);
  xb_env_close(&b->env);
  return 1;
}

static bool batch_report(xb_batch *b, const xb_cli *c, uint64_t t0) {
  if (b->n_results == 0) return true;
  FILE *out = xb_cli_table_out(c);
  xb_report_table_header(out);
  for (size_t i = 0; i < b->n_results; i++)
    xb_report_table_row(out, &b->results[i]);
  fprintf(out, "%zu replay%s in %.1f s\n", b->n_results,
          b->n_results == 1 ? "" : "s", (double)(xb_now_ns() - t0) * 1e-9);
  if (!c->quiet) {
    fputc('\n', out);
    xb_report_legend(out);
  }
  return xb_cli_outputs(c, &b->json, b->results, b->n_results);
}

/* The default run's synthetic rows: varbatch's server at these stream
   counts. */
static const uint64_t xb_default_varbatch[] = {1, 2, 4};
enum { XB_N_DEFAULT_VARBATCH = 3 };

static bool batch_varbatch(xb_batch *b, size_t *done, size_t total) {
  bool ok = true;
  for (size_t i = 0; ok && i < XB_N_DEFAULT_VARBATCH; i++) {
    xb_trace t;
    xb_error err;
    ok = xb_varbatch_default_trace(xb_default_varbatch[i], &t, &err);
    if (!ok) fprintf(stderr, "xseg-bench: varbatch: %s\n", err.text);
    ok = ok && batch_trace(b, &t, done, total);
    xb_trace_release(&t);
  }
  return ok;
}

/* How a batch runs its workloads. */
typedef enum xb_batch_kind {
  XB_BATCH_ONE,                     /* at --gpu-lag only */
  XB_BATCH_COMPARE,                 /* without and with lag */
  XB_BATCH_DEFAULT                  /* compare, plus the varbatch rows */
} xb_batch_kind;

/* False (printed) when --json is the same file as one of the n traces,
   whatever the paths: the results would replace it. */
static bool json_spares_traces(const xb_cli *c, char **paths, size_t n) {
  if (c->json == NULL || strcmp(c->json, "-") == 0) return true;
  for (size_t i = 0; i < n; i++) {
    if (!xb_same_file(c->json, paths[i])) continue;
    fprintf(stderr, "xseg-bench: --json %s is the trace %s; the results "
            "would replace it\n", c->json, paths[i]);
    return false;
  }
  return true;
}

/* Runs n trace files, or the one trace `built`, in every policy, then
   prints the table and writes the outputs. */
static int batch_run(const xb_cli *c, char **paths, size_t n,
                     const xb_trace *built, xb_batch_kind kind) {
  if (built == NULL && !json_spares_traces(c, paths, n)) return 2;
  xb_batch b = {.n_results = 0};
  bool is_default = kind == XB_BATCH_DEFAULT;
  int rc = batch_open(&b, c, n, kind != XB_BATCH_ONE,
                      is_default ? XB_N_DEFAULT_VARBATCH : 0);
  if (rc >= 0) return rc;
  size_t done = 0;
  uint64_t t0 = xb_now_ns();
  xb_trace *loaded = NULL;
  bool ok = built != NULL || traces_load(paths, n, &loaded);
  for (size_t i = 0; ok && i < n; i++)
    ok = batch_trace(&b, built != NULL ? built : &loaded[i], &done,
                     b.cap_results);
  if (ok && is_default) ok = batch_varbatch(&b, &done, b.cap_results);
  ok = ok && batch_report(&b, c, t0);
  if (loaded != NULL) traces_release(loaded, n);
  batch_release(&b);
  xb_env_close(&b.env);
  return ok ? 0 : 1;
}

int xb_run_trace(const xb_cli *c, const xb_trace *t) {
  return batch_run(c, NULL, 1, t, XB_BATCH_ONE);
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_trace_name(const char *n) {
  size_t len = strlen(n);
  return (len > 4 && strcmp(n + len - 4, ".csv") == 0) ||
         (len > 7 && strcmp(n + len - 7, ".csv.gz") == 0);
}

/* Appends a copy of dir/name to *paths. */
static bool paths_push(char ***paths, size_t *n, size_t *cap, const char *dir,
                       const char *name) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 8;
    char **p = realloc(*paths, c * sizeof *p);
    if (p == NULL) return false;
    *paths = p;
    *cap = c;
  }
  size_t len = strlen(dir) + strlen(name) + 2;
  char *path = malloc(len);
  if (path == NULL) return false;
  snprintf(path, len, "%s/%s", dir, name);
  (*paths)[(*n)++] = path;
  return true;
}

/* The trace files of dir, sorted by name; false (printed) on failure. */
static bool trace_files(const char *dir, char ***paths, size_t *n) {
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "xseg-bench: trace folder %s: %s\n", dir, strerror(errno));
    return false;
  }
  size_t cap = 0;
  bool ok = true;
  for (struct dirent *e; ok && (e = readdir(d)) != NULL;)
    if (is_trace_name(e->d_name))
      ok = paths_push(paths, n, &cap, dir, e->d_name);
  closedir(d);
  if (!ok) fprintf(stderr, "xseg-bench: out of host memory\n");
  if (ok && *n == 0)
    fprintf(stderr, "xseg-bench: no .csv or .csv.gz traces in %s\n", dir);
  if (*n > 0) qsort(*paths, *n, sizeof **paths, name_cmp);
  return ok && *n > 0;
}

/* Parses shared options only; prints and returns false on anything else. */
static bool parse_common(int argc, char **argv, xb_cli *c) {
  static const struct option opts[] = {XB_CLI_LONG_OPTIONS, {0, 0, 0, 0}};
  optind = 0;                       /* glibc: rescan from scratch */
  for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
    if (o == '?' || xb_cli_option(c, o, optarg) != 1) return false;
  }
  if (optind < argc) {
    fprintf(stderr, "xseg-bench: unexpected argument '%s'\n", argv[optind]);
    return false;
  }
  return true;
}

int xb_cmd_default(int argc, char **argv) {
  xb_cli c;
  xb_cli_defaults(&c);
  c.mode = "all";
  if (!parse_common(argc, argv, &c) ||
      !xb_cli_refuse(&c, "the default run", XB_OPT_BIT(XB_OPT_TRACE)))
    return 2;
  const char *dir = c.traces;
  if (dir == NULL) dir = getenv("XSEG_BENCH_TRACES");
  /* The varbatch rows go with the bundled traces, not with another folder. */
  xb_batch_kind kind = XB_BATCH_COMPARE;
  if (dir == NULL || dir[0] == '\0') {
    dir = XB_TRACE_DIR;
    kind = XB_BATCH_DEFAULT;
  }
  size_t n = 0;
  char **paths = NULL;
  int rc = trace_files(dir, &paths, &n) ? batch_run(&c, paths, n, NULL, kind)
                                        : 1;
  for (size_t i = 0; i < n; i++) free(paths[i]);
  free(paths);
  return rc;
}

static void replay_usage(FILE *out) {
  fprintf(out,
          "usage: xseg-bench replay --trace FILE [--mode M] [--gpu-lag US]\n"
          "                         [--conf STR] [--device-memory SIZE] "
          "[--driver D]\n"
          "                         [--json OUT] [--svg OUT] [--points N] "
          "[--quiet]\n"
          "  replays one RMM replay-log CSV (.csv or .csv.gz)\n"
          "  --mode M           xseg (default), pytorch-expandable, "
          "pytorch-native,\n"
          "                     exact or all (expandable and classic: xseg, "
          "pytorch-native)\n"
          "  --gpu-lag US       the device runs US microseconds of trace time "
          "behind\n"
          "                     (the emulator only; default 0)\n"
          "  --conf STR         allocator settings; default $XSEG_ALLOC_CONF\n"
          "%s", xb_cli_output_help);
}

int xb_cmd_replay(int argc, char **argv) {
  xb_cli c;
  xb_cli_defaults(&c);
  c.mode = "xseg";
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
      return replay_usage(stdout), 0;
  if (!parse_common(argc, argv, &c) ||
      !xb_cli_refuse(&c, "replay", XB_OPT_BIT(XB_OPT_TRACES)))
    return 2;
  if (c.trace == NULL) {
    fprintf(stderr, "xseg-bench replay: --trace FILE is required\n");
    return 2;
  }
  char *paths[1] = {(char *)c.trace};
  return batch_run(&c, paths, 1, NULL, XB_BATCH_ONE);
}
