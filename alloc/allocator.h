/* allocator.h: the device allocator behind xseg_allocator (internal).
 *
 * One per device. Pools come per (stream, size class), two to a pair
 * (xs_stream_pools); each pair keeps its own statistics shard, block struct
 * cache, pointer table (the address of each of its live blocks) and free
 * clock, under its own lock.
 *
 * Locks (alloc/pairs.c). The cached malloc and free take one pair's lock
 * alone: the pair of the stream (a thread-local cache, or the append-only
 * stream index) or of the address (the read-mostly range table,
 * alloc/ranges.c). Everything else takes the allocator's `lock`, then every
 * pair's lock in creation order (xs_alloc_lock): it sees a quiescent
 * allocator, and every function named *_locked runs so (debug builds
 * assert it). The cached path goes that way whenever `slow` is set
 * (frees made during a capture still to record, captures, tracing, shared
 * blocks, per-operation checks), and never waits for the allocator's lock
 * while it holds a pair's. What the cached path reads of the allocator
 * (slow, cfg, the tables, the pending count) is only written with every
 * lock held or published atomically.
 *
 * Cross-stream frees (deferred.c) are the pair's too: a free of a block
 * used on other streams queues its events in the block's pair, and a
 * cached malloc settles its pair's and, by a try of each one's lock, the
 * other streams' pairs' (PyTorch's process_events at each malloc); when a
 * try fails or a private pool holds pending frees it takes every lock and
 * settles them all.
 */
#ifndef XS_ALLOC_ALLOCATOR_H
#define XS_ALLOC_ALLOCATOR_H

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "alloc/config.h"
#include "vmm/lock.h"
#include "alloc/ptrtable.h"
#include "segments/shards.h"
#include "alloc/trace.h"
#include "segments/block.h"
#include "segments/freetree.h"
#include "segments/pool.h"
#include "segments/stats.h"
#include "streams/event_pool.h"
#include "streams/guard.h"
#include "streams/pending.h"
#include "vmm/vmm.h"
#include "xseg.h"

/* PyTorch's kSmallSize: requests up to 1 MiB go to the small pool. */
#define XS_SMALL_SIZE ((size_t)1 << 20)
/* PyTorch's kMinBlockSize: the rounding unit and the smallest remainder
   worth splitting off in expandable mode. */
#define XS_MIN_BLOCK ((size_t)512)

/* The two pools of one stream, or of one private pool on one stream
   (graph capture: private_id != 0; a private pool that several streams
   allocate to has a pair per stream, whose guard follows that stream).
   Allocated on a cache line of its own, so that two threads on two pairs
   share no line; never freed before the allocator (a thread may still
   find a pair that went away in an old table: `dead` says so). */
typedef struct xs_stream_pools {
  xs_lock lock;                       /* the pair's lock (alloc/pairs.c) */
  bool dead;                          /* went away: in no list or table */
  /* The cached path may not run on it: dead, or the allocator's `slow`
     (one load for both; written with every lock held, pairs.c). */
  bool cached_off;
  uint64_t order;                     /* lock order: creation order */
  struct CUstream_st *stream;
  xseg_pool_id private_id;            /* 0: the stream's own pools */
  bool released;                      /* private: xseg_release_pool called */
  uint64_t used_at;                   /* recency: the calling thread's use
                                         count at its last malloc (pairs.c) */
  xs_guard guard;                     /* unmap guard; sets safe_epoch */
  /* Its free clock: the last stamp of a free of its blocks (free_epoch),
     strictly increasing (xs_pair_tick). */
  uint64_t clock;
  uint64_t frees;                     /* its frees so far (flow.c's quiet
                                         period counts every pair's) */
  uint64_t grew_at;                   /* its clock at its last growth */
  uint64_t took_at;                   /* its clock when it last took
                                         other streams' memory (flow.c) */
  xs_stats stats;                     /* its shard of the statistics */
  xs_blocks blocks;                   /* its block struct cache */
  xs_ptrtable live;                   /* its live and parked blocks */
  /* Pools whose block the cached free parked unmerged (segments/pool.h,
     lazy merging): the pair's cached malloc and free deal with them,
     every other entry point settles them all as it takes the locks. A
     parked block keeps its entry in `live` (not allocated: a free of it
     is the slow path's) until it settles, so that taking it back costs
     the table nothing. */
  size_t n_parked;
  /* The pool of the last park while neither that free nor its merge is
     in the stats yet, and the parked block's requested size, for its
     free's count. The free of a block taken back at once then moves no
     gauge but the totals of increases (alloc.c, alloc_retake). With more
     than one pair, what is held back is published in the shard
     (xs_stats.unposted: `park_unposted`), so that other pairs' crossings
     sum true values, and a take-back checks the thresholds first. */
  xs_pool *park_stats;
  size_t park_requested;
  bool park_unposted;
  xs_pool pool[2];                    /* indexed by xs_pool_kind */
  /* The frees of its blocks that wait on work recorded on other streams
     (deferred.c): their events and per-stream queues, under the pair's
     lock, so that a cross-stream free and the malloc that settles it take
     the pair's lock alone. */
  xs_event_pool events;
  xs_pending pending;
  /* Its blocks in state pending: written under its lock, read by other
     pairs' cached mallocs (xs_pairs_settle_others). */
  atomic_size_t n_pending;
  struct xs_stream_pools *next;       /* the allocator's list */
  /* The size bins of the small pool's free index (segments/freetree.h):
     its requests are the ones up to 1 MiB; the large pool's index and
     both indexes of unmapped blocks have none. */
  xs_freebin small_bins[XS_FREETREE_BINS];
#ifndef NDEBUG
  pthread_t owner;                    /* holder of lock, for asserts */
  bool owned;
#endif
} xs_stream_pools;

