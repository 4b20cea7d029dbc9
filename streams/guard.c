/* guard.c: advancing a stream's unmap guard; see guard.h. */
#include <assert.h>

#include "streams/guard.h"
#include "streams/stream_query.h"
#include "vmm/error.h"

/* Step 1: has the event in flight fired (or, waiting, once it has)? */
static xseg_status guard_check_event(xs_guard *g, xs_event_pool *events,
                                     struct CUstream_st *stream, bool wait) {
  xs_driver *drv = events->vmm->drv;
  CUresult r = wait ? XS_DRV(drv, cuEventSynchronize, g->event)
                    : XS_DRV(drv, cuEventQuery, g->event);
  if (r == CUDA_ERROR_NOT_READY) return XSEG_OK;
  if (r != CUDA_SUCCESS)
    return xs_driver_error(drv, r, "%s(unmap guard of stream %p)",
                           wait ? "cuEventSynchronize" : "cuEventQuery",
                           (void *)stream);
  assert(g->mark >= g->safe && "a guard never moves back");
  g->safe = g->mark;
  xs_event_pool_give(events, g->event);
  g->event = NULL;
  return XSEG_OK;
}

/* Steps 2 and 3: an idle stream proves `now`; a busy one gets an event.
   A stream the caller destroyed counts as idle (stream_query.h). */
static xseg_status guard_mark(xs_guard *g, xs_event_pool *events,
                              struct CUstream_st *stream, uint64_t now) {
  xs_driver *drv = events->vmm->drv;
  CUresult r;
  xs_stream_state state = xs_stream_query(drv, stream, &r);
  if (state == XS_STREAM_IDLE || state == XS_STREAM_GONE) {
    g->safe = now;
    return XSEG_OK;
  }
  if (state == XS_STREAM_FAILED)
    return xs_driver_error(drv, r, "cuStreamQuery(stream %p)", (void *)stream);
  CUevent ev;
  xseg_status st = xs_event_pool_take(events, &ev);
  if (st != XSEG_OK) return st;
  r = XS_DRV(drv, cuEventRecord, ev, (CUstream)stream);
  if (r != CUDA_SUCCESS) {
    xs_event_pool_discard(events, ev);
    return xs_driver_error(drv, r, "cuEventRecord(unmap guard of stream %p)",
                           (void *)stream);
  }
  g->event = ev;
  g->mark = now;
  return XSEG_OK;
}

xseg_status xs_guard_advance(xs_guard *g, xs_event_pool *events,
                             struct CUstream_st *stream, uint64_t target,
                             uint64_t now, bool wait) {
  assert(target <= now && "the target is a free that happened");
  if (g->safe >= target) return XSEG_OK;
  if (g->event != NULL) {
    xseg_status st = guard_check_event(g, events, stream, wait);
    if (st != XSEG_OK || g->safe >= target) return st;
    if (g->event != NULL) return XSEG_OK;   /* one in flight is enough */
  }
  xseg_status st = guard_mark(g, events, stream, now);
  if (st != XSEG_OK || !wait || g->event == NULL) return st;
  return guard_check_event(g, events, stream, true);
}

void xs_guard_drop(xs_guard *g, xs_event_pool *events) {
  if (g->event != NULL) xs_event_pool_give(events, g->event);
  g->event = NULL;
}
