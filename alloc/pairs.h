/* pairs.h: the pairs of pools, the locks and the way in and out of
 * every slow operation (internal; the structs are types.h's).
 *
 * One per device. Pools come per (stream, size class), two to a pair
 * (xs_pair); each pair keeps its own statistics shard, block struct
 * cache, pointer table (the address of each of its live blocks) and free
 * clock, under its own lock.
 *
 * Locks (alloc/pairs.c). The cached malloc and free take one pair's lock
 * alone: the pair of the stream (a thread-local cache, or the append-only
 * stream index) or of the address (the read-mostly range table,
 * alloc/ranges.c). Everything else takes the allocator's `lock`, then every
 * pair's lock in creation order (xs_alloc_enter): it sees a quiescent
 * allocator. The cached path goes that way whenever `slow` is set
 * (frees made during a capture still to record, captures, tracing, shared
 * blocks, per-operation checks), and never waits for the allocator's lock
 * while it holds a pair's. What the cached path reads of the allocator
 * (slow, cfg, the tables, the pending count) is only written with every
 * lock held or published atomically.
 *
 * Cross-stream frees (deferred.c) are the pair's too: a free of a block
 * used on other streams queues its events in the block's pair, and a
 * cached malloc polls its pair's and, by a try of each one's lock, the
 * other streams' pairs' (PyTorch's process_events at each malloc); when a
 * try fails or a private pool holds pending frees it takes every lock and
 * completes them all.
 *
 * The lock a function needs is in its name:
 *   - `_locked`: every lock (xs_alloc_enter's; XS_ASSERT_LOCKED);
 *   - `xs_pair_*`, `xs_park_*` and a `_pair` suffix: the lock of the pair
 *     it is given (or of the block's), every lock doing as well
 *     (XS_ASSERT_PAIR_LOCKED);
 *   - anything else says so on its first comment line, or needs none.
 */
#ifndef XS_ALLOC_PAIRS_H
#define XS_ALLOC_PAIRS_H

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>

#include "alloc/thread.h"
#include "alloc/types.h"

/* Whose memory a release pass may take: a stream's own pools, and private
   pools once released and the device synchronised since (sync_owed);
   never a private pool still in use. */
static inline bool xs_pools_reclaimable(const xs_pair *pair) {
  return pair->private_id == 0 || (pair->released && !pair->sync_owed);
}

/* The pair a pool belongs to. */
static inline xs_pair *xs_pool_pair(xs_pool *p) {
  return (xs_pair *)((char *)(p - p->kind) -
                     offsetof(xs_pair, pool));
}

/* Whether either pool of `pair` has parked blocks (lazy merging). */
static inline bool xs_pair_parked(const xs_pair *pair) {
  return pair->pool[0].parked != NULL || pair->pool[1].parked != NULL;
}

/* The pair lock alone, for the cached malloc and free: debug builds
   assert the lock order (pairs.c keeps what each thread holds): the
   cached path's pair lock is the calling thread's first (`nth` 1: it
   holds no other lock of this allocator's), and a second one only beside
   it, by a try (`nth` 2). */
#ifndef NDEBUG
void xs_pair_held(xs_pair *pair, bool taken, int nth);
#define XS_PAIR_HELD(pair, taken, nth) xs_pair_held(pair, taken, nth)
#else
#define XS_PAIR_HELD(pair, taken, nth) ((void)(nth))
#endif
static inline void xs_pair_take(xs_pair *pair) {
  xs_lock_take(&pair->lock);
  XS_PAIR_HELD(pair, true, 1);
}
static inline void xs_pair_drop(xs_pair *pair) {
  XS_PAIR_HELD(pair, false, 1);
  xs_lock_drop(&pair->lock);
}
/* The pair's lock if it is free (false: busy), as the nth held. */
static inline bool xs_pair_try_nth(xs_pair *pair, int nth) {
  if (!xs_lock_try(&pair->lock)) return false;
  XS_PAIR_HELD(pair, true, nth);
  return true;
}
/* For the repeated size's path (alloc.c, free.c): takes the pair lock
   only if it is free; xs_pair_drop_wake_later drops it. */
static inline bool xs_pair_try(xs_pair *pair) {
  return xs_pair_try_nth(pair, 1);
}
/* A second pair's lock while holding one, by a try alone (a wait there
   could deadlock): false when it is busy. */
static inline bool xs_pair_try_second(xs_pair *pair) {
  return xs_pair_try_nth(pair, 2);
}
static inline void xs_pair_drop_second(xs_pair *pair) {
  XS_PAIR_HELD(pair, false, 2);
  xs_lock_drop(&pair->lock);
}
/* Drops the pair lock without waking a waiter: false when there is one,
   which the caller then wakes (xs_lock_wake). */
static inline bool xs_pair_drop_wake_later(xs_pair *pair) {
  XS_PAIR_HELD(pair, false, 1);
  return xs_lock_drop_wake_later(&pair->lock);
}
/* Whether the cached path may run on `pair` (its lock held): nothing
   calls for the slow path (`slow`) and the pair is alive. */
static inline bool xs_pair_cached_on(const xseg_allocator *a,
                                     const xs_pair *pair) {
  assert(pair->cached_off == (a->slow || pair->dead));
  (void)a;
  return __builtin_expect(!pair->cached_off, 1);
}
#ifndef NDEBUG
#define XS_ASSERT_PAIR_LOCKED(a, pair)                                       \
  assert((((a)->owned && pthread_equal((a)->owner, pthread_self())) ||       \
          ((pair)->owned && pthread_equal((pair)->owner, pthread_self()))) && \
         "caller must hold the pair's lock")
