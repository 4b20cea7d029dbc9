/* grow.c: the slow path of malloc — mapping more physical memory — and the
 * out-of-memory path around it.
 *
 * Expandable growth maps at the placement xs_pool_place picks (a hole left
 * by an earlier release, or the end of the newest segment, where a free
 * block touching the mapped end needs only the missing granules), with the
 * fewest granules. The physical handles come first from whole free granules
 * elsewhere in the same stream's pools (unmapped and mapped again: two calls
 * per run plus one map per granule, and no new device memory), then from
 * cuMemCreate; at the device limit (the memory-fraction cap, or cuMemCreate
 * out of memory) from other streams' free granules whose guards have
 * passed (reclaim.c): physical memory moves between streams without a
 * release and re-create and without a host sync. Only free blocks whose
 * stream's guard has passed their free are unmapped (segments/release.c).
 *
 * Classic growth (expandable_segments:False) reserves and maps one new
 * segment of PyTorch's size with a single physical allocation.
 *
 * Before growing, garbage_collection_threshold releases the oldest free
 * granules while what is mapped exceeds its share of the cap. On running
 * out: settle pending frees and collect garbage, retry; release every safe
 * free granule, retry; wait (on the guards' and pending frees' events,
 * never on a stream or the device) and retry; release all, retry; and only
 * then fail with PyTorch's message. While a graph capture is under way
 * nothing is unmapped: growth creates fresh memory or fails.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc/allocator.h"
#include "vmm/error.h"

/* Fails when n more bytes of device memory would exceed the cap. */
static bool grow_within_cap(const xseg_allocator *a, size_t bytes) {
  int64_t reserved = xs_stats_current(&a->stats, XS_GAUGE_reserved_bytes);
  return (size_t)reserved + bytes <= a->cap;
}

static xseg_status grow_cap_error(const xseg_allocator *a, size_t bytes) {
  return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                  "mapping %zu more bytes would pass the memory fraction's "
                  "cap of %zu bytes", bytes, a->cap);
}

/* Releases handles[0..n) (after a failed growth). */
static void grow_release(xseg_allocator *a, const uint64_t *handles,
                         size_t n) {
  for (size_t i = 0; i < n; i++) {
    /* Around the message-setting wrappers: the growth's own failure is the
       message. A failed release is tried once more (see release.c). */
    CUmemGenericAllocationHandle h = (CUmemGenericAllocationHandle)handles[i];
    if (XS_DRV(a->vmm.drv, cuMemRelease, h) != CUDA_SUCCESS)
      XS_DRV(a->vmm.drv, cuMemRelease, h);
    a->stats.counter[XS_COUNTER_num_device_free]++;
  }
}

/* Whole free granules of the same size from p and its sibling pool (the
   same stream's, or the same private pool's), once the guard has passed
   them; nothing while a capture is under way (no unmap then). */
static size_t grow_harvest(xseg_allocator *a, xs_pool *p, const xs_place *pl,
                           uint64_t *handles) {
  xs_stream_pools *sp = xs_pools_of(p);
  size_t g = pl->seg->granule, got = 0;
  if (xs_alloc_capturing(a)) return 0;
  /* A failed guard only means fewer reused handles. */
  xs_alloc_guard_pair_locked(a, sp, false);
  for (int k = 0; k < 2 && got < pl->n; k++) {
    xs_pool *donor = k == 0 ? p : &sp->pool[!p->kind];
    xseg_status st;
    /* keep is the block the new granules merge with; the hole itself is
       unmapped and so never a donor. A failed harvest only means more
       fresh handles. */
    got += xs_pool_harvest(donor, g, pl->n - got, pl->keep, handles + got,
                           &st);
  }
  return got;
}

