/* policy_exact.c: one reservation and one mapping per allocation.
 *
 * Each request gets its own address range of exactly its size rounded up to
 * the granularity, one physical handle of that size mapped there, and access
 * granted; a free undoes all of it. Nothing is cached, so this is the floor
 * no caching policy can beat on reserved bytes (only rounding to granules is
 * lost) and the ceiling on driver calls (7 per allocate/free pair).
 *
 * A zero-byte request maps nothing and gets NULL: the driver has no
 * zero-byte mapping, and there is nothing to reserve. A request above
 * XB_MAX_SIZE, whose rounding could wrap, is refused as xseg refuses it.
 *
 * Under --gpu-lag a freed block may still be used by work queued on its
 * stream, so its unmap and release wait, without a host wait, for an event
 * recorded on that stream at the free: pending blocks are kept in free
 * order and released from the oldest while their events have completed,
 * polled at every malloc and free. They count as mapped until then. All
 * work runs the same lag behind its queueing, so events complete in the
 * order they were recorded and the oldest is the one to poll.
 */
#include <stdlib.h>

#include "bench.h"
#include "vmm/error.h"

/* A freed block whose unmap waits for its event. */
typedef struct xb_pending {
  uint64_t addr, handle, bytes;
  CUevent event;
} xb_pending;

typedef struct xb_exact {
  xs_vmm *v;
  CUcontext saved;                  /* the caller's context, for close */
  uint64_t *addr, *handle, *bytes;  /* per slot, while allocated */
  CUstream *stream;                 /* per slot, while allocated */
  bool deferred;                    /* --gpu-lag: release behind events */
  xb_pending *pending;              /* ring, oldest at head */
  size_t head, count, cap;
  uint64_t mapped, window_peak;
} xb_exact;

static void exact_release(xb_exact *x) {
  free(x->addr);
  free(x->handle);
  free(x->bytes);
  free(x->stream);
  free(x->pending);
  free(x);
}

static xseg_status exact_unmap(xb_exact *x, uint64_t addr, uint64_t handle,
                               uint64_t bytes) {
  xseg_status st = xs_vmm_unmap_run(x->v, addr, bytes, 1, &handle);
  if (st == XSEG_OK) st = xs_vmm_unreserve(x->v, addr, bytes);
  if (st == XSEG_OK) x->mapped -= bytes;
  return st;
}

/* Releases the oldest pending block; with `wait`, after its event
   completes (a host wait: teardown only), else only if it has. */
static xseg_status pending_pop(xb_exact *x, bool wait, bool *done) {
  xb_pending *p = &x->pending[x->head];
  CUresult r = wait ? XS_DRV(x->v->drv, cuEventSynchronize, p->event)
                    : XS_DRV(x->v->drv, cuEventQuery, p->event);
  *done = r == CUDA_SUCCESS;
  if (r == CUDA_ERROR_NOT_READY) return XSEG_OK;
  if (r != CUDA_SUCCESS)
    return xs_driver_error(x->v->drv, r, wait ? "cuEventSynchronize"
                                              : "cuEventQuery");
  XS_DRV(x->v->drv, cuEventDestroy, p->event);
  xseg_status st = exact_unmap(x, p->addr, p->handle, p->bytes);
  x->head = (x->head + 1) % x->cap;
  x->count--;
  return st;
}

static xseg_status pending_poll(xb_exact *x, bool wait) {
  bool done = true;
  xseg_status st = XSEG_OK;
  while (st == XSEG_OK && done && x->count > 0)
    st = pending_pop(x, wait, &done);
  return st;
}

static bool pending_grow(xb_exact *x) {
  size_t cap = x->cap ? x->cap * 2 : 64;
  xb_pending *p = malloc(cap * sizeof *p);
  if (p == NULL) return false;
  for (size_t i = 0; i < x->count; i++)
    p[i] = x->pending[(x->head + i) % x->cap];
  free(x->pending);
  x->pending = p;
  x->head = 0;
  x->cap = cap;
  return true;
}

