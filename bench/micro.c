/* micro.c: `xseg-bench micro`, the allocator's host-side cost.
 *
 * Cached path: malloc+free pairs that never reach the driver, timed in
 * rounds of --pairs pairs (one clock read per round, so the clock's own cost
 * is not in the number), median over --rounds. "cached-repeat" allocates and
 * frees one size; "cached-random" keeps L blocks live (L = 10^3 .. --live-max)
 * and replaces a random one by a block of a random size (1..4096 B) per
 * pair; "cached-mixed" does the same with --mixed-live blocks of sizes
 * spread over both pools (1 KiB .. 2 MiB, as many of each power of two);
 * "cached-layers" is a model's layer pattern: a batch of tensors of
 * several sizes in both pools allocated in turn, then freed in reverse
 * order, over and over. glibc's malloc/free runs the very same size and
 * victim sequence in the same process, round for round interleaved with
 * xseg's, as the baseline that is always there. The cached-path loops:
 * micro_cached.c; growth path: micro_growth.c; thread scaling:
 * micro_threads.c;
 * deferred (cross-stream) frees: micro_deferred.c.
 */
#include <stdlib.h>
#include <string.h>

#include "micro.h"

bool xb_micro_allocator(xb_micro *m, xseg_allocator **out) {
  if (xb_xseg_create(&m->env, m->cli.conf, m->expandable, out) == XSEG_OK)
    return true;
  fprintf(stderr, "xseg-bench micro: cannot create the allocator: %s\n",
          xseg_last_error());
  return false;
}

bool xb_micro_selected(const xb_micro *m, const char *name) {
  return m->only == NULL || strcmp(m->only, name) == 0;
}

static int micro_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double xb_micro_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, micro_cmp_double);
  return v[n / 2];
}

/* ---- the command --------------------------------------------------------- */

typedef struct xb_micro_out {
  xb_cached_row cached[XB_CACHED_ROWS];
  size_t n_cached;
  xb_growth_row growth[2];
  size_t n_growth;
  xb_threads_row threads;
  bool have_threads;
  xb_deferred_row deferred;
  bool have_deferred;
} xb_micro_out;

static bool run_all(xb_micro *m, xb_micro_out *o) {
  bool ok = xb_micro_cached(m, o->cached, &o->n_cached);
  if (ok && xb_micro_selected(m, "growth"))
    ok = xb_micro_growth(m, "growth-small", 1, 1 << 20, 1ull << 30,
                         &o->growth[o->n_growth++]) &&
         xb_micro_growth(m, "growth-large", 1 << 20, 64 << 20, 4ull << 30,
                         &o->growth[o->n_growth++]);
  if (ok && xb_micro_selected(m, "threads"))
    ok = o->have_threads = xb_micro_threads(m, &o->threads);
  if (ok && xb_micro_selected(m, "deferred"))
    ok = o->have_deferred = xb_micro_deferred(m, &o->deferred);
  return ok;
}

static void print_cached(const xb_micro_out *o) {
  if (o->n_cached == 0) return;
  printf("%-14s %9s %9s %13s %14s %7s\n", "cached path", "live", "pairs",
         "xseg ns/pair", "glibc ns/pair", "ratio");
  for (size_t i = 0; i < o->n_cached; i++) {
    const xb_cached_row *r = &o->cached[i];
    printf("%-14s %9llu %9llu %13.1f %14.1f %7.2f\n", r->name,
           (unsigned long long)r->live, (unsigned long long)r->pairs,
           r->xseg_ns, r->glibc_ns, r->xseg_ns / r->glibc_ns);
  }
}

/* n threads on n streams against one, and glibc's malloc+free in the
   same loops: its scaling says what the machine allows (a shared cache,
   a loaded or throttled core). A speedup is claimed only for as many
   threads as the machine has cores (more threads than cores share them,
   and their ratio says nothing about the allocator). */