/* The pairs of streams by stream, for the cached malloc's lookup without
   a lock (pairs.c): append-only, as a stream's own pair never goes away
   before the allocator. An entry is written before the count that shows
   it is published; a full array is replaced by one twice its size, the
   old one kept until xseg_destroy (a reader may still be in it), so the
   arrays kept add up to at most twice the largest. */
typedef struct xs_stream_entry {
  struct CUstream_st *stream;
  struct xs_stream_pools *pair;
} xs_stream_entry;
typedef struct xs_stream_index {
  struct xs_stream_index *retired;    /* older arrays, kept */
  size_t cap;
  atomic_size_t n;
  xs_stream_entry entry[];
} xs_stream_index;

/* The reserved ranges of every pair, sorted by address, for the cached
   free (alloc/ranges.c): rewritten in place under a sequence count, its
   array replaced when it must grow (old arrays stay until xseg_destroy).
   A cache: a range may name a pair whose segment went away; the pair's
   pointer table decides. */
typedef struct xs_range {
  _Atomic uint64_t base, end;
  _Atomic(struct xs_stream_pools *) pair;
} xs_range;
typedef struct xs_range_array {
  struct xs_range_array *retired;     /* older arrays, kept */
  size_t cap;
  xs_range range[];
} xs_range_array;

/* Whose memory a release pass may take: a stream's own pools, and private
   pools once released; never a private pool still in use. */
static inline bool xs_pools_reclaimable(const xs_stream_pools *sp) {
  return sp->private_id == 0 || sp->released;
}

/* The pair a pool belongs to. */
static inline xs_stream_pools *xs_pools_of(xs_pool *p) {
  return (xs_stream_pools *)((char *)(p - p->kind) -
                             offsetof(xs_stream_pools, pool));
}

/* Allocations on `stream` go to private pool `pool` (graph capture): one
   entry per xseg_begin_allocate_to_pool, or per unannounced capture seen by
   cuStreamGetCaptureInfo (implicit). While any entry exists, no event is
   queried, no stream synchronised and nothing unmapped. */
typedef struct xs_capture {
  struct CUstream_st *stream;
  xseg_pool_id pool;
  uint64_t capture_id;                /* implicit: the driver's id */
  bool implicit;
} xs_capture;

struct xseg_allocator {
  xs_lock lock;                       /* see vmm/lock.h for why not pthread */
  /* Set whenever the cached malloc and free must take the slow path;
     written with every lock held (xs_alloc_unlock). Read under a pair
     lock for the answer, and before it as a hint: a malloc or free that
     sees it set goes the slow way without taking its pair's lock. */
  _Atomic bool slow;
  uint64_t id;                        /* unique per xseg_create (pairs.c) */
  size_t n_pairs;                     /* live pairs */
  _Atomic(xs_stream_index *) stream_index;
  /* Every pair in lock order (creation order), read and written with the
     allocator's lock held: xs_alloc_lock takes each one's lock. A pair
     that goes away stays in it, dead, until the unlock drops its lock. */
  xs_stream_pools **order;
  size_t n_order, order_cap;
  /* The range table (ranges.c): even sequence count when stable. */
  _Atomic(xs_range_array *) ranges;
  atomic_size_t n_ranges;
  atomic_uint ranges_seq;
  uint64_t ranges_made_at;            /* vmm.reserves at its making */
  uint64_t next_order;                /* of the next pair */
  /* Pairs gone: their memory is never given back before xseg_destroy, as
     a thread may still hold one found in the range table, but it is
     recycled as a new pair (pairs.c), so there are never more than the
     most pairs alive at once. `dying`: gone during this operation, still
     in `order`; `spare`: out of it, ready for reuse. */
  xs_stream_pools *dying, *spare;
  size_t pair_structs;                /* allocated, alive or not */
  uint64_t frees_gone;                /* frees of pairs gone */
  xs_vmm vmm;
  xs_config cfg;
  xs_stats_group stats;               /* the shards and their peaks */
  xs_stats shared_stats;              /* the shard of no pair: counters of
                                         slow operations, totals of pairs
                                         gone */
  xs_stream_pools *streams;           /* most recently used first (as of
                                         xs_alloc_lock, by used_at) */
  size_t granule[2];                  /* expandable mapping unit per pool */
  size_t reserve[2];                  /* bytes per reservation per pool */
  size_t cap;                         /* memory_fraction * device memory */
  size_t cap_over;                    /* what was mapped when the cap was
                                         lowered under it, until a growth
                                         ends within the cap (0: none);
                                         see xs_flow_mapped_most */
  /* Cross-stream safety (alloc/deferred.c, alloc/reclaim.c). */
  xs_event_pool events;               /* the unmap guards' events */
  bool flow_at_limit;                 /* the out-of-memory path's last try
                                         before a host wait: flow.c steals
                                         from any stream */
  /* Blocks in state pending, every pair's: moved by a pair's cached
     cross-stream free and by the malloc that settles it under that pair's
     lock alone, and read by every cached malloc (active's peak needs a
     look while anything is held), hence atomics. */
  atomic_size_t pending_blocks;
  _Atomic int64_t pending_bytes;
  xs_block **deferred;                /* pending, events not recorded yet
                                         (freed during a capture) */
  size_t n_deferred, cap_deferred;
  /* Graph capture (alloc/capture.c). */
  xs_capture *captures;
  size_t n_captures, cap_captures, n_implicit;
  xs_trace trace;                     /* device_traces ring (snapshot) */
  /* Blocks shared with other processes (alloc/ipc*.c); NULL until the
     first export or open. */
  struct xs_ipc *ipc;
  size_t ipc_parked;                  /* pending blocks that other processes
                                         hold (no events, not in deferred) */
#ifndef NDEBUG
  pthread_t owner;                    /* holder of every lock, for asserts */
  bool owned;
  /* Debug builds validate the whole allocator every debug_check_every
     operations (XSEG_DEBUG_CHECK in the environment; 0 = never), when the
     operation lets go of its locks: a broken invariant aborts right after
     the operation that broke it, not at the test's end. */
  uint32_t debug_check_every;
  atomic_uint debug_ops;
#endif
};

