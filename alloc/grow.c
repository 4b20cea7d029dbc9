/* grow.c: the slow path of malloc — mapping more physical memory — and the
 * out-of-memory path around it.
 *
 * Expandable growth maps at the placement xs_pool_place picks (a hole left
 * by an earlier release, or the end of the newest segment, where a free
 * block touching the mapped end needs only the missing granules), with the
 * fewest granules. Which physical memory serves it is the policy's
 * decision (flow.c: the stream's own free memory, lent before it is
 * unmapped where its stream may still use it; other streams' free memory,
 * behind an event where theirs may; new memory last). Lent aliases that
 * their guards proved done are unmapped before a placement is chosen.
 *
 * Classic growth (expandable_segments:False) reserves and maps one new
 * segment of PyTorch's size with a single physical allocation.
 *
 * Before growing, garbage_collection_threshold releases the oldest free
 * granules while what is mapped exceeds its share of the cap. On running
 * out: complete pending frees and collect garbage, retry; release every safe
 * free granule, retry; take any stream's free memory behind an event,
 * retry; only then wait on the host (on the guards' and pending frees'
 * events, never on a stream or the device: what is left is memory freed
 * after xseg_record_stream, whose streams the device cannot be made to
 * wait for here) and retry; release all, retry; and only then fail with
 * PyTorch's message. While a graph capture is under way
 * nothing is unmapped: growth creates fresh memory or fails.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc/account.h"
#include "alloc/capture.h"
#include "alloc/deferred.h"
#include "alloc/flow.h"
#include "alloc/frees.h"
#include "alloc/grow.h"
#include "alloc/pairs.h"
#include "alloc/policy.h"
#include "alloc/reclaim.h"
#include "alloc/types.h"
#include "vmm/error.h"

/* Most granules a growth maps beyond what it needs when a reused handle is
   larger than the need. */
#define XS_GROW_OVERSHOOT ((size_t)512)

/* Maps at least pl->n granules at pl, with handles the policy finds
   (flow.c). */
