/* event_pool.c: take and give back driver events; see event_pool.h. */
#include <assert.h>
#include <stdlib.h>

#include "streams/event_pool.h"
#include "vmm/array.h"
#include "vmm/error.h"

void xs_event_pool_init(xs_event_pool *p, xs_vmm *vmm) {
  *p = (xs_event_pool){.vmm = vmm};
}

void xs_event_pool_init_in(xs_event_pool *p, xs_vmm *vmm, CUcontext ctx) {
  *p = (xs_event_pool){.vmm = vmm, .ctx = ctx == vmm->ctx ? NULL : ctx};
}

/* A new event of p's context. */
static xseg_status event_pool_create(xs_event_pool *p, CUevent *out) {
  CUcontext saved = NULL;
  /* An event is created in the current context. The vmm's own is current
     unless a switch back failed earlier in this call: an event made then
     would be another context's, and every record of it on the vmm's
     streams would fail. */
  xseg_status st = p->ctx != NULL ? xs_vmm_ctx_switch(p->vmm, p->ctx, &saved)
                                  : xs_vmm_ctx_mend(p->vmm);
  if (st != XSEG_OK) return st;
  CUresult r = XS_DRV(p->vmm->drv, cuEventCreate, out, CU_EVENT_DISABLE_TIMING);
  xseg_status back =
      p->ctx != NULL ? xs_vmm_ctx_return(p->vmm, p->ctx, saved) : XSEG_OK;
  if (r != CUDA_SUCCESS)
    return xs_driver_error(p->vmm->drv, r,
                           "cuEventCreate(CU_EVENT_DISABLE_TIMING) on device "
                           "%d%s", p->vmm->device,
                           p->ctx != NULL ? ", in a recorded stream's context"
                                          : "");
  /* The caller's thread is left in the other context: said, not hidden
     (the event goes: nothing was recorded on it). */
  if (back != XSEG_OK) XS_DRV(p->vmm->drv, cuEventDestroy, *out);
  return back;
}

void xs_event_pool_destroy(xs_event_pool *p) {
  assert(p->in_flight == 0 && "every taken event was given back");
  for (size_t i = 0; i < p->n_idle; i++)
    XS_DRV(p->vmm->drv, cuEventDestroy, p->idle[i]);
  free(p->idle);
  *p = (xs_event_pool){.vmm = p->vmm, .ctx = p->ctx};
}

xseg_status xs_event_pool_take(xs_event_pool *p, CUevent *out) {
  if (p->n_idle > 0) {
    *out = p->idle[--p->n_idle];
    p->in_flight++;
    return XSEG_OK;
  }
  xseg_status st = event_pool_create(p, out);
  if (st != XSEG_OK) return st;
  p->created++;
  p->in_flight++;
  return XSEG_OK;
}

void xs_event_pool_give(xs_event_pool *p, CUevent ev) {
  assert(p->in_flight > 0 && "gives match takes");
  p->in_flight--;
  if (!XS_ARRAY_RESERVE(p->idle, p->cap_idle, p->n_idle + 1, 16)) {
    XS_DRV(p->vmm->drv, cuEventDestroy, ev);
    return;
  }
  p->idle[p->n_idle++] = ev;
}

void xs_event_pool_discard(xs_event_pool *p, CUevent ev) {
  assert(p->in_flight > 0 && "discards match takes");
  p->in_flight--;
  XS_DRV(p->vmm->drv, cuEventDestroy, ev);
}

void xs_event_pool_absorb(xs_event_pool *into, xs_event_pool *from) {
  assert(from->in_flight == 0 && "every taken event was given back");
  assert(into->ctx == from->ctx && "one context's events");
  size_t moved = 0;
  if (XS_ARRAY_RESERVE(into->idle, into->cap_idle,
                       into->n_idle + from->n_idle, 16)) {
    for (; moved < from->n_idle; moved++)
      into->idle[into->n_idle++] = from->idle[moved];
  }
  for (size_t i = moved; i < from->n_idle; i++)   /* host OOM: let go */
    XS_DRV(from->vmm->drv, cuEventDestroy, from->idle[i]);
  free(from->idle);
  *from = (xs_event_pool){.vmm = from->vmm, .ctx = from->ctx};
}