#ifndef NDEBUG
/* Runs xseg_check's walk with the lock held; prints the broken rule and
   aborts (check.c). */
void xs_alloc_debug_check_locked(xseg_allocator *a);
#endif
/* xseg_check's walk, every lock held: XSEG_OK, or the first broken rule
   as XSEG_ERR_INVALID_ARGUMENT with its message (check.c). */
xseg_status xs_alloc_check_locked(xseg_allocator *a);

/* The stats of a block of `size` bytes, `requested` asked for, that stops
   being live (pool `kind`, shard s): allocation and its bytes fall. */
static inline void xs_alloc_account_free(xs_stats *s, xs_pool_kind kind,
                                         size_t size, size_t requested) {
  xs_stats_dec(s, XS_GAUGE_allocation, kind, 1);
  xs_stats_dec(s, XS_GAUGE_allocated_bytes, kind, (int64_t)size);
  xs_stats_dec(s, XS_GAUGE_requested_bytes, kind, (int64_t)requested);
}
/* The gauges a park holds back: its free's three, its merge's two. */
#define XS_PARK_GAUGES(X)                                                    \
  X(allocation) X(allocated_bytes) X(requested_bytes) X(inactive_split)     \
  X(inactive_split_bytes)
/* Publishes what a park of block b (parkable, `requested` asked for) in
   pool kind k holds back in shard s: each gauge's current less its true
   value (segments/stats.h, unposted). Its merge moves inactive_split from
   the rest (a piece: `rest` bytes) to the merged block (`whole` bytes, a
   piece unless 0: a whole segment). */
static inline void xs_park_unposted_set(xs_stats *s, xs_pool_kind k,
                                        const xs_block *b, size_t requested,
                                        size_t rest, size_t whole) {
  _Atomic int64_t *u = s->unposted[k];
  xs_gv_set(&u[XS_GAUGE_allocation], 1);
  xs_gv_set(&u[XS_GAUGE_allocated_bytes], (int64_t)b->size);
  xs_gv_set(&u[XS_GAUGE_requested_bytes], (int64_t)requested);
  xs_gv_set(&u[XS_GAUGE_inactive_split], 1 - (int64_t)(whole != 0));
  xs_gv_set(&u[XS_GAUGE_inactive_split_bytes],
            (int64_t)rest - (int64_t)whole);
}
/* Clears it, before the currents move (a release fence after: a reader
   that sees a moved current sees it cleared). */
static inline void xs_park_unposted_clear(xs_stats *s, xs_pool_kind k) {
#define XS_PARK_CLEAR_(name) xs_gv_set(&s->unposted[k][XS_GAUGE_##name], 0);
  XS_PARK_GAUGES(XS_PARK_CLEAR_)
#undef XS_PARK_CLEAR_
  atomic_thread_fence(memory_order_release);
}
/* Whether the block parked in pool kind k may be taken back for its own
   requested size without posting first: its free's gauges, back at their
   current values, pass no threshold. With one pair nothing else moves
   the thresholds, so always; with more, another pair's crossing may have
   lowered them to the true values meanwhile. */
