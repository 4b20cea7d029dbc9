/* event_pool.h: a device's reusable events.
 *
 * Cross-stream frees and unmap guards record an event per stream they wait
 * on. Creating a driver event per free would put cuEventCreate/Destroy on a
 * hot path and let the event count grow with the free rate, so events are
 * taken from this pool and returned when they have fired: in a steady state
 * the pool stops creating events at the largest number that were ever in
 * flight at once.
 *
 * Not thread-safe: its owner's lock guards it (the allocator keeps one
 * for unmap guards under every lock, and one per pair of pools for the
 * frees of its blocks under the pair's lock).
 * Needs the device's context current (xs_vmm_ctx_enter). A pool of another
 * context's events (`ctx`: a stream of another device recorded on a
 * block, as PyTorch allows) makes that context current to create one:
 * cuEventRecord wants the event's and the stream's contexts to be one.
 */
#ifndef XS_STREAMS_EVENT_POOL_H
#define XS_STREAMS_EVENT_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "vmm/vmm.h"

typedef struct xs_event_pool {
  xs_vmm  *vmm;
  CUcontext ctx;          /* whose events: NULL for the vmm's own (current
                             already), else another context's */
  CUevent *idle;          /* events not in flight, a stack */
  size_t   n_idle, cap_idle;
  uint64_t created;       /* events ever created by this pool */
  uint64_t in_flight;     /* taken and not yet returned */
} xs_event_pool;

void xs_event_pool_init(xs_event_pool *p, xs_vmm *vmm);
/* A pool of context ctx's events (NULL or vmm's own: xs_event_pool_init). */
void xs_event_pool_init_in(xs_event_pool *p, xs_vmm *vmm, CUcontext ctx);
/* Destroys every idle event. Events still in flight are the caller's bug:
   asserted in debug builds, and left to the driver otherwise. */
void xs_event_pool_destroy(xs_event_pool *p);

/* An idle event, or a new one (CU_EVENT_DISABLE_TIMING: cheaper to record
   and query, and timing is never needed here). */
xseg_status xs_event_pool_take(xs_event_pool *p, CUevent *out);
/* Gives back an event whose recorded work has completed, that was never
   recorded, or whose record only a queued cuStreamWaitEvent needed (the
   driver API documents that the waiting stream waits for the record the
   event had when the wait was queued, and that later records or a destroy
   of the event do not affect it). Never fails: if the stack cannot grow,
   the event is destroyed. */
void xs_event_pool_give(xs_event_pool *p, CUevent ev);
/* Destroys a taken event whose record failed rather than keep it: the
   failure may be the event's own (another context's, say), and a pool
   that handed it out again would fail every record after. */
void xs_event_pool_discard(xs_event_pool *p, CUevent ev);
/* Moves every idle event of `from` (none in flight) to `into`, leaving
   `from` empty (no driver call unless host memory runs out, when they are
   destroyed instead). */
void xs_event_pool_absorb(xs_event_pool *into, xs_event_pool *from);

#endif /* XS_STREAMS_EVENT_POOL_H */