static xseg_status grow_at_locked(xseg_allocator *a, xs_pool *p,
                                  const xs_place *pl, xs_block **out) {
  xs_flow_plan plan = xs_flow_plan_for(a, pl);
  /* A reused handle may be larger than the need: moving it whole is one
     map, and the rest is free mapped space here, not new memory. */
  size_t max = pl->n + XS_GROW_OVERSHOOT;
  if (max > plan.room) max = plan.room;
  if (max < plan.fresh) max = plan.fresh;
  uint64_t *handles = malloc(max * sizeof *handles);
  if (handles == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for %zu handles", max);
  size_t have = 0;
  xseg_status st = xs_flow_collect_locked(a, p, pl, &plan, max, handles, &have);
  assert(st != XSEG_OK || (have >= pl->n && have <= plan.room));
  xs_place at = *pl;
  at.n = have;
  uint64_t addr = pl->hole->addr;  /* the hole may merge away in the map */
  if (st == XSEG_OK) st = xs_pool_map(p, &at, handles, out);
  if (st == XSEG_OK) {
    xs_pool_pair(p)->grew_at = xs_pool_pair(p)->clock;
    xs_trace_record(&a->trace, XS_TRACE_SEGMENT_MAP, addr, have * plan.g,
                    p->stream);
  }
  if (st != XSEG_OK) xs_phys_release_locked(a, handles, have);
  free(handles);
  return st;
}

static xseg_status grow_expandable_locked(xseg_allocator *a, xs_pool *p,
                                          size_t rounded, xs_block **out) {
  xs_place pl;
  /* Retired aliases become holes before a placement is chosen (never
     after: one merging into the chosen hole would free it). */
  xs_pair *pair = xs_pool_pair(p);
  if (!xs_alloc_capturing(a) &&
      (pair->pool[0].n_retiring != 0 || pair->pool[1].n_retiring != 0)) {
    xs_alloc_guard_advance_locked(a, pair, false);
    xs_alloc_retire_aliases_locked(a, pair);
  }
  xs_segment *fresh = NULL;
  if (!xs_pool_place(p, rounded, &pl)) {
    size_t g = a->granule[p->kind];
    size_t size = (rounded + g - 1) / g * g;
    if (size < a->reserve[p->kind]) size = a->reserve[p->kind];
    xseg_status st = xs_pool_add_segment(p, size, g, &fresh);
    if (st != XSEG_OK) return st;
    bool placed = xs_pool_place(p, rounded, &pl);
    assert(placed && "a fresh reservation holds the request");
    (void)placed;
  }
  xseg_status st = grow_at_locked(a, p, &pl, out);
  /* A reservation made for this growth goes again when the growth fails
     (a failed map changes nothing: it maps nothing), as the classic
     growth's does: a failed malloc leaves no segment behind. */
  if (st != XSEG_OK && fresh != NULL) (void)xs_pool_drop_segment(p, fresh);
  return st;
}

static xseg_status grow_classic_locked(xseg_allocator *a, xs_pool *p,
                                       size_t rounded, xs_block **out) {
  size_t size = xs_alloc_classic_size(a, rounded);
  if (!xs_flow_within_cap(a, size)) return xs_flow_cap_error(a, size);
  xs_segment *s;
  xseg_status st = xs_pool_add_segment(p, size, size, &s);
  if (st != XSEG_OK) return st;
  uint64_t handle;
  st = xs_phys_create_locked(a, size, &handle);
  if (st == XSEG_OK) {
    xs_place pl = {.seg = s, .hole = s->first, .keep = NULL, .n = 1};
    st = xs_pool_map(p, &pl, &handle, out);
    if (st != XSEG_OK) xs_phys_release_locked(a, &handle, 1);
    else   /* a classic segment is PyTorch's cudaMalloc: segment_alloc */
      xs_trace_record(&a->trace, XS_TRACE_SEGMENT_ALLOC, s->base, size,
                      p->stream);
  }
  if (st != XSEG_OK) xs_pool_drop_segment(p, s);
  return st;
}

/* A growth maps new memory only within the cap; one that only moves
   memory (the cap lowered under what is mapped) leaves reserved_bytes no
   higher than it found them. */
static xseg_status grow_once_locked(xseg_allocator *a, xs_pool *p,
                                    size_t rounded, xs_block **out) {
#ifndef NDEBUG
  size_t before = (size_t)xs_alloc_current(a, XS_GAUGE_reserved_bytes);
#endif
  xseg_status st = a->cfg.expandable_segments
                       ? grow_expandable_locked(a, p, rounded, out)
                       : grow_classic_locked(a, p, rounded, out);
  size_t after = (size_t)xs_alloc_current(a, XS_GAUGE_reserved_bytes);
  assert((after <= a->cap || after <= before) && "growth passed the cap");
  if (after <= a->cap) a->cap_over = 0;
  return st;
}

/* PyTorch's message: what was asked, what the device has, what xseg holds,
   and the failure that ended the last try. */
/* The out-of-memory error; *dev_free is the device's free memory (0 when
   unknown), which the oom trace entry keeps as PyTorch's does. */
static xseg_status grow_oom_locked(xseg_allocator *a, size_t requested,
                                   size_t *dev_free_out) {
  char cause[256], want[32], total[32], free_b[32], alloc_b[32], unused[32],
      cap[32];
  snprintf(cause, sizeof cause, "%s", xseg_last_error());
  size_t dev_free = 0, dev_total = a->vmm.total_memory;
  bool known = xs_vmm_mem_info(&a->vmm, &dev_free, &dev_total) == XSEG_OK;
  *dev_free_out = known ? dev_free : 0;
  int64_t allocated = xs_alloc_current(a, XS_GAUGE_allocated_bytes);
  int64_t reserved = xs_alloc_current(a, XS_GAUGE_reserved_bytes);
  a->shared_stats.counter[XS_COUNTER_num_ooms]++;
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
static xseg_status grow_route_locked(xseg_allocator *a, xs_pool **p,
                                     struct CUstream_st *stream, size_t rounded,
                                     xs_block **out) {
  *out = NULL;
  if (xs_pool_pair(*p)->private_id != 0) return XSEG_OK;
  xs_pair *priv;
  xseg_status st = xs_capture_detect_locked(a, stream, &priv);
  if (st != XSEG_OK || priv == NULL) return st;
  *p = &priv->pool[(*p)->kind];
  *out = xs_alloc_find_free(a, *p, rounded);
  return XSEG_OK;
}

/* After a failed growth: each step frees more, at a higher price. */
static xseg_status grow_retry_locked(xseg_allocator *a, xs_pool *p,
                                     size_t rounded, xs_block **out) {
  xseg_status st = XSEG_ERR_OUT_OF_MEMORY;
  /* Nothing may be unmapped; PyTorch's ladder stops before its retry
     too. */
  if (xs_alloc_capturing(a)) return st;
  xs_alloc_complete_frees_locked(a, false);
  /* Just enough oversize blocks first (max_split_size_mb, classic
     segments), as PyTorch's ladder, which counts a retry only past
     them. */
  if (xs_alloc_release_oversize_locked(a, p, rounded)) {
    st = grow_once_locked(a, p, rounded, out);
    if (st != XSEG_ERR_OUT_OF_MEMORY) return st;
  }
  a->shared_stats.counter[XS_COUNTER_num_alloc_retries]++;
  /* Released private pools' memory moves to the growth once the device
     is idle (as PyTorch's cudaFree of it would wait), before any release
     pass gives its handles back to the driver. */
  if (xs_alloc_sync_owed_locked(a) &&
      xs_alloc_sync_released_locked(a) == XSEG_OK) {
    st = grow_once_locked(a, p, rounded, out);
    if (st != XSEG_ERR_OUT_OF_MEMORY) return st;
  }
  if (xs_alloc_collect_garbage_locked(a))
    st = grow_once_locked(a, p, rounded, out);
  if (st != XSEG_ERR_OUT_OF_MEMORY) return st;
  xs_alloc_release_locked(a, SIZE_MAX, false);
  st = grow_once_locked(a, p, rounded, out);
  if (st != XSEG_ERR_OUT_OF_MEMORY || xs_alloc_capturing(a)) return st;
  /* Any stream's free memory behind an event (flow.c's steal rule without
     its surplus and quiet conditions): the device waits, not the host. */
  a->flow_at_limit = true;
  st = grow_once_locked(a, p, rounded, out);
  a->flow_at_limit = false;
  if (st != XSEG_ERR_OUT_OF_MEMORY || xs_alloc_capturing(a)) return st;
  /* Wait for the recorded work that still guards free memory (its events
     only), then let growth take it, and last release everything. */
  xs_alloc_complete_frees_locked(a, true);
  a->shared_stats.counter[XS_COUNTER_num_sync_all_streams]++;
  xs_alloc_guards_locked(a, true);
  st = grow_once_locked(a, p, rounded, out);
  if (st != XSEG_ERR_OUT_OF_MEMORY) return st;
  xs_alloc_release_locked(a, SIZE_MAX, false);
  return grow_once_locked(a, p, rounded, out);
}

xseg_status xs_alloc_grow_locked(xseg_allocator *a, xs_pool **p,
                                 struct CUstream_st *stream, size_t rounded,
                                 size_t requested, bool detect,
                                 xs_block **out) {
  XS_ASSERT_LOCKED(a);
  CUcontext saved;
  *out = NULL;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  if (detect) st = grow_route_locked(a, p, stream, rounded, out);
  if (st == XSEG_OK && *out == NULL) {
    if (rounded > a->cap) {
      /* More than the device (or the fraction) holds: refused before a
         reservation and its page map, which grow with the request, exist. */
      st = xs_error(XSEG_ERR_OUT_OF_MEMORY, "the request is larger than the "
                    "%zu bytes xseg may map", a->cap);
    } else {
      xs_alloc_collect_garbage_locked(a);
      st = grow_once_locked(a, *p, rounded, out);
      if (st == XSEG_ERR_OUT_OF_MEMORY)
        st = grow_retry_locked(a, *p, rounded, out);
    }
    if (st == XSEG_ERR_OUT_OF_MEMORY) {
      size_t dev_free;
      st = grow_oom_locked(a, requested, &dev_free);
      xs_trace_record(&a->trace, XS_TRACE_OOM, dev_free, requested, stream);
    }
  }
  xs_vmm_ctx_leave(&a->vmm, saved);
  return st;
}
