/* reclaim.h: giving memory back: guards, retiring aliases, release
 * passes and garbage collection (reclaim.c, physical.c).
 */
#ifndef XS_ALLOC_RECLAIM_H
#define XS_ALLOC_RECLAIM_H

#include "alloc/types.h"

/* Reclaiming memory (reclaim.c; the guard and retire acts are physical.c's).
   All need the context current and do nothing (XSEG_OK) while a capture is
   under way. */
/* Moves `pair`'s guard towards its newest unsafe free (one query or one
   event at most; see streams/guard.h). */
xseg_status xs_alloc_guard_advance_locked(xseg_allocator *a,
                                          xs_pair *pair, bool wait);
/* Unmaps `pair`'s lent aliases whose old work its guard has proven done
   (segments/release.c). Never between choosing a growth's placement and
   mapping it: a retired alias merges with unmapped neighbours. */
xseg_status xs_alloc_retire_aliases_locked(xseg_allocator *a,
                                           xs_pair *pair);
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
/* PyTorch's release_available_cached_blocks, the out-of-memory ladder's
   first step with max_split_size_mb set (classic segments): pool p, the
   request's, gives back its smallest free oversize block that holds a
   request of `rounded` bytes (at least max_split_size), else its oversize
   blocks from the largest down until as many bytes went. True when one
   such block or that many bytes went; false, nothing released, when the
   rule is off. */
bool xs_alloc_release_oversize_locked(xseg_allocator *a, xs_pool *p,
                                      size_t rounded);

/* Released private pools whose graphs' replays no event covers
   (sync_owed): the device is waited for once, and their memory becomes
   reclaimable. XSEG_OK at once when none; the driver's failure leaves
   them as they were. No capture may be under way; the context must be
   current. */
xseg_status xs_alloc_sync_released_locked(xseg_allocator *a);
/* Whether a released private pool waits for that (sync_owed). */
bool xs_alloc_sync_owed_locked(const xseg_allocator *a);
/* Releases whole free granules of every reclaimable pool until `goal`
   bytes are gone (SIZE_MAX: all): pending frees processed and guards
   advanced first, `wait`ing on their events or not (reclaim.c). Nothing
   while a capture is under way. The context must be current. */
xseg_status xs_alloc_release_locked(xseg_allocator *a, size_t goal,
                                    bool wait);
/* The blocking release of `stream`'s pairs alone (its own, and the
   released private pools begun on it): every free whose events fired
   completes, the pairs' own pending frees and the work guarding their
   free memory are waited for, and all of their free granules go; other
   streams' caches stay, and their work is not waited for
   (xseg_forget_stream), except that of a stream whose old mapping of
   memory it lent to these pairs still pins that memory (its guard). Nothing while a capture is under way. The context
   must be current. */
xseg_status xs_alloc_release_stream_locked(xseg_allocator *a,
                                           struct CUstream_st *stream);
/* Whether any pair of `stream` (its own, or a private pool begun on it)
   still has a segment. */
bool xs_alloc_stream_holds_memory_locked(const xseg_allocator *a,
                                         const struct CUstream_st *stream);

#endif /* XS_ALLOC_RECLAIM_H */
