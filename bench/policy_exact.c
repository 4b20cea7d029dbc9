/* policy_exact.c: one reservation and one mapping per allocation.
 *
 * Each request gets its own address range of exactly its size rounded up to
 * the granularity, one physical handle of that size mapped there, and access
 * granted; a free undoes all of it. Nothing is cached, so this is the floor
 * no caching policy can beat on reserved bytes (only rounding to granules is
 * lost) and the ceiling on driver calls (7 per allocate/free pair).
 *
 * A zero-byte request maps nothing and gets NULL: the driver has no
 * zero-byte mapping, and there is nothing to reserve.
 */
#include <stdlib.h>

#include "bench.h"
#include "vmm/error.h"

typedef struct xb_exact {
  xs_vmm *v;
  CUcontext saved;                  /* the caller's context, for close */
  uint64_t *addr, *handle, *bytes;  /* per slot, while allocated */
  uint64_t mapped, window_peak;
} xb_exact;

static void exact_release(xb_exact *x) {
  free(x->addr);
  free(x->handle);
  free(x->bytes);
  free(x);
}

static void exact_close(void *self) {
  xb_exact *x = self;
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
  xseg_status st =
      x->addr != NULL && x->handle != NULL && x->bytes != NULL
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
  (void)stream;                     /* mapping is not stream-ordered */
  xb_exact *x = self;
  uint64_t bytes = xb_round_up(size, x->v->granularity);
  x->bytes[slot] = 0;
  *ptr = NULL;
  if (bytes == 0) return XSEG_OK;
  xseg_status st = xs_vmm_reserve(x->v, bytes, &x->addr[slot]);
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
  if (bytes == 0) return XSEG_OK;
  xseg_status st =
      xs_vmm_unmap_run(x->v, x->addr[slot], bytes, 1, &x->handle[slot]);
  if (st == XSEG_OK) st = xs_vmm_unreserve(x->v, x->addr[slot], bytes);
  if (st != XSEG_OK) return st;
  x->mapped -= bytes;
  x->bytes[slot] = 0;
  return XSEG_OK;
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