static inline bool xs_park_refill_under(const xs_stream_pools *sp,
                                        xs_pool_kind k) {
  return !sp->park_unposted ||
         (xs_stats_rise_under(&sp->stats, XS_GAUGE_allocation, k, 0) &&
          xs_stats_rise_under(&sp->stats, XS_GAUGE_allocated_bytes, k, 0) &&
          xs_stats_rise_under(&sp->stats, XS_GAUGE_requested_bytes, k, 0));
}
/* Holds back the stats of a park of b in pool p of pair sp (none held
   back yet): published when other pairs' crossings could read them
   (`several`). False when they must count at once (xs_pair_park_stats,
   once b is parked): held back, the merge would raise a true value above
   the shard's threshold, which only inactive_split_bytes can (by b's
   size, less the rest's when it makes a whole segment). Hidden there,
   the other shards could pass the recorded peak between them with none
   of them crossing, since their thresholds and this one sum to it.
   `kind` is p's, given apart so that a caller that knows it at compile
   time folds the stats' offsets. */
static inline bool xs_pair_park_hold(xs_stream_pools *sp, xs_pool *p,
                                     xs_pool_kind kind, const xs_block *b,
                                     bool several) {
  assert(sp->park_stats == NULL && "the last park counted first");
  assert(p->kind == kind);
  sp->park_stats = p;
  sp->park_requested = b->requested;
  sp->park_unposted = several;
  if (!several) return true;
  size_t rest = xs_pool_merge_rest(b), whole = xs_pool_merge_whole(b);
  xs_park_unposted_set(&sp->stats, kind, b, b->requested, rest, whole);
  return xs_stats_rise_under(&sp->stats, XS_GAUGE_inactive_split_bytes,
                             kind, (int64_t)whole - (int64_t)rest);
}
/* The take-back of sp's held-back park for its own requested size: the
   free and the malloc cancel, what was held back is posted as it is (and
   cleared before any current moves). `kind`: the parked pool's, as
   above. */
static inline void xs_pair_park_refilled(xs_stream_pools *sp,
                                         xs_pool_kind kind) {
  assert(sp->park_stats != NULL && sp->park_stats->kind == kind);
  if (sp->park_unposted) xs_park_unposted_clear(&sp->stats, kind);
  sp->park_stats = NULL;
  sp->park_unposted = false;
}
/* Counts sp's last park (its free, then its merge) in the stats, if it
   is not yet: what it held back is cleared as at a take-back, then the
   currents move. */
static inline void xs_pair_park_stats(xs_stream_pools *sp) {
  xs_pool *p = sp->park_stats;
  if (p == NULL) return;
  xs_pair_park_refilled(sp, p->kind);
  xs_alloc_account_free(&sp->stats, p->kind, p->parked->size,
                        sp->park_requested);
  xs_pool_park_stats(p);
}
/* Merges p's parked block, if any, as its free would have; its entry
   leaves the pair's pointer table (entries after it may move). */
static inline void xs_alloc_settle_pool_locked(xs_pool *p) {
  if (p->parked == NULL) return;
  xs_stream_pools *sp = xs_pools_of(p);
  size_t slot = xs_ptrtable_find(&sp->live, p->parked->addr);
  assert(slot != SIZE_MAX && "a parked block keeps its entry");
  xs_ptrtable_remove_at(&sp->live, slot);
  xs_pair_park_stats(sp);
  xs_pool_settle(p);
  sp->n_parked--;
}
/* Merges every parked block of sp. */
static inline void xs_pair_settle(xs_stream_pools *sp) {
  if (sp->n_parked == 0) return;
  xs_pair_park_stats(sp);
  for (int k = 0; k < 2; k++) xs_alloc_settle_pool_locked(&sp->pool[k]);
  assert(sp->n_parked == 0);
}
/* Merges every parked block (pairs.c). */
void xs_alloc_settle_locked(xseg_allocator *a);

/* The pair lock alone, for the cached malloc and free: debug builds
   assert the lock order (the calling thread holds no lock of this
   allocator's; pairs.c keeps what each thread holds). */
#ifndef NDEBUG
void xs_pair_held(xs_stream_pools *sp, bool taken);
void xs_pair_held_beside(xs_stream_pools *sp, bool taken);
#endif
static inline void xs_pair_take(xs_stream_pools *sp) {
  xs_lock_take(&sp->lock);
#ifndef NDEBUG
  xs_pair_held(sp, true);
#endif
}
static inline void xs_pair_drop(xs_stream_pools *sp) {
#ifndef NDEBUG
  xs_pair_held(sp, false);
#endif
  xs_lock_drop(&sp->lock);
}
/* The same, for the repeated size's path (alloc.c): takes the pair lock
   only if it is free, drops it without waking (false: the caller wakes
   the waiter, xs_lock_wake). */
static inline bool xs_pair_try(xs_stream_pools *sp) {
  if (!xs_lock_try(&sp->lock)) return false;
#ifndef NDEBUG
  xs_pair_held(sp, true);
#endif
  return true;
}
/* A second pair's lock while holding one, by a try alone (a wait there
   could deadlock): false when it is busy. */