static void print_threads(const xb_threads_row *t) {
  printf("threads        %d cores%s%s; 1 thread %.2f M pairs/s (glibc %.2f)\n",
         t->cores,
         t->record ? ", each block recorded on a side stream of its thread's"
                   : "",
         t->pinned ? ", each worker pinned to a core" : "",
         t->pairs_per_s[0] * 1e-6, t->glibc_pairs_per_s[0] * 1e-6);
  for (int i = 1; i < XB_THREAD_COUNTS; i++) {
    int n = xb_thread_count[i];
    /* Where the best run's threads ended (-1: unknown). */
    char cpus[64];
    int len = snprintf(cpus, sizeof cpus, "cpus");
    for (int j = 0; j < n && len < (int)sizeof cpus; j++)
      len += snprintf(cpus + len, sizeof cpus - (size_t)len, "%s%d",
                      j ? "," : " ", t->cpus[i][j]);
    printf("               %d threads on %d streams %.2f M pairs/s: "
           "%.2fx, glibc %.2f M pairs/s: %.2fx (%s%s%s)%s\n", n, n,
           t->pairs_per_s[i] * 1e-6, t->pairs_per_s[i] / t->pairs_per_s[0],
           t->glibc_pairs_per_s[i] * 1e-6,
           t->glibc_pairs_per_s[i] / t->glibc_pairs_per_s[0], cpus,
           t->shared_core[i] ? "; two on one core" : "",
           t->glibc_shared_core[i] ? "; glibc's two on one core" : "",
           n > t->cores ? " (more threads than cores: no scaling claimed)"
                        : "");
  }
}

static void print_rest(const xb_micro_out *o) {
  for (size_t i = 0; i < o->n_growth; i++) {
    const xb_growth_row *g = &o->growth[i];
    char res[32];
    printf("%-14s %llu mallocs grew %s: %llu VMM calls, %.1f per GiB, "
           "%.0f ns per malloc\n", g->name, (unsigned long long)g->mallocs,
           xb_format_bytes(g->reserved, res, sizeof res),
           (unsigned long long)g->vmm_calls, g->calls_per_gib,
           g->ns_per_malloc);
  }
  if (o->have_threads) print_threads(&o->threads);
  if (o->have_deferred) {
    const xb_deferred_row *d = &o->deferred;
    printf("deferred-free  malloc+record_stream+free %.1f ns, malloc+free "
           "%.1f ns: %.1f ns per deferred free; %llu events for %llu frees, "
           "%.2f cuEventRecord and %.2f cuEventQuery per free\n",
           d->deferred_ns, d->plain_ns, d->deferred_ns - d->plain_ns,
           (unsigned long long)d->events_created,
           (unsigned long long)d->frees, d->records_per_free,
           d->queries_per_free);
  }
}

static void json_cached(FILE *f, const xb_micro_out *o) {
  fprintf(f, "  \"cached\": [");
  for (size_t i = 0; i < o->n_cached; i++) {
    const xb_cached_row *r = &o->cached[i];
    fprintf(f, "%s\n    {\"name\": \"%s\", \"live\": %llu, \"pairs\": %llu, "
            "\"xseg_ns_per_pair\": %.2f, \"glibc_ns_per_pair\": %.2f, "
            "\"ratio\": %.3f}", i ? "," : "", r->name,
            (unsigned long long)r->live, (unsigned long long)r->pairs,
            r->xseg_ns, r->glibc_ns, r->xseg_ns / r->glibc_ns);
  }
  fprintf(f, "\n  ],\n");
}

static void json_growth(FILE *f, const xb_micro_out *o) {
  fprintf(f, "  \"growth\": [");
  for (size_t i = 0; i < o->n_growth; i++) {
    const xb_growth_row *g = &o->growth[i];
    fprintf(f, "%s\n    {\"name\": \"%s\", \"mallocs\": %llu, "
            "\"reserved_bytes\": %llu, \"vmm_calls\": %llu, "
            "\"vmm_calls_per_gib\": %.2f, \"ns_per_malloc\": %.1f}",
            i ? "," : "", g->name, (unsigned long long)g->mallocs,
            (unsigned long long)g->reserved, (unsigned long long)g->vmm_calls,
            g->calls_per_gib, g->ns_per_malloc);
  }
  fprintf(f, "\n  ]");
}

