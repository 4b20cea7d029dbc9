/* micro_cached.c: `xseg-bench micro`'s cached-path loops: malloc+free
 * pairs that never reach the driver, xseg's and glibc's over the same size
 * and victim sequence, round for round interleaved (micro.c has the
 * command and what each case is).
 */
#include <stdlib.h>
#include <string.h>

#include "micro.h"

enum { XB_RANDOM_MAX_SIZE = 4096, XB_REPEAT_SIZE = 4096 };

/* cached-mixed's sizes: a power of two 2^e, e in [10, 21), then uniform
   in [2^e, 2^(e+1)): 1 KiB .. 2 MiB - 1, as tensor sizes spread over
   orders of magnitude; one request in 11 goes to the large pool (above
   1 MiB), about half of the bytes; a mean near 290 KiB. --mixed-pools
   small keeps e in [10, 20) (the small pool alone), large e = 20 above
   1 MiB (the large pool alone), to tell the pools' shares apart. */
enum { XB_MIXED_MIN_LOG = 10, XB_MIXED_LOGS = 11 };

/* cached-layers' batch, one layer's tensors in allocation order (a
   transformer block's activations at a small batch: biases and norms,
   attention and MLP outputs), a pair per tensor. */
static const uint32_t xb_layer_sizes[] = {
    3 << 10,   48 << 10, 192 << 10, 1 << 20,
    3 << 19,   4 << 20,  6 << 20,   12 << 20,
};
enum { XB_LAYER_TENSORS = sizeof xb_layer_sizes / sizeof *xb_layer_sizes };

/* A row's xseg call failed: says which row and xseg's message (false). A
   row that fails for another reason (host memory) says so itself. */
static bool cached_failed(const char *row) {
  fprintf(stderr, "xseg-bench micro: %s failed: %s\n", row,
          xseg_last_error());
  return false;
}

static bool repeat_xseg(xseg_allocator *a, uint64_t pairs, double *ns) {
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < pairs; i++) {
    void *p;
    if (xseg_malloc(a, XB_REPEAT_SIZE, NULL, &p) != XSEG_OK ||
        xseg_free(a, p) != XSEG_OK)
      return false;
  }
  *ns = (double)(xb_now_ns() - t0) / (double)pairs;
  return true;
}

static void repeat_glibc(uint64_t pairs, double *ns) {
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < pairs; i++) {
    void *p = malloc(XB_REPEAT_SIZE);
    XB_ESCAPE(p);
    free(p);
  }
  *ns = (double)(xb_now_ns() - t0) / (double)pairs;
}

static bool cached_repeat(xb_micro *m, xseg_allocator *a, xb_cached_row *row) {
  double xs[64], gl[64];
  size_t rounds = m->rounds;
  for (size_t r = 0; r < rounds; r++) {
    if (!repeat_xseg(a, m->pairs, &xs[r]))
      return cached_failed("cached-repeat");
    repeat_glibc(m->pairs, &gl[r]);
  }
  *row = (xb_cached_row){"cached-repeat", 0, m->pairs,
                         xb_micro_median(xs, rounds),
                         xb_micro_median(gl, rounds)};
  return true;
}

/* The random sequence both allocators replay: initial sizes of the live
   set, then per pair the victim's index and the new size. */
typedef struct xb_churn {
  uint64_t live, pairs;
  const char *mixed;                /* cached-mixed's pools (xb_mixed_size),
                                       or NULL: sizes 1..4096 */
  uint32_t *init_size, *victim, *size;
  void **xseg_live, **glibc_live;
} xb_churn;

uint32_t xb_mixed_size(const char *pools, uint64_t *s) {
  bool small = !strcmp(pools, "small"), large = !strcmp(pools, "large");
  unsigned min_log = large ? 20 : XB_MIXED_MIN_LOG;
  unsigned logs = large ? 1 : XB_MIXED_LOGS - small;
  uint64_t r = xb_splitmix64(s);
  unsigned e = min_log + (unsigned)(r % logs);
  uint64_t size = (1ull << e) + (r >> 8) % (1ull << e);
  /* 2^20 itself is the small pool's. */
  return (uint32_t)(large && size == (1ull << 20) ? size + 1 : size);
}

