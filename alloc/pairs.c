/* pairs.c: the pairs of pools and the locks (see pairs.h).
 *
 * Lock order: the allocator's lock, then pairs in creation order (the
 * `order` array), never the other way. The cached malloc and free hold one
 * pair's lock and nothing else; everything else takes them all. A pair
 * created meanwhile is born locked (its lock is dropped with the others),
 * so a thread that finds it in the stream index or the range table waits
 * for the operation to end. Debug builds keep, per thread, what it holds
 * and assert the order.
 *
 * Pairs that go away (private pools released) are recycled, never freed
 * before xseg_destroy: a thread may have read one from the range table and
 * be about to take its lock. Whoever takes the lock of a pair finds it
 * either dead (and goes the slow way) or alive as whatever pair it now is,
 * whose pointer table decides whether an address is its block. The pair
 * that recycles it takes its lock like such a thread does (after every
 * other, as the newest pair is last in lock order) and keeps the lock word
 * through the reset.
 *
 * Recency: flow.c and the release passes walk the pairs most recently used
 * first. The cached malloc cannot relink a shared list, so it stamps its
 * pair with the calling thread's count of uses, and xs_alloc_enter sorts
 * the list by those stamps. On one thread that is the order relinking
 * gave; with several, the counts of different threads are not comparable
 * and the order between their pairs is a guess.
 */
#include <assert.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/pairs.h"
#include "alloc/park.h"
#include "alloc/ranges.h"
#include "alloc/thread.h"
#include "alloc/types.h"
#include "vmm/array.h"
#include "vmm/error.h"

static atomic_uint_fast64_t pairs_next_id = 1;

#ifndef NDEBUG
/* What the calling thread holds, for the lock order's asserts. */
static __thread struct {
  bool all;                     /* the allocator's lock */
  int pairs;                    /* pair locks */
  uint64_t last;                /* order of the last pair lock taken */
} pairs_held;
#endif

uint64_t xs_pairs_new_id(void) {
  return atomic_fetch_add_explicit(&pairs_next_id, 1, memory_order_relaxed);
}

#ifndef NDEBUG
void xs_pair_held(xs_pair *pair, bool taken, int nth) {
  assert((nth == 1 || nth == 2) && !pairs_held.all);
  if (taken) {
    assert(pairs_held.pairs == nth - 1 &&
           "lock order: the cached path holds one pair lock and nothing "
           "else, and a second one only beside it, by a try");
    pairs_held.pairs = nth;
    if (nth == 1) pairs_held.last = pair->order;
    pair->owner = pthread_self();
    pair->owned = true;
    return;
  }
  assert(pair->owned && pthread_equal(pair->owner, pthread_self()) &&
         (nth == 1 || pairs_held.pairs == 2));
  pair->owned = false;
  pairs_held.pairs = nth - 1;
  if (nth == 1) pairs_held.last = 0;
}
#endif

/* The trace's entry for memory that leaves a pool: segment_unmap, or
   segment_free for a classic segment (always released whole), as
   PyTorch's release_block records for its cudaFree. */
static void pairs_trace_unmap(void *ctx, const xs_pool *p, uint64_t addr,
                              size_t size) {
  xseg_allocator *a = ctx;
  xs_trace_record(&a->trace,
                  a->cfg.expandable_segments ? XS_TRACE_SEGMENT_UNMAP
                                             : XS_TRACE_SEGMENT_FREE,
                  addr, size, p->stream);
}

xs_pair *xs_pairs_find_stream(xseg_allocator *a,
                              struct CUstream_st *stream) {
  xs_stream_index *x =
      atomic_load_explicit(&a->stream_index, memory_order_acquire);
  if (x == NULL) return NULL;
  size_t n = atomic_load_explicit(&x->n, memory_order_acquire);
  for (size_t i = 0; i < n; i++) {
    if (x->entry[i].stream == stream) {
      xs_pair *pair = x->entry[i].pair;
      xs_pairs_tls.id = a->id;
      xs_pairs_tls.stream = stream;
      xs_pairs_tls.pair = pair;
      return pair;
    }
  }
  return NULL;
}

/* Adds a stream's pair to the stream index; false on host OOM (nothing
   changed). */
