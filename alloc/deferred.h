/* deferred.h: frees that wait on work recorded on other streams: queued
 * behind events, per pair (deferred.c). The completion of every free that
 * waits is frees.h's.
 */
#ifndef XS_ALLOC_DEFERRED_H
#define XS_ALLOC_DEFERRED_H

#include "alloc/types.h"
#include "alloc/pairs.h"

/* Deferred frees (deferred.c). xseg_free of a block with recorded streams:
   makes it pending. Fails (block still live, nothing changed) only when
   the events cannot be recorded, a stream's capture status cannot be read
   or host memory runs out. */
xseg_status xs_alloc_defer_free_locked(xseg_allocator *a, xs_block *b);
/* A pending block that waited on something else (other processes holding
   it, alloc/ipc_export.c) now waits on its recorded streams: listed
   unrecorded until the next completion of pending frees records their
   events. Fails only on host OOM (the block is then unchanged). */
xseg_status xs_alloc_defer_unrecorded_locked(xseg_allocator *a, xs_block *b);
/* Frees every pending block whose events fired; `wait` blocks on them
   (cuEventSynchronize). Records the events of frees made during a capture
   once none is under way; does nothing while one is. Enters the context. */
xseg_status xs_alloc_process_pending_locked(xseg_allocator *a, bool wait);
/* Queued behind events or waiting without them, every pending free is
   counted in pending_blocks: one load on the cached path. */
static inline bool xs_alloc_has_pending(const xseg_allocator *a) {
  return atomic_load_explicit(&a->pending_blocks, memory_order_relaxed) != 0;
}
/* Block b becomes pending (+1) or stops being (-1), its pair's lock
   held. */
static inline void xs_alloc_pending_count(xseg_allocator *a, xs_block *b,
                                          int sign) {
  atomic_size_t *own = &xs_pool_pair(b->seg->pool)->n_pending;
  atomic_store_explicit(own, atomic_load_explicit(own, memory_order_relaxed) +
                                 (size_t)(ptrdiff_t)sign,
                        memory_order_relaxed);
  atomic_fetch_add_explicit(&a->pending_blocks, (size_t)(ptrdiff_t)sign,
                            memory_order_relaxed);
  atomic_fetch_add_explicit(&a->pending_bytes, sign * (int64_t)b->size,
                            memory_order_relaxed);
}
/* Whether every pending block is `pair`'s (its lock held). */
static inline bool xs_alloc_pending_all_pair(const xseg_allocator *a,
                                             const xs_pair *pair) {
  return atomic_load_explicit(&a->pending_blocks, memory_order_relaxed) ==
         atomic_load_explicit(&pair->n_pending, memory_order_relaxed);
}
/* `pair`'s lock held: the cached malloc's share of PyTorch's
   process_events for the other streams' pairs (deferred.c). Each one with
   pending frees is taken by a try of its lock (never a wait, so the lock
   order holds) and polls its own. True when every pending block is then
   accounted for, each still waiting on its events; false (the malloc
   takes every lock and completes them all) when a pair was busy, or
   pending blocks sit in pairs the stream index lacks (private pools). */
bool xs_alloc_poll_others(xseg_allocator *a, xs_pair *pair);
/* The cross-stream free of live block b (recorded streams, not shared)
   with its pair's lock held and no capture under way that xseg knows of
   (the cached path: deferred.c): queued behind an event on each of its
   streams, pending. *later (nothing changed) when one of its streams
   captures all the same: the free must wait unrecorded, with every lock
   (xs_alloc_defer_free_locked). Fails (block still live, nothing changed)
   only when the events cannot be recorded, a stream's capture status
   cannot be read, or host memory runs out. Enters the context. */
xseg_status xs_alloc_defer_free_pair(xseg_allocator *a, xs_block *b,
                                     bool *later);
/* Frees the pending blocks of `pair` whose events fired (queries only),
   its lock held and no capture under way (the cached malloc, as PyTorch's
   process_events), its parked blocks merged first; nothing when none is
   queued. A failed query leaves them waiting. Enters the context. */
void xs_alloc_poll_pair(xseg_allocator *a, xs_pair *pair);
/* As xs_alloc_poll_pair, but waits (cuEventSynchronize) for every pending
   free queued in `pair` now; every lock held, no capture under way
   (xseg_forget_stream's wait for one stream's pairs alone). Frees made
   during a capture and not recorded yet are xs_alloc_process_pending's.
   Enters the context. */
xseg_status xs_alloc_drain_pair_locked(xseg_allocator *a, xs_pair *pair);
/* Every lock held, no capture under way, the context entered
   (xseg_forget_stream): waits for the frees recorded on `stream` in every
   pair and drops its queues (streams/pending.h, xs_pending_forget), so
   that a stream made later at its address, of any context, starts anew. */
xseg_status xs_alloc_forget_pending_locked(xseg_allocator *a,
                                           struct CUstream_st *stream);

#endif /* XS_ALLOC_DEFERRED_H */
