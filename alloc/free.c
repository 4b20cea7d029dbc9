/* free.c: the public entry point xseg_free, its cached path and its slow
 * path (malloc is alloc.c's).
 *
 * The cached free finds the block's pair from the thread's last malloc or
 * from the range table (ranges.h), takes that pair's lock alone and gives
 * the block back to its pool, or parks it where merging would only undo
 * its split (lazy merging, segments/pool.h, park.h); a block used on
 * other streams goes pending behind their events (deferred.c). A pointer
 * the pair does not know, a shared block or the slow flag go the slow way,
 * with every lock (enter.h).
 */
#include <assert.h>

#include "alloc/account.h"
#include "alloc/deferred.h"
#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "alloc/park.h"
#include "alloc/ranges.h"
#include "alloc/thread.h"
#include "vmm/error.h"

/* A block of `pair` whose last use is over: stamped, and traced when
   `slow` (tracing sends the cached path the slow way, pairs.c). `t`: the
   calling thread's xs_pairs_tls (one access for a caller that has it). */
static inline __attribute__((always_inline)) void alloc_stamp(
    xseg_allocator *a, xs_pairs_thread *t, xs_pair *pair, xs_block *b,
    bool slow) {
  assert(slow || a->trace.cap == 0);
  if (slow)
    xs_pair_stamp(a, pair, b);
  else
    b->free_epoch = xs_pair_tick(t, pair);
}

/* Parks b, freed, in its pool p (of `kind`, given apart as in
   alloc_give_plain; lazy merging): stamped and traced as
   xs_pair_give_block does, merged later; its pointer-table entry stays
   (types.h, `live`). Its free and merge count in the stats later
   (types.h, park_stats), what they hold back published while other
   pairs' crossings could read the shard (park.h, xs_park_owe). False when
   holding them back would hide a rise above a threshold: the caller
   counts them at once (xs_park_owed_pay), once it is parked. */
static inline __attribute__((always_inline)) bool alloc_park(
    xseg_allocator *a, xs_pairs_thread *t, xs_pair *pair, xs_pool *p,
    xs_pool_kind kind, xs_block *b, bool slow) {
  /* Read before the stores, which the compiler cannot tell from them. */
  bool first = p->parked == NULL, older = pair->park_stats != NULL;
  alloc_stamp(a, t, pair, b, slow);
  bool held = xs_park_owe(pair, p, kind, b, a->n_pairs > 1, first, older);
  xs_pool_park(p, b, first);
  return held;
}

/* alloc_park, its stats held back on top of those held back already
   when their order allows (park.h, xs_park_may_hold), else counted first;
   a merge that would pass a threshold unseen counts at once, crossing. */
static inline __attribute__((always_inline)) void alloc_park_held_back(
    xseg_allocator *a, xs_pairs_thread *t, xs_pair *pair, xs_pool *p,
    xs_pool_kind kind, xs_block *b, bool slow) {
  if (!xs_park_may_hold(pair, p)) xs_park_owed_pay(pair);
  if (__builtin_expect(!alloc_park(a, t, pair, p, kind, b, slow), 0))
    xs_park_owed_pay(pair);
}

/* A live block's free that needs nothing outside its pair (no recorded
   streams, not shared): back to its pool p (of `kind`, given apart so
   that a caller that knows it at compile time folds it), or parked (true:
   its entry in the pair's pointer table must stay, or be put back).
   `slow`: with every lock held, the only way traced. `t`: the calling
   thread's xs_pairs_tls (alloc_stamp). */
static inline __attribute__((always_inline)) bool alloc_give_plain(
    xseg_allocator *a, xs_pairs_thread *t, xs_pair *pair, xs_pool *p,
    xs_pool_kind kind, xs_block *b, bool slow) {
  assert(b->seg->pool == p && p->kind == kind);
  /* Looked at once, before the stores that the compiler cannot tell from
     the neighbours'. */
  unsigned merges = xs_pool_merges(b);
  if (merges != XS_MERGE_NEXT ||          /* not parkable */
      (p->parked == NULL && !xs_pool_park_pays(p))) {
    /* The parks held back count before this free's moves. */
    xs_park_owed_pay(pair);
    xs_alloc_account_free(&pair->stats, kind, b->size, b->requested);
    alloc_stamp(a, t, pair, b, slow);
    if (merges == 0)
      xs_pool_give_alone(p, &pair->stats, kind, b);
    else if (!p->counts_split)
      xs_pool_give_merged(p, b, merges);
    else
      xs_pool_give(p, b);
    return false;
  }
  alloc_park_held_back(a, t, pair, p, kind, b, slow);
  return true;
}