static inline bool xs_pair_try_beside(xs_stream_pools *sp) {
  if (!xs_lock_try(&sp->lock)) return false;
#ifndef NDEBUG
  xs_pair_held_beside(sp, true);
#endif
  return true;
}
static inline void xs_pair_drop_beside(xs_stream_pools *sp) {
#ifndef NDEBUG
  xs_pair_held_beside(sp, false);
#endif
  xs_lock_drop(&sp->lock);
}
static inline bool xs_pair_drop_unwoken(xs_stream_pools *sp) {
#ifndef NDEBUG
  xs_pair_held(sp, false);
#endif
  return xs_lock_drop_unwoken(&sp->lock);
}
#ifndef NDEBUG
#define XS_ASSERT_PAIR_LOCKED(a, sp)                                         \
  assert((((a)->owned && pthread_equal((a)->owner, pthread_self())) ||       \
          ((sp)->owned && pthread_equal((sp)->owner, pthread_self()))) &&    \
         "caller must hold the pair's lock")
#else
#define XS_ASSERT_PAIR_LOCKED(a, sp) ((void)0)
#endif
/* Debug builds: the cached path's share of XSEG_DEBUG_CHECK, after its
   pair lock is dropped (pairs.c). */
#ifndef NDEBUG
void xs_alloc_debug_after_cached(xseg_allocator *a);
#else
static inline void xs_alloc_debug_after_cached(xseg_allocator *a) {
  (void)a;
}
#endif

/* Every lock, for everything but the cached path: the allocator's, then
   every pair's in table order; then every parked block is settled, so
   every pool keeps block.h's rules, and the pair list is put in recency
   order (pairs.c). */
void xs_alloc_lock(xseg_allocator *a);
/* Publishes what changed (slow flag, range table) and drops every lock. */
void xs_alloc_unlock(xseg_allocator *a);
/* xseg_destroy's unlock: frees every pair (their pools destroyed), every
   table, and drops the allocator's lock. */
void xs_alloc_unlock_destroyed(xseg_allocator *a);
/* A new allocator's id (pairs.c). */
uint64_t xs_pairs_new_id(void);
#ifndef NDEBUG
#define XS_ASSERT_LOCKED(a)                                                  \
  assert((a)->owned && pthread_equal((a)->owner, pthread_self()) &&          \
         "caller must hold every lock of the allocator")
#else
#define XS_ASSERT_LOCKED(a) ((void)0)
#endif

/* The pools of `stream`, created on first use, looked up in the list and
   moved to its front (pairs.c). */
xseg_status xs_stream_pools_lookup_locked(xseg_allocator *a,
                                          struct CUstream_st *stream,
                                          xs_stream_pools **out);
/* The calling thread's count of uses, for pairs' recency (thread.c). */
uint64_t xs_pairs_use(void);
/* What the calling thread keeps (thread.c): its count of uses (recency)
   and the pair of its last cached malloc, named by the allocator's id
   (not its address: a destroyed allocator's successor may get it). */
typedef struct xs_pairs_thread {
  uint64_t uses;
  uint64_t frees;                     /* its free stamps (xs_pair_tick) */
  uint64_t id;
  struct CUstream_st *stream;
  xs_stream_pools *pair;
  /* The range of its last cached free, valid while the range table's
     sequence count is still range_seq (xs_ranges_find). */
  uint64_t range_id, range_base, range_size;
  unsigned range_seq;
  xs_stream_pools *range_pair;
} xs_pairs_thread;
extern __thread xs_pairs_thread xs_pairs_tls;
/* &xs_pairs_tls, for a hot path that reads it more than once: the empty
   asm hides where the address came from, so the compiler keeps it in a
   register rather than recomputing it at each use (a TLS-descriptor
   sequence of three instructions, CMakeLists.txt). */
static inline xs_pairs_thread *xs_pairs_self(void) {
  xs_pairs_thread *t = &xs_pairs_tls;
  __asm__("" : "+r"(t));
  return t;
}
/* The stream index's search for xs_pairs_of_stream (pairs.c). */
xs_stream_pools *xs_pairs_find_stream(xseg_allocator *a,
                                      struct CUstream_st *stream);
/* Whether the cached path is off for now (a hint; `slow`). */
static inline bool xs_alloc_slow_hint(const xseg_allocator *a) {
  return atomic_load_explicit(&a->slow, memory_order_relaxed);
}
/* The pair of `stream` for the cached malloc: the thread's last, or from
   the stream index; NULL when it has none yet. No lock needed. */
static inline xs_stream_pools *xs_pairs_of_stream(xseg_allocator *a,
                                                  struct CUstream_st *stream) {
  xs_pairs_thread *t = &xs_pairs_tls;
  if (__builtin_expect(t->id == a->id && t->stream == stream, 1))
    return t->pair;
  return xs_pairs_find_stream(a, stream);
}
/* A new pair (private_id 0: a stream's), linked first and published, its
   lock held until xs_alloc_unlock; NULL on host OOM. */
xs_stream_pools *xs_stream_pools_new_locked(xseg_allocator *a,
                                            struct CUstream_st *stream,
                                            xseg_pool_id private_id);
/* Stamps sp as used now and puts it first in the list. */
void xs_stream_pools_touch_locked(xseg_allocator *a, xs_stream_pools *sp);
/* Takes a pair that holds no segment out of every list and table. */
void xs_stream_pools_free_locked(xseg_allocator *a, xs_stream_pools *sp);
/* The live block at addr and its pair's table slot, or NULL (pairs.c). */
xs_block *xs_alloc_find_live_locked(xseg_allocator *a, uint64_t addr,
                                    size_t *slot);
