/* types.h: every struct of the allocator (internal), as mimalloc's
 * types.h: the allocator, its pairs of pools, the stream index, the range
 * table, the capture entries and what a thread keeps. The functions on
 * them live in a small header per module (pairs.h, park.h, ranges.h,
 * deferred.h, ...); docs/DESIGN.md says which room each belongs to.
 */
#ifndef XS_ALLOC_TYPES_H
#define XS_ALLOC_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc/config.h"
#include "alloc/ptrtable.h"
#include "alloc/trace.h"
#include "segments/freetree.h"
#include "segments/pool.h"
#include "segments/shards.h"
#include "segments/stats.h"
#include "streams/event_pool.h"
#include "streams/guard.h"
#include "streams/pending.h"
#include "vmm/lock.h"
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
   Allocated on lines of its own (xs_lines_alloc), so that two threads on
   two pairs share no line; never freed before the allocator (a thread may still
   find a pair that went away in an old table: `dead` says so). */
typedef struct xs_pair {
  xs_lock lock;                       /* the pair's lock (alloc/pairs.c) */
  bool dead;                          /* went away: in no list or table */
  /* The cached path may not run on it: dead, or the allocator's `slow`
     (one load for both; written with every lock held, at
     xs_pairs_unlock_all). */
  bool cached_off;
  uint64_t order;                     /* lock order: creation order */
  struct CUstream_st *stream;
  xseg_pool_id private_id;            /* 0: the stream's own pools */
  bool released;                      /* private: xseg_release_pool called */
  /* Released, and a replay of its graph may still be queued on a stream
     no event of xseg's covers: its memory waits for a device
     synchronisation (reclaim.c, xs_alloc_sync_released_locked). */
  bool sync_owed;
  /* Own: xseg_forget_stream gave its memory back, and no capture sweep
     asks its stream (which the caller may have destroyed) any more. A
     later malloc on the same handle (a new stream; it misses, as the pair
     holds nothing) clears it (xs_pairs_touch_locked). */
  bool forgotten;
  uint64_t used_at;                   /* recency: the calling thread's use
                                         count at its last malloc (thread.c) */
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
  /* Its pools' blocks the cached free parked unmerged (segments/pool.h,
     lazy merging: a run of them per pool, xs_pair_parked): the pair's
     cached malloc and free deal with them, every other entry point
     settles them all as it takes the locks. A parked block keeps its
     entry in `live` (not allocated: a free of it is the slow path's)
     until it settles, so that taking it back costs the table nothing. */
  /* Parks whose free and merge are not in the stats yet (held back,
     alloc/park.h): the newest parks of at most two runs, in the order of
     their frees. Those of pool park_stats are the newest, from
     park_oldest[its kind] up to its top; those of park_first (NULL: none)
     came before, from park_oldest[its kind] up to its top. Each keeps its
     requested size for its free's count. A malloc that takes the newest
     back for its own requested size moves no gauge but the totals of
     increases (alloc.c, alloc_retake); anything else counts them all
     first. With more than one pair, what is held back is published in
     the shard (xs_stats.owed: `park_owed_published`), so that other
     pairs' crossings sum true values, and a take-back checks the
     thresholds first. */
  xs_pool *park_stats;
  xs_pool *park_first;
  xs_block *park_oldest[2];
  bool park_owed_published;
  xs_pool pool[2];                    /* indexed by xs_pool_kind */
  /* The frees of its blocks that wait on work recorded on other streams
     (deferred.c): their events and per-stream queues, under the pair's
     lock, so that a cross-stream free and the malloc that polls it take
     the pair's lock alone. */
  xs_event_pool events;
  xs_pending pending;
  /* Its blocks in state pending: written under its lock, read by other
     pairs' cached mallocs (xs_alloc_poll_others). */
  atomic_size_t n_pending;
  struct xs_pair *next;               /* the allocator's list */
  /* The size bins of each pool's free index (segments/freetree.h), by
     pool kind. The small pool's requests are the ones up to 1 MiB; the
     large pool's never take a block that small, but its splits leave such
     rests, and in its bins they keep out of the way of its red-black tree
     (bench/README.md, "The large pool's rests in bins"). The indexes of
     unmapped blocks have none: those blocks are whole granules. */
  xs_freebin bins[2][XS_FREETREE_BINS];
#ifndef NDEBUG
  pthread_t owner;                    /* holder of lock, for asserts */
  bool owned;
#endif
} xs_pair;

/* The pairs of streams by stream, for the cached malloc's lookup without
   a lock (pairs.c): append-only, as a stream's own pair never goes away
   before the allocator. An entry is written before the count that shows
   it is published; a full array is replaced by one twice its size, the
   old one kept until xseg_destroy (a reader may still be in it), so the
   arrays kept add up to at most twice the largest. */