static uint32_t churn_size(const xb_churn *c, uint64_t *s) {
  if (c->mixed == NULL)
    return (uint32_t)(xb_splitmix64(s) % XB_RANDOM_MAX_SIZE + 1);
  return xb_mixed_size(c->mixed, s);
}

static void churn_release(xb_churn *c) {
  free(c->init_size);
  free(c->victim);
  free(c->size);
  free(c->xseg_live);
  free(c->glibc_live);
}

static bool churn_init(xb_churn *c, uint64_t live, uint64_t pairs,
                       const char *mixed, uint64_t seed) {
  *c = (xb_churn){.live = live, .pairs = pairs, .mixed = mixed};
  /* calloc checks the products for overflow. */
  c->init_size = calloc(live, sizeof *c->init_size);
  c->victim = calloc(pairs, sizeof *c->victim);
  c->size = calloc(pairs, sizeof *c->size);
  c->xseg_live = calloc(live, sizeof *c->xseg_live);
  c->glibc_live = calloc(live, sizeof *c->glibc_live);
  if (!c->init_size || !c->victim || !c->size || !c->xseg_live ||
      !c->glibc_live)
    return churn_release(c), false;
  uint64_t s = seed;
  for (uint64_t i = 0; i < live; i++)
    c->init_size[i] = churn_size(c, &s);
  for (uint64_t i = 0; i < pairs; i++) {
    c->victim[i] = (uint32_t)(xb_splitmix64(&s) % live);
    c->size[i] = churn_size(c, &s);
  }
  return true;
}

static bool churn_fill(xb_churn *c, xseg_allocator *a) {
  for (uint64_t i = 0; i < c->live; i++) {
    if (xseg_malloc(a, c->init_size[i], NULL, &c->xseg_live[i]) != XSEG_OK)
      return false;
    c->glibc_live[i] = malloc(c->init_size[i]);
    if (c->glibc_live[i] == NULL) return false;
  }
  return true;
}

/* Not inlined: bench/callgrind.sh dumps its count before the drain
   (--dump-before=churn_drain), so that only the fill (the same in both of
   its runs) and the churn are measured. */
__attribute__((noinline)) static void churn_drain(xb_churn *c,
                                                  xseg_allocator *a) {
  for (uint64_t i = 0; i < c->live; i++) {
    if (c->xseg_live[i] != NULL) xseg_free(a, c->xseg_live[i]);
    free(c->glibc_live[i]);
  }
}

static bool churn_xseg(xb_churn *c, xseg_allocator *a, double *ns) {
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < c->pairs; i++) {
    void **slot = &c->xseg_live[c->victim[i]];
    if (xseg_free(a, *slot) != XSEG_OK ||
        xseg_malloc(a, c->size[i], NULL, slot) != XSEG_OK)
      return *slot = NULL, false;
  }
  *ns = (double)(xb_now_ns() - t0) / (double)c->pairs;
  return true;
}

static void churn_glibc(xb_churn *c, double *ns) {
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < c->pairs; i++) {
    void **slot = &c->glibc_live[c->victim[i]];
    free(*slot);
    *slot = malloc(c->size[i]);
    XB_ESCAPE(*slot);
  }
  *ns = (double)(xb_now_ns() - t0) / (double)c->pairs;
}

static bool cached_random(xb_micro *m, xseg_allocator *a, const char *name,
                          uint64_t live, xb_cached_row *row) {
  xb_churn c;
  const char *mixed = strcmp(name, "cached-mixed") == 0 ? m->mixed_pools
                                                       : NULL;
  if (!churn_init(&c, live, m->pairs, mixed, m->seed + live)) {
    fprintf(stderr, "xseg-bench micro: %s: out of host memory for %llu live "
            "blocks and %llu pairs\n", name, (unsigned long long)live,
            (unsigned long long)m->pairs);
    return false;
  }
  double xs[64], gl[64];
  bool ok = churn_fill(&c, a);
  for (size_t r = 0; ok && r < m->rounds; r++) {
    ok = churn_xseg(&c, a, &xs[r]);
    churn_glibc(&c, &gl[r]);
  }
  churn_drain(&c, a);
  churn_release(&c);
  if (!ok) return cached_failed(name);
  *row = (xb_cached_row){name, live, m->pairs,
                         xb_micro_median(xs, m->rounds),
                         xb_micro_median(gl, m->rounds)};
  return true;
}

