/* park.h: lazy merging's other half (segments/pool.h parks): the
 * statistics a park owes and the merge of parked blocks, inline because
 * the cached malloc and free run them. Every function here needs the
 * pair's lock (pairs.h), but xs_pairs_settle_all_locked, which needs
 * every lock.
 *
 * Two words, one meaning each:
 *   - a park *owes* the statistics of its free and of the merge it put
 *     off: they are *paid* (counted) later, or *cancelled* when the same
 *     request takes the block back; with several pairs what is owed is
 *     *published* in the shard (xs_stats.owed), so that other pairs'
 *     crossings sum true values;
 *   - a parked block *settles*: what the pair's parks owe is paid first
 *     (the statistics move in the order of the frees), then it merges as
 *     its free would have. (Frees that wait on events or other processes
 *     *complete*, deferred.h.)
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
/* Adds to what shard s holds back for pool kind k (segments/stats.h,
   owed: each gauge's current less its true value) what a park of block b
   (parkable, `requested` asked for) holds back, `sign` -1 taking it off
   again; `alone`: nothing else is held back (each value is 0), so that
   they are written, not added to. Its merge moves inactive_split from
   what follows b (a piece: `rest` bytes; 0 where the pool counts no
   pieces, segments/pool.h) to the merged block (`whole` bytes, a piece
   unless 0: a whole segment, or not counted). */