/* Maps pl->n granules at pl: reused handles first, then fresh ones. */
static xseg_status grow_at(xseg_allocator *a, xs_pool *p, const xs_place *pl,
                           xs_block **out) {
  size_t g = pl->seg->granule;
  uint64_t *handles = malloc(pl->n * sizeof *handles);
  if (handles == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for %zu handles", pl->n);
  size_t have = grow_harvest(a, p, pl, handles);
  xseg_status st = XSEG_OK;
  if (have < pl->n && !grow_within_cap(a, (pl->n - have) * g)) {
    have += xs_alloc_take_foreign_locked(a, p, g, pl->n - have,
                                         handles + have);
    if (have < pl->n && !grow_within_cap(a, (pl->n - have) * g))
      st = grow_cap_error(a, (pl->n - have) * g);
  }
  for (; st == XSEG_OK && have < pl->n; have++) {
    st = xs_vmm_handle_create(&a->vmm, g, false, &handles[have]);
    if (st != XSEG_OK) break;
    a->stats.counter[XS_COUNTER_num_device_alloc]++;
  }
  if (st == XSEG_ERR_OUT_OF_MEMORY && have < pl->n) {
    have += xs_alloc_take_foreign_locked(a, p, g, pl->n - have,
                                         handles + have);
    if (have == pl->n) st = XSEG_OK;
  }
  uint64_t at = pl->hole->addr;  /* the hole may merge away in the map */
  if (st == XSEG_OK) st = xs_pool_map(p, pl, handles, out);
  if (st == XSEG_OK)
    xs_trace_record(&a->trace, XS_TRACE_SEGMENT_MAP, at, pl->n * g,
                    p->stream);
  if (st != XSEG_OK) grow_release(a, handles, have);
  free(handles);
  return st;
}

static xseg_status grow_expandable(xseg_allocator *a, xs_pool *p,
                                   size_t rounded, xs_block **out) {
  xs_place pl;
  if (!xs_pool_place(p, rounded, &pl)) {
    size_t g = a->granule[p->kind];
    size_t size = (rounded + g - 1) / g * g;
    if (size < a->reserve[p->kind]) size = a->reserve[p->kind];
    xs_segment *s;
    xseg_status st = xs_pool_add_segment(p, size, g, &s);
    if (st != XSEG_OK) return st;
    bool placed = xs_pool_place(p, rounded, &pl);
    assert(placed && "a fresh reservation holds the request");
    (void)placed;
  }
  return grow_at(a, p, &pl, out);
}

static xseg_status grow_classic(xseg_allocator *a, xs_pool *p, size_t rounded,
                                xs_block **out) {
  size_t size = xs_alloc_classic_size(a, rounded);
  if (!grow_within_cap(a, size)) return grow_cap_error(a, size);
  xs_segment *s;
  xseg_status st = xs_pool_add_segment(p, size, size, &s);
  if (st != XSEG_OK) return st;
  uint64_t handle;
  st = xs_vmm_handle_create(&a->vmm, size, false, &handle);
  if (st == XSEG_OK) {
    a->stats.counter[XS_COUNTER_num_device_alloc]++;
    xs_place pl = {.seg = s, .hole = s->first, .keep = NULL, .n = 1};
    st = xs_pool_map(p, &pl, &handle, out);
    if (st != XSEG_OK) grow_release(a, &handle, 1);
    else xs_trace_record(&a->trace, XS_TRACE_SEGMENT_MAP, s->base, size,
                         p->stream);
  }
  if (st != XSEG_OK) xs_pool_drop_segment(p, s);
  return st;
}

static xseg_status grow_once(xseg_allocator *a, xs_pool *p, size_t rounded,
                             xs_block **out) {
  return a->cfg.expandable_segments ? grow_expandable(a, p, rounded, out)
                                    : grow_classic(a, p, rounded, out);
}

/* PyTorch's message: what was asked, what the device has, what xseg holds,
   and the failure that ended the last try. */
static xseg_status grow_oom(xseg_allocator *a, size_t requested) {
  char cause[256], want[32], total[32], free_b[32], alloc_b[32], unused[32],
      cap[32];
  snprintf(cause, sizeof cause, "%s", xseg_last_error());
  size_t dev_free = 0, dev_total = a->vmm.total_memory;
  bool known = xs_vmm_mem_info(&a->vmm, &dev_free, &dev_total) == XSEG_OK;
  int64_t allocated = xs_stats_current(&a->stats, XS_GAUGE_allocated_bytes);
  int64_t reserved = xs_stats_current(&a->stats, XS_GAUGE_reserved_bytes);
  a->stats.counter[XS_COUNTER_num_ooms]++;
  return xs_error(
      XSEG_ERR_OUT_OF_MEMORY,
      "xseg: out of memory. Tried to allocate %s. Device %d has a total "
      "capacity of %s of which %s is free. Of the allocated memory %s is "
      "allocated by xseg, and %s is reserved by xseg but unallocated; xseg "
      "may map at most %s (memory fraction %.3g). Last failure: %s",
      xs_format_bytes(requested, want, sizeof want), a->vmm.device,
      xs_format_bytes(dev_total, total, sizeof total),
      known ? xs_format_bytes(dev_free, free_b, sizeof free_b)
            : "an unknown amount",
      xs_format_bytes((size_t)allocated, alloc_b, sizeof alloc_b),
      xs_format_bytes((size_t)(reserved - allocated), unused, sizeof unused),
      xs_format_bytes(a->cap, cap, sizeof cap), a->cfg.memory_fraction,
      cause);
}

/* The slow path's first step, only here so the cached path makes no
   extra driver call: an unannounced capture on `stream` sends the request
   to its private pool, where a cached block may already fit. */
static xseg_status grow_route(xseg_allocator *a, xs_pool **p,
                              struct CUstream_st *stream, size_t rounded,
                              xs_block **out) {
  *out = NULL;
  if (xs_pools_of(*p)->private_id != 0) return XSEG_OK;
  xs_stream_pools *priv;
  xseg_status st = xs_capture_detect_locked(a, stream, &priv);
  if (st != XSEG_OK || priv == NULL) return st;
  *p = &priv->pool[(*p)->kind];
  *out = xs_alloc_find_free(a, *p, rounded);
  return XSEG_OK;
}

/* After a failed growth: each step frees more, at a higher price. */
static xseg_status grow_retry(xseg_allocator *a, xs_pool *p, size_t rounded,
                              xs_block **out) {
  a->stats.counter[XS_COUNTER_num_alloc_retries]++;
  xseg_status st = XSEG_ERR_OUT_OF_MEMORY;
  if (xs_alloc_capturing(a)) return st;       /* nothing may be unmapped */
  xs_alloc_process_pending_locked(a, false);
  if (xs_alloc_collect_garbage_locked(a)) st = grow_once(a, p, rounded, out);
  if (st != XSEG_ERR_OUT_OF_MEMORY) return st;
  xs_alloc_release_locked(a, SIZE_MAX, false);
  st = grow_once(a, p, rounded, out);
  if (st != XSEG_ERR_OUT_OF_MEMORY || xs_alloc_capturing(a)) return st;
  /* Wait for the recorded work that still guards free memory (its events
     only), then let growth take it, and last release everything. */
  xs_alloc_process_pending_locked(a, true);
  a->stats.counter[XS_COUNTER_num_sync_all_streams]++;
  xs_alloc_guards_locked(a, true);
  st = grow_once(a, p, rounded, out);
  if (st != XSEG_ERR_OUT_OF_MEMORY) return st;
  xs_alloc_release_locked(a, SIZE_MAX, false);
  return grow_once(a, p, rounded, out);
}

xseg_status xs_alloc_grow_locked(xseg_allocator *a, xs_pool **p,
                                 struct CUstream_st *stream, size_t rounded,
                                 size_t requested, xs_block **out) {
  XS_ASSERT_LOCKED(a);
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  st = grow_route(a, p, stream, rounded, out);
  if (st == XSEG_OK && *out == NULL) {
    xs_alloc_collect_garbage_locked(a);
    st = grow_once(a, *p, rounded, out);
    if (st == XSEG_ERR_OUT_OF_MEMORY) st = grow_retry(a, *p, rounded, out);
    if (st == XSEG_ERR_OUT_OF_MEMORY) {
      st = grow_oom(a, requested);
      xs_trace_record(&a->trace, XS_TRACE_OOM, 0, requested, stream);
    }
  }
  xs_vmm_ctx_leave(&a->vmm, saved);
  return st;
}
