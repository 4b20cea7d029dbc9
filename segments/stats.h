/* stats.h: the allocator's statistics, with PyTorch's names and meanings.
 *
 * Two X-macro lists, kept in the order of xseg_stats (include/xseg.h):
 *   gauges   rise and fall; each keeps current, peak, allocated (sum of
 *            increases) and freed (sum of decreases), for all pools and for
 *            the small and the large pool apart (PyTorch's StatType).
 *   counters only ever increase.
 * They are updated where the state changes (blocks and segments here, the
 * allocation counts in alloc/), under the allocator's mutex, and xseg_check
 * compares every current value with a walk of the blocks.
 *
 * Meanings, as PyTorch's memory_stats():
 *   allocation / allocated_bytes   blocks handed out and not freed (rounded)
 *   requested_bytes                the sizes callers asked for
 *   active / active_bytes          allocated, or freed but waiting on stream
 *                                  work (the same as allocated until the
 *                                  cross-stream layer defers frees)
 *   inactive_split(_bytes)         free mapped blocks that are a piece of a
 *                                  larger range (xs_block_is_split)
 *   segment                        reserved ranges (classic: cudaMalloc-like
 *                                  segments)
 *   reserved_bytes                 physical bytes mapped
 *   num_device_alloc / _free       physical allocations created / released
 */
#ifndef XS_SEGMENTS_STATS_H
#define XS_SEGMENTS_STATS_H

#include <stdint.h>

#include "xseg.h"

#define XS_STAT_GAUGES(X)                                                    \
  X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes)    \
  X(reserved_bytes) X(active_bytes) X(inactive_split_bytes) X(requested_bytes)

#define XS_STAT_COUNTERS(X)                                                  \
  X(num_alloc_retries) X(num_ooms) X(num_sync_all_streams)                   \
  X(num_device_alloc) X(num_device_free)

typedef enum xs_gauge {
#define XS_GAUGE_ENUM_(name) XS_GAUGE_##name,
  XS_STAT_GAUGES(XS_GAUGE_ENUM_)
#undef XS_GAUGE_ENUM_
  XS_GAUGE_COUNT
} xs_gauge;

typedef enum xs_counter {
#define XS_COUNTER_ENUM_(name) XS_COUNTER_##name,
  XS_STAT_COUNTERS(XS_COUNTER_ENUM_)
#undef XS_COUNTER_ENUM_
  XS_COUNTER_COUNT
} xs_counter;

/* The pools: small (requests <= 1 MiB) and large. Stat index = kind + 1. */
typedef enum xs_pool_kind { XS_POOL_SMALL = 0, XS_POOL_LARGE = 1 } xs_pool_kind;
enum { XS_STAT_ALL = 0, XS_STAT_SCOPES = 3 };

typedef struct xs_stats {
  xseg_stat gauge[XS_GAUGE_COUNT][XS_STAT_SCOPES];
  int64_t counter[XS_COUNTER_COUNT];
} xs_stats;

static inline void xs_stat_move(xseg_stat *s, int64_t delta) {
  s->current += delta;
  if (delta > 0) {
    s->allocated += delta;
    if (s->current > s->peak) s->peak = s->current;
  } else {
    s->freed -= delta;
  }
}

/* Moves gauge g of pool `kind` (and of all pools) by delta. */
static inline void xs_stats_move(xs_stats *s, xs_gauge g, xs_pool_kind kind,
                                 int64_t delta) {
  xs_stat_move(&s->gauge[g][XS_STAT_ALL], delta);
  xs_stat_move(&s->gauge[g][kind + 1], delta);
}

static inline int64_t xs_stats_current(const xs_stats *s, xs_gauge g) {
  return s->gauge[g][XS_STAT_ALL].current;
}

#endif /* XS_SEGMENTS_STATS_H */