static void json_threads(FILE *f, const xb_micro_out *o) {
  if (!o->have_threads) return;
  const xb_threads_row *t = &o->threads;
  /* speedup_N is null where N threads exceed the cores. */
  fprintf(f, ",\n  \"threads\": {\"pairs_per_thread\": %llu, "
          "\"cores\": %d, \"record\": %s, \"pinned\": %s",
          (unsigned long long)t->pairs_per_thread, t->cores,
          t->record ? "true" : "false", t->pinned ? "true" : "false");
  for (int i = 0; i < XB_THREAD_COUNTS; i++) {
    int n = xb_thread_count[i];
    fprintf(f, ", \"threads_%d_pairs_per_s\": %.0f, "
            "\"glibc_threads_%d_pairs_per_s\": %.0f", n, t->pairs_per_s[i],
            n, t->glibc_pairs_per_s[i]);
    if (i > 0)
      fprintf(f, ", \"threads_%d_shared_a_core\": %s, "
              "\"glibc_threads_%d_shared_a_core\": %s", n,
              t->shared_core[i] ? "true" : "false", n,
              t->glibc_shared_core[i] ? "true" : "false");
    if (i == 0) continue;
    if (n > t->cores)
      fprintf(f, ", \"speedup_%d\": null, \"glibc_speedup_%d\": null", n,
              n);
    else
      fprintf(f, ", \"speedup_%d\": %.3f, \"glibc_speedup_%d\": %.3f", n,
              t->pairs_per_s[i] / t->pairs_per_s[0], n,
              t->glibc_pairs_per_s[i] / t->glibc_pairs_per_s[0]);
  }
  fputs("}", f);
}

static void json_deferred(FILE *f, const xb_micro_out *o) {
  if (!o->have_deferred) return;
  const xb_deferred_row *d = &o->deferred;
  fprintf(f, ",\n  \"deferred\": {\"frees\": %llu, "
          "\"plain_ns_per_pair\": %.2f, \"deferred_ns_per_iteration\": %.2f, "
          "\"ns_per_deferred_free\": %.2f, \"events_created\": %llu, "
          "\"event_records_per_free\": %.3f, \"event_queries_per_free\": "
          "%.3f}", (unsigned long long)d->frees, d->plain_ns, d->deferred_ns,
          d->deferred_ns - d->plain_ns, (unsigned long long)d->events_created,
          d->records_per_free, d->queries_per_free);
}

/* Writes the results to json (opened before the run, so that a path that
   cannot be written fails at once and no run is lost) and commits it. */
static bool micro_json(const xb_micro *m, const xb_micro_out *o,
                       xb_json_out *json) {
  FILE *f = json->f;
  fprintf(f, "{\n  \"mode\": \"%s\",\n  \"driver\": ",
          m->expandable ? "expandable" : "classic");
  xb_json_string(f, m->env.driver);
  fprintf(f, ",\n  \"rounds\": %llu,\n", (unsigned long long)m->rounds);
  json_cached(f, o);
  json_growth(f, o);
  json_threads(f, o);
  json_deferred(f, o);
  fprintf(f, "\n}\n");
  return xb_cli_json_commit(json);
}

enum {
  XB_MI_ONLY = XB_OPT_FIRST_OWN, XB_MI_PAIRS, XB_MI_LIVE_MIN, XB_MI_LIVE_MAX,
  XB_MI_ROUNDS, XB_MI_SEED, XB_MI_OTHER_STREAMS, XB_MI_FIRED, XB_MI_RECORD,
  XB_MI_MIXED_LIVE, XB_MI_MIXED_POOLS, XB_MI_PIN, XB_MI_HELP
};