/* The one way a block stops being live. A block used on other streams
   (xseg_record_stream) waits, pending, until the work they had queued at
   this free is done (deferred.c); any other goes back to its pool at once,
   where its own stream may reuse it (stream order makes that safe), or is
   parked there (*parked: its pointer-table entry goes back). */
static xseg_status alloc_give_block_locked(xseg_allocator *a, xs_block *b,
                                           bool *parked) {
  XS_ASSERT_LOCKED(a);
  xs_trace_record(&a->trace, XS_TRACE_FREE_REQUESTED, b->addr, b->requested,
                  b->stream);
  xs_pool *p = b->seg->pool;
  *parked = false;
  /* Its pool's parked block merges first, as at its own free. */
  xs_park_settle_pool(p);
  if (__builtin_expect(a->ipc != NULL || b->uses.n != 0, 0)) {
    /* Shared or deferred frees may look at other pools: none parked. */
    xs_pairs_settle_all_locked(a);
    /* Exported and held by another process: pending until it lets go. */
    if (a->ipc != NULL && xs_ipc_hold_free_locked(a, b)) return XSEG_OK;
    if (b->uses.n != 0) return xs_alloc_defer_free_locked(a, b);
  }
  *parked = alloc_give_plain(a, &xs_pairs_tls, xs_pool_pair(p), p, p->kind,
                             b, true);
  return XSEG_OK;
}

static xseg_status alloc_free_slow(xseg_allocator *a, void *ptr);

/* The cached free of live block b, used on other streams, `slot` in the
   pointer table of `pair`, whose lock is held and dropped here: pending
   behind their events, its entry out of the table, unless recording them
   fails (its status, nothing changed) or one of its streams captures
   (then the free parks, with every lock). The pair's parked blocks merge
   first, as completions may give blocks back to their pools. Out of line:
   the plain free's registers stay few. */
static __attribute__((noinline)) xseg_status alloc_free_deferred(
    xseg_allocator *a, xs_pair *pair, xs_block *b, size_t slot) {
  if (xs_pair_parked(pair)) {
    xs_park_settle_pair(pair);                 /* entries after b's may move */
    slot = xs_ptrtable_find(&pair->live, b->addr);
  }
  bool later;
  xseg_status st = xs_alloc_defer_free_pair(a, b, &later);
  if (st == XSEG_OK && !later) xs_ptrtable_remove_at(&pair->live, slot);
  void *ptr = (void *)(uintptr_t)b->addr;
  xs_pair_drop(pair);
  /* One of its streams captures: the free waits unrecorded, with every
     lock. */
  if (__builtin_expect(st == XSEG_OK && later, 0))
    return alloc_free_slow(a, ptr);
  xs_alloc_debug_after_cached(a);
  return st;
}

/* The cached free of the block in `slot` of the pair's pointer table
   (SIZE_MAX: not a block of the pair), pair lock held, not used on other
   streams (alloc_free_pair sends those to alloc_free_deferred): false
   (nothing changed) when there is none or its free needs more than the
   pair. `t` as alloc_give_plain's. */
static inline __attribute__((always_inline)) bool alloc_free_cached(
    xseg_allocator *a, xs_pairs_thread *t, xs_pair *pair,
    size_t slot) {
  if (slot == SIZE_MAX) return false;
  xs_block *b = pair->live.slot[slot].block;
  /* A parked block (freed twice) is the slow path's to report. */
  if (!b->allocated) return false;
  assert(b->uses.n == 0);
  /* Tracing sends the cached path the slow way (pairs.c). */
  assert(a->trace.cap == 0);
  xs_pool *p = b->seg->pool;
  /* A free beside the top of the run (in reverse order of allocation)
     parks on it; any other settles the run first, its entries leaving
     the table: b's slot may move. */
  if (__builtin_expect(p->parked != NULL, 0) &&
      (p->parked != b->next || !xs_pool_parkable(b))) {
    xs_park_settle_pool(p);
    slot = xs_ptrtable_find(&pair->live, b->addr);
  }
  /* The kind a constant in each copy: the stats' offsets fold. */
  bool parked =
      p->kind == XS_POOL_SMALL
          ? alloc_give_plain(a, t, pair, p, XS_POOL_SMALL, b, false)
          : alloc_give_plain(a, t, pair, p, XS_POOL_LARGE, b, false);
  if (!parked) xs_ptrtable_remove_at(&pair->live, slot);
  return true;
}

