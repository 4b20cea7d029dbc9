/* allocator.h: the device allocator behind xseg_allocator (internal).
 *
 * One per device. Everything below the public entry points runs with `lock`
 * held (functions named *_locked assert it in debug builds) and reaches the
 * driver only through vmm/. Pools come per (stream, size class); the
 * pointer table maps the address of every live block to its block.
 */
#ifndef XS_ALLOC_ALLOCATOR_H
#define XS_ALLOC_ALLOCATOR_H

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "alloc/config.h"
#include "alloc/lock.h"
#include "alloc/ptrtable.h"
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
   allocate to has a pair per stream, whose guard follows that stream). */
typedef struct xs_stream_pools {
  struct CUstream_st *stream;
  xseg_pool_id private_id;            /* 0: the stream's own pools */
  bool released;                      /* private: xseg_release_pool called */
  xs_guard guard;                     /* unmap guard; sets safe_epoch */
  uint64_t grew_at;                   /* free clock at its last growth */
  uint64_t took_at;                   /* free clock when it last took
                                         other streams' memory (flow.c) */
  xs_pool pool[2];                    /* indexed by xs_pool_kind */
  struct xs_stream_pools *next;
} xs_stream_pools;

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
  xs_lock lock;                       /* see alloc/lock.h for why not pthread */
  xs_vmm vmm;
  xs_config cfg;
  xs_stats stats;
  xs_blocks blocks;                   /* block struct cache */
  xs_ptrtable live;                   /* pointer table: every live block */
  xs_stream_pools *streams;           /* most recently used first */
  size_t granule[2];                  /* expandable mapping unit per pool */
  size_t reserve[2];                  /* bytes per reservation per pool */
  size_t cap;                         /* memory_fraction * device memory */
  size_t cap_over;                    /* what was mapped when the cap was
                                         lowered under it, until a growth
                                         ends within the cap (0: none);
                                         see xs_flow_mapped_most */
  /* Cross-stream safety (alloc/deferred.c, alloc/reclaim.c). */
  xs_event_pool events;               /* pending frees' and guards' events */
  xs_pending pending;                 /* frees waiting on recorded streams */
  uint64_t free_clock;                /* stamps every free: free_epoch */
  bool flow_at_limit;                 /* the out-of-memory path's last try
                                         before a host wait: flow.c steals
                                         from any stream */
  size_t pending_blocks;              /* blocks in state pending */
  int64_t pending_bytes;
  xs_block **deferred;                /* pending, events not recorded yet
                                         (freed during a capture) */
  size_t n_deferred, cap_deferred;
  /* Graph capture (alloc/capture.c). */
  xs_capture *captures;
  size_t n_captures, cap_captures, n_implicit;
  xs_trace trace;                     /* device_traces ring (snapshot) */
  /* Pools whose block the cached free parked unmerged (segments/pool.h,
     lazy merging). Every entry point but the cached malloc and free
     settles them all as it takes the lock (xs_alloc_lock), so nothing
     else ever sees one. */
  size_t n_parked;
  /* The pool of the last park while its merge is not in the stats yet:
     until the next operation, which counts it first or, taking the block
     back, together with the split (segments/pool.h). */
  xs_pool *park_stats;
  /* Blocks shared with other processes (alloc/ipc*.c); NULL until the
     first export or open. */
  struct xs_ipc *ipc;
  size_t ipc_parked;                  /* pending blocks that other processes
                                         hold (no events, not in deferred) */
#ifndef NDEBUG
  pthread_t owner;                    /* holder of lock, for asserts */
  bool owned;
  /* Debug builds validate the whole allocator every debug_check_every
     operations (XSEG_DEBUG_CHECK in the environment; 0 = never), when the
     operation lets go of the lock: a broken invariant aborts right after
     the operation that broke it, not at the test's end. */
  uint32_t debug_check_every, debug_ops;
#endif
};

#ifndef NDEBUG
/* Runs xseg_check's walk with the lock held; prints the broken rule and
   aborts (check.c). */
void xs_alloc_debug_check_locked(xseg_allocator *a);
#endif

