/* varbatch.c: `xseg-bench varbatch`, a synthetic variable-batch inference
 * server.
 *
 * The model is L transformer layers of width H (fp16) whose weights are
 * allocated once. Each request draws a batch size and a sequence length from
 * a seeded generator, so every activation is proportional to its own batch:
 * per layer the fused QKV projection, the attention scores and softmax
 * (batch x heads x T x T), the attention output, the 4H MLP activation and
 * the layer output, each freed when PyTorch would free it. With
 * --decode-steps N > 0 the request then decodes N tokens with a KV cache that
 * grows by reallocation (torch.cat): each step allocates K and V one token
 * longer per layer and frees the old ones.
 *
 * Requests run `streams` at a time, one per stream, their events interleaved
 * one by one, so blocks of different streams live side by side as in a
 * server with a stream per worker.
 *
 * Event i happens at time i x --event-us (default 20 us, a host launching
 * about one kernel per allocation at 50k launches per second), the clock a
 * replay under --gpu-lag follows. --write-trace writes the workload as an
 * RMM replay CSV with these times and the real stream ids (1..streams), so
 * other allocators can replay the same multi-stream work.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct xb_varbatch {
  uint64_t layers, hidden, heads, requests, streams;
  uint64_t batch_min, batch_max, seq_min, seq_max, decode_steps, seed;
  uint64_t event_us;                /* trace time between two events */
} xb_varbatch;

/* One request's events before interleaving: key > 0 allocates `size`
   bytes under that key, key < 0 frees -key. */
typedef struct xb_op {
  int64_t key;
  uint64_t size;
} xb_op;

typedef struct xb_script {
  xb_op *ops;
  size_t n, cap, next;              /* next: interleaving cursor */
  int64_t *next_key;                /* shared key counter */
  bool oom;
} xb_script;

static uint64_t rng_range(uint64_t *s, uint64_t lo, uint64_t hi) {
  return lo + xb_splitmix64(s) % (hi - lo + 1);
}

static void script_push(xb_script *s, int64_t key, uint64_t size) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    xb_op *p = realloc(s->ops, cap * sizeof *p);
    if (p == NULL) {
      s->oom = true;
      return;
    }
    s->ops = p;
    s->cap = cap;
  }
  s->ops[s->n++] = (xb_op){key, size};
}

static int64_t script_alloc(xb_script *s, uint64_t size) {
  int64_t key = ++*s->next_key;
  script_push(s, key, size);
  return key;
}

static void script_free(xb_script *s, int64_t key) { script_push(s, -key, 0); }

/* One layer's forward over b x t tokens; returns the new hidden state. */
static int64_t layer_forward(xb_script *s, const xb_varbatch *v, uint64_t b,
                             uint64_t t, int64_t x, int64_t *k, int64_t *kv) {
  uint64_t act = b * t * v->hidden * 2;
  int64_t qkv = script_alloc(s, 3 * act);
  int64_t scores = script_alloc(s, b * v->heads * t * t * 2);
  int64_t probs = script_alloc(s, b * v->heads * t * t * 2);
  script_free(s, scores);
  int64_t attn = script_alloc(s, act);
  script_free(s, probs);
  if (k != NULL) {                  /* the cache keeps copies of K and V */
    *k = script_alloc(s, act);
    *kv = script_alloc(s, act);
  }
  script_free(s, qkv);
  int64_t mlp = script_alloc(s, 4 * act);
  int64_t y = script_alloc(s, act);
  script_free(s, mlp);
  script_free(s, attn);
  script_free(s, x);
  return y;
}