static inline __attribute__((always_inline)) void xs_park_owed_publish(
    xs_stats *s, xs_pool_kind k, const xs_block *b, size_t rest,
    size_t whole, int64_t sign, bool alone) {
  _Atomic int64_t *u = s->owed[k];
#define XS_PARK_PUBLISH_(gauge, value)                                       \
  (alone ? xs_gv_set(&u[XS_GAUGE_##gauge], sign * (value))                   \
         : (void)xs_gv_add(&u[XS_GAUGE_##gauge], sign * (value)))
  XS_PARK_PUBLISH_(allocation, 1);
  XS_PARK_PUBLISH_(allocated_bytes, (int64_t)b->size);
  XS_PARK_PUBLISH_(requested_bytes, (int64_t)b->requested);
  XS_PARK_PUBLISH_(inactive_split,
                   (int64_t)(rest != 0) - (int64_t)(whole != 0));
  XS_PARK_PUBLISH_(inactive_split_bytes, (int64_t)rest - (int64_t)whole);
#undef XS_PARK_PUBLISH_
}
/* Clears it, before the currents move (a release fence after: a reader
   that sees a moved current sees it cleared). */
static inline void xs_park_owed_clear(xs_stats *s, xs_pool_kind k) {
#define XS_PARK_CLEAR_(name) xs_gv_set(&s->owed[k][XS_GAUGE_##name], 0);
  XS_PARK_GAUGES(XS_PARK_CLEAR_)
#undef XS_PARK_CLEAR_
  atomic_thread_fence(memory_order_release);
}
/* How far the held-back merges of pool p's run raise inactive_split_bytes
   above its current value (types.h, park_held: the parks from
   park_oldest[kind] up to the top); 0 when none is held back. Only the
   top's merge can make a whole segment (nothing is before it), so every
   other merge adds its block's bytes. */
static inline int64_t xs_park_held_split_bytes(const xs_pair *pair,
                                               const xs_pool *p) {
  if ((pair->park_stats != p && pair->park_first != p) || !p->counts_split)
    return 0;
  const xs_block *top = p->parked, *last = p->park_rest;
  const xs_block *oldest = pair->park_oldest[p->kind];
  return (int64_t)xs_pool_merge_whole(p, top, last) -
         (int64_t)(xs_block_end(last) - xs_block_end(oldest));
}
/* Whether inactive_split_bytes of pool kind k, `up` above its current
   value and the other kind's `up_other` above its own, stays at or under
   both thresholds (xs_stats_rise_under with the other kind's held-back
   merges). */
static inline bool xs_park_split_under(const xs_stats *s, xs_pool_kind k,
                                       int64_t up, int64_t up_other) {
  const xs_gauge g = XS_GAUGE_inactive_split_bytes;
  int64_t pt = xs_gv_get(&s->pool[k][g].current) + up;
  return pt <= xs_gv_get(&s->pool[k][g].peak) &&
         pt + xs_gv_get(&s->pool[!k][g].current) + up_other <=
             xs_gv_get(&s->all[g].peak);
}
/* Whether the top of pool kind k may be taken back for its own requested
   size without paying first: its free's gauges, back at their current
   values, pass no threshold. With one pair nothing else moves the
   thresholds, so always; with more, another pair's crossing may have
   lowered them to the true values meanwhile. */
static inline bool xs_park_cancel_under(const xs_pair *pair,
                                        xs_pool_kind k) {
  return !pair->park_owed_published ||
         (xs_stats_rise_under(&pair->stats, XS_GAUGE_allocation, k, 0) &&
          xs_stats_rise_under(&pair->stats, XS_GAUGE_allocated_bytes, k, 0) &&
          xs_stats_rise_under(&pair->stats, XS_GAUGE_requested_bytes, k, 0));
}
/* Whether a park in pool p may hold its stats back: the held-back parks
   are undone newest first, so they keep the order of their frees in two
   runs at most, p's the newer: nothing is held back, or p's park is the
   newest, or only the other pool's are held. */
static inline bool xs_park_may_hold(const xs_pair *pair,
                                    const xs_pool *p) {
  return pair->park_stats == p || pair->park_first == NULL;
}
/* Holds back the stats of a park of b in pool p of `pair`, on top of
   those held back already (xs_park_may_hold): published when other
   pairs' crossings could read them (`several`); b keeps its requested
   size until they count. False when they must count at once
   (xs_park_owed_pay, once b is parked): held back, the merges would
   raise a true value above the shard's threshold, which only
   inactive_split_bytes can. Hidden there, the other shards could pass
   the recorded peak between them with none of them crossing, since their
   thresholds and this one sum to it. `kind` is p's, given apart so that
   a caller that knows it at compile time folds the stats' offsets;
   `first`: nothing is parked in p yet (xs_pool_park); `older`: other
   parks are held back (park_stats), as the caller read it. */
static inline __attribute__((always_inline)) bool xs_park_owe(
    xs_pair *pair, xs_pool *p, xs_pool_kind kind, xs_block *b,
    bool several, bool first, bool older) {
  assert(xs_park_may_hold(pair, p) && p->kind == kind &&
         older == (pair->park_stats != NULL) &&
         (older || pair->park_first == NULL));
  if (pair->park_stats != p) {            /* the first of p's held back */
    /* (park_first is NULL already when nothing is held back.) */
    if (older) pair->park_first = pair->park_stats;
    pair->park_stats = p;
    pair->park_oldest[kind] = b;
  }
  /* Pairs come and go with every lock held, which settles every park:
     the older ones were published, or not, as this one is. */
  assert(!older || pair->park_owed_published == several);
  pair->park_owed_published = several;
  if (!several) return true;
  const xs_block *last = xs_pool_run_last(p, b, first);
  size_t rest = xs_pool_merge_rest(p, b, last);
  size_t whole = xs_pool_merge_whole(p, b, last);
  xs_park_owed_publish(&pair->stats, kind, b, rest, whole, 1, !older);
  /* A merge into a whole segment (a classic one: only there are pieces
     counted) lowers inactive_split. Held back, the shard's current would
     stay above its true value, from which other pairs' crossings set
     thresholds: a take-back that raises it again to the current value
     could pass them unchecked (a peak under the current value), and a
     late count would replay a value the allocator no longer had. It
     counts at once. */
  if (whole == 0 && rest != 0) return false;
  if (!older)
    return xs_park_split_under(&pair->stats, kind,
                               (int64_t)whole - (int64_t)rest, 0);
  const xs_gauge g = XS_GAUGE_inactive_split_bytes;
  return xs_park_split_under(&pair->stats, kind,
                             -xs_gv_get(&pair->stats.owed[kind][g]),
                             -xs_gv_get(&pair->stats.owed[!kind][g]));
}
/* The take-back of the newest held-back park, the top of pool p (of
   `kind`, as above), for its own requested size: its free and the malloc
   cancel, what it held back is taken off what is published. */
static inline __attribute__((always_inline)) void xs_park_owed_cancel(
    xs_pair *pair, xs_pool *p, xs_pool_kind kind) {
  const xs_block *top = p->parked;
  assert(pair->park_stats == p && p->kind == kind);
  if (pair->park_owed_published) {
    const xs_block *last = p->park_rest;
    xs_park_owed_publish(&pair->stats, kind, top,
                         xs_pool_merge_rest(p, top, last),
                         xs_pool_merge_whole(p, top, last), -1, false);
  }
  if (top == pair->park_oldest[kind]) {   /* p's last held back */
    pair->park_stats = pair->park_first;
    pair->park_first = NULL;
  }
}
/* xs_park_owed_cancel when the top of p is the only park held back: it
   is the repeated size's, and its stats are all that is published. */
static inline __attribute__((always_inline)) void xs_park_owed_cancel_alone(
    xs_pair *pair, xs_pool *p, xs_pool_kind kind) {
  (void)p;
  assert(pair->park_stats == p && pair->park_first == NULL &&
         pair->park_oldest[kind] == p->parked && p->kind == kind);
  if (pair->park_owed_published) xs_park_owed_clear(&pair->stats, kind);
  pair->park_stats = NULL;
}
/* Counts every held-back park (its free, then its merge), in the order
   of their frees: what they held back is cleared first, then the
   currents move (pairs.c). */
void xs_park_owed_pay_now(xs_pair *pair);
static inline void xs_park_owed_pay(xs_pair *pair) {
  if (pair->park_stats != NULL) xs_park_owed_pay_now(pair);
}
/* Settles p's parked blocks, if any: everything the pair owes is paid
   (the other pool's parks too), then they merge as their frees would
   have; their entries leave the pair's pointer table (entries after them
   may move). */
static inline void xs_park_settle_pool(xs_pool *p) {
  if (p->parked == NULL) return;
  xs_pair *pair = xs_pool_pair(p);
  for (xs_block *b = p->parked; b != p->park_rest; b = b->next) {
    size_t slot = xs_ptrtable_find(&pair->live, b->addr);
    assert(slot != SIZE_MAX && "a parked block keeps its entry");
    xs_ptrtable_remove_at(&pair->live, slot);
  }
  xs_park_owed_pay(pair);
  xs_pool_settle(p);
}
/* Settles every parked block of `pair` (what it owes paid first). */
static inline void xs_park_settle_pair(xs_pair *pair) {
  if (!xs_pair_parked(pair)) return;
  xs_park_owed_pay(pair);
  for (int k = 0; k < 2; k++) xs_park_settle_pool(&pair->pool[k]);
}
/* Every lock held: settles every parked block of every pair (pairs.c). */
void xs_pairs_settle_all_locked(xseg_allocator *a);

#endif /* XS_ALLOC_PARK_H */
