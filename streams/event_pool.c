/* event_pool.c: take and give back driver events; see event_pool.h. */
#include <assert.h>
#include <stdlib.h>

#include "streams/event_pool.h"
#include "vmm/error.h"

void xs_event_pool_init(xs_event_pool *p, xs_vmm *vmm) {
  *p = (xs_event_pool){.vmm = vmm};
}

void xs_event_pool_destroy(xs_event_pool *p) {
  assert(p->in_flight == 0 && "every taken event was given back");
  for (size_t i = 0; i < p->n_idle; i++)
    XS_DRV(p->vmm->drv, cuEventDestroy, p->idle[i]);
  free(p->idle);
  *p = (xs_event_pool){.vmm = p->vmm};
}

xseg_status xs_event_pool_take(xs_event_pool *p, CUevent *out) {
  if (p->n_idle > 0) {
    *out = p->idle[--p->n_idle];
    p->in_flight++;
    return XSEG_OK;
  }
  CUresult r = XS_DRV(p->vmm->drv, cuEventCreate, out, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(p->vmm->drv, r,
                           "cuEventCreate(CU_EVENT_DISABLE_TIMING) on device %d",
                           p->vmm->device);
  p->created++;
  p->in_flight++;
  return XSEG_OK;
}

static int event_pool_grow(xs_event_pool *p) {
  size_t cap = p->cap_idle ? 2 * p->cap_idle : 16;
  CUevent *idle = realloc(p->idle, cap * sizeof *idle);
  if (idle == NULL) return -1;
  p->idle = idle;
  p->cap_idle = cap;
  return 0;
}

void xs_event_pool_give(xs_event_pool *p, CUevent ev) {
  assert(p->in_flight > 0 && "gives match takes");
  p->in_flight--;
  if (p->n_idle == p->cap_idle && event_pool_grow(p) != 0) {
    XS_DRV(p->vmm->drv, cuEventDestroy, ev);
    return;
  }
  p->idle[p->n_idle++] = ev;
}