/* cached-layers: `pairs` rounded down to whole batches (at least one). */
static uint64_t layer_batches(uint64_t pairs) {
  return pairs < XB_LAYER_TENSORS ? 1 : pairs / XB_LAYER_TENSORS;
}

static bool layers_xseg(xseg_allocator *a, uint64_t batches, double *ns) {
  void *t[XB_LAYER_TENSORS];
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < batches; i++) {
    for (size_t j = 0; j < XB_LAYER_TENSORS; j++)
      if (xseg_malloc(a, xb_layer_sizes[j], NULL, &t[j]) != XSEG_OK)
        return false;
    for (size_t j = XB_LAYER_TENSORS; j-- > 0;)
      if (xseg_free(a, t[j]) != XSEG_OK) return false;
  }
  *ns = (double)(xb_now_ns() - t0) / (double)(batches * XB_LAYER_TENSORS);
  return true;
}

static void layers_glibc(uint64_t batches, double *ns) {
  void *t[XB_LAYER_TENSORS];
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < batches; i++) {
    for (size_t j = 0; j < XB_LAYER_TENSORS; j++) {
      t[j] = malloc(xb_layer_sizes[j]);
      XB_ESCAPE(t[j]);
    }
    for (size_t j = XB_LAYER_TENSORS; j-- > 0;) free(t[j]);
  }
  *ns = (double)(xb_now_ns() - t0) / (double)(batches * XB_LAYER_TENSORS);
}

static bool cached_layers(xb_micro *m, xseg_allocator *a, xb_cached_row *row) {
  double xs[64], gl[64];
  uint64_t batches = layer_batches(m->pairs);
  for (size_t r = 0; r < m->rounds; r++) {
    if (!layers_xseg(a, batches, &xs[r]))
      return cached_failed("cached-layers");
    layers_glibc(batches, &gl[r]);
  }
  *row = (xb_cached_row){"cached-layers", XB_LAYER_TENSORS,
                         batches * XB_LAYER_TENSORS,
                         xb_micro_median(xs, m->rounds),
                         xb_micro_median(gl, m->rounds)};
  return true;
}

/* Pools of `n` other streams in a, as a server with a stream per worker
   has (one block malloc'ed and freed on each): the cached path then runs
   as it does beside other streams' pools. */
static bool other_streams_open(xb_micro *m, xseg_allocator *a, uint64_t n,
                               struct CUstream_st **streams) {
  for (uint64_t i = 0; i < n; i++) {
    void *p;
    if (xb_env_stream_create(&m->env, &streams[i]) != XSEG_OK ||
        xseg_malloc(a, XB_REPEAT_SIZE, streams[i], &p) != XSEG_OK ||
        xseg_free(a, p) != XSEG_OK)
      return false;
  }
  return true;
}

bool xb_micro_cached(xb_micro *m, xb_cached_row *rows, size_t *n) {
  xseg_allocator *a;
  if (!xb_micro_allocator(m, &a)) return false;
  struct CUstream_st *others[XB_OTHER_STREAMS_MAX] = {NULL};
  bool ok = other_streams_open(m, a, m->other_streams, others);
  if (!ok)
    fprintf(stderr, "xseg-bench micro: --other-streams %llu: %s\n",
            (unsigned long long)m->other_streams, xseg_last_error());
  bool row_failed = false;
  if (ok && xb_micro_selected(m, "cached-repeat"))
    row_failed = !(ok = cached_repeat(m, a, &rows[(*n)++]));
  if (ok && xb_micro_selected(m, "cached-layers"))
    row_failed = !(ok = cached_layers(m, a, &rows[(*n)++]));
  for (uint64_t live = m->live_min;
       ok && live <= m->live_max && *n < XB_CACHED_ROWS - 1; live *= 10)
    if (xb_micro_selected(m, "cached-random"))
      row_failed = !(ok = cached_random(m, a, "cached-random", live,
                                        &rows[(*n)++]));
  if (ok && xb_micro_selected(m, "cached-mixed"))
    row_failed = !(ok = cached_random(m, a, "cached-mixed", m->mixed_live,
                                      &rows[(*n)++]));
  if (row_failed) (*n)--;
  xseg_destroy(a);
  for (uint64_t i = 0; i < m->other_streams; i++)
    if (others[i] != NULL) xb_env_stream_destroy(&m->env, others[i]);
  return ok;
}

