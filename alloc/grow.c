/* grow.c: the slow path of malloc — mapping more physical memory — and the
 * out-of-memory path around it.
 *
 * Expandable growth maps at the placement xs_pool_place picks (a hole left
 * by an earlier release, or the end of the newest segment, where a free
 * block touching the mapped end needs only the missing granules), with the
 * fewest granules. The physical handles come first from whole free handles
 * elsewhere in the same stream's pools (unmapped and mapped again: two calls
 * per run plus one map per handle, and no new device memory), then from
 * cuMemCreate, one handle per run of fresh granules up to the handle
 * policy's size (multi-granule handles: one create and one map for many
 * granules, but a live block pins its whole handle); at the device limit (the memory-fraction cap, or cuMemCreate
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

/* Releases the handles in handles[0..n) (after a failed growth): one call
   per handle, a run of equal values being one. */
static void grow_release(xseg_allocator *a, const uint64_t *handles,
                         size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && handles[i] == handles[i - 1]) continue;
    /* Around the message-setting wrappers: the growth's own failure is the
       message. A failed release is kept for a retry (vmm/unreleased.c). */
    CUmemGenericAllocationHandle h = (CUmemGenericAllocationHandle)handles[i];
    if (XS_DRV(a->vmm.drv, cuMemRelease, h) != CUDA_SUCCESS &&
        !xs_vmm_unreleased_keep(&a->vmm, handles[i]))
      XS_DRV(a->vmm.drv, cuMemRelease, h);
    a->stats.counter[XS_COUNTER_num_device_free]++;
  }
}

/* Most granules a growth maps beyond what it needs when a reused handle is
   larger than the need: moving a whole handle is one map, and the rest is
   free mapped space at the growth point, not new memory. */
#define XS_GROW_OVERSHOOT ((size_t)512)

/* How a growth of pl->n granules gets its handles (grow_plan). */
typedef struct grow_plan {
  size_t g;          /* bytes per granule */
  size_t room;       /* granules the hole can take */
  size_t harvest;    /* granules to reuse from free blocks, at least */
  size_t fresh;      /* granules to create when reuse falls short, at most */
} grow_plan;

/* Fresh growth at least xseg_grow_min_mb (where the hole has room): a
   segment that grows by a few granules at a time (weights loaded one by
   one) then makes one growth of many. */
static size_t grow_fresh_target(const xseg_allocator *a, const xs_place *pl,
                                size_t room) {
  size_t g = pl->seg->granule;
  size_t want = (a->cfg.grow_min + g - 1) / g;
  if (want > room) want = room;
  return want > pl->n ? want : pl->n;
}

/* Free handles are reused for the whole growth (fresh ones only for the
   rest): mapped bytes stay at their high mark while the free ones can
   move. */
static grow_plan grow_plan_for(const xseg_allocator *a, const xs_place *pl) {
  grow_plan gp = {.g = pl->seg->granule};
  gp.room = pl->hole->size / gp.g;
  gp.fresh = grow_fresh_target(a, pl, gp.room);
  gp.harvest = pl->n;
  return gp;
}

/* Whole free handles from p and its sibling pool (the same stream's, or
   the same private pool's), once the guard has passed them: at least
   `want` granules if there are, at most `max`; nothing while a capture is
   under way (no unmap then). */
static size_t grow_harvest(xseg_allocator *a, xs_pool *p, const xs_place *pl,
                           size_t want, size_t max, uint64_t *handles) {
  xs_stream_pools *sp = xs_pools_of(p);
  size_t g = pl->seg->granule, got = 0;
  if (want == 0 || xs_alloc_capturing(a)) return 0;
  /* A failed guard only means fewer reused handles. */
  xs_alloc_guard_pair_locked(a, sp, false);
  for (int k = 0; k < 2 && got < want; k++) {
    xs_pool *donor = k == 0 ? p : &sp->pool[!p->kind];
    xseg_status st;
    /* keep is the block the new granules merge with; the hole itself is
       unmapped and so never a donor. A failed harvest only means more
       fresh handles. */
    got += xs_pool_harvest(donor, g, want - got, max - got, pl->keep,
                           handles + got, &st);
  }
  return got;
}

/* Most granules of `g` bytes in one fresh handle: xseg_handle_max_mb, and
   1/xseg_handle_max_part of what is mapped. A handle can only be unmapped
   whole, so a large one that a live block pins strands its free granules;
   the second bound keeps that small beside a small footprint (on the
   bundled traces, 8 MiB handles lift cnn_infer's 106 MiB from 1.029 to
   1.048 times its peak, and bounding them by 1/32 of what is mapped keeps
   it at 1.029 while bert_infer still maps 8 MiB handles). */
static size_t grow_handle_most(const xseg_allocator *a, size_t g) {
  size_t most = a->cfg.handle_max != 0 ? a->cfg.handle_max / g : SIZE_MAX;
  if (a->cfg.handle_max_part != 0) {
    size_t reserved =
        (size_t)xs_stats_current(&a->stats, XS_GAUGE_reserved_bytes);
    size_t part = reserved / a->cfg.handle_max_part / g;
    if (part < most) most = part;
  }
  return most > 0 ? most : 1;
}