static bool pairs_index_stream_locked(xseg_allocator *a, xs_pair *pair) {
  xs_stream_index *x =
      atomic_load_explicit(&a->stream_index, memory_order_relaxed);
  size_t n = x != NULL ? atomic_load_explicit(&x->n, memory_order_relaxed)
                       : 0;
  if (x == NULL || n == x->cap) {
    size_t cap = x != NULL ? 2 * x->cap : 8;
    xs_stream_index *y = malloc(sizeof *y + cap * sizeof *y->entry);
    if (y == NULL) return false;
    y->retired = x;
    y->cap = cap;
    if (n != 0) memcpy(y->entry, x->entry, n * sizeof *x->entry);
    atomic_init(&y->n, n);
    atomic_store_explicit(&a->stream_index, y, memory_order_release);
    x = y;
  }
  x->entry[n] = (xs_stream_entry){pair->stream, pair};
  atomic_store_explicit(&x->n, n + 1, memory_order_release);
  return true;
}

/* A pair's memory: a spare one, its lock taken (a thread that found it
   gone may still hold it), everything but the lock reset; or a new one,
   its lock held. NULL on host OOM. */
_Static_assert(offsetof(xs_pair, lock) == 0 &&
                   offsetof(xs_pair, dead) >= sizeof(xs_lock),
               "a spare pair's reset keeps its lock: the lock comes first");

static xs_pair *pairs_memory_locked(xseg_allocator *a) {
  xs_pair *pair = a->spare;
  if (pair != NULL) {
    assert(pair->dead);
    a->spare = pair->next;
    xs_lock_take(&pair->lock);
    memset((char *)pair + offsetof(xs_pair, dead), 0,
           sizeof *pair - offsetof(xs_pair, dead));
    return pair;
  }
  pair = xs_lines_alloc(sizeof *pair);
  if (pair == NULL) return NULL;
  memset(pair, 0, sizeof *pair);
  atomic_init(&pair->lock.state, 1);
  a->pair_structs++;
  return pair;
}

/* Gives back what pairs_memory_locked gave when the pair could not be made. */
static void pairs_memory_back_locked(xseg_allocator *a, xs_pair *pair) {
  pair->dead = true;
  pair->next = a->spare;
  a->spare = pair;
  xs_lock_drop(&pair->lock);
}

/* xs_pairs_new_locked's pair once the stream is allowed: NULL on host
   OOM. */
static xs_pair *pairs_new_locked(xseg_allocator *a,
                                 struct CUstream_st *stream,
                                 xseg_pool_id private_id) {
  XS_ASSERT_LOCKED(a);
  if (!XS_ARRAY_RESERVE(a->order, a->order_cap, a->n_order + 1, 8))
    return NULL;
  xs_pair *pair = pairs_memory_locked(a);
  if (pair == NULL) return NULL;
  /* Born locked: dropped with the others at xs_alloc_leave. */
  pair->stream = stream;
  pair->private_id = private_id;
  if (!xs_ptrtable_init(&pair->live)) {
    pairs_memory_back_locked(a, pair);
    return NULL;
  }
  if (private_id == 0 && !pairs_index_stream_locked(a, pair)) {
    xs_ptrtable_destroy(&pair->live);
    pairs_memory_back_locked(a, pair);
    return NULL;
  }
  pair->order = ++a->next_order;
  a->order[a->n_order++] = pair;        /* the newest: last in lock order */
  for (int k = 0; k < 2; k++) {
    xs_pool *p = &pair->pool[k];
    xs_pool_init(p, (xs_pool_kind)k, stream, &a->vmm, &pair->blocks,
                 &pair->stats, pair->bins[k]);
    p->safe_epoch = 0;           /* the guard vouches for nothing yet */
    /* inactive_split as PyTorch's: classic segments alone. */
    p->counts_split = !a->cfg.expandable_segments;
    p->on_unmap = pairs_trace_unmap;
    p->on_unmap_ctx = a;
  }
  xs_stats_group_add(&a->stats, &pair->stats);
  xs_event_pool_init(&pair->events, &a->vmm);
  xs_pending_init(&pair->pending, &pair->events);
  pair->used_at = xs_pairs_use();
  pair->next = a->streams;
  a->streams = pair;
  a->n_pairs++;
#ifndef NDEBUG
  pair->owner = pthread_self();
  pair->owned = true;
#endif
  return pair;
}

xseg_status xs_pairs_new_locked(xseg_allocator *a, const char *what,
                                struct CUstream_st *stream,
                                xseg_pool_id private_id, xs_pair **out) {
  xseg_status st = xs_vmm_stream_allocates(&a->vmm, what, stream);
  if (st != XSEG_OK) return st;
  *out = pairs_new_locked(a, stream, private_id);
  if (*out != NULL) return XSEG_OK;
  if (private_id != 0)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for private pool %llu",
                    (unsigned long long)private_id);
  return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                  "out of host memory for the pools of stream %p",
                  (void *)stream);
}

