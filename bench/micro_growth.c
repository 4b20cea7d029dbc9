/* micro_growth.c: the growth path of `xseg-bench micro`.
 *
 * A fresh allocator takes blocks of random sizes in [min, max] until
 * `total` bytes are live, so every byte it maps is new; the VMM calls that
 * cost (the emulator's counters, or vmm's on a GPU) are divided by the GiB
 * it reserved.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "micro.h"

static uint64_t growth_rng(uint64_t *s) {   /* xorshift64 */
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static uint64_t growth_vmm_calls(xb_env *env) {
  uint64_t n = 0;
  for (int f = 0; f < XS_DRIVER_FN_COUNT; f++)
    if (xb_fn_is_vmm((xs_driver_fn)f))
      n += xb_env_call_count(env, (xs_driver_fn)f);
  return n;
}

/* Allocates until `total` bytes are live; the pointers go to *ptrs. */
static bool growth_fill(xseg_allocator *a, uint64_t min, uint64_t max,
                        uint64_t total, void ***ptrs, uint64_t *n,
                        uint64_t *ns) {
  uint64_t cap = 1024, seed = 0x2545f4914f6cdd1dull, live = 0;
  *ptrs = malloc(cap * sizeof **ptrs);
  *n = *ns = 0;
  while (*ptrs != NULL && live < total) {
    if (*n == cap) {
      void **p = realloc(*ptrs, (cap *= 2) * sizeof *p);
      if (p == NULL) return false;
      *ptrs = p;
    }
    uint64_t size = min + growth_rng(&seed) % (max - min + 1);
    uint64_t t0 = xb_now_ns();
    if (xseg_malloc(a, size, NULL, &(*ptrs)[*n]) != XSEG_OK) return false;
    *ns += xb_now_ns() - t0;
    (*n)++;
    live += size;
  }
  return *ptrs != NULL;
}

bool xb_micro_growth(xb_micro *m, const char *name, uint64_t min_size,
                     uint64_t max_size, uint64_t total, xb_growth_row *row) {
  xseg_allocator *a;
  xb_env_reset_counts(&m->env);
  if (!xb_micro_allocator(m, &a)) return false;
  void **ptrs = NULL;
  uint64_t n = 0, ns = 0;
  bool ok = growth_fill(a, min_size, max_size, total, &ptrs, &n, &ns);
  xseg_stats s;
  ok = ok && xseg_get_stats(a, &s) == XSEG_OK;
  if (ok) {
    uint64_t calls = growth_vmm_calls(&m->env);
    double gib = (double)s.reserved_bytes.peak / (double)(1ull << 30);
    *row = (xb_growth_row){name, n, (uint64_t)s.reserved_bytes.peak, calls,
                           gib > 0 ? (double)calls / gib : 0.0,
                           n ? (double)ns / (double)n : 0.0};
  } else {
    fprintf(stderr, "xseg-bench micro: %s failed after %llu mallocs: %s\n",
            name, (unsigned long long)n, xseg_last_error());
  }
  for (uint64_t i = 0; ptrs != NULL && i < n; i++) xseg_free(a, ptrs[i]);
  free(ptrs);
  xseg_destroy(a);
  return ok;
}