/* The size in granules of the next fresh handle for `left` granules of
   `g` bytes: the handle policy's, within grow_handle_most. */
static size_t grow_handle_size(const xseg_allocator *a, size_t g,
                               size_t left) {
  size_t most = grow_handle_most(a, g);
  if (left > most) left = most;
  switch (a->cfg.handle_policy) {
    case XS_HANDLES_GRANULE: return 1;
    case XS_HANDLES_SINGLE: return left;
    case XS_HANDLES_POW2: break;
  }
  size_t k = 1;
  while (k <= left / 2) k *= 2;
  return k;
}

/* Creates fresh handles for handles[*have .. want), each handle's value
   repeated over its granules. */
static xseg_status grow_create(xseg_allocator *a, size_t g, size_t want,
                               uint64_t *handles, size_t *have) {
  while (*have < want) {
    size_t k = grow_handle_size(a, g, want - *have);
    uint64_t h;
    xseg_status st = xs_vmm_handle_create(&a->vmm, k * g, false, &h);
    if (st != XSEG_OK) return st;
    a->stats.counter[XS_COUNTER_num_device_alloc]++;
    for (size_t i = 0; i < k; i++) handles[(*have)++] = h;
  }
  return XSEG_OK;
}

/* Fills handles[*have .. pl->n) at the device limit: other streams' free
   handles, safe to move. */
static void grow_foreign(xseg_allocator *a, xs_pool *p, const xs_place *pl,
                         size_t max, uint64_t *handles, size_t *have) {
  *have += xs_alloc_take_foreign_locked(a, p, pl->seg->granule,
                                        pl->n - *have, max - *have,
                                        handles + *have);
}

/* Gets handles for at least pl->n granules into handles[0..*have): reused
   ones first (as the plan says), then fresh ones, then other streams'. */
static xseg_status grow_collect(xseg_allocator *a, xs_pool *p,
                                const xs_place *pl, const grow_plan *gp,
                                size_t max, uint64_t *handles,
                                size_t *have) {
  size_t n = pl->n, g = gp->g;
  *have = grow_harvest(a, p, pl, gp->harvest, max, handles);
  if (*have >= n) return XSEG_OK;
  size_t fresh = gp->fresh > *have ? gp->fresh : n;
  if (!grow_within_cap(a, (fresh - *have) * g)) fresh = n;
  xseg_status st = XSEG_OK;
  if (!grow_within_cap(a, (n - *have) * g)) {
    grow_foreign(a, p, pl, max, handles, have);
    if (*have < n && !grow_within_cap(a, (n - *have) * g))
      st = grow_cap_error(a, (n - *have) * g);
  }
  if (st == XSEG_OK && *have < n) st = grow_create(a, g, fresh, handles, have);
  if (st == XSEG_ERR_OUT_OF_MEMORY && *have < n) {
    grow_foreign(a, p, pl, max, handles, have);
    if (*have >= n) st = XSEG_OK;
  }
  return st;
}

/* Maps at least pl->n granules at pl: see grow_collect for where the
   handles come from. */
static xseg_status grow_at(xseg_allocator *a, xs_pool *p, const xs_place *pl,
                           xs_block **out) {
  grow_plan gp = grow_plan_for(a, pl);
  size_t max = pl->n + XS_GROW_OVERSHOOT;
  if (max > gp.room) max = gp.room;
  if (max < gp.fresh) max = gp.fresh;
  uint64_t *handles = malloc(max * sizeof *handles);
  if (handles == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for %zu handles", max);
  size_t have = 0;
  xseg_status st = grow_collect(a, p, pl, &gp, max, handles, &have);
  assert(st != XSEG_OK || (have >= pl->n && have <= gp.room));
  xs_place at = *pl;
  at.n = have;
  uint64_t addr = pl->hole->addr;  /* the hole may merge away in the map */
  if (st == XSEG_OK) st = xs_pool_map(p, &at, handles, out);
  if (st == XSEG_OK)
    xs_trace_record(&a->trace, XS_TRACE_SEGMENT_MAP, addr, have * gp.g,
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
    if (rounded > a->cap) {
      /* More than the device (or the fraction) holds: refused before a
         reservation and its page map, which grow with the request, exist. */
      st = xs_error(XSEG_ERR_OUT_OF_MEMORY, "the request is larger than the "
                    "%zu bytes xseg may map", a->cap);
    } else {
      xs_alloc_collect_garbage_locked(a);
      st = grow_once(a, *p, rounded, out);
      if (st == XSEG_ERR_OUT_OF_MEMORY) st = grow_retry(a, *p, rounded, out);
    }
    if (st == XSEG_ERR_OUT_OF_MEMORY) {
      st = grow_oom(a, requested);
      xs_trace_record(&a->trace, XS_TRACE_OOM, 0, requested, stream);
    }
  }
  xs_vmm_ctx_leave(&a->vmm, saved);
  return st;
}
