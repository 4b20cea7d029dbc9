/* shards.c: sums and exact peaks of the statistics' shards (see
 * segments/shards.h for the scheme and its bound with several threads).
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "segments/shards.h"

void xs_stats_group_init(xs_stats_group *g) {
  memset(g, 0, sizeof *g);
  atomic_init(&g->lock.state, 0);
}

void xs_stats_group_add(xs_stats_group *g, xs_stats *s) {
  s->group = g;
  s->next_shard = g->first;
  g->first = s;
  g->n++;
}

static void shards_fold_val(xs_gauge_val *into, xs_gauge_val *from) {
  xs_gv_add(&into->current, xs_gv_get(&from->current)); /* 0 for all */
  /* Its threshold goes along: the sum of thresholds stays at most P, and
     the merged shard's current stays at most its threshold. */
  xs_gv_add(&into->peak, xs_gv_get(&from->peak));
  into->allocated += from->allocated;
}

/* Whether shard s holds anything back (segments/stats.h, owed): the
   first such kind and gauge in *kind and *gauge when asked. */
static bool shards_held_back(const xs_stats *s, int *kind, int *gauge) {
  for (int k = 0; k < 2; k++)
    for (int gg = 0; gg < XS_GAUGE_COUNT; gg++)
      if (xs_gv_get(&s->owed[k][gg]) != 0) {
        if (kind != NULL) *kind = k, *gauge = gg;
        return true;
      }
  return false;
}

void xs_stats_group_remove(xs_stats_group *g, xs_stats *s, xs_stats *into) {
  assert(!shards_held_back(s, NULL, NULL) && "what its parks owe paid");
  for (int gg = 0; gg < XS_GAUGE_COUNT; gg++) {
    shards_fold_val(&into->all[gg], &s->all[gg]);
    for (int k = 0; k < 2; k++)
      shards_fold_val(&into->pool[k][gg], &s->pool[k][gg]);
  }
  for (int c = 0; c < XS_COUNTER_COUNT; c++) into->counter[c] += s->counter[c];
  xs_stats **link = &g->first;
  while (*link != s) link = &(*link)->next_shard;
  *link = s->next_shard;
  g->n--;
  s->group = NULL;
}

void xs_stats_sum(const xs_stats_group *g, xs_stats *out) {
  memset(out, 0, sizeof *out);
  for (const xs_stats *s = g->first; s != NULL; s = s->next_shard) {
    for (int gg = 0; gg < XS_GAUGE_COUNT; gg++)
      for (int sc = 0; sc < XS_STAT_SCOPES; sc++) {
        const xs_gauge_val *v = xs_stats_val((xs_stats *)s, gg, sc);
        xs_gauge_val *o = xs_stats_val(out, gg, sc);
        xs_gv_add(&o->current, xs_gv_get(&v->current));  /* 0 for all */
        o->allocated += v->allocated;
      }
    for (int c = 0; c < XS_COUNTER_COUNT; c++) out->counter[c] += s->counter[c];
  }
  for (int gg = 0; gg < XS_GAUGE_COUNT; gg++)
    for (int sc = 0; sc < XS_STAT_SCOPES; sc++)
      xs_gv_set(&xs_stats_val(out, gg, sc)->peak, g->peak[sc][gg]);
}

int64_t xs_stats_group_current(const xs_stats_group *g, xs_gauge gauge) {
  int64_t sum = 0;
  for (const xs_stats *s = g->first; s != NULL; s = s->next_shard)
    sum += xs_stats_current(s, gauge);
  return sum;
}

/* Sum of the shards' currents of (gauge, scope). */
static int64_t shards_sum(const xs_stats_group *g, int gauge, int scope) {
  int64_t sum = 0;
  for (xs_stats *s = g->first; s != NULL; s = s->next_shard)
    sum += xs_stats_cur_true(s, gauge, scope);
  return sum;
}

