/* stats.h: the allocator's statistics, with PyTorch's names and meanings.
 *
 * Two X-macro lists, kept in the order of xseg_stats (include/xseg.h):
 *   gauges   rise and fall; each keeps current, peak, allocated (sum of
 *            increases) and freed (sum of decreases), for all pools and for
 *            the small and the large pool apart (PyTorch's StatType).
 *   counters only ever increase.
 * They are updated where the state changes (blocks and segments here, the
 * allocation counts in alloc/), each pool in its own shard under its own
 * lock (segments/shards.h sums them), and xseg_check compares every current
 * value with a walk of the blocks.
 *
 * Meanings, as PyTorch's memory_stats():
 *   allocation / allocated_bytes   blocks handed out and not freed (rounded)
 *   requested_bytes                the sizes callers asked for
 *   active / active_bytes          allocated, or freed but waiting on stream
 *                                  work (the same as allocated until the
 *                                  cross-stream layer defers frees)
 *   inactive_split(_bytes)         free mapped blocks that are a piece of a
 *                                  larger range (xs_block_is_split), of
 *                                  classic segments alone: as PyTorch,
 *                                  which leaves expandable segments out
 *                                  (any free granule of one can be
 *                                  unmapped; segments/pool.h,
 *                                  counts_split)
 *   segment                        reserved ranges (classic: cudaMalloc-like
 *                                  segments)
 *   reserved_bytes                 physical bytes mapped
 *   num_device_alloc / _free       physical allocations created / released
 */
#ifndef XS_SEGMENTS_STATS_H
#define XS_SEGMENTS_STATS_H

#include <assert.h>
#include <stdatomic.h>
#include <stdbool.h>
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

/* One gauge of one pool kind in one shard. `freed` is not stored: it is
   always allocated - current (both start at 0), so the hot path writes two
   words and compares one.

   Sharding: the allocator keeps one xs_stats per pair of pools (each under
   that pair's lock) and one of its own; a value read is the sum of the
   shards (segments/shards.c). A peak of a sum is not a sum of peaks, so in a
   shard that belongs to a group `peak` is a threshold t: the group keeps
   the true peak P of each gauge and scope, with the shards' thresholds
   summing to at most P. While every shard stays at or under its threshold
   the sum stays at or under P, so no peak is missed; a shard that passes
   its threshold calls xs_stats_crossed, which sums the currents, raises P
   if needed and hands the slack P - sum back as thresholds. A shard of no
   group (group NULL) keeps its own peak in `peak`, as before sharding.
   current and peak are read by other shards' crossings while their owner
   moves them: relaxed atomics, written with a plain load and store by the
   owner alone (no read-modify-write instruction). */
typedef struct xs_gauge_val {
  _Atomic int64_t current, peak;
  int64_t allocated;
} xs_gauge_val;

static inline int64_t xs_gv_get(const _Atomic int64_t *v) {
  return atomic_load_explicit(v, memory_order_relaxed);
}
static inline void xs_gv_set(_Atomic int64_t *v, int64_t x) {
  atomic_store_explicit(v, x, memory_order_relaxed);
}
/* The owner's update: one load, one store (no lock prefix). */
static inline int64_t xs_gv_add(_Atomic int64_t *v, int64_t d) {
  int64_t x = xs_gv_get(v) + d;
  xs_gv_set(v, x);
  return x;
}

struct xs_stats_group;

/* Kept per pool kind; the "all" scope keeps only its own peak (not the
   sum of the kinds' peaks): its current, allocated and freed are the
   kinds' summed when read (xs_stats_cur, xs_stats_get), so a decrease
   writes one word. Every malloc and free moves three gauges (active and
   active_bytes are derived, below), so an increase costs one add, two
   loads and two compares, a decrease one subtraction. */
typedef struct xs_stats {
  xs_gauge_val pool[2][XS_GAUGE_COUNT];
  xs_gauge_val all[XS_GAUGE_COUNT];      /* .peak alone used */
  int64_t counter[XS_COUNTER_COUNT];
  struct xs_stats_group *group;          /* NULL: a lone shard */
  struct xs_stats *next_shard;           /* in the group's list */
  bool rare;                             /* moves only on slow paths: no
                                            slack for it (segments/shards.c) */
  /* What the owner holds back (alloc/, a park whose free and merge count
     later): for each kind and gauge, the shard's current less its true
     value, 0 when nothing is held back. Other shards' crossings read the
     true values (xs_stats_cur_true); the owner clears these before it
     moves a current to post what they held (a release fence between), so
     that a reader that sees the new current sees them cleared. */
  _Atomic int64_t owed[2][XS_GAUGE_COUNT];
} xs_stats;