/* Frees so far, every pair's (pairs.c). */
uint64_t xs_alloc_frees_locked(const xseg_allocator *a);
/* Live blocks of every pair. */
size_t xs_alloc_live_count_locked(const xseg_allocator *a);

/* The range table's search for xs_ranges_find (ranges.c). */
xs_stream_pools *xs_ranges_search(xseg_allocator *a, uint64_t addr);
/* The pair whose reserved range holds addr, per the range table, or NULL
   (also while it is being rewritten; see alloc/ranges.c): the range of
   the thread's last free when the table has not changed since, else a
   search. No lock needed. */
static inline xs_stream_pools *xs_ranges_last(xseg_allocator *a,
                                              uint64_t addr);
static inline xs_stream_pools *xs_ranges_find(xseg_allocator *a,
                                              uint64_t addr) {
  xs_stream_pools *sp = xs_ranges_last(a, addr);
  return __builtin_expect(sp != NULL, 1) ? sp : xs_ranges_search(a, addr);
}
/* The thread's last range's pair if it holds addr and the table has not
   changed since, else NULL (no search, no call). */
static inline xs_stream_pools *xs_ranges_last(xseg_allocator *a,
                                              uint64_t addr) {
  xs_pairs_thread *t = &xs_pairs_tls;
  unsigned seq = atomic_load_explicit(&a->ranges_seq, memory_order_acquire);
  if (__builtin_expect(seq == t->range_seq && t->range_id == a->id &&
                           addr - t->range_base < t->range_size, 1))
    return t->range_pair;
  return NULL;
}
/* Makes a new range table (ranges.c). A host OOM keeps the old one: the
   cached free of a block it lacks goes the slow way. */
void xs_ranges_remake_locked(xseg_allocator *a);
/* A new range table when segments were added since the last: every
   segment is a reservation of its own (segments/pool.c), so a table made
   at the current count of reservations lacks none. (IPC's mappings
   reserve too: a remake they cause costs nothing else.) Inline: every
   slow operation asks. */
static inline void xs_ranges_refresh_locked(xseg_allocator *a) {
  XS_ASSERT_LOCKED(a);
  if (__builtin_expect(a->vmm.reserves != a->ranges_made_at, 0))
    xs_ranges_remake_locked(a);
}
/* Frees every table (xseg_destroy). */
void xs_ranges_destroy(xseg_allocator *a);

/* A summed value of the statistics (every lock held). */
static inline int64_t xs_alloc_current(const xseg_allocator *a, xs_gauge g) {
  return xs_stats_group_current(&a->stats, g);
}

/* Stats of a block becoming live (+1) or no longer live (-1) for the
   caller (allocation, allocated and requested bytes), and active (+1/-1)
   until its memory may really be reused (active, active_bytes). */
static inline void xs_alloc_account_live(const xs_block *b, int sign) {
  xs_pool_kind k = b->seg->pool->kind;
  xs_stats *s = b->seg->pool->stats;
  xs_stats_move(s, XS_GAUGE_allocation, k, sign);
  xs_stats_move(s, XS_GAUGE_allocated_bytes, k, sign * (int64_t)b->size);
  xs_stats_move(s, XS_GAUGE_requested_bytes, k, sign * (int64_t)b->requested);
  /* active stays: it is derived from allocation (segments/stats.h). */
  xs_stats_held_move(s, XS_GAUGE_active, k, sign, 0);
  xs_stats_held_move(s, XS_GAUGE_active_bytes, k, sign * (int64_t)b->size,
                     0);
}
static inline void xs_alloc_account_active(const xs_block *b, int sign) {
  xs_pool_kind k = b->seg->pool->kind;
  xs_stats *s = b->seg->pool->stats;
  xs_stats_held_move(s, XS_GAUGE_active, k, 0, sign);
  xs_stats_held_move(s, XS_GAUGE_active_bytes, k, 0, sign * (int64_t)b->size);
}
/* The next stamp of sp's free clock. Guards compare a pair's stamps with
   its own clock alone, so each pair's must only increase; but garbage
   collection orders the free blocks of every pair by age (reclaim.c), so
   stamps of different pairs should compare as the frees happened, and a
   counter per pair cannot give that without a shared write. The calling
   thread's count of frees can: on one thread it is exactly the old global
   clock (the pair's own clock never exceeds it); frees of different
   threads compare by their threads' counts, a guess. `t`: the calling
   thread's xs_pairs_tls, which a caller that has it passes. */
static inline uint64_t xs_pair_tick(xs_pairs_thread *t,
                                    xs_stream_pools *sp) {
  uint64_t stamp = ++t->frees;
  if (stamp <= sp->clock) stamp = t->frees = sp->clock + 1;
  sp->frees++;
  return sp->clock = stamp;
}
/* A block of pair sp whose last use is over: stamped with sp's free
   clock, traced. */
