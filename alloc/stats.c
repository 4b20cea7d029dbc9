/* stats.c: xseg_get_stats, xseg_reset_peak_stats and xseg_stats_json, all
 * generated from the X-macro lists of segments/stats.h, so that a stat
 * added there appears everywhere under PyTorch's name. Each reads the sum
 * of the shards (segments/shards.h).
 */
#include <string.h>

#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "vmm/error.h"

xseg_status xseg_get_stats(xseg_allocator *a, xseg_stats *out) {
  if (a == NULL || out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_get_stats: %s is NULL",
                    a == NULL ? "allocator" : "out");
  memset(out, 0, sizeof *out);
  xs_stats s;
  xs_alloc_enter(a);
  xs_stats_sum(&a->stats, &s);
  out->pending_free_bytes = atomic_load(&a->pending_bytes);
  out->handles_awaiting_release = (int64_t)a->vmm.n_unreleased;
  xs_alloc_leave(a);
#define XS_STATS_GAUGE_(name)                                                \
  out->name = xs_stats_get(&s, XS_GAUGE_##name, XS_STAT_ALL);
  XS_STAT_GAUGES(XS_STATS_GAUGE_)
#undef XS_STATS_GAUGE_
#define XS_STATS_COUNTER_(name) out->name = s.counter[XS_COUNTER_##name];
  XS_STAT_COUNTERS(XS_STATS_COUNTER_)
#undef XS_STATS_COUNTER_
  out->mapped_bytes = out->reserved_bytes.current;
  return XSEG_OK;
}

xseg_status xseg_reset_peak_stats(xseg_allocator *a) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_reset_peak_stats: allocator is NULL");
  xs_alloc_enter(a);
  xs_stats_reset_peaks(&a->shared_stats);   /* resets the whole group */
  xs_alloc_leave(a);
  return XSEG_OK;
}

static const char *const stats_gauge_names[XS_GAUGE_COUNT] = {
#define XS_STATS_NAME_(name) #name,
    XS_STAT_GAUGES(XS_STATS_NAME_)
#undef XS_STATS_NAME_
};
static const char *const stats_counter_names[XS_COUNTER_COUNT] = {
#define XS_STATS_NAME_(name) #name,
    XS_STAT_COUNTERS(XS_STATS_NAME_)
#undef XS_STATS_NAME_
};
/* PyTorch's StatType names, in xs_stats scope order. */
static const char *const stats_scope_names[XS_STAT_SCOPES] = {
    "all", "small_pool", "large_pool"};

static void stats_json_gauge(FILE *out, const xs_stats *s, int g) {
  for (int sc = 0; sc < XS_STAT_SCOPES; sc++) {
    xseg_stat st = xs_stats_get(s, (xs_gauge)g, sc);
    const xseg_stat *v = &st;
    const char *n = stats_gauge_names[g], *scope = stats_scope_names[sc];
    fprintf(out,
            "  \"%s.%s.current\": %lld,\n  \"%s.%s.peak\": %lld,\n"
            "  \"%s.%s.allocated\": %lld,\n  \"%s.%s.freed\": %lld,\n",
            n, scope, (long long)v->current, n, scope, (long long)v->peak, n,
            scope, (long long)v->allocated, n, scope, (long long)v->freed);
  }
}

xseg_status xseg_stats_json(xseg_allocator *a, FILE *out) {
  if (a == NULL || out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_stats_json: %s is NULL",
                    a == NULL ? "allocator" : "out");
  xs_stats s;
  xs_alloc_enter(a);
  xs_stats_sum(&a->stats, &s);
  size_t max_split = a->cfg.max_split_size;
  xseg_ipc_stats ipc;
  xs_ipc_stats_locked(a, &ipc);
  size_t unreleased = a->vmm.n_unreleased;
  xs_alloc_leave(a);
  fputs("{\n", out);
  for (int g = 0; g < XS_GAUGE_COUNT; g++) stats_json_gauge(out, &s, g);
  for (int c = 0; c < XS_COUNTER_COUNT; c++)
    fprintf(out, "  \"%s\": %lld,\n", stats_counter_names[c],
            (long long)s.counter[c]);
  /* xseg's own: blocks shared with other processes (xseg_ipc_get_stats). */
  fprintf(out,
          "  \"ipc.exported_blocks\": %lld,\n  \"ipc.exported_total\": %lld,\n"
          "  \"ipc.open_by_others\": %lld,\n  \"ipc.pending_on_others\": "
          "%lld,\n  \"ipc.reclaimed\": %lld,\n  \"ipc.opened_blocks\": "
          "%lld,\n  \"ipc.opened_total\": %lld,\n",
          (long long)ipc.exported_blocks, (long long)ipc.exported_total,
          (long long)ipc.open_by_others, (long long)ipc.pending_on_others,
          (long long)ipc.reclaimed, (long long)ipc.opened_blocks,
          (long long)ipc.opened_total);
  fprintf(out, "  \"handles_awaiting_release\": %zu,\n", unreleased);
  /* PyTorch casts SIZE_MAX (unset) to int64: -1. */
  fprintf(out, "  \"max_split_size\": %lld\n}\n",
          max_split == SIZE_MAX ? -1LL : (long long)max_split);
  if (ferror(out))
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_stats_json: writing the stats failed");
  return XSEG_OK;
}