#else
#define XS_ASSERT_PAIR_LOCKED(a, pair) ((void)0)
#endif

/* Every lock, in order: the allocator's, then every pair's in table
   order (xs_alloc_enter's first step). */
void xs_pairs_lock_all(xseg_allocator *a);
/* Publishes the slow flag to every pair (cached_off), makes the pairs gone
   meanwhile spares and drops every lock (xs_alloc_leave's last step). */
void xs_pairs_unlock_all(xseg_allocator *a);
/* Puts the pair list in recency order (see pairs.c). */
void xs_pairs_sort_by_use_locked(xseg_allocator *a);
/* xseg_destroy's unlock: frees every pair (their pools destroyed), the
   stream index, and drops the allocator's lock. */
void xs_pairs_unlock_destroyed(xseg_allocator *a);
/* A new allocator's id (pairs.c). */
uint64_t xs_pairs_new_id(void);
#ifndef NDEBUG
#define XS_ASSERT_LOCKED(a)                                                  \
  assert((a)->owned && pthread_equal((a)->owner, pthread_self()) &&          \
         "caller must hold every lock of the allocator")
#else
#define XS_ASSERT_LOCKED(a) ((void)0)
#endif

/* The pair of `stream`'s own pools from the list, or NULL (none made). */
xs_pair *xs_pairs_own_locked(xseg_allocator *a, struct CUstream_st *stream);
/* The pools of `stream`, created on first use, looked up in the list and
   moved to its front (pairs.c). */
xseg_status xs_pairs_lookup_locked(xseg_allocator *a,
                                   struct CUstream_st *stream,
                                   xs_pair **out);
/* The stream index's search for xs_pairs_of_stream (pairs.c). */
xs_pair *xs_pairs_find_stream(xseg_allocator *a,
                              struct CUstream_st *stream);
/* Whether the cached path is off for now (a hint; `slow`). */
static inline bool xs_alloc_slow_hint(const xseg_allocator *a) {
  return atomic_load_explicit(&a->slow, memory_order_relaxed);
}
/* The pair of `stream` for the cached malloc: the thread's last, or from
   the stream index; NULL when it has none yet. No lock needed. */
static inline xs_pair *xs_pairs_of_stream(xseg_allocator *a,
                                          struct CUstream_st *stream) {
  xs_pairs_thread *t = &xs_pairs_tls;
  if (__builtin_expect(t->id == a->id && t->stream == stream, 1))
    return t->pair;
  return xs_pairs_find_stream(a, stream);
}
/* A new pair in *out (private_id 0: a stream's), linked first and
   published, its lock held until xs_alloc_leave. Refused for a stream of
   another context (xs_vmm_stream_allocates: its pools' growth and guards
   record events on it; `what` names the caller in the refusal), and on
   host OOM, each said. */
xseg_status xs_pairs_new_locked(xseg_allocator *a, const char *what,
                                struct CUstream_st *stream,
                                xseg_pool_id private_id, xs_pair **out);
/* Stamps `pair` as used now (by a malloc's slow path: a forgotten pair's
   stream is a new one) and puts it first in the list. */
void xs_pairs_touch_locked(xseg_allocator *a, xs_pair *pair);
/* Takes a pair that holds no segment out of every list and table. */
void xs_pairs_free_locked(xseg_allocator *a, xs_pair *pair);
/* The live block at addr and its pair's table slot, or NULL (pairs.c). */
xs_block *xs_alloc_find_live_locked(xseg_allocator *a, uint64_t addr,
                                    size_t *slot);
/* Frees so far, every pair's (pairs.c). */
uint64_t xs_alloc_frees_locked(const xseg_allocator *a);
/* Live blocks of every pair. */
size_t xs_alloc_live_count_locked(const xseg_allocator *a);


/* The next stamp of `pair`'s free clock. Guards compare a pair's stamps with
   its own clock alone, so each pair's must only increase; but garbage
   collection orders the free blocks of every pair by age (reclaim.c), so
   stamps of different pairs should compare as the frees happened, and a
   counter per pair cannot give that without a shared write. The calling
   thread's count of frees can: on one thread it is exactly the old global
   clock (the pair's own clock never exceeds it); frees of different
   threads compare by their threads' counts, a guess. `t`: the calling
   thread's xs_pairs_tls, which a caller that has it passes. */
static inline uint64_t xs_pair_tick(xs_pairs_thread *t,
                                    xs_pair *pair) {
  uint64_t stamp = ++t->frees;
  if (stamp <= pair->clock) stamp = t->frees = pair->clock + 1;
  pair->frees++;
  return pair->clock = stamp;
}
/* A block of `pair` whose last use is over: stamped with `pair`'s free
   clock, traced. */
static inline void xs_pair_stamp(xseg_allocator *a, xs_pair *pair,
                                 xs_block *b) {
  b->free_epoch = xs_pair_tick(&xs_pairs_tls, pair);
  xs_trace_record(&a->trace, XS_TRACE_FREE_COMPLETED, b->addr, b->requested,
                  b->stream);
}
/* The same, the pair found from the block. */
static inline void xs_pair_stamp_block(xseg_allocator *a, xs_block *b) {
  xs_pair_stamp(a, xs_pool_pair(b->seg->pool), b);
}
/* Gives a block whose last use is over back to its pool, stamped. */
static inline void xs_pair_give_block(xseg_allocator *a, xs_block *b) {
  xs_pair_stamp_block(a, b);
  xs_pool_give(b->seg->pool, b);
}

#endif /* XS_ALLOC_PAIRS_H */
