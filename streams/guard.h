/* guard.h: how far a stream's work has got, proven without a host sync.
 *
 * cuMemUnmap does not wait for work in flight, and the granules of a free
 * block may still be used by work queued on its stream before the free (a
 * stream reuses its own free blocks at once: stream order makes that safe,
 * but unmapping happens on the host, outside any stream). So every free is
 * stamped with the allocator's free clock (xs_block.free_epoch), and each
 * stream has a guard whose `safe` epoch says: every block stamped at or
 * below it is past all the work its stream had queued when it was freed.
 * Such a block may be unmapped, or its physical memory handed to another
 * stream; the others wait, mapped, for a later pass.
 *
 * Advancing a guard towards a target epoch (the stream's newest free):
 *   1. an event in flight is queried; if it fired, safe = its mark;
 *   2. if still short and no event is in flight, cuStreamQuery: an idle
 *      stream proves every free so far (safe = now, no event needed);
 *   3. otherwise one pooled event is recorded on the stream, marking the
 *      clock now; a later pass finds it fired.
 * So a release pass records at most one event per stream, and a steady
 * state needs at most one event per stream in flight. The blocking form
 * waits on that one event (cuEventSynchronize), never on a stream or the
 * device.
 *
 * A destroyed stream (cuStreamQuery: CUDA_ERROR_INVALID_HANDLE) proves
 * `now` as an idle one does, so its cached memory can move. This never
 * touches the dead stream beyond that query: an event already in flight is
 * still queried (events outlive their stream). It trusts the caller to
 * have finished the stream's work before destroying it (CUDA lets
 * cuStreamDestroy return while work drains). A handle value the driver
 * recycles for a new stream is safe too: CUDA frees a stream's resources
 * only after its work is done, so the new stream's query speaks for both.
 *
 * An event recorded at release time also covers work queued after the free
 * and before the release: a guard may wait longer than strictly needed,
 * never less.
 *
 * Queries are illegal during a graph capture: callers advance guards only
 * when no capture is under way. Not thread-safe (the allocator's locks,
 * all held); the device's context must be current.
 */
#ifndef XS_STREAMS_GUARD_H
#define XS_STREAMS_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "streams/event_pool.h"

typedef struct xs_guard {
  CUevent event;         /* recorded and not yet seen fired, or NULL */
  uint64_t mark;         /* the free clock when `event` was recorded */
  uint64_t safe;         /* frees stamped <= safe are past their work */
} xs_guard;

/* Moves g->safe towards `target` (<= now, the clock's value) as above.
   `wait`: block on the guard's event instead of leaving it in flight. A
   failing driver call is returned with its message; g stays consistent. */
xseg_status xs_guard_advance(xs_guard *g, xs_event_pool *events,
                             struct CUstream_st *stream, uint64_t target,
                             uint64_t now, bool wait);

/* Returns the in-flight event, if any, to the pool (xseg_destroy; the
   caller no longer needs to know when it fires). */
void xs_guard_drop(xs_guard *g, xs_event_pool *events);

#endif /* XS_STREAMS_GUARD_H */