/* xseg_free's slow path, no lock held: takes every lock (after the
   cached path declined, or when it may not run). */
static __attribute__((noinline)) xseg_status alloc_free_slow(
    xseg_allocator *a, void *ptr) {
  uint64_t addr = (uint64_t)(uintptr_t)ptr;
  xs_alloc_enter(a);
  size_t slot;
  xs_block *b = xs_alloc_find_live_locked(a, addr, &slot);
  if (b == NULL) {
    xs_alloc_leave(a);
    return xs_error(XSEG_ERR_UNKNOWN_POINTER,
                    "xseg_free(%p): not a live block of the allocator of "
                    "device %d (never allocated here, already freed, or not "
                    "the start of a block)", ptr, a->vmm.device);
  }
  xs_ptrtable *live = &xs_pool_pair(b->seg->pool)->live;
  xs_ptrtable_remove_at(live, slot);
  bool parked;
  xseg_status st = alloc_give_block_locked(a, b, &parked);
  if (st != XSEG_OK || parked) {
    /* Still live, as the caller sees it, or parked: back in the table,
       where the slot just freed leaves room. */
    xs_ptrtable_add(live, b);
  }
  xs_alloc_leave(a);
  return st;
}

/* Where the cached free finds addr in `pair`'s pointer table, pair lock
   held: SIZE_MAX when absent or when the cached path may not run. */
static inline size_t alloc_free_slot(const xseg_allocator *a,
                                     const xs_pair *pair,
                                     uint64_t addr) {
  return xs_pair_cached_on(a, pair)
             ? xs_ptrtable_find(&pair->live, addr)
             : SIZE_MAX;
}

/* The repeated size's free: the block at addr of the pair's small pool
   that the pool parked and took back last (xs_pool_parkable_again: live,
   parkable, used on no other stream, found without the pointer table),
   with no park uncounted, so that it is parked with its free and merge
   counted later (alloc_park), keeping its table entry, and no gauge
   moves. Pair lock held. NULL when it does not apply: alloc_free_last_pair
   then does what it would. */
static inline __attribute__((always_inline)) xs_block *alloc_park_repeated(
    xs_pair *pair, uint64_t addr) {
  xs_block *b = xs_pool_parkable_again(&pair->pool[XS_POOL_SMALL], addr);
  if (b == NULL || pair->park_stats != NULL) return NULL;
  /* Recording a use forgets the block (deferred.c, record_use). */
  assert(b->uses.n == 0 && xs_ptrtable_get(&pair->live, addr) == b);
  return b;
}

/* The repeated size's park when holding its stats back would hide a rise
   above a threshold (alloc_park): they count now; the pair lock drops. */
static __attribute__((noinline, cold)) xseg_status alloc_park_pay_now(
    xseg_allocator *a, xs_pair *pair) {
  xs_park_owed_pay(pair);
  xs_pair_drop(pair);
  xs_alloc_debug_after_cached(a);
  return XSEG_OK;
}

/* A free with `pair`'s lock held (nothing else), the block in `slot` of
   its pointer table (alloc_free_slot): the cached path
   (alloc_free_cached), else every lock. `t`: the calling thread's
   xs_pairs_tls. */
static inline __attribute__((always_inline)) xseg_status alloc_free_pair(
    xseg_allocator *a, xs_pairs_thread *t, xs_pair *pair, void *ptr,
    size_t slot) {
  xs_block *b = slot != SIZE_MAX ? pair->live.slot[slot].block : NULL;
  if (__builtin_expect(b != NULL && b->allocated && b->uses.n != 0, 0))
    return alloc_free_deferred(a, pair, b, slot);
  bool done = alloc_free_cached(a, t, pair, slot);
  xs_pair_drop(pair);
  if (__builtin_expect(done, 1)) {
    xs_alloc_debug_after_cached(a);
    return XSEG_OK;
  }
  return alloc_free_slow(a, ptr);
}

/* No lock held: xseg_free's every case but the repeated size's, the
   block's pair found by its address in the range table and its lock
   taken, then its cached path (alloc_free_pair), else every lock
   (alloc_free_slow). */