void xs_pairs_free_locked(xseg_allocator *a, xs_pair *pair) {
  XS_ASSERT_LOCKED(a);
  assert(pair->private_id != 0 && "a stream's own pair stays (stream index)");
  assert(pair->pool[0].segments == NULL && pair->pool[1].segments == NULL);
  assert(!xs_pair_parked(pair) && pair->live.count == 0);
  xs_guard_drop(&pair->guard, &a->events);
  /* No pending block without a segment: its queues are empty, and its
     idle events serve the allocator's guards. */
  xs_pending_destroy(&pair->pending);
  xs_event_pool_absorb(&a->events, &pair->events);
  xs_pair **link = &a->streams;
  while (*link != pair) link = &(*link)->next;
  *link = pair->next;
  xs_stats_group_remove(&a->stats, &pair->stats, &a->shared_stats);
  a->frees_gone += pair->frees;
  xs_ptrtable_destroy(&pair->live);
  xs_blocks_destroy(&pair->blocks);
  pair->dead = true;
  pair->cached_off = true;
  a->n_pairs--;
  /* Still in `order`, its lock held: the unlock drops it and makes it a
     spare. */
  pair->next = a->dying;
  a->dying = pair;
}

void xs_pairs_touch_locked(xseg_allocator *a, xs_pair *pair) {
  XS_ASSERT_LOCKED(a);
  pair->used_at = xs_pairs_use();
  pair->forgotten = false;      /* a new stream at a forgotten address */
  if (pair == a->streams) return;          /* most recently used goes first */
  xs_pair **link = &a->streams;
  while (*link != pair) link = &(*link)->next;
  *link = pair->next;
  pair->next = a->streams;
  a->streams = pair;
}

xs_pair *xs_pairs_own_locked(xseg_allocator *a, struct CUstream_st *stream) {
  xs_pair *pair = a->streams;
  while (pair != NULL && (pair->stream != stream || pair->private_id != 0))
    pair = pair->next;
  return pair;
}

xseg_status xs_pairs_lookup_locked(xseg_allocator *a,
                                   struct CUstream_st *stream,
                                   xs_pair **out) {
  *out = xs_pairs_own_locked(a, stream);
  if (*out == NULL) return xs_pairs_new_locked(a, "a malloc", stream, 0, out);
  xs_pairs_touch_locked(a, *out);
  return XSEG_OK;
}

xs_block *xs_alloc_find_live_locked(xseg_allocator *a, uint64_t addr,
                                    size_t *slot) {
  /* The range table names the pair (it is current: every unlock refreshes
     it); a range it lacks, a table kept through a host OOM, or a pointer
     outside every range is looked for in every pair. */
  xs_pair *owner = xs_ranges_find(a, addr);
  if (owner != NULL && !owner->dead) {
    size_t i = xs_ptrtable_find(&owner->live, addr);
    if (i != SIZE_MAX) {
      *slot = i;
      return owner->live.slot[i].block;
    }
  }
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    size_t i = xs_ptrtable_find(&pair->live, addr);
    if (i != SIZE_MAX) {
      assert(pair->live.slot[i].block->allocated &&
             "every lock taken: nothing is parked");
      *slot = i;
      return pair->live.slot[i].block;
    }
  }
  return NULL;
}

uint64_t xs_alloc_frees_locked(const xseg_allocator *a) {
  uint64_t n = a->frees_gone;
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    n += pair->frees;
  return n;
}

size_t xs_alloc_live_count_locked(const xseg_allocator *a) {
  size_t n = 0;
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    n += pair->live.count;
  return n;
}

void xs_pairs_settle_all_locked(xseg_allocator *a) {
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    xs_park_settle_pair(pair);
}

/* Pair lock held: the held-back parks of pool p (of `kind`, a constant
   in each copy: the stats' offsets fold), oldest first, each one's free,
   then its merge, as they would have counted at once. */
static inline __attribute__((always_inline)) void pairs_pay_pool(
    xs_pair *pair, xs_pool *p, xs_pool_kind kind) {
  const xs_block *last = p->park_rest;
  for (xs_block *b = pair->park_oldest[kind];; b = b->prev) {
    xs_alloc_account_free(&pair->stats, kind, b->size, b->requested);
    b->requested = 0;
    if (p->counts_split)
      xs_pool_split_swap(&pair->stats, kind, xs_pool_merge_rest(p, b, last),
                         xs_pool_merge_whole(p, b, last));
    if (b == p->parked) break;
  }
}