/* Decoding: each step regrows every layer's K and V by one token. */
static void decode(xb_script *s, const xb_varbatch *v, uint64_t b, uint64_t t,
                   int64_t *k, int64_t *kv) {
  for (uint64_t step = 1; step <= v->decode_steps; step++) {
    uint64_t len = b * (t + step) * v->hidden * 2;
    for (uint64_t l = 0; l < v->layers; l++) {
      int64_t nk = script_alloc(s, len), nv = script_alloc(s, len);
      int64_t tmp = script_alloc(s, b * v->hidden * 2 * 4);
      script_free(s, k[l]);
      script_free(s, kv[l]);
      script_free(s, tmp);
      k[l] = nk;
      kv[l] = nv;
    }
  }
  for (uint64_t l = 0; l < v->layers; l++) {
    script_free(s, k[l]);
    script_free(s, kv[l]);
  }
}

static void request_script(xb_script *s, const xb_varbatch *v, uint64_t *rng,
                           int64_t *k, int64_t *kv) {
  uint64_t b = rng_range(rng, v->batch_min, v->batch_max);
  uint64_t t = rng_range(rng, v->seq_min, v->seq_max);
  bool cache = v->decode_steps > 0;
  int64_t x = script_alloc(s, b * t * v->hidden * 2);
  for (uint64_t l = 0; l < v->layers; l++)
    x = layer_forward(s, v, b, t, x, cache ? &k[l] : NULL,
                      cache ? &kv[l] : NULL);
  if (cache) decode(s, v, b, t, k, kv);
  script_free(s, x);
}

static bool op_apply(xb_trace *t, const xb_varbatch *v, const xb_op *op,
                     int64_t stream, xb_error *err) {
  xb_trace_at(t, t->n_events * v->event_us * 1000);
  if (op->key > 0)
    return xb_trace_alloc(t, (uint64_t)op->key, op->size, stream, err);
  return xb_trace_free(t, (uint64_t)-op->key, UINT64_MAX, stream, err);
}

/* Interleaves the scripts one event at a time; script i runs on stream
   i + 1 (all created streams, none the legacy one). */
static bool scripts_interleave(xb_trace *t, const xb_varbatch *v,
                               xb_script *s, size_t n, xb_error *err) {
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < n; i++) {
      if (s[i].next == s[i].n) continue;
      if (!op_apply(t, v, &s[i].ops[s[i].next++], (int64_t)i + 1, err))
        return false;
      more = true;
    }
  }
  return true;
}

static bool weight_add(xb_trace *t, const xb_varbatch *v, int64_t *key,
                       uint64_t size, xb_error *err) {
  xb_trace_at(t, t->n_events * v->event_us * 1000);
  return xb_trace_alloc(t, (uint64_t)++*key, size, 1, err);
}

static bool weights_add(xb_trace *t, const xb_varbatch *v, int64_t *key,
                        xb_error *err) {
  uint64_t h = v->hidden;
  for (uint64_t l = 0; l < v->layers; l++) {
    if (!weight_add(t, v, key, 3 * h * h * 2, err) ||
        !weight_add(t, v, key, h * h * 2, err) ||
        !weight_add(t, v, key, 8 * h * h * 2, err))
      return false;
  }
  return true;
}

/* Builds the whole workload into t. */
static bool varbatch_build(const xb_varbatch *v, const char *name,
                           xb_trace *t, xb_error *err) {
  xb_trace_init(t, name);
  int64_t key = 0;
  uint64_t rng = v->seed;
  size_t ns = (size_t)v->streams;
  xb_script *s = calloc(ns, sizeof *s);
  int64_t *k = calloc(v->layers * 2 + 1, sizeof *k);
  bool ok = s != NULL && k != NULL;
  if (!ok) xb_fail(err, "out of host memory");
  ok = ok && weights_add(t, v, &key, err);
  for (uint64_t r = 0; ok && r < v->requests; r += ns) {
    for (size_t i = 0; i < ns && r + i < v->requests; i++) {
      s[i] = (xb_script){.ops = s[i].ops, .cap = s[i].cap, .next_key = &key};
      request_script(&s[i], v, &rng, k, k + v->layers);
      if (s[i].oom) ok = xb_fail(err, "out of host memory for the script");
    }
    ok = ok && scripts_interleave(t, v, s, ns, err);
    for (size_t i = 0; i < ns; i++) s[i].n = s[i].next = 0;
  }
  for (size_t i = 0; s != NULL && i < ns; i++) free(s[i].ops);
  free(s);
  free(k);
  xb_trace_done(t);
  return ok;
}

