/* cache.c: what the caller may ask of the cache as a whole: give back every
 * free granule (empty_cache, and its blocking form), forget a stream the
 * caller will destroy, cap the device memory xseg maps
 * (set_memory_fraction), and let a peer device reach every mapping.
 */
#include "alloc/account.h"
#include "alloc/capture.h"
#include "alloc/capture_mode.h"
#include "alloc/deferred.h"
#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "alloc/reclaim.h"
#include "alloc/types.h"
#include "streams/stream_set.h"
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

/* Live blocks of any pair recorded on `stream`: each one's free would
   record an event there. */
static size_t cache_live_uses_locked(xseg_allocator *a,
                                     struct CUstream_st *stream) {
  size_t n = 0;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (size_t i = 0; pair->live.count != 0 && i <= pair->live.mask; i++) {
      const xs_ptrtable_slot *s = &pair->live.slot[i];
      if (s->addr != 0 && s->block->allocated &&
          xs_stream_set_has(&s->block->uses, stream))
        n++;
    }
  return n;
}

/* Whether a free made during a capture, its events not recorded yet, was
   recorded on `stream`. Every lock held. */
static bool cache_unrecorded_on_locked(const xseg_allocator *a,
                                       struct CUstream_st *stream) {
  for (size_t i = 0; i < a->n_deferred; i++)
    if (xs_stream_set_has(&a->deferred[i]->uses, stream)) return true;
  return false;
}

/* What keeps `stream` from being forgotten, as an error; XSEG_OK if
   nothing. Every lock held. */
static xseg_status cache_forget_refusal_locked(xseg_allocator *a,
                                               struct CUstream_st *stream) {
  const char *fn = "xseg_forget_stream";
  if (xs_alloc_capturing(a))
    return xs_error(XSEG_ERR_CAPTURE, "%s(stream %p): a graph capture is "
                    "under way on device %d", fn, (void *)stream,
                    a->vmm.device);
  size_t live = 0;
  for (const xs_pair *p = a->streams; p != NULL; p = p->next)
    if (p->stream == stream) live += p->live.count;
  if (live != 0)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "%s(stream %p): %zu blocks "
                    "allocated on it are live (free them first)", fn,
                    (void *)stream, live);
  size_t recorded = cache_live_uses_locked(a, stream);
  if (recorded != 0)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "%s(stream %p): %zu live "
                    "blocks were recorded on it (xseg_record_stream; free "
                    "them first)", fn, (void *)stream, recorded);
  for (const xs_pair *p = a->streams; p != NULL; p = p->next)
    if (p->private_id != 0 && p->stream == stream && !p->released)
      return xs_error(XSEG_ERR_INVALID_ARGUMENT, "%s(stream %p): private "
                      "pool %llu allocated on it (xseg_release_pool first)",
                      fn, (void *)stream, (unsigned long long)p->private_id);
  return XSEG_OK;
}

xseg_status xseg_forget_stream(xseg_allocator *a,
                               struct CUstream_st *stream) {
  if (a == NULL || stream == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_forget_stream(stream "
                    "%p): %s", (void *)stream, a == NULL
                    ? "allocator is NULL"
                    : "the legacy stream (NULL) is never destroyed");
  xs_alloc_enter(a);
  xs_pair *own = xs_pairs_own_locked(a, stream);
  xseg_status st = cache_forget_refusal_locked(a, stream);
  CUcontext saved;
  if (st == XSEG_OK && (st = xs_vmm_ctx_enter(&a->vmm, &saved)) == XSEG_OK) {
    /* Waits for the work that guards the free memory of the stream's
       pairs (while the stream still lives) and gives all of it back: its
       own pair keeps no segment. Other streams keep their caches, and
       their work is not waited for (reclaim.h says when it is). */
    st = xs_alloc_release_stream_locked(a, stream);
    /* A free made during a capture whose events are still to be recorded
       on this stream (another of its streams captures, unseen: the release
       above recorded the others) would name it after it is destroyed. */
    if (st == XSEG_OK && cache_unrecorded_on_locked(a, stream))
      st = xs_error(XSEG_ERR_CAPTURE, "xseg_forget_stream(stream %p): a "
                    "free recorded on it waits for a graph capture on "
                    "another of its streams to end", (void *)stream);
    /* Frees recorded on it, of any pair: waited for (after every refusal
       that changes nothing), their queues dropped. */
    if (st == XSEG_OK) st = xs_alloc_forget_pending_locked(a, stream);
    /* Nothing of the stream may remain: its own pair without memory, and
       no private pair of it (unreleased ones were refused, and the
       release drops the released ones that hold nothing). */
    if (st == XSEG_OK && xs_alloc_stream_holds_memory_locked(a, stream))
      st = xs_error(XSEG_ERR_DRIVER, "xseg_forget_stream(stream %p): memory "
                    "cached for it could not all be given back; it is not "
                    "forgotten", (void *)stream);
    if (st == XSEG_OK && own != NULL) own->forgotten = true;
    xs_vmm_ctx_leave(&a->vmm, saved);
  }
  xs_alloc_leave(a);
  return st;
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

/* Every mapping: the pools' segments, and the blocks of other processes
   opened here (xseg_ipc_open), whose access list was the one of their
   open. */
static xseg_status peer_grant_all_locked(xseg_allocator *a) {
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (xs_segment *s = pair->pool[k].segments; s != NULL; s = s->next) {
        xseg_status st = peer_grant_segment(&a->vmm, s);
        if (st != XSEG_OK) return st;
      }
  if (a->ipc == NULL) return XSEG_OK;
  for (xs_ipc_mapping *m = a->ipc->mappings; m != NULL; m = m->next) {
    xseg_status st = xs_vmm_set_access(&a->vmm, m->va, m->size);
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