void xs_stats_crossed(xs_stats *s, xs_gauge gauge, int scope, int64_t top) {
  xs_gauge_val *v = xs_stats_val(s, gauge, scope);
  xs_stats_group *g = s->group;
  if (g == NULL) {
    xs_gv_set(&v->peak, top);          /* a lone shard keeps its peak */
    return;
  }
  xs_lock_take(&g->lock);
  /* s's own current is true: its owner posts what it holds back before
     anything of it can cross. */
  int64_t cur = xs_stats_cur_true(s, gauge, scope);
  assert(cur == xs_stats_cur(s, gauge, scope));
  int64_t sum = shards_sum(g, gauge, scope) - cur + top;
  int64_t *peak = &g->peak[scope][gauge];
  if (sum > *peak) *peak = sum;
  /* s gets what the others' thresholds leave under P. When that is below
     its current, every shard gets its current, and the shards that move
     on the cached path an even share of the slack (rare ones none: they
     would hold it for nothing), so that a shard crossing after another
     does not take all of it back at once (two threads would otherwise
     cross in turn). */
  int64_t others = 0;
  for (xs_stats *t = g->first; t != NULL; t = t->next_shard)
    if (t != s) others += xs_gv_get(&xs_stats_val(t, gauge, scope)->peak);
  if (*peak - others < cur) {
    /* One reading of each current, for the thresholds and the slack alike:
       with other threads moving them, two readings could disagree and
       leave s a threshold below its current, or below 0. A sum of values
       read one by one may pass P (values never all there at once): P
       takes it, as shards.h's bound allows. */
    int64_t currents = cur, busy = !s->rare;
    for (xs_stats *t = g->first; t != NULL; t = t->next_shard) {
      if (t == s) continue;
      int64_t c = xs_stats_cur_true(t, gauge, scope);
      xs_gv_set(&xs_stats_val(t, gauge, scope)->peak, c);
      currents += c;
      busy += !t->rare;
    }
    if (currents > *peak) *peak = currents;
    int64_t share = busy > 0 ? (*peak - currents) / busy : 0;
    others = 0;
    for (xs_stats *t = g->first; t != NULL; t = t->next_shard) {
      if (t == s) continue;
      _Atomic int64_t *th = &xs_stats_val(t, gauge, scope)->peak;
      if (!t->rare) xs_gv_set(th, xs_gv_get(th) + share);
      others += xs_gv_get(th);
    }
  }
  xs_gv_set(&v->peak, *peak - others);
  xs_lock_drop(&g->lock);
}

static inline void shards_raise(int64_t *peak, int64_t value) {
  if (value > *peak) *peak = value;
}

void xs_stats_pending_peak(xs_stats *s, xs_pool_kind kind) {
  static const xs_gauge derived[2] = {XS_GAUGE_active, XS_GAUGE_active_bytes};
  const int scopes[2] = {kind + 1, XS_STAT_ALL};
  xs_stats_group *g = s->group;
  if (g == NULL) {
    for (int i = 0; i < 2; i++) {
      xs_gauge d = derived[i];
      int base = xs_stats_base(d);
      for (int j = 0; j < 2; j++) {
        xs_gauge_val *v = xs_stats_val(s, d, scopes[j]);
        int64_t now = xs_stats_cur(s, base, scopes[j]) +
                      xs_stats_cur(s, d, scopes[j]);
        if (now > xs_gv_get(&v->peak)) xs_gv_set(&v->peak, now);
      }
    }
    return;
  }
  /* Every malloc asks while a free is pending, on the cached path too,
     while other pairs move their shards: the group's lock, as a crossing's
     (the peaks are shared), and each shard's true values (what a park
     holds back is not active). One walk over the shards gathers the four
     sums (active and active_bytes, each its base plus what is held, in
     the pool's scope and all). */
  xs_lock_take(&g->lock);
  int64_t count_kind = 0, count_all = 0, bytes_kind = 0, bytes_all = 0;
  int in = kind + 1, out = 2 - kind;          /* the kinds' scopes */
  for (const xs_stats *t = g->first; t != NULL; t = t->next_shard) {
    int64_t ck = xs_stats_cur_true(t, XS_GAUGE_allocation, in) +
                 xs_stats_cur(t, XS_GAUGE_active, in);
    int64_t bk = xs_stats_cur_true(t, XS_GAUGE_allocated_bytes, in) +
                 xs_stats_cur(t, XS_GAUGE_active_bytes, in);
    count_kind += ck;
    bytes_kind += bk;
    count_all += ck + xs_stats_cur_true(t, XS_GAUGE_allocation, out) +
                 xs_stats_cur(t, XS_GAUGE_active, out);
    bytes_all += bk + xs_stats_cur_true(t, XS_GAUGE_allocated_bytes, out) +
                 xs_stats_cur(t, XS_GAUGE_active_bytes, out);
  }
  int64_t *in_kind = g->peak[kind + 1], *in_all = g->peak[XS_STAT_ALL];
  shards_raise(&in_kind[XS_GAUGE_active], count_kind);
  shards_raise(&in_all[XS_GAUGE_active], count_all);
  shards_raise(&in_kind[XS_GAUGE_active_bytes], bytes_kind);
  shards_raise(&in_all[XS_GAUGE_active_bytes], bytes_all);
  xs_lock_drop(&g->lock);
}

