/* pairs.c: the pairs of pools and the locks (see allocator.h).
 *
 * Lock order: the allocator's lock, then pairs in table order (creation
 * order), never the other way. The cached malloc and free hold one pair's
 * lock and nothing else; everything else takes them all. A pair created
 * meanwhile is born locked (its lock is dropped with the others), so a
 * thread that finds it in the newly published table waits for the
 * operation to end. Debug builds keep, per thread, what it holds and
 * assert the order.
 *
 * Recency: flow.c and the release passes walk the pairs most recently used
 * first. The cached malloc cannot relink a shared list, so it stamps its
 * pair with the calling thread's count of uses, and xs_alloc_lock sorts
 * the list by those stamps. On one thread that is the order relinking
 * gave; with several, the counts of different threads are not comparable
 * and the order between their pairs is a guess.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/allocator.h"
#include "vmm/error.h"

__thread xs_pairs_thread xs_pairs_tls;
static atomic_uint_fast64_t pairs_next_id = 1;

#ifndef NDEBUG
/* What the calling thread holds, for the lock order's asserts. */
static __thread struct {
  bool all;                     /* the allocator's lock */
  int pairs;                    /* pair locks */
  uint64_t last;                /* order of the last pair lock taken */
} pairs_held;
#endif

uint64_t xs_pairs_use(void) { return ++xs_pairs_tls.uses; }

uint64_t xs_pairs_new_id(void) {
  return atomic_fetch_add_explicit(&pairs_next_id, 1, memory_order_relaxed);
}

#ifndef NDEBUG
void xs_pair_held(xs_stream_pools *sp, bool taken) {
  if (taken) {
    assert(!pairs_held.all && pairs_held.pairs == 0 &&
           "lock order: the cached path holds one pair lock and nothing "
           "else");
    pairs_held.pairs = 1;
    pairs_held.last = sp->order;
    sp->owner = pthread_self();
    sp->owned = true;
    return;
  }
  assert(sp->owned && pthread_equal(sp->owner, pthread_self()));
  sp->owned = false;
  pairs_held.pairs = 0;
  pairs_held.last = 0;
}
#endif

/* segment_unmap entries for the trace. */
static void pairs_trace_unmap(void *ctx, const xs_pool *p, uint64_t addr,
                              size_t size) {
  xs_trace_record(ctx, XS_TRACE_SEGMENT_UNMAP, addr, size, p->stream);
}

static xs_pair_table *pairs_table(const xseg_allocator *a) {
  return atomic_load_explicit(&((xseg_allocator *)a)->pairs,
                              memory_order_acquire);
}

xs_stream_pools *xs_pairs_find_stream(xseg_allocator *a,
                                      struct CUstream_st *stream) {
  xs_pair_table *t = pairs_table(a);
  if (t == NULL) return NULL;
  /* A pair's stream and id never change once published; a stream's own
     pair never goes away before the allocator. */
  for (size_t i = 0; i < t->n; i++) {
    xs_stream_pools *sp = t->pair[i];
    if (sp->stream == stream && sp->private_id == 0) {
      xs_pairs_tls.id = a->id;
      xs_pairs_tls.stream = stream;
      xs_pairs_tls.pair = sp;
      return sp;
    }
  }
  return NULL;
}

/* The order of the last pair of the table xs_alloc_lock took (0: none):
   pairs above it were born during this operation. */
static uint64_t pairs_locked_top(const xseg_allocator *a) {
  const xs_pair_table *t = a->locked;
  return t != NULL && t->n != 0 ? t->pair[t->n - 1]->order : 0;
}

/* Publishes the pair table with sp added (add) or taken out; false on
   host OOM (nothing changed). The old table stays readable. */
static bool pairs_publish(xseg_allocator *a, xs_stream_pools *sp, bool add) {
  xs_pair_table *old = atomic_load_explicit(&a->pairs, memory_order_relaxed);
  size_t n = old != NULL ? old->n : 0;
  xs_pair_table *t = malloc(sizeof *t + (n + 1) * sizeof *t->pair);
  if (t == NULL) return false;
  t->retired = old;
  t->n = 0;
  for (size_t i = 0; i < n; i++)
    if (old->pair[i] != sp) t->pair[t->n++] = old->pair[i];
  if (add) t->pair[t->n++] = sp;      /* the newest: last in lock order */
  atomic_store_explicit(&a->pairs, t, memory_order_release);
  return true;
}