enum {
  XB_VB_LAYERS = XB_OPT_FIRST_OWN, XB_VB_HIDDEN, XB_VB_HEADS, XB_VB_REQUESTS,
  XB_VB_STREAMS, XB_VB_BATCH, XB_VB_SEQ, XB_VB_DECODE, XB_VB_SEED, XB_VB_HELP,
  XB_VB_EVENT_US, XB_VB_WRITE_TRACE
};

static void varbatch_usage(FILE *out, const xb_varbatch *d) {
  fprintf(out,
          "usage: xseg-bench varbatch [options] (and the common options "
          "but --trace(s))\n"
          "  --layers N         transformer layers (default %llu)\n"
          "  --hidden N         model width, fp16 (default %llu)\n"
          "  --heads N          attention heads (default %llu)\n"
          "  --requests N       requests served (default %llu)\n"
          "  --streams N        concurrent requests, one stream each "
          "(default %llu, at most %d)\n"
          "  --batch MIN:MAX    batch size per request (default %llu:%llu)\n"
          "  --seq MIN:MAX      prompt length per request (default %llu:%llu)\n"
          "  --decode-steps N   decode steps with a growing KV cache; 0 = "
          "prefill only (default %llu)\n"
          "  --seed N           generator seed (default %llu)\n"
          "  --event-us N       trace time between events, for --gpu-lag "
          "(default %llu)\n"
          "  --gpu-lag US       the device runs US microseconds of trace time "
          "behind\n"
          "  --write-trace F    also write the workload as an RMM replay CSV "
          "(gzip if F ends in .gz)\n",
          (unsigned long long)d->layers, (unsigned long long)d->hidden,
          (unsigned long long)d->heads, (unsigned long long)d->requests,
          (unsigned long long)d->streams, XB_MAX_STREAMS - 1,
          (unsigned long long)d->batch_min, (unsigned long long)d->batch_max,
          (unsigned long long)d->seq_min, (unsigned long long)d->seq_max,
          (unsigned long long)d->decode_steps, (unsigned long long)d->seed,
          (unsigned long long)d->event_us);
}

static bool parse_range(const char *opt, const char *arg, uint64_t *lo,
                        uint64_t *hi) {
  char *end;
  unsigned long long a = strtoull(arg, &end, 10), b;
  if (end == arg || *end != ':' || arg[0] == '-') goto bad;
  const char *p = end + 1;
  b = strtoull(p, &end, 10);
  if (end == p || *end != '\0' || *p == '-' || a == 0 || a > b) goto bad;
  *lo = a;
  *hi = b;
  return true;
bad:
  fprintf(stderr, "xseg-bench: %s wants MIN:MAX with 0 < MIN <= MAX, not "
          "'%s'\n", opt, arg);
  return false;
}

static bool varbatch_option(xb_varbatch *v, int o, const char *arg) {
  switch (o) {
    case XB_VB_LAYERS: return xb_cli_u64("--layers", arg, &v->layers);
    case XB_VB_HIDDEN: return xb_cli_u64("--hidden", arg, &v->hidden);
    case XB_VB_HEADS: return xb_cli_u64("--heads", arg, &v->heads);
    case XB_VB_REQUESTS: return xb_cli_u64("--requests", arg, &v->requests);
    case XB_VB_STREAMS: return xb_cli_u64("--streams", arg, &v->streams);
    case XB_VB_DECODE: return xb_cli_u64("--decode-steps", arg,
                                         &v->decode_steps);
    case XB_VB_SEED: return xb_cli_u64("--seed", arg, &v->seed);
    case XB_VB_EVENT_US: return xb_cli_u64("--event-us", arg, &v->event_us);
    case XB_VB_BATCH: return parse_range("--batch", arg, &v->batch_min,
                                         &v->batch_max);
    case XB_VB_SEQ: return parse_range("--seq", arg, &v->seq_min, &v->seq_max);
    default: return false;
  }
}

