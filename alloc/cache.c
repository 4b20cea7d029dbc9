/* cache.c: what the caller may ask of the cache as a whole: give back every
 * free granule (empty_cache, and its blocking form), cap the device memory
 * xseg maps (set_memory_fraction), and let a peer device reach every
 * mapping.
 */
#include "alloc/account.h"
#include "alloc/capture.h"
#include "alloc/enter.h"
#include "alloc/pairs.h"
#include "alloc/reclaim.h"
#include "alloc/types.h"
#include "vmm/error.h"

static xseg_status cache_empty(xseg_allocator *a, bool wait) {
  xs_alloc_enter(a);
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st == XSEG_OK) {
    st = xs_alloc_release_locked(a, SIZE_MAX, wait);
    /* The blocking form promises everything: a capture prevents that. */
    if (st == XSEG_OK && wait && xs_alloc_capturing(a))
      st = xs_error(XSEG_ERR_CAPTURE,
                    "xseg_empty_cache_blocking: a graph capture is under way "
                    "on device %d; nothing may be unmapped until it ends",
                    a->vmm.device);
    xs_vmm_ctx_leave(&a->vmm, saved);
  }
  xs_alloc_leave(a);
  return st;
}

xseg_status xseg_empty_cache(xseg_allocator *a) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_empty_cache: allocator "
                    "is NULL");
  return cache_empty(a, false);
}

xseg_status xseg_empty_cache_blocking(xseg_allocator *a) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_empty_cache_blocking: allocator is NULL");
  return cache_empty(a, true);
}

xseg_status xseg_set_memory_fraction(xseg_allocator *a, double fraction) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_set_memory_fraction: allocator is NULL");
  if (!(fraction > 0 && fraction <= 1))
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_set_memory_fraction(%g): the fraction must be in "
                    "(0, 1]", fraction);
  xs_alloc_enter(a);
  a->cfg.memory_fraction = fraction;
  a->cap = (size_t)(fraction * (double)a->vmm.total_memory);
  /* As PyTorch's: the fraction limits growth; what is mapped stays (the
     out-of-memory path releases cached memory when growth needs room). */
  size_t mapped = (size_t)xs_alloc_current(a, XS_GAUGE_reserved_bytes);
  a->cap_over = mapped > a->cap ? mapped : 0;
  xs_alloc_leave(a);
  return XSEG_OK;
}

/* One cuMemSetAccess per maximal run of mapped granules of s. */
static xseg_status peer_grant_segment(xs_vmm *v, const xs_segment *s) {
  size_t g = 0;
  while (g < s->n_granules) {
    if (!s->mapped[g]) {
      g++;
      continue;
    }
    size_t run = 1;
    while (g + run < s->n_granules && s->mapped[g + run]) run++;
    xseg_status st =
        xs_vmm_set_access(v, s->base + g * s->granule, run * s->granule);
    if (st != XSEG_OK) return st;
    g += run;
  }
  return XSEG_OK;
}

static xseg_status peer_grant_all_locked(xseg_allocator *a) {
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (xs_segment *s = pair->pool[k].segments; s != NULL; s = s->next) {
        xseg_status st = peer_grant_segment(&a->vmm, s);
        if (st != XSEG_OK) return st;
      }
  return XSEG_OK;
}

static xseg_status peer_check(xseg_allocator *a, int peer) {
  int count = 0;
  CUresult r = XS_DRV(a->vmm.drv, cuDeviceGetCount, &count);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(a->vmm.drv, r, "cuDeviceGetCount");
  if (peer < 0 || peer >= count)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_enable_peer_access(%d): no such device (the "
                    "driver has %d)", peer, count);
  return XSEG_OK;
}

xseg_status xseg_enable_peer_access(xseg_allocator *a, int peer_device) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_enable_peer_access: allocator is NULL");
  xs_alloc_enter(a);
  xseg_status st = peer_check(a, peer_device);
  int before = a->vmm.n_access;
  if (st == XSEG_OK && peer_device != a->vmm.device)
    st = xs_vmm_add_peer(&a->vmm, peer_device);
  if (st == XSEG_OK && a->vmm.n_access != before) {
    CUcontext saved;
    st = xs_vmm_ctx_enter(&a->vmm, &saved);
    if (st == XSEG_OK) {
      st = peer_grant_all_locked(a);
      xs_vmm_ctx_leave(&a->vmm, saved);
    }
    /* Future growth would fail on the same grant: forget the peer. */
    if (st != XSEG_OK) a->vmm.n_access = before;
  }
  xs_alloc_leave(a);
  return st;
}