typedef struct xs_stream_entry {
  struct CUstream_st *stream;
  struct xs_pair *pair;
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
  _Atomic(struct xs_pair *) pair;
} xs_range;
typedef struct xs_range_array {
  struct xs_range_array *retired;     /* older arrays, kept */
  size_t cap;
  xs_range range[];
} xs_range_array;

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

/* Three parts, each on cache lines of its own (the struct is allocated
   on lines, create.c), so that what threads on different pairs write
   stays off what the others' cached paths read: a line one core writes
   is taken from every core that holds it. */
struct xseg_allocator {
  /* 1. What every cached malloc and free reads, written only with every
     lock held (or, the range table, by a slow operation under its
     sequence count): shared by every core, written rarely. */
  /* Set whenever the cached malloc and free must take the slow path;
     written with every lock held (xs_alloc_leave). Read under a pair
     lock for the answer, and before it as a hint: a malloc or free that
     sees it set goes the slow way without taking its pair's lock. */
  _Atomic bool slow;
  uint64_t id;                        /* unique per xseg_create (pairs.c) */
  size_t n_pairs;                     /* live pairs */
  _Atomic(xs_stream_index *) stream_index;
  /* The range table (ranges.c): even sequence count when stable. */
  _Atomic(xs_range_array *) ranges;
  atomic_size_t n_ranges;
  atomic_uint ranges_seq;
  xs_config cfg;
  /* 2. Blocks in state pending, every pair's: moved by a pair's cached
     cross-stream free and by the malloc that polls it under that pair's
     lock alone, and read by every cached malloc (active's peak needs a
     look while anything is held), hence atomics; apart from part 1, which
     a deferred free would otherwise take from every other core. */
  _Alignas(XS_LINE) atomic_size_t pending_blocks;
  _Atomic int64_t pending_bytes;
  /* 3. What slow operations (every lock held) read and write. */
  _Alignas(XS_LINE) xs_lock lock;     /* see vmm/lock.h for why not pthread */
  /* Every pair in lock order (creation order), read and written with the
     allocator's lock held: xs_alloc_enter takes each one's lock. A pair
     that goes away stays in it, dead, until the unlock drops its lock. */
  xs_pair **order;
  size_t n_order, order_cap;
  uint64_t ranges_made_at;            /* range table: vmm.reserves at its
                                         making */
  uint64_t next_order;                /* of the next pair */
  /* Pairs gone: their memory is never given back before xseg_destroy, as
     a thread may still hold one found in the range table, but it is
     recycled as a new pair (pairs.c), so there are never more than the
     most pairs alive at once. `dying`: gone during this operation, still
     in `order`; `spare`: out of it, ready for reuse. */
  xs_pair *dying, *spare;
  size_t pair_structs;                /* allocated, alive or not */
  uint64_t frees_gone;                /* frees of pairs gone */
  xs_vmm vmm;
  xs_stats_group stats;               /* the shards and their peaks */
  xs_stats shared_stats;              /* the shard of no pair: counters of
                                         slow operations, totals of pairs
                                         gone */
  xs_pair *streams;                   /* most recently used first (as of
                                         xs_alloc_enter, by used_at) */
  size_t granule[2];                  /* expandable mapping unit per pool */
  size_t reserve[2];                  /* bytes per reservation per pool */
  size_t cap;                         /* memory_fraction * device memory */
  size_t cap_over;                    /* what was mapped when the cap was
                                         lowered under it, until a growth
                                         ends within the cap (0: none);
                                         see xs_alloc_mapped_most */
  /* Cross-stream safety (alloc/deferred.c, alloc/reclaim.c). */
  xs_event_pool events;               /* the unmap guards' events */
  bool flow_at_limit;                 /* the out-of-memory path's last try
                                         before a host wait: flow.c steals
                                         from any stream */
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
  size_t ipc_held_frees;              /* pending blocks that other processes
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

/* What the calling thread keeps (thread.c): its count of uses (recency)
   and the pair of its last cached malloc, named by the allocator's id
   (not its address: a destroyed allocator's successor may get it). */
typedef struct xs_pairs_thread {
  uint64_t uses;
  uint64_t frees;                     /* its free stamps (xs_pair_tick) */
  uint64_t id;
  struct CUstream_st *stream;
  xs_pair *pair;
  /* The range of its last cached free, valid while the range table's
     sequence count is still range_seq (xs_ranges_find). */
  uint64_t range_id, range_base, range_size;
  unsigned range_seq;
  xs_pair *range_pair;
} xs_pairs_thread;

#endif /* XS_ALLOC_TYPES_H */