void xs_park_owed_pay_now(xs_pair *pair) {
  if (pair->park_owed_published) {
    for (int k = 0; k < 2; k++)
      xs_park_owed_clear(&pair->stats, (xs_pool_kind)k);
    pair->park_owed_published = false;
  }
  /* The older run first; the kind a constant in each copy. */
  for (xs_pool *p = pair->park_first ? pair->park_first : pair->park_stats;;
       p = pair->park_stats) {
    if (p->kind == XS_POOL_SMALL)
      pairs_pay_pool(pair, p, XS_POOL_SMALL);
    else
      pairs_pay_pool(pair, p, XS_POOL_LARGE);
    if (p == pair->park_stats) break;
  }
  pair->park_first = pair->park_stats = NULL;
}

/* The list in recency order (see the top): an insertion sort, the list
   being short and mostly in order already. */
void xs_pairs_sort_by_use_locked(xseg_allocator *a) {
  XS_ASSERT_LOCKED(a);
  xs_pair *sorted = NULL, *pair = a->streams;
  while (pair != NULL) {
    xs_pair *next = pair->next, **link = &sorted;
    while (*link != NULL && (*link)->used_at >= pair->used_at)
      link = &(*link)->next;
    pair->next = *link;
    *link = pair;
    pair = next;
  }
  a->streams = sorted;
}

void xs_pairs_lock_all(xseg_allocator *a) {
#ifndef NDEBUG
  assert(!pairs_held.all && pairs_held.pairs == 0 &&
         "lock order: the allocator's lock is taken holding no other");
#endif
  xs_lock_take(&a->lock);
  assert(a->dying == NULL);
  for (size_t i = 0; i < a->n_order; i++) {
#ifndef NDEBUG
    assert(a->order[i]->order > pairs_held.last && "lock order");
    pairs_held.last = a->order[i]->order;
#endif
    xs_lock_take(&a->order[i]->lock);
  }
#ifndef NDEBUG
  pairs_held.all = true;
  a->owner = pthread_self();
  a->owned = true;
#endif
}

void xs_pairs_unlock_all(xseg_allocator *a) {
  bool slow = atomic_load_explicit(&a->slow, memory_order_relaxed);
#ifndef NDEBUG
  a->owned = false;
  pairs_held.all = false;
  pairs_held.last = 0;
#endif
  /* Every pair in `order` is locked: those there at xs_pairs_lock_all,
     and those born since. Pairs gone meanwhile leave it now. */
  size_t kept = 0;
  for (size_t i = 0; i < a->n_order; i++) {
    xs_pair *pair = a->order[i];
#ifndef NDEBUG
    pair->owned = false;
#endif
    pair->cached_off = slow || pair->dead;
    if (!pair->dead) a->order[kept++] = pair;
    xs_lock_drop(&pair->lock);
  }
  a->n_order = kept;
  while (a->dying != NULL) {
    xs_pair *pair = a->dying;
    a->dying = pair->next;
    pair->next = a->spare;
    a->spare = pair;
  }
  xs_lock_drop(&a->lock);
}

/* Frees a list of pairs gone (their tables and caches went with them). */
static void pairs_free_gone(xs_pair **list) {
  while (*list != NULL) {
    xs_pair *pair = *list;
    *list = pair->next;
    free(pair);
  }
}

void xs_pairs_unlock_destroyed(xseg_allocator *a) {
  for (xs_pair *pair = a->streams; pair != NULL;) {
    xs_pair *next = pair->next;
    xs_ptrtable_destroy(&pair->live);
    xs_blocks_destroy(&pair->blocks);
    free(pair);
    pair = next;
  }
  a->streams = NULL;
  xs_stream_index *x =
      atomic_load_explicit(&a->stream_index, memory_order_relaxed);
  while (x != NULL) {
    xs_stream_index *older = x->retired;
    free(x);
    x = older;
  }
  atomic_store_explicit(&a->stream_index, NULL, memory_order_relaxed);
  free(a->order);
  a->order = NULL;
  a->n_order = a->order_cap = 0;
  pairs_free_gone(&a->dying);
  pairs_free_gone(&a->spare);
#ifndef NDEBUG
  a->owned = false;
  pairs_held.all = false;
  pairs_held.last = 0;
#endif
  xs_lock_drop(&a->lock);
}
