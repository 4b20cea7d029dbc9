/* shards.h: the allocator's statistics as shards (internal).
 *
 * Each pair of pools moves its own xs_stats under its own lock, and the
 * allocator keeps one more for what no pair owns (the counters of slow
 * operations, the totals of pairs that went away). A value read is the sum
 * of the shards; peaks are kept exact by thresholds (segments/stats.h):
 *
 *   - Any order of operations on one thread at a time: exact. The shards'
 *     thresholds sum to at most the recorded peak P, so as long as no
 *     shard passes its threshold the sum cannot pass P; the shard that
 *     passes it sums every current at that moment and raises P.
 *   - Operations running at once on several threads: a crossing reads the
 *     other shards' currents while their owners may be moving them, and a
 *     threshold it lowers may be seen late by its owner. The recorded peak
 *     is then at least the true one less what the other threads added
 *     while the crossing ran (each compares its shard with its threshold
 *     at every increase, so it can only build an unseen excess during
 *     that window; a crossing thread preempted there makes the window
 *     long, so the excess is bounded by the other shards' thresholds, not
 *     by one operation each). It is always at least what any one shard
 *     reached (each threshold is at most P), and never more than a sum of
 *     values that each shard really had. active and active_bytes (derived
 *     from allocation and what deferred frees hold, segments/stats.h) have
 *     the same bound: a malloc that runs at once with a free deferred on
 *     another pair does not see the hold, and active's peak can miss what
 *     that malloc added; a read then reports the current value as the
 *     peak, never less.
 *
 * Slack (P less the sum of currents) goes to the crossing shard; when the
 * others' thresholds leave it too little, each shard that moves on the
 * cached path gets its current plus an even share, and the allocator's
 * own shard (`rare`: moved only with every lock held) its current alone.
 * With one pair its thresholds are the peaks themselves, as before
 * sharding; two threads on two streams steady after a few crossings.
 */
#ifndef XS_SEGMENTS_SHARDS_H
#define XS_SEGMENTS_SHARDS_H

#include "vmm/lock.h"
#include "segments/stats.h"

typedef struct xs_stats_group {
  xs_lock lock;                 /* one crossing at a time; a leaf lock */
  int64_t peak[XS_STAT_SCOPES][XS_GAUGE_COUNT]; /* P; scope 0: all */
  xs_stats *first;              /* the shards */
  size_t n;
} xs_stats_group;

void xs_stats_group_init(xs_stats_group *g);
/* Adds zeroed shard s (every shard's lock held). */
void xs_stats_group_add(xs_stats_group *g, xs_stats *s);
/* Takes s out, its values added to `into` (a shard of the group), so that
   every sum and total stays (every shard's lock held). */
void xs_stats_group_remove(xs_stats_group *g, xs_stats *s, xs_stats *into);
/* The sum of the shards as a lone shard, peaks included (every shard's
   lock held). */
void xs_stats_sum(const xs_stats_group *g, xs_stats *out);
/* Current value of gauge g, all scope, summed (every shard's lock held). */
int64_t xs_stats_group_current(const xs_stats_group *g, xs_gauge gauge);
/* Every shard's thresholds sum to at most P, every current is at most its
   threshold unless it is crossing; false with the problem in msg. */
bool xs_stats_group_valid(const xs_stats_group *g, char *msg,
                          size_t msg_size);

#endif /* XS_SEGMENTS_SHARDS_H */
