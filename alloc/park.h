/* park.h: lazy merging's other half (segments/pool.h parks): the
 * statistics a park owes and the merge of parked blocks, inline because
 * the cached malloc and free run them. Every function here needs the
 * pair's lock (pairs.h).
 *
 * Two words, one meaning each:
 *   - a park *owes* the statistics of its free and of the merge it put
 *     off: they are *paid* (counted) later, or *cancelled* when the same
 *     request takes the block back; with several pairs what is owed is
 *     *published* in the shard (xs_stats.owed), so that other pairs'
 *     crossings sum true values;
 *   - a parked block *settles*: it merges as its free would have. (Frees
 *     that wait on events or other processes *complete*, deferred.h.)
 */
#ifndef XS_ALLOC_PARK_H
#define XS_ALLOC_PARK_H

#include <assert.h>

#include "alloc/types.h"
#include "alloc/account.h"
#include "alloc/pairs.h"

/* The gauges a park holds back: its free's three, its merge's two. */
#define XS_PARK_GAUGES(X)                                                    \
  X(allocation) X(allocated_bytes) X(requested_bytes) X(inactive_split)     \
  X(inactive_split_bytes)
/* Publishes what a park of block b (parkable, `requested` asked for) in
   pool kind k holds back in shard s: each gauge's current less its true
   value (segments/stats.h, owed). Its merge moves inactive_split from
   the rest (a piece: `rest` bytes) to the merged block (`whole` bytes, a
   piece unless 0: a whole segment). */
static inline void xs_park_owed_publish(xs_stats *s, xs_pool_kind k,
                                        const xs_block *b, size_t requested,
                                        size_t rest, size_t whole) {
  _Atomic int64_t *u = s->owed[k];
  xs_gv_set(&u[XS_GAUGE_allocation], 1);
  xs_gv_set(&u[XS_GAUGE_allocated_bytes], (int64_t)b->size);
  xs_gv_set(&u[XS_GAUGE_requested_bytes], (int64_t)requested);
  xs_gv_set(&u[XS_GAUGE_inactive_split], 1 - (int64_t)(whole != 0));
  xs_gv_set(&u[XS_GAUGE_inactive_split_bytes],
            (int64_t)rest - (int64_t)whole);
}
/* Clears it, before the currents move (a release fence after: a reader
   that sees a moved current sees it cleared). */
static inline void xs_park_owed_clear(xs_stats *s, xs_pool_kind k) {
#define XS_PARK_CLEAR_(name) xs_gv_set(&s->owed[k][XS_GAUGE_##name], 0);
  XS_PARK_GAUGES(XS_PARK_CLEAR_)
#undef XS_PARK_CLEAR_
  atomic_thread_fence(memory_order_release);
}
/* Whether the block parked in pool kind k may be taken back for its own
   requested size without posting first: its free's gauges, back at their
   current values, pass no threshold. With one pair nothing else moves
   the thresholds, so always; with more, another pair's crossing may have
   lowered them to the true values meanwhile. */
static inline bool xs_park_cancel_under(const xs_stream_pools *sp,
                                        xs_pool_kind k) {
  return !sp->park_owed_published ||
         (xs_stats_rise_under(&sp->stats, XS_GAUGE_allocation, k, 0) &&
          xs_stats_rise_under(&sp->stats, XS_GAUGE_allocated_bytes, k, 0) &&
          xs_stats_rise_under(&sp->stats, XS_GAUGE_requested_bytes, k, 0));
}
/* Holds back the stats of a park of b in pool p of pair sp (none held
   back yet): published when other pairs' crossings could read them
   (`several`). False when they must count at once (xs_park_owed_pay,
   once b is parked): held back, the merge would raise a true value above
   the shard's threshold, which only inactive_split_bytes can (by b's
   size, less the rest's when it makes a whole segment). Hidden there,
   the other shards could pass the recorded peak between them with none
   of them crossing, since their thresholds and this one sum to it.
   `kind` is p's, given apart so that a caller that knows it at compile
   time folds the stats' offsets; `first`: nothing is parked in p yet
   (xs_pool_park). */
static inline __attribute__((always_inline)) bool xs_park_owe(
    xs_stream_pools *sp, xs_pool *p, xs_pool_kind kind, const xs_block *b,
    bool several, bool first) {
  assert(sp->park_stats == NULL && "the last park counted first");
  assert(p->kind == kind);
  sp->park_stats = p;
  sp->park_requested = b->requested;
  sp->park_owed_published = several;
  if (!several) return true;
  const xs_block *last = xs_pool_run_last(p, b, first);
  size_t rest = xs_pool_merge_rest(b, last);
  size_t whole = xs_pool_merge_whole(b, last);
  xs_park_owed_publish(&sp->stats, kind, b, b->requested, rest, whole);
  return xs_stats_rise_under(&sp->stats, XS_GAUGE_inactive_split_bytes,
                             kind, (int64_t)whole - (int64_t)rest);
}
/* The take-back of sp's held-back park for its own requested size: the
   free and the malloc cancel, what was held back is posted as it is (and
   cleared before any current moves). `kind`: the parked pool's, as
   above. */
static inline void xs_park_owed_cancel(xs_stream_pools *sp,
                                         xs_pool_kind kind) {
  assert(sp->park_stats != NULL && sp->park_stats->kind == kind);
  if (sp->park_owed_published) xs_park_owed_clear(&sp->stats, kind);
  sp->park_stats = NULL;
  sp->park_owed_published = false;
}
/* Counts sp's last park (its free, then its merge) in the stats, if it
   is not yet: what it held back is cleared as at a take-back, then the
   currents move (the pool's kind given apart, as xs_park_owe's). */
static inline __attribute__((always_inline)) void xs_park_owed_pay_kind(
    xs_stream_pools *sp, xs_pool *p, xs_pool_kind kind) {
  xs_park_owed_cancel(sp, kind);
  xs_alloc_account_free(&sp->stats, kind, p->parked->size,
                        sp->park_requested);
  xs_pool_park_stats(p, &sp->stats, kind);
}
void xs_park_owed_pay_now(xs_stream_pools *sp);
static inline void xs_park_owed_pay(xs_stream_pools *sp) {
  if (sp->park_stats != NULL) xs_park_owed_pay_now(sp);
}
/* Merges p's parked blocks, if any, as their frees would have; their
   entries leave the pair's pointer table (entries after them may move). */
static inline void xs_park_settle_pool(xs_pool *p) {
  if (p->parked == NULL) return;
  xs_stream_pools *sp = xs_pools_of(p);
  for (xs_block *b = p->parked; b != p->park_rest; b = b->next) {
    size_t slot = xs_ptrtable_find(&sp->live, b->addr);
    assert(slot != SIZE_MAX && "a parked block keeps its entry");
    xs_ptrtable_remove_at(&sp->live, slot);
  }
  xs_park_owed_pay(sp);
  xs_pool_settle(p);
}
/* Merges every parked block of sp. */
static inline void xs_park_settle_pair(xs_stream_pools *sp) {
  if (!xs_pair_parked(sp)) return;
  xs_park_owed_pay(sp);
  for (int k = 0; k < 2; k++) xs_park_settle_pool(&sp->pool[k]);
}
/* Merges every parked block (pairs.c). */
void xs_park_settle_all_locked(xseg_allocator *a);

#endif /* XS_ALLOC_PARK_H */