void xs_stats_reset_peaks(xs_stats *s) {
  xs_stats_group *g = s->group;
  for (int gg = 0; gg < XS_GAUGE_COUNT; gg++) {
    int base = xs_stats_base((xs_gauge)gg);
    for (int sc = 0; sc < XS_STAT_SCOPES; sc++) {
      if (g == NULL) {
        xs_gauge_val *v = xs_stats_val(s, gg, sc);
        xs_gv_set(&v->peak, xs_stats_cur(s, gg, sc) +
                                (base >= 0 ? xs_stats_cur(s, base, sc) : 0));
        continue;
      }
      g->peak[sc][gg] = shards_sum(g, gg, sc) +
                        (base >= 0 ? shards_sum(g, base, sc) : 0);
      for (xs_stats *t = g->first; t != NULL; t = t->next_shard)
        xs_gv_set(&xs_stats_val(t, gg, sc)->peak, xs_stats_cur(t, gg, sc));
    }
  }
}

bool xs_stats_group_valid(const xs_stats_group *g, char *msg,
                          size_t msg_size) {
  size_t n = 0;
  for (const xs_stats *s = g->first; s != NULL; s = s->next_shard) n++;
  if (n != g->n) {
    snprintf(msg, msg_size, "stats: %zu shards listed, %zu counted", n, g->n);
    return false;
  }
  /* Every park is paid when every lock is held: nothing held back. */
  for (const xs_stats *s = g->first; s != NULL; s = s->next_shard) {
    int k, gg;
    if (shards_held_back(s, &k, &gg)) {
      snprintf(msg, msg_size, "stats: a shard holds back %lld of gauge %d "
               "of pool %d with every park paid",
               (long long)xs_gv_get(&s->owed[k][gg]), gg, k);
      return false;
    }
  }
  /* A shard may be over its threshold (another thread's crossing lowered
     it meanwhile; its next increase crosses), but the thresholds never sum
     over the peak. */
  for (int gg = 0; gg < XS_GAUGE_COUNT; gg++) {
    if (xs_stats_base((xs_gauge)gg) >= 0) continue;  /* no thresholds */
    for (int sc = 0; sc < XS_STAT_SCOPES; sc++) {
      int64_t thresholds = 0;
      for (xs_stats *s = g->first; s != NULL; s = s->next_shard)
        thresholds += xs_gv_get(&xs_stats_val(s, gg, sc)->peak);
      if (thresholds > g->peak[sc][gg]) {
        snprintf(msg, msg_size, "stats: gauge %d scope %d: thresholds sum "
                 "to %lld, over the peak %lld", gg, sc,
                 (long long)thresholds, (long long)g->peak[sc][gg]);
        return false;
      }
    }
  }
  return true;
}