static void micro_usage(FILE *out) {
  fprintf(out,
          "usage: xseg-bench micro [options] (and --driver, --conf, --mode "
          "expandable|classic, --json, --device-memory)\n"
          "  --only NAME        cached-repeat, cached-layers, cached-random,\n"
          "                     cached-mixed, growth, threads, deferred\n"
          "  --pairs N          malloc+free pairs per round (default 200000, "
          "at most 10^9)\n"
          "  --live-min N       smallest live set for cached-random (default "
          "1000)\n"
          "  --live-max N       largest live set for cached-random, from "
          "--live-min by tens (default 1000000)\n"
          "  --mixed-live N     live set of cached-mixed (default 10000)\n"
          "  --mixed-pools P    cached-mixed's sizes: both (default), small "
          "(1 KiB..1 MiB,\n"
          "                     the small pool alone) or large (1..2 MiB, "
          "the large pool)\n"
          "  --rounds N         rounds per measurement, median taken (default "
          "5, at most 64)\n"
          "  --seed N           size sequence seed (default 1)\n"
          "  --other-streams N  cached-*: the pools of N other streams "
          "(at most 16)\n"
          "                     exist meanwhile, as beside a server's "
          "workers (default 0)\n"
          "  --record           threads: each thread records every block on "
          "a side stream\n"
          "                     of its own before freeing it (cross-stream "
          "frees)\n"
          "  --pin              threads: each worker (xseg's and glibc's) on "
          "a core of its own\n"
          "  --fired            deferred: wait for the side stream after "
          "each deferred free\n"
          "                     (outside the allocator's calls; its time "
          "counts), so that\n"
          "                     every malloc finds the last free's event "
          "fired\n");
}

static bool micro_option(xb_micro *m, int o, const char *arg) {
  switch (o) {
    case XB_MI_ONLY: return (m->only = arg), true;
    case XB_MI_PAIRS: return xb_cli_u64("--pairs", arg, &m->pairs);
    case XB_MI_LIVE_MIN: return xb_cli_u64("--live-min", arg, &m->live_min);
    case XB_MI_LIVE_MAX: return xb_cli_u64("--live-max", arg, &m->live_max);
    case XB_MI_MIXED_LIVE:
      return xb_cli_u64("--mixed-live", arg, &m->mixed_live);
    case XB_MI_MIXED_POOLS: return (m->mixed_pools = arg), true;
    case XB_MI_ROUNDS: return xb_cli_u64("--rounds", arg, &m->rounds);
    case XB_MI_SEED: return xb_cli_u64("--seed", arg, &m->seed);
    case XB_MI_OTHER_STREAMS:
      return xb_cli_u64("--other-streams", arg, &m->other_streams);
    case XB_MI_FIRED: return (m->fired = true), true;
    case XB_MI_RECORD: return (m->record = true), true;
    case XB_MI_PIN: return (m->pin = true), true;
    default: return false;
  }
}

static bool micro_valid(xb_micro *m) {
  if (m->pairs > XB_MICRO_MAX_PAIRS) {
    fprintf(stderr, "xseg-bench micro: --pairs %llu is out of range (at "
            "most %llu)\n", (unsigned long long)m->pairs,
            (unsigned long long)XB_MICRO_MAX_PAIRS);
    return false;
  }
  if (m->live_min > m->live_max) {  /* no live set to run */
    fprintf(stderr, "xseg-bench micro: --live-min %llu is above --live-max "
            "%llu\n", (unsigned long long)m->live_min,
            (unsigned long long)m->live_max);
    return false;
  }
  static const char *const names[] = {"cached-repeat", "cached-layers",
                                      "cached-random", "cached-mixed",
                                      "growth", "threads", "deferred"};
  bool known = m->only == NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !known; i++)
    known = !strcmp(m->only, names[i]);
  const xb_policy *p = xb_policy_find(m->cli.mode);
  m->expandable = p != NULL && p == xb_policy_find("xseg");
  bool mode_ok = m->expandable || (p != NULL && p == xb_policy_find("classic"));
  const char *bad =
      !known ? "--only" : !mode_ok ? "--mode" : m->pairs == 0 ? "--pairs"
      : m->rounds == 0 || m->rounds > 64 ? "--rounds (1..64)"
      : m->live_min == 0 ? "--live-min" : m->live_max > UINT32_MAX
      ? "--live-max" : m->mixed_live == 0 || m->mixed_live > UINT32_MAX
      ? "--mixed-live" : strcmp(m->mixed_pools, "both") &&
        strcmp(m->mixed_pools, "small") && strcmp(m->mixed_pools, "large")
      ? "--mixed-pools (both, small or large)"
      : m->other_streams > XB_OTHER_STREAMS_MAX
      ? "--other-streams" : NULL;
  if (bad == NULL) return true;
  fprintf(stderr, "xseg-bench micro: bad %s", bad);
  if (!known) fprintf(stderr, " '%s' (cached-repeat, cached-layers, "
                      "cached-random, cached-mixed, growth, threads or "
                      "deferred)", m->only);
  if (known && !mode_ok) fprintf(stderr, " '%s' (xseg or pytorch-native)",
                                 m->cli.mode);
  fprintf(stderr, " (see --help)\n");
  return false;
}