static inline void xs_alloc_stamp_pair(xseg_allocator *a, xs_stream_pools *sp,
                                       xs_block *b) {
  b->free_epoch = xs_pair_tick(&xs_pairs_tls, sp);
  xs_trace_record(&a->trace, XS_TRACE_FREE_COMPLETED, b->addr, b->size,
                  b->stream);
}
/* The same, the pair found from the block. */
static inline void xs_alloc_stamp_locked(xseg_allocator *a, xs_block *b) {
  xs_alloc_stamp_pair(a, xs_pools_of(b->seg->pool), b);
}
/* Gives a block whose last use is over back to its pool, stamped. */
static inline void xs_alloc_give_locked(xseg_allocator *a, xs_block *b) {
  xs_alloc_stamp_locked(a, b);
  xs_pool_give(b->seg->pool, b);
}

/* Deferred frees (deferred.c). xseg_free of a block with recorded streams:
   parks it pending. Fails (block still live, nothing changed) only when
   the events cannot be recorded or host memory runs out. */
xseg_status xs_alloc_defer_free_locked(xseg_allocator *a, xs_block *b);
/* A pending block that waited on something else (other processes holding
   it, alloc/ipc_export.c) now waits on its recorded streams: parked until
   the next settling of pending frees records their events. Fails only on
   host OOM (the block is then unchanged). */
xseg_status xs_alloc_park_pending_locked(xseg_allocator *a, xs_block *b);
/* Frees every pending block whose events fired; `wait` blocks on them
   (cuEventSynchronize). Records the events of frees made during a capture
   once none is under way; does nothing while one is. Enters the context. */
xseg_status xs_alloc_process_pending_locked(xseg_allocator *a, bool wait);
/* Every free that waits: blocks other processes let go of (IPC) go
   pending, then xs_alloc_process_pending_locked (frees.c). */
xseg_status xs_alloc_settle_frees_locked(xseg_allocator *a, bool wait);
/* Queued or parked, every pending free is counted in pending_blocks: one
   load on the cached path. */
static inline bool xs_alloc_has_pending(const xseg_allocator *a) {
  return atomic_load_explicit(&a->pending_blocks, memory_order_relaxed) != 0;
}
/* Block b becomes pending (+1) or stops being (-1), its pair's lock
   held. */
static inline void xs_alloc_pending_count(xseg_allocator *a, xs_block *b,
                                          int sign) {
  atomic_size_t *own = &xs_pools_of(b->seg->pool)->n_pending;
  atomic_store_explicit(own, atomic_load_explicit(own, memory_order_relaxed) +
                                 (size_t)(ptrdiff_t)sign,
                        memory_order_relaxed);
  atomic_fetch_add_explicit(&a->pending_blocks, (size_t)(ptrdiff_t)sign,
                            memory_order_relaxed);
  atomic_fetch_add_explicit(&a->pending_bytes, sign * (int64_t)b->size,
                            memory_order_relaxed);
}
/* Whether every pending block is pair sp's (its lock held). */
static inline bool xs_alloc_pending_all_pair(const xseg_allocator *a,
                                             const xs_stream_pools *sp) {
  return atomic_load_explicit(&a->pending_blocks, memory_order_relaxed) ==
         atomic_load_explicit(&sp->n_pending, memory_order_relaxed);
}
/* The cached malloc's share of PyTorch's process_events for the other
   streams' pairs, pair sp's lock held (deferred.c): each one with pending
   frees is taken by a try of its lock (never a wait, so the lock order
   holds) and settles its own. True when every pending block is then
   accounted for, each still waiting on its events; false (the malloc
   takes every lock and settles them all) when a pair was busy, or
   pending blocks sit in pairs the stream index lacks (private pools). */
bool xs_pairs_settle_others(xseg_allocator *a, xs_stream_pools *sp);
/* The cross-stream free of live block b (recorded streams, not shared)
   with its pair's lock held and no capture under way (the cached path:
   deferred.c): queued behind an event on each of its streams, pending.
   Fails (block still live, nothing changed) only when the events cannot
   be recorded or host memory runs out. Enters the context. */
xseg_status xs_alloc_defer_free_pair(xseg_allocator *a, xs_block *b);
/* Frees the pending blocks of pair sp whose events fired (queries only),
   its lock held and no capture under way (the cached malloc, as PyTorch's
   process_events), its parked blocks merged first; nothing when none is
   queued. A failed query leaves them waiting. Enters the context. */
void xs_alloc_poll_pair(xseg_allocator *a, xs_stream_pools *sp);

/* Graph capture (capture.c). */
static inline bool xs_alloc_capturing(const xseg_allocator *a) {
  return a->n_captures != 0;
}
/* The private pools that allocations on `stream` go to, or NULL. */
xs_stream_pools *xs_capture_pools_locked(xseg_allocator *a,
                                         struct CUstream_st *stream);
/* Slow path: an unannounced capture on `stream` (cuStreamGetCaptureInfo)
   becomes an implicit entry, whose private pools are returned in *out
   (NULL when the stream does not capture). Context current. */
xseg_status xs_capture_detect_locked(xseg_allocator *a,
                                     struct CUstream_st *stream,
                                     xs_stream_pools **out);