/* The true current of gauge g in `scope` of shard s, read by another
   shard's crossing while s's owner may move it: each kind's current, then
   (an acquire fence between) what it holds back, so that the value is
   one the shard really had (see `owed`). */
static inline int64_t xs_stats_cur_true(const xs_stats *s, int g,
                                          int scope);

/* Gauge g of scope `scope` (XS_STAT_ALL or kind + 1) of shard s went over
   its threshold, `top` being the shard's value (its current): raises the
   peak, resets thresholds (segments/shards.c; the lone shard's peak
   here). The caller holds s's own lock. */
void xs_stats_crossed(xs_stats *s, xs_gauge g, int scope, int64_t top);

static inline xs_gauge_val *xs_stats_val(xs_stats *s, xs_gauge g,
                                         int scope) {
  return scope == XS_STAT_ALL ? &s->all[g] : &s->pool[scope - 1][g];
}

/* The current value of gauge g in `scope`. */
static inline int64_t xs_stats_cur(const xs_stats *s, int g, int scope) {
  if (scope != XS_STAT_ALL) return xs_gv_get(&s->pool[scope - 1][g].current);
  return xs_gv_get(&s->pool[0][g].current) +
         xs_gv_get(&s->pool[1][g].current);
}

static inline int64_t xs_stats_cur_true(const xs_stats *s, int g,
                                          int scope) {
  int64_t cur = xs_stats_cur(s, g, scope);
  atomic_thread_fence(memory_order_acquire);
  if (scope != XS_STAT_ALL)
    return cur - xs_gv_get(&s->owed[scope - 1][g]);
  return cur - xs_gv_get(&s->owed[0][g]) - xs_gv_get(&s->owed[1][g]);
}

/* Raises gauge g of pool `kind` (and of all pools) by delta >= 0. */
static inline void xs_stats_inc(xs_stats *s, xs_gauge g, xs_pool_kind kind,
                                int64_t delta) {
  xs_gauge_val *p = &s->pool[kind][g], *a = &s->all[g];
  int64_t pc = xs_gv_add(&p->current, delta);
  p->allocated += delta;
  if (__builtin_expect(pc > xs_gv_get(&p->peak), 0))
    xs_stats_crossed(s, g, kind + 1, pc);
  int64_t ac = pc + xs_gv_get(&s->pool[!kind][g].current);
  if (__builtin_expect(ac > xs_gv_get(&a->peak), 0))
    xs_stats_crossed(s, g, XS_STAT_ALL, ac);
}

/* Lowers gauge g of pool `kind` (and of all pools) by delta >= 0. */
static inline void xs_stats_dec(xs_stats *s, xs_gauge g, xs_pool_kind kind,
                                int64_t delta) {
  xs_gv_add(&s->pool[kind][g].current, -delta);
}

/* The same as xs_stats_dec(out) then xs_stats_inc(in), in one pass: one
   block leaving an index and another entering it (a split or merge in
   place). The value in between is at most the current one, so only the
   end value can set a peak. */
static inline void xs_stats_swap(xs_stats *s, xs_gauge g, xs_pool_kind kind,
                                 int64_t out, int64_t in) {
  xs_gauge_val *p = &s->pool[kind][g], *a = &s->all[g];
  int64_t pc = xs_gv_add(&p->current, in - out);
  p->allocated += in;
  if (in > out) {
    int64_t ac = pc + xs_gv_get(&s->pool[!kind][g].current);
    if (pc > xs_gv_get(&p->peak)) xs_stats_crossed(s, g, kind + 1, pc);
    if (ac > xs_gv_get(&a->peak)) xs_stats_crossed(s, g, XS_STAT_ALL, ac);
  }
}

/* Whether gauge g of pool `kind`, `up` above its current value, stays at
   or under both thresholds, its scope's and all's: a rise to there passes
   no peak (up 0: a rise to the current value from below, as a take-back's;
   up > 0: the top of merges undone at once). A caller that must call nothing
   checks first, then moves without a check. Always inline: the repeated
   size's path asks it several times (measured: out of line there, 11
   instructions more per pair). */
static inline __attribute__((always_inline)) bool xs_stats_rise_under(
    const xs_stats *s, xs_gauge g, xs_pool_kind kind, int64_t up) {
  int64_t pt = xs_gv_get(&s->pool[kind][g].current) + up;
  return pt <= xs_gv_get(&s->pool[kind][g].peak) &&
         pt + xs_gv_get(&s->pool[!kind][g].current) <=
             xs_gv_get(&s->all[g].peak);
}