/* Counts the last park's merge in the stats, if it is not yet. */
static inline void xs_alloc_park_stats_locked(xseg_allocator *a) {
  if (a->park_stats == NULL) return;
  xs_pool_park_stats(a->park_stats);
  a->park_stats = NULL;
}
/* Merges p's parked block, if any, as its free would have. */
static inline void xs_alloc_settle_pool_locked(xseg_allocator *a,
                                               xs_pool *p) {
  if (p->parked == NULL) return;
  xs_alloc_park_stats_locked(a);
  xs_pool_settle(p);
  a->n_parked--;
}
/* Merges every parked block (alloc.c). */
void xs_alloc_settle_locked(xseg_allocator *a);

/* The lock for the cached malloc and free alone, which deal with a parked
   block themselves. */
static inline void xs_alloc_lock_cached(xseg_allocator *a) {
  xs_lock_take(&a->lock);
#ifndef NDEBUG
  a->owner = pthread_self();
  a->owned = true;
#endif
}

/* The lock for everything else: every pool keeps block.h's rules. */
static inline void xs_alloc_lock(xseg_allocator *a) {
  xs_alloc_lock_cached(a);
  if (__builtin_expect(a->n_parked != 0, 0)) xs_alloc_settle_locked(a);
}

static inline void xs_alloc_unlock(xseg_allocator *a) {
#ifndef NDEBUG
  if (a->debug_check_every != 0 &&
      ++a->debug_ops % a->debug_check_every == 0) {
    if (a->n_parked != 0) xs_alloc_settle_locked(a);
    xs_alloc_debug_check_locked(a);
  }
  a->owned = false;
#endif
  xs_lock_drop(&a->lock);
}
#ifndef NDEBUG
#define XS_ASSERT_LOCKED(a)                                                  \
  assert((a)->owned && pthread_equal((a)->owner, pthread_self()) &&          \
         "caller must hold the allocator's mutex")
#else
#define XS_ASSERT_LOCKED(a) ((void)0)
#endif

/* The pools of `stream`, created on first use, looked up in the list and
   moved to its front (alloc.c). */
xseg_status xs_stream_pools_lookup_locked(xseg_allocator *a,
                                          struct CUstream_st *stream,
                                          xs_stream_pools **out);
/* The same, inline for the common case: the stream of the last call,
   already first. */
static inline xseg_status xs_stream_pools_get_locked(
    xseg_allocator *a, struct CUstream_st *stream, xs_stream_pools **out) {
  xs_stream_pools *sp = a->streams;
  if (sp != NULL && sp->stream == stream && sp->private_id == 0)
    return *out = sp, XSEG_OK;
  return xs_stream_pools_lookup_locked(a, stream, out);
}
/* A new pair (private_id 0: a stream's), linked first; NULL on host OOM. */
xs_stream_pools *xs_stream_pools_new_locked(xseg_allocator *a,
                                            struct CUstream_st *stream,
                                            xseg_pool_id private_id);
/* Unlinks and frees a pair that holds no segment. */
void xs_stream_pools_free_locked(xseg_allocator *a, xs_stream_pools *sp);

/* Stats of a block becoming live (+1) or no longer live (-1) for the
   caller (allocation, allocated and requested bytes), and active (+1/-1)
   until its memory may really be reused (active, active_bytes). */
void xs_alloc_account_live(xseg_allocator *a, const xs_block *b, int sign);
void xs_alloc_account_active(xseg_allocator *a, const xs_block *b, int sign);
/* A block whose last use is over: stamped with the free clock, traced. */
static inline void xs_alloc_stamp_locked(xseg_allocator *a, xs_block *b) {
  b->free_epoch = ++a->free_clock;
  xs_trace_record(&a->trace, XS_TRACE_FREE_COMPLETED, b->addr, b->size,
                  b->stream);
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
/* Queued or parked, every pending free is counted in pending_blocks: one
   load on the cached path. */
static inline bool xs_alloc_has_pending(const xseg_allocator *a) {
  return a->pending_blocks != 0;
}

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
  if (rounded < max_split && size >= max_split) return false;
  return rounded < max_split ||
         size - rounded < a->cfg.max_non_split_rounding;
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

/* Formats bytes as PyTorch does ("20.00 MiB") into buf. */
const char *xs_format_bytes(size_t bytes, char *buf, size_t size);

#endif /* XS_ALLOC_ALLOCATOR_H */