/* 1 run, 0 done (help), -1 bad arguments (printed). */
static int micro_parse(int argc, char **argv, xb_micro *m) {
  static const struct option opts[] = {
      XB_CLI_LONG_OPTIONS,
      {"only", required_argument, 0, XB_MI_ONLY},
      {"pairs", required_argument, 0, XB_MI_PAIRS},
      {"live-min", required_argument, 0, XB_MI_LIVE_MIN},
      {"live-max", required_argument, 0, XB_MI_LIVE_MAX},
      {"mixed-live", required_argument, 0, XB_MI_MIXED_LIVE},
      {"mixed-pools", required_argument, 0, XB_MI_MIXED_POOLS},
      {"rounds", required_argument, 0, XB_MI_ROUNDS},
      {"seed", required_argument, 0, XB_MI_SEED},
      {"other-streams", required_argument, 0, XB_MI_OTHER_STREAMS},
      {"fired", no_argument, 0, XB_MI_FIRED},
      {"record", no_argument, 0, XB_MI_RECORD},
      {"pin", no_argument, 0, XB_MI_PIN},
      {"help", no_argument, 0, XB_MI_HELP},
      {0, 0, 0, 0}};
  optind = 0;
  for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
    if (o == XB_MI_HELP) return micro_usage(stdout), 0;
    int common = o == '?' ? -1 : xb_cli_option(&m->cli, o, optarg);
    if (common < 0 || (common == 0 && !micro_option(m, o, optarg))) return -1;
  }
  /* What only replays take. */
  uint32_t ignored = XB_OPT_BIT(XB_OPT_SVG) | XB_OPT_BIT(XB_OPT_POINTS) |
                     XB_OPT_BIT(XB_OPT_TRACE) | XB_OPT_BIT(XB_OPT_TRACES) |
                     XB_OPT_BIT(XB_OPT_GPU_LAG);
  if (!xb_cli_refuse(&m->cli, "micro", ignored)) return -1;
  return optind == argc && micro_valid(m) ? 1 : -1;
}

int xb_cmd_micro(int argc, char **argv) {
  xb_micro m = {.pairs = 200000, .live_min = 1000, .live_max = 1000000,
                .mixed_live = 10000, .mixed_pools = "both", .rounds = 5,
                .seed = 1};
  xb_cli_defaults(&m.cli);
  m.cli.mode = "expandable";
  int parsed = micro_parse(argc, argv, &m);
  if (parsed <= 0) return parsed == 0 ? 0 : 2;
  xb_json_out json;
  if (!xb_cli_json_open(&m.cli, &json)) return 1;
  if (!xb_cli_env_open(&m.cli, &m.env)) return xb_cli_json_close(&json), 1;
  xb_micro_out o = {.n_cached = 0};
  bool ok = run_all(&m, &o);
  if (xb_cli_table_out(&m.cli) == stdout) {   /* not beside --json - */
    print_cached(&o);
    print_rest(&o);
  }
  if (ok && json.f != NULL) ok = micro_json(&m, &o, &json);
  xb_cli_json_close(&json);         /* a failed run: the temporary goes */
  xb_env_close(&m.env);
  return ok ? 0 : 1;
}
