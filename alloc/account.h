/* account.h: the allocator's moves of its statistics (segments/stats.h)
 * for a block that becomes live, stops being live or stops being active.
 */
#ifndef XS_ALLOC_ACCOUNT_H
#define XS_ALLOC_ACCOUNT_H

#include "alloc/types.h"

/* The lock of the shard's pair held: the stats of a block of `size`
   bytes, `requested` asked for, that stops being live (pool `kind`,
   shard s): allocation and its bytes fall. */
static inline void xs_alloc_account_free(xs_stats *s, xs_pool_kind kind,
                                         size_t size, size_t requested) {
  xs_stats_dec(s, XS_GAUGE_allocation, kind, 1);
  xs_stats_dec(s, XS_GAUGE_allocated_bytes, kind, (int64_t)size);
  xs_stats_dec(s, XS_GAUGE_requested_bytes, kind, (int64_t)requested);
}
/* A summed value of the statistics (every lock held). */
static inline int64_t xs_alloc_current(const xseg_allocator *a, xs_gauge g) {
  return xs_stats_group_current(&a->stats, g);
}

/* The block's pair lock held: stats of a block becoming live (+1) or no
   longer live (-1) for the caller (allocation, allocated and requested
   bytes), and active (+1/-1) until its memory may really be reused (active,
   active_bytes). */
static inline void xs_alloc_account_live(const xs_block *b, int sign) {
  xs_pool_kind k = b->seg->pool->kind;
  xs_stats *s = b->seg->pool->stats;
  xs_stats_move(s, XS_GAUGE_allocation, k, sign);
  xs_stats_move(s, XS_GAUGE_allocated_bytes, k, sign * (int64_t)b->size);
  xs_stats_move(s, XS_GAUGE_requested_bytes, k, sign * (int64_t)b->requested);
  /* active stays: it is derived from allocation (segments/stats.h). */
  xs_stats_pending_move(s, XS_GAUGE_active, k, sign, 0);
  xs_stats_pending_move(s, XS_GAUGE_active_bytes, k, sign * (int64_t)b->size,
                        0);
}
/* The block's pair lock held: active (+1/-1) alone. */
static inline void xs_alloc_account_active(const xs_block *b, int sign) {
  xs_pool_kind k = b->seg->pool->kind;
  xs_stats *s = b->seg->pool->stats;
  xs_stats_pending_move(s, XS_GAUGE_active, k, 0, sign);
  xs_stats_pending_move(s, XS_GAUGE_active_bytes, k, 0,
                        sign * (int64_t)b->size);
}

#endif /* XS_ALLOC_ACCOUNT_H */
