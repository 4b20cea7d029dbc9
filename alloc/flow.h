/* flow.h: where a growth's physical memory comes from (internal).
 *
 * Physical memory flows between granules and streams without a host wait.
 * The policy decides (flow.c: one budget across streams, the order of the
 * sources, the steal rule, handle sizes); physical.c acts (guards,
 * retiring aliases, taking whole handles from a pair of pools, stealing
 * behind an event, creating and releasing handles). The layers call only
 * downward:
 *
 *     alloc.c     malloc, its cached path (free.c: free)
 *     grow.c      the slow path: placement, mapping, the out-of-memory
 *                 ladder
 *     flow.c      the policy: which memory serves a growth
 *     reclaim.c   release passes and garbage collection
 *     physical.c  the acts, on segments/, streams/ and vmm/
 *
 * All need every lock held (`_locked`) and the device's context current.
 */
#ifndef XS_ALLOC_FLOW_H
#define XS_ALLOC_FLOW_H

#include "alloc/types.h"

/* ---- the policy (flow.c) ------------------------------------------------ */

/* How a growth of pl->n granules gets its handles. */
typedef struct xs_flow_plan {
  size_t g;          /* bytes per granule */
  size_t room;       /* granules the hole can take */
  size_t fresh;      /* granules to create when reuse falls short, at most */
} xs_flow_plan;
xs_flow_plan xs_flow_plan_for(const xseg_allocator *a, const xs_place *pl);

/* Whether `bytes` more device memory stay within the memory-fraction cap;
   the error when they do not. */
bool xs_flow_within_cap(const xseg_allocator *a, size_t bytes);
xseg_status xs_flow_cap_error(const xseg_allocator *a, size_t bytes);

/* Gets handles for at least pl->n granules (at most `max`) into
   handles[0..*have), a run of equal values being one handle: the
   stream's own free memory, then other streams', then new memory. Fails
   (with what it got in *have, for the caller to release) when none of
   that can serve. */
xseg_status xs_flow_collect_locked(xseg_allocator *a, xs_pool *p,
                                   const xs_place *pl,
                                   const xs_flow_plan *plan, size_t max,
                                   uint64_t *handles, size_t *have);

/* ---- the acts (physical.c) ---------------------------------------------- */

/* Whole free handles of `pair`'s pools (`first` first, then its sibling),
   granules of `granule` bytes, at least `want` if there are, at most
   `max`: those the guard has passed are unmapped, those freed at or below
   `lend_upto` lent (segments/release.c). `keep` is never cut. */
size_t xs_phys_take_locked(xseg_allocator *a, xs_pair *pair,
                           xs_pool *first, size_t granule, size_t want,
                           size_t max, const xs_block *keep,
                           uint64_t lend_upto, uint64_t *handles);
/* Records an event on donor's stream and makes thief's stream wait on it
   (cuStreamWaitEvent), then lends donor's free memory (all of it is
   covered), from the pools in `pools` (bit k: pool k). 0 when the wait
   cannot be queued. */
size_t xs_phys_steal_locked(xseg_allocator *a, xs_pair *thief,
                            xs_pair *donor, unsigned pools,
                            size_t granule, size_t want, size_t max,
                            uint64_t *handles);
/* One fresh handle of `bytes` (cuMemCreate). */
xseg_status xs_phys_create_locked(xseg_allocator *a, size_t bytes,
                                  uint64_t *out);
/* Releases handles[0..n) (after a failed growth): one call per handle; a
   handle an alias still maps becomes its orphan instead (vmm/aliases.c). */
void xs_phys_release_locked(xseg_allocator *a, const uint64_t *handles,
                            size_t n);

#endif /* XS_ALLOC_FLOW_H */