/* Moves gauge g of pool `kind` (and of all pools) by delta. */
static inline void xs_stats_move(xs_stats *s, xs_gauge g, xs_pool_kind kind,
                                 int64_t delta) {
  if (delta > 0)
    xs_stats_inc(s, g, kind, delta);
  else
    xs_stats_dec(s, g, kind, -delta);
}

/* Derived gauges. active and active_bytes are allocation and allocated_bytes
   plus what is pending: blocks freed by the caller but still in use on other
   streams (alloc/'s pending frees). Their slots keep only that difference
   (current: what is pending; allocated: active's increases other than a
   malloc's, less live increases that were not active's; peak: active's peak
   whenever it moved while something was pending), so that the cached path,
   which moves allocation and active together, moves only the first. The peak
   stays exact: active >= allocation always, and equals it while nothing is
   pending, so a peak reached then is allocation's peak, and one reached
   while something is pending is recorded by xs_stats_pending_peak at the
   malloc that reached it (a malloc is the only way active rises). With
   several threads at once, a malloc on one pair reads whether anything is
   pending before its moves, and a free deferred on another pair meanwhile is
   not seen: allocation's peak then misses active's new value by what that
   malloc added (the bound of segments/shards.h, for active). A read never
   reports a peak below the current value it reports (xs_stats_get): the
   current is one the allocator really had. */
static inline int xs_stats_base(xs_gauge g) {
  return g == XS_GAUGE_active         ? XS_GAUGE_allocation
         : g == XS_GAUGE_active_bytes ? XS_GAUGE_allocated_bytes
                                      : -1;
}

/* After a malloc of pool `kind` while something is pending (the caller
   knows: alloc/ counts pending blocks): active's peaks see the new value. In
   a group, the sums of every shard's (segments/shards.c; every shard's lock
   held). */
void xs_stats_pending_peak(xs_stats *s, xs_pool_kind kind);

/* Derived gauge g of pool `kind` when its base moves by `live` and active
   by `active` <= 0 (a malloc is active's only rise, and moves both):
   what is pending moves by the difference, and active's total of increases
   does not follow the base's. */
static inline void xs_stats_pending_move(xs_stats *s, xs_gauge g,
                                         xs_pool_kind kind, int64_t live,
                                         int64_t active) {
  assert(xs_stats_base(g) >= 0 && active <= 0);
  xs_gauge_val *p = &s->pool[kind][g];
  xs_gv_add(&p->current, active - live);
  if (live > 0) p->allocated -= live;
}

static inline int64_t xs_stats_current(const xs_stats *s, xs_gauge g) {
  int base = xs_stats_base(g);
  return xs_stats_cur(s, g, XS_STAT_ALL) +
         (base >= 0 ? xs_stats_cur(s, base, XS_STAT_ALL) : 0);
}

/* Gauge g in PyTorch's form for scope XS_STAT_ALL or kind + 1, derived
   gauges included, of a lone shard (a group's sum: xs_stats_sum). */
static inline xseg_stat xs_stats_get(const xs_stats *s, xs_gauge g,
                                     int scope) {
  const xs_gauge_val *v = scope == XS_STAT_ALL ? &s->all[g]
                                               : &s->pool[scope - 1][g];
  int64_t allocated = scope == XS_STAT_ALL
                          ? s->pool[0][g].allocated + s->pool[1][g].allocated
                          : v->allocated;
  xseg_stat out = {.current = xs_stats_cur(s, g, scope),
                   .peak = xs_gv_get(&v->peak), .allocated = allocated};
  int base = xs_stats_base(g);
  if (base >= 0) {
    xseg_stat b = xs_stats_get(s, (xs_gauge)base, scope);
    out.current += b.current;
    out.allocated += b.allocated;
    if (b.peak > out.peak) out.peak = b.peak;
    /* A peak missed by a malloc that ran at once with a deferred free
       (above): the value now is at least a true one. */
    if (out.current > out.peak) out.peak = out.current;
  }
  out.freed = out.allocated - out.current;
  return out;
}

/* xseg_reset_peak_stats: every peak becomes the current value (in a
   group: of the sums, every shard's lock held; segments/shards.c). */
void xs_stats_reset_peaks(xs_stats *s);

#endif /* XS_SEGMENTS_STATS_H */