static const xb_varbatch varbatch_defaults = {
    .layers = 12, .hidden = 2048, .heads = 16, .requests = 120, .streams = 2,
    .batch_min = 1, .batch_max = 32, .seq_min = 32, .seq_max = 512,
    .decode_steps = 8, .seed = 1, .event_us = 20};

bool xb_varbatch_default_trace(uint64_t streams, xb_trace *t, xb_error *err) {
  xb_varbatch v = varbatch_defaults;
  v.streams = streams;
  char name[64];
  snprintf(name, sizeof name, "varbatch_%llu_stream%s",
           (unsigned long long)streams, streams == 1 ? "" : "s");
  return varbatch_build(&v, name, t, err);
}

/* The product of n factors, false when it wraps or passes XB_MAX_SIZE. */
static bool size_product(const uint64_t *f, size_t n) {
  uint64_t p = 1;
  for (size_t i = 0; i < n; i++)
    if (__builtin_mul_overflow(p, f[i], &p)) return false;
  return p <= XB_MAX_SIZE;
}

/* The largest block of each kind varbatch_build makes (at the largest
   batch and sequence): false (printed, naming the options that size it)
   when one would wrap or pass xseg's largest request. The others (QKV,
   the layer output, decoding's temporary) are smaller than these. */
static bool varbatch_sizes_fit(const xb_varbatch *v) {
  uint64_t h = v->hidden, b = v->batch_max, t = v->seq_max, cached;
  if (__builtin_add_overflow(t, v->decode_steps, &cached))
    cached = UINT64_MAX;
  const struct {
    const char *options, *what;
    uint64_t f[5];
  } blocks[] = {
      {"--hidden", "an MLP weight (16 x hidden^2 bytes)", {16, h, h, 1, 1}},
      {"--batch, --seq and --hidden",
       "the MLP activation (8 x batch x seq x hidden bytes)", {8, b, t, h, 1}},
      {"--batch, --heads and --seq",
       "the attention scores (2 x batch x heads x seq^2 bytes)",
       {2, b, v->heads, t, t}},
      {"--batch, --seq, --decode-steps and --hidden",
       "a KV cache (2 x batch x (seq + decode steps) x hidden bytes)",
       {2, b, cached, h, 1}},
  };
  for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++) {
    if (size_product(blocks[i].f, 5)) continue;
    fprintf(stderr, "xseg-bench varbatch: %s too large: %s would be above "
            "2^62 bytes (xseg's largest request)\n", blocks[i].options,
            blocks[i].what);
    return false;
  }
  return true;
}