/* Drops implicit entries whose capture ended. Context current. */
xseg_status xs_capture_refresh_locked(xseg_allocator *a);
/* Before releasing memory: drops implicit entries whose capture ended and
   detects unannounced captures on every stream with pools. Context
   current. */
xseg_status xs_capture_sweep_locked(xseg_allocator *a);

/* The calling thread's stream-capture mode, relaxed around xseg's own
   event and stream queries (capture_mode.c); *saved is the caller's mode,
   which xs_capture_mode_restore puts back. */
xseg_status xs_capture_mode_relax(xseg_allocator *a,
                                  CUstreamCaptureMode *saved);
void xs_capture_mode_restore(xseg_allocator *a, CUstreamCaptureMode saved);

/* Reclaiming memory (reclaim.c; the guard and retire acts are physical.c's).
   All need the context current and do nothing (XSEG_OK) while a capture is
   under way. */
/* Moves sp's guard towards its newest unsafe free (one query or one
   event at most; see streams/guard.h). */
xseg_status xs_alloc_guard_pair_locked(xseg_allocator *a,
                                       xs_stream_pools *sp, bool wait);
/* Unmaps sp's lent aliases whose old work its guard has proven done
   (segments/release.c). Never between choosing a growth's placement and
   mapping it: a retired alias merges with unmapped neighbours. */
xseg_status xs_alloc_retire_pair_locked(xseg_allocator *a,
                                        xs_stream_pools *sp);
/* Advances the guard of every reclaimable pair with unsafe free blocks,
   and retires what it proved done. */
xseg_status xs_alloc_guards_locked(xseg_allocator *a, bool wait);
/* Frees a stream must see between taking other streams' memory and giving
   its own to them (flow.c). */
#define XS_FLOW_QUIET ((uint64_t)256)
/* garbage_collection_threshold: releases free granules, oldest free first,
   until what is mapped is under the threshold's share of the cap. False
   when it is off or had nothing to do. */
bool xs_alloc_collect_garbage_locked(xseg_allocator *a);

/* Policy: PyTorch's pool choice, fit and split rules, inline because
   every cached malloc asks them (the classic segment size is in
   policy.c). */
static inline xs_pool_kind xs_alloc_kind(size_t rounded) {
  return rounded <= XS_SMALL_SIZE ? XS_POOL_SMALL : XS_POOL_LARGE;
}

/* get_free_block's rule: a best fit of `size` bytes is taken, unless it is
   an oversize block (at least max_split_size, never split) that a smaller
   request must not take, or far too large for an oversize request. */
static inline bool xs_alloc_fit_takes(const xseg_allocator *a, size_t size,
                                      size_t rounded) {
  size_t max_split = a->cfg.max_split_size;
  if (rounded < max_split) return size < max_split;
  return size - rounded < a->cfg.max_non_split_rounding;
}

/* get_free_block: the best fit, if xs_alloc_fit_takes it. */
static inline xs_block *xs_alloc_find_free(const xseg_allocator *a,
                                           xs_pool *p, size_t rounded) {
  xs_block *b = xs_freetree_best_fit(&p->free, rounded);
  return b != NULL && xs_alloc_fit_takes(a, b->size, rounded) ? b : NULL;
}

/* should_split, for a block of `size` bytes in a pool of `kind`:
   expandable segments split off any remainder of at least 512 bytes
   (every byte of a segment is reachable, so slivers cost nothing);
   classic large blocks only when the request is below max_split_size and
   more than 1 MiB would remain. */
static inline bool xs_alloc_splits(const xseg_allocator *a, xs_pool_kind kind,
                                   size_t size, size_t rounded) {
  assert(size >= rounded);
  size_t remaining = size - rounded;
  if (kind == XS_POOL_SMALL || a->cfg.expandable_segments)
    return remaining >= XS_MIN_BLOCK;
  return rounded < a->cfg.max_split_size && remaining > XS_SMALL_SIZE;
}

static inline bool xs_alloc_should_split(const xseg_allocator *a,
                                         const xs_pool *p, const xs_block *b,
                                         size_t rounded) {
  return xs_alloc_splits(a, p->kind, b->size, rounded);
}

size_t xs_alloc_classic_size(const xseg_allocator *a, size_t rounded);

/* The slow path of malloc (grow.c): a free block of at least `rounded`
   bytes for a request on `stream` from *p, which an unannounced capture
   detected here turns into a private pool's; growth and the out-of-memory
   path. Enters the device's context itself. */
xseg_status xs_alloc_grow_locked(xseg_allocator *a, xs_pool **p,
                                 struct CUstream_st *stream, size_t rounded,
                                 size_t requested, xs_block **out);
/* Releases whole free granules of every reclaimable pool until `goal`
   bytes are gone (SIZE_MAX: all): pending frees processed and guards
   advanced first, `wait`ing on their events or not (reclaim.c). Nothing
   while a capture is under way. The context must be current. */
xseg_status xs_alloc_release_locked(xseg_allocator *a, size_t goal,
                                    bool wait);

#endif /* XS_ALLOC_ALLOCATOR_H */