/* Queues the slot's block behind an event recorded on its stream now. */
static xseg_status pending_push(xb_exact *x, uint32_t slot) {
  if (x->count == x->cap && !pending_grow(x))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  CUevent ev;
  CUresult r = XS_DRV(x->v->drv, cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(x->v->drv, r, "cuEventCreate");
  r = XS_DRV(x->v->drv, cuEventRecord, ev, x->stream[slot]);
  if (r != CUDA_SUCCESS) {
    XS_DRV(x->v->drv, cuEventDestroy, ev);
    return xs_driver_error(x->v->drv, r, "cuEventRecord");
  }
  x->pending[(x->head + x->count++) % x->cap] =
      (xb_pending){x->addr[slot], x->handle[slot], x->bytes[slot], ev};
  return XSEG_OK;
}

static void exact_close(void *self) {
  xb_exact *x = self;
  pending_poll(x, true);
  xs_vmm_ctx_leave(x->v, x->saved);
  exact_release(x);
}

/* The whole replay runs on one thread: enter the context once, here. */
static xseg_status exact_open(xb_env *env, const char *conf, uint32_t n_slots,
                              void **self) {
  (void)conf;
  xb_exact *x = calloc(1, sizeof *x);
  if (x == NULL) return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  x->v = &env->vmm;
  size_t n = n_slots ? n_slots : 1;
  x->addr = calloc(n, sizeof *x->addr);
  x->handle = calloc(n, sizeof *x->handle);
  x->bytes = calloc(n, sizeof *x->bytes);
  x->stream = calloc(n, sizeof *x->stream);
  x->deferred = env->gpu_lag_us > 0;
  xseg_status st =
      x->addr != NULL && x->handle != NULL && x->bytes != NULL &&
              x->stream != NULL
          ? xs_vmm_ctx_enter(x->v, &x->saved)
          : xs_error(XSEG_ERR_OUT_OF_MEMORY,
                     "out of host memory for %zu slots", n);
  if (st != XSEG_OK) {
    exact_release(x);
    return st;
  }
  *self = x;
  return XSEG_OK;
}

static xseg_status exact_malloc(void *self, uint32_t slot, size_t size,
                                struct CUstream_st *stream, void **ptr) {
  xb_exact *x = self;
  uint64_t bytes = xb_round_up(size, x->v->granularity);
  x->bytes[slot] = 0;
  x->stream[slot] = stream;
  *ptr = NULL;
  if (size > XB_MAX_SIZE)           /* bytes may have wrapped to 0 */
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "%zu bytes overflow when "
                    "rounded to granules", size);
  xseg_status st = x->deferred ? pending_poll(x, false) : XSEG_OK;
  if (bytes == 0 || st != XSEG_OK) return st;
  st = xs_vmm_reserve(x->v, bytes, &x->addr[slot]);
  if (st != XSEG_OK) return st;
  st = xs_vmm_map_run(x->v, x->addr[slot], bytes, 1, &x->handle[slot]);
  if (st != XSEG_OK) {
    xs_vmm_unreserve(x->v, x->addr[slot], bytes);
    return st;
  }
  x->bytes[slot] = bytes;
  x->mapped += bytes;
  if (x->mapped > x->window_peak) x->window_peak = x->mapped;
  *ptr = (void *)(uintptr_t)x->addr[slot];
  return XSEG_OK;
}

static xseg_status exact_free(void *self, uint32_t slot, void *ptr) {
  (void)ptr;
  xb_exact *x = self;
  uint64_t bytes = x->bytes[slot];
  xseg_status st = x->deferred ? pending_poll(x, false) : XSEG_OK;
  if (bytes == 0 || st != XSEG_OK) return st;
  st = x->deferred ? pending_push(x, slot)
                   : exact_unmap(x, x->addr[slot], x->handle[slot], bytes);
  if (st == XSEG_OK) x->bytes[slot] = 0;
  return st;
}

static void exact_usage(void *self, xb_usage *u) {
  xb_exact *x = self;
  u->reserved = x->mapped;
  u->reserved_peak = x->window_peak;
  x->window_peak = x->mapped;
}

const xb_policy xb_policy_exact = {
    .name = "exact",
    .open = exact_open,
    .malloc = exact_malloc,
    .free = exact_free,
    .usage = exact_usage,
    .snapshot = NULL,
    .close = exact_close,
};