xs_stream_pools *xs_stream_pools_new_locked(xseg_allocator *a,
                                            struct CUstream_st *stream,
                                            xseg_pool_id private_id) {
  XS_ASSERT_LOCKED(a);
  size_t size = (sizeof(xs_stream_pools) + 63) / 64 * 64;
  xs_stream_pools *sp = aligned_alloc(64, size);
  if (sp == NULL) return NULL;
  memset(sp, 0, size);
  if (!xs_ptrtable_init(&sp->live)) {
    free(sp);
    return NULL;
  }
  /* Born locked: dropped with the others at xs_alloc_unlock. */
  atomic_init(&sp->lock.state, 1);
  sp->order = ++a->next_order;
  sp->stream = stream;
  sp->private_id = private_id;
  for (int k = 0; k < 2; k++) {
    xs_pool *p = &sp->pool[k];
    xs_pool_init(p, (xs_pool_kind)k, stream, &a->vmm, &sp->blocks,
                 &sp->stats);
    p->safe_epoch = 0;           /* the guard vouches for nothing yet */
    p->on_unmap = pairs_trace_unmap;
    p->on_unmap_ctx = &a->trace;
  }
  if (!pairs_publish(a, sp, true)) {
    xs_ptrtable_destroy(&sp->live);
    free(sp);
    return NULL;
  }
  xs_stats_group_add(&a->stats, &sp->stats);
  sp->used_at = xs_pairs_use();
  sp->next = a->streams;
  a->streams = sp;
  a->n_pairs++;
#ifndef NDEBUG
  sp->owner = pthread_self();
  sp->owned = true;
#endif
  return sp;
}

void xs_stream_pools_free_locked(xseg_allocator *a, xs_stream_pools *sp) {
  XS_ASSERT_LOCKED(a);
  assert(sp->pool[0].segments == NULL && sp->pool[1].segments == NULL);
  assert(sp->n_parked == 0 && sp->live.count == 0);
  xs_guard_drop(&sp->guard, &a->events);
  xs_stream_pools **link = &a->streams;
  while (*link != sp) link = &(*link)->next;
  *link = sp->next;
  /* On host OOM it stays in the table, dead: every reader checks. */
  bool unpublished = pairs_publish(a, sp, false);
  xs_stats_group_remove(&a->stats, &sp->stats, &a->shared_stats);
  a->frees_gone += sp->frees;
  xs_ptrtable_destroy(&sp->live);
  xs_blocks_destroy(&sp->blocks);
  sp->dead = true;
  sp->cached_off = true;
  a->n_pairs--;
  sp->next = a->dead;
  a->dead = sp;
  /* Born during this operation and in no table now: no unlock will see
     it, and a thread that found it in a table published meanwhile may
     wait on it. */
  if (unpublished && sp->order > pairs_locked_top(a)) {
#ifndef NDEBUG
    sp->owned = false;
#endif
    xs_lock_drop(&sp->lock);
  }
}

xseg_status xs_stream_pools_lookup_locked(xseg_allocator *a,
                                          struct CUstream_st *stream,
                                          xs_stream_pools **out) {
  xs_stream_pools **link = &a->streams;
  for (; *link != NULL; link = &(*link)->next)
    if ((*link)->stream == stream && (*link)->private_id == 0) break;
  xs_stream_pools *sp = *link;
  if (sp == NULL) {
    sp = xs_stream_pools_new_locked(a, stream, 0);
    if (sp == NULL)
      return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                      "out of host memory for the pools of stream %p",
                      (void *)stream);
  } else {
    sp->used_at = xs_pairs_use();
    if (sp != a->streams) {
      *link = sp->next;          /* most recently used goes first */
      sp->next = a->streams;
      a->streams = sp;
    }
  }
  *out = sp;
  return XSEG_OK;
}

xs_block *xs_alloc_find_live_locked(xseg_allocator *a, uint64_t addr,
                                    size_t *slot) {
  for (xs_stream_pools *sp = a->streams; sp != NULL; sp = sp->next) {
    size_t i = xs_ptrtable_find(&sp->live, addr);
    if (i != SIZE_MAX) {
      assert(sp->live.slot[i].block->allocated &&
             "every lock taken: nothing is parked");
      *slot = i;
      return sp->live.slot[i].block;
    }
  }
  return NULL;
}

uint64_t xs_alloc_frees_locked(const xseg_allocator *a) {
  uint64_t n = a->frees_gone;
  for (const xs_stream_pools *sp = a->streams; sp != NULL; sp = sp->next)
    n += sp->frees;
  return n;
}

size_t xs_alloc_live_count_locked(const xseg_allocator *a) {
  size_t n = 0;
  for (const xs_stream_pools *sp = a->streams; sp != NULL; sp = sp->next)
    n += sp->live.count;
  return n;
}

void xs_alloc_settle_locked(xseg_allocator *a) {
  for (xs_stream_pools *sp = a->streams; sp != NULL; sp = sp->next)
    xs_pair_settle(sp);
}