static __attribute__((noinline)) xseg_status alloc_free_by_range(
    xseg_allocator *a, void *ptr) {
  if (__builtin_expect(a == NULL || ptr == NULL, 0)) {
    if (a == NULL)
      return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_free(%p): allocator "
                      "is NULL", ptr);
    return XSEG_OK;                         /* as free(NULL) */
  }
  uint64_t addr = (uint64_t)(uintptr_t)ptr;
  /* The slow flag up (a hint, read without the lock): every lock at
     once, not the pair's first. */
  xs_pair *pair =
      xs_alloc_slow_hint(a) ? NULL : xs_ranges_find(a, addr);
  if (__builtin_expect(pair == NULL, 0)) return alloc_free_slow(a, ptr);
  xs_pair_take(pair);
  return alloc_free_pair(a, xs_pairs_self(), pair, ptr,
                         alloc_free_slot(a, pair, addr));
}

/* The live block at ptr if it is the one just before the top of p's run,
   a plain one (not pending, used on no other stream) that may park on
   it; NULL otherwise. The run's neighbours are the pair's blocks: no
   pointer-table lookup needed (the block keeps its entry once parked). */
static inline xs_block *alloc_park_onto(const xs_pool *p, const void *ptr) {
  const xs_block *top = p->parked;
  if (top == NULL) return NULL;
  xs_block *b = top->prev;
  if (b == NULL || b->addr != (uint64_t)(uintptr_t)ptr || !b->allocated ||
      b->pending || b->uses.n != 0 || !xs_pool_parkable(b))
    return NULL;
  assert(xs_ptrtable_get(&xs_pool_pair((xs_pool *)p)->live, b->addr) == b);
  return b;
}

/* A free with `pair`'s lock held, `pair` the thread's last (not the
   repeated size's): alloc_free_pair when the block is one of the pair's,
   else the range table decides (alloc_free_by_range). Out of line:
   xseg_free then makes no call but tail calls, and keeps its values in
   scratch registers (its arguments first, as alloc_malloc_pair's). */
static __attribute__((noinline)) xseg_status alloc_free_last_pair(
    xseg_allocator *a, void *ptr, xs_pair *pair, xs_pairs_thread *t) {
  /* The cached path may not run: the range table decides (the slow
     path, in the end). */
  if (__builtin_expect(!xs_pair_cached_on(a, pair), 0)) {
    xs_pair_drop(pair);
    return alloc_free_by_range(a, ptr);
  }
  /* A free in reverse order of allocation: the block just before the
     top of the run parked last (the pool whose parks are held back
     newest) parks on it, found without the pointer table. */
  xs_pool *p = pair->park_stats;
  if (p != NULL) {
    xs_block *b = alloc_park_onto(p, ptr);
    if (b != NULL) {
      /* The kind a constant in each copy: the stats' offsets fold. */
      if (p->kind == XS_POOL_SMALL)
        alloc_park_held_back(a, t, pair, p, XS_POOL_SMALL, b, false);
      else
        alloc_park_held_back(a, t, pair, p, XS_POOL_LARGE, b, false);
      xs_pair_drop(pair);
      xs_alloc_debug_after_cached(a);
      return XSEG_OK;
    }
  }
  size_t slot = xs_ptrtable_find(&pair->live, (uint64_t)(uintptr_t)ptr);
  if (__builtin_expect(slot != SIZE_MAX, 1))
    return alloc_free_pair(a, t, pair, ptr, slot);
  /* Another pair's block, or none. */
  xs_pair_drop(pair);
  return alloc_free_by_range(a, ptr);
}

/* The pair of the thread's last malloc first (the block's, when a stream
   frees what it allocated), its lock free: the repeated size's park
   (alloc_park_repeated), else alloc_free_last_pair with that lock.
   Anything else goes by the range table (alloc_free_by_range). */
xseg_status xseg_free(xseg_allocator *a, void *ptr) {
  if (__builtin_expect(a != NULL && ptr != NULL, 1)) {
    xs_pairs_thread *t = xs_pairs_self();
    xs_pair *pair = t->pair;
    if (__builtin_expect(t->id == a->id, 1) && xs_pair_try(pair)) {
      xs_block *b = xs_pair_cached_on(a, pair)
                        ? alloc_park_repeated(pair, (uint64_t)(uintptr_t)ptr)
                        : NULL;
      if (__builtin_expect(b == NULL, 0))
        return alloc_free_last_pair(a, ptr, pair, t);
      bool held = alloc_park(a, t, pair, &pair->pool[XS_POOL_SMALL],
                             XS_POOL_SMALL, b, false);
      if (__builtin_expect(!held, 0)) return alloc_park_pay_now(a, pair);
      if (__builtin_expect(!xs_pair_drop_wake_later(pair), 0))
        return xs_alloc_wake_after_cached(a, pair);
      xs_alloc_debug_after_cached(a);
      return XSEG_OK;
    }
  }
  return alloc_free_by_range(a, ptr);
}