/* 1 run, 0 done (help), -1 bad arguments (printed). */
static int varbatch_parse(int argc, char **argv, xb_cli *c, xb_varbatch *v,
                          const char **write_trace) {
  static const struct option opts[] = {
      XB_CLI_LONG_OPTIONS,
      {"layers", required_argument, 0, XB_VB_LAYERS},
      {"hidden", required_argument, 0, XB_VB_HIDDEN},
      {"heads", required_argument, 0, XB_VB_HEADS},
      {"requests", required_argument, 0, XB_VB_REQUESTS},
      {"streams", required_argument, 0, XB_VB_STREAMS},
      {"batch", required_argument, 0, XB_VB_BATCH},
      {"seq", required_argument, 0, XB_VB_SEQ},
      {"decode-steps", required_argument, 0, XB_VB_DECODE},
      {"seed", required_argument, 0, XB_VB_SEED},
      {"event-us", required_argument, 0, XB_VB_EVENT_US},
      {"write-trace", required_argument, 0, XB_VB_WRITE_TRACE},
      {"help", no_argument, 0, XB_VB_HELP},
      {0, 0, 0, 0}};
  optind = 0;
  for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
    if (o == XB_VB_HELP) return varbatch_usage(stdout, v), 0;
    if (o == XB_VB_WRITE_TRACE) {
      *write_trace = optarg;
      continue;
    }
    int common = o == '?' ? -1 : xb_cli_option(c, o, optarg);
    if (common < 0 || (common == 0 && !varbatch_option(v, o, optarg)))
      return -1;
  }
  if (!xb_cli_refuse(c, "varbatch", XB_OPT_BIT(XB_OPT_TRACE) |
                                     XB_OPT_BIT(XB_OPT_TRACES)))
    return -1;
  const char *bad = optind < argc ? argv[optind]
                    : v->layers == 0 ? "--layers 0"
                    /* The layer arrays' counts (2 * layers + 1) must not
                       wrap; no trace of more layers fits in host memory. */
                    : v->layers > UINT32_MAX ? "--layers (at most 4294967295)"
                    : v->hidden == 0 ? "--hidden 0"
                    : v->heads == 0  ? "--heads 0"
                                     : NULL;
  if (bad != NULL) {
    fprintf(stderr, "xseg-bench varbatch: bad argument '%s' (see --help)\n",
            bad);
    return -1;
  }
  if (v->event_us > UINT64_MAX / 1000 / (1ull << 40)) {
    fprintf(stderr, "xseg-bench varbatch: --event-us %llu is too large\n",
            (unsigned long long)v->event_us);
    return -1;
  }
  if (v->streams == 0 || v->streams >= XB_MAX_STREAMS) {
    fprintf(stderr, "xseg-bench varbatch: --streams %llu is not in 1..%d\n",
            (unsigned long long)v->streams, XB_MAX_STREAMS - 1);
    return -1;
  }
  return varbatch_sizes_fit(v) ? 1 : -1;
}

/* Whether --write-trace and --json name one file (the same path, or one
   file already there under two): the results would replace the trace. */
static bool varbatch_outputs_collide(const char *trace, const char *json) {
  if (trace == NULL || json == NULL || strcmp(json, "-") == 0) return false;
  return strcmp(trace, json) == 0 || xb_same_file(trace, json);
}

int xb_cmd_varbatch(int argc, char **argv) {
  xb_cli c;
  xb_cli_defaults(&c);
  c.mode = "all";
  xb_varbatch v = varbatch_defaults;
  const char *write_trace = NULL;
  int parsed = varbatch_parse(argc, argv, &c, &v, &write_trace);
  if (parsed <= 0) return parsed == 0 ? 0 : 2;
  if (varbatch_outputs_collide(write_trace, c.json)) {
    fprintf(stderr, "xseg-bench varbatch: --write-trace and --json are the "
            "same file %s; the results would replace the trace\n",
            write_trace);
    return 2;
  }
  xb_trace t;
  xb_error err;
  if (!varbatch_build(&v, "varbatch", &t, &err) ||
      (write_trace != NULL && !xb_trace_write(write_trace, &t, &err))) {
    fprintf(stderr, "xseg-bench varbatch: %s\n", err.text);
    xb_trace_release(&t);
    return 1;
  }
  fprintf(xb_cli_table_out(&c),
         "varbatch: %llu layers, width %llu, %llu requests on %llu streams, "
         "batch %llu..%llu, seq %llu..%llu, %llu decode steps, seed %llu: "
         "%zu events\n", (unsigned long long)v.layers,
         (unsigned long long)v.hidden, (unsigned long long)v.requests,
         (unsigned long long)v.streams, (unsigned long long)v.batch_min,
         (unsigned long long)v.batch_max, (unsigned long long)v.seq_min,
         (unsigned long long)v.seq_max, (unsigned long long)v.decode_steps,
         (unsigned long long)v.seed, t.n_events);
  int rc = xb_run_trace(&c, &t);
  xb_trace_release(&t);
  return rc;
}