/* The list in recency order (see the top): an insertion sort, the list
   being short and mostly in order already. */
static void pairs_sort_by_use(xseg_allocator *a) {
  xs_stream_pools *sorted = NULL, *sp = a->streams;
  while (sp != NULL) {
    xs_stream_pools *next = sp->next, **link = &sorted;
    while (*link != NULL && (*link)->used_at >= sp->used_at)
      link = &(*link)->next;
    sp->next = *link;
    *link = sp;
    sp = next;
  }
  a->streams = sorted;
}

void xs_alloc_lock(xseg_allocator *a) {
#ifndef NDEBUG
  assert(!pairs_held.all && pairs_held.pairs == 0 &&
         "lock order: the allocator's lock is taken holding no other");
#endif
  xs_lock_take(&a->lock);
  xs_pair_table *t = atomic_load_explicit(&a->pairs, memory_order_relaxed);
  for (size_t i = 0; t != NULL && i < t->n; i++) {
#ifndef NDEBUG
    assert(t->pair[i]->order > pairs_held.last && "lock order: table order");
    pairs_held.last = t->pair[i]->order;
#endif
    xs_lock_take(&t->pair[i]->lock);
  }
  a->locked = t;
#ifndef NDEBUG
  pairs_held.all = true;
  a->owner = pthread_self();
  a->owned = true;
#endif
  xs_alloc_settle_locked(a);
  pairs_sort_by_use(a);
}

/* Whether the cached path must go the slow way (allocator.h). */
static bool pairs_slow(const xseg_allocator *a) {
  return xs_alloc_has_pending(a) || xs_alloc_capturing(a) || a->ipc != NULL ||
         a->trace.cap != 0;
}

static void pairs_unlock(xseg_allocator *a) {
  a->slow = pairs_slow(a);
  xs_ranges_refresh_locked(a);
  uint64_t top = pairs_locked_top(a);
  const xs_pair_table *t = a->locked, *now = pairs_table(a);
  for (size_t i = 0; now != NULL && i < now->n; i++)
    now->pair[i]->cached_off = a->slow || now->pair[i]->dead;
  a->locked = NULL;
#ifndef NDEBUG
  a->owned = false;
  pairs_held.all = false;
  pairs_held.last = 0;
  for (size_t i = 0; now != NULL && i < now->n; i++)
    now->pair[i]->owned = false;
#endif
  for (size_t i = 0; t != NULL && i < t->n; i++)
    xs_lock_drop(&t->pair[i]->lock);
  for (size_t i = 0; now != NULL && i < now->n; i++)
    if (now->pair[i]->order > top) xs_lock_drop(&now->pair[i]->lock);
  xs_lock_drop(&a->lock);
}

#ifndef NDEBUG
/* Whether this operation is one that XSEG_DEBUG_CHECK validates after. */
static bool pairs_debug_due(xseg_allocator *a) {
  if (a->debug_check_every == 0) return false;
  unsigned ops = atomic_fetch_add_explicit(&a->debug_ops, 1,
                                           memory_order_relaxed) + 1;
  return ops % a->debug_check_every == 0;
}

static void pairs_debug_check(xseg_allocator *a) {
  xs_alloc_settle_locked(a);
  xs_alloc_debug_check_locked(a);
}

void xs_alloc_debug_after_cached(xseg_allocator *a) {
  if (!pairs_debug_due(a)) return;
  xs_alloc_lock(a);
  pairs_debug_check(a);
  pairs_unlock(a);
}
#endif

void xs_alloc_unlock(xseg_allocator *a) {
#ifndef NDEBUG
  if (pairs_debug_due(a)) pairs_debug_check(a);
#endif
  pairs_unlock(a);
}

void xs_alloc_unlock_destroyed(xseg_allocator *a) {
  for (xs_stream_pools *sp = a->streams; sp != NULL;) {
    xs_stream_pools *next = sp->next;
    xs_ptrtable_destroy(&sp->live);
    xs_blocks_destroy(&sp->blocks);
    free(sp);
    sp = next;
  }
  a->streams = NULL;
  xs_pair_table *t = atomic_load_explicit(&a->pairs, memory_order_relaxed);
  while (t != NULL) {
    xs_pair_table *older = t->retired;
    free(t);
    t = older;
  }
  atomic_store_explicit(&a->pairs, NULL, memory_order_relaxed);
  while (a->dead != NULL) {
    xs_stream_pools *sp = a->dead;
    a->dead = sp->next;
    free(sp);
  }
  xs_ranges_destroy(a);
#ifndef NDEBUG
  a->owned = false;
  pairs_held.all = false;
  pairs_held.last = 0;
#endif
  xs_lock_drop(&a->lock);
}
