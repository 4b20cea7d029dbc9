/* alloc.c: the public entry points of the device allocator: create and
 * destroy, malloc and free, and the per-stream pools they find.
 *
 * The cached path (a free block fits) makes no driver call and no heap
 * allocation once warm: a best-fit lookup, a split from the block cache,
 * one pointer-table insert, all under the allocator's one mutex. A free
 * that would only merge the block back into the rest it was split from
 * parks it instead, and a malloc of the same size on the same pool takes
 * it back when that is what merging and splitting would give (lazy
 * merging, segments/pool.h); every other entry point settles first.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/allocator.h"
#include "alloc/ipc.h"
#include "streams/stream_set.h"
#include "vmm/error.h"

/* Larger requests cannot be rounded to granules without overflow. */
#define XS_MAX_REQUEST ((size_t)1 << 62)

const char *xs_format_bytes(size_t bytes, char *buf, size_t size) {
  static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  if (u == 0)
    snprintf(buf, size, "%zu bytes", bytes);
  else
    snprintf(buf, size, "%.2f %s", v, units[u]);
  return buf;
}

/* segment_unmap entries for the trace. */
static void alloc_trace_unmap(void *ctx, const xs_pool *p, uint64_t addr,
                              size_t size) {
  xs_trace_record(ctx, XS_TRACE_SEGMENT_UNMAP, addr, size, p->stream);
}

xs_stream_pools *xs_stream_pools_new_locked(xseg_allocator *a,
                                            struct CUstream_st *stream,
                                            xseg_pool_id private_id) {
  xs_stream_pools *sp = calloc(1, sizeof *sp);
  if (sp == NULL) return NULL;
  sp->stream = stream;
  sp->private_id = private_id;
  for (int k = 0; k < 2; k++) {
    xs_pool *p = &sp->pool[k];
    xs_pool_init(p, (xs_pool_kind)k, stream, &a->vmm, &a->blocks, &a->stats);
    p->safe_epoch = 0;           /* the guard vouches for nothing yet */
    p->on_unmap = alloc_trace_unmap;
    p->on_unmap_ctx = &a->trace;
  }
  sp->next = a->streams;
  a->streams = sp;
  return sp;
}

void xs_stream_pools_free_locked(xseg_allocator *a, xs_stream_pools *sp) {
  assert(sp->pool[0].segments == NULL && sp->pool[1].segments == NULL);
  xs_guard_drop(&sp->guard, &a->events);
  xs_stream_pools **link = &a->streams;
  while (*link != sp) link = &(*link)->next;
  *link = sp->next;
  free(sp);
}

/* The pools of `stream`, looked up in the list and moved to its front. */
xseg_status xs_stream_pools_lookup_locked(xseg_allocator *a,
                                          struct CUstream_st *stream,
                                          xs_stream_pools **out) {
  xs_stream_pools **link = &a->streams;
  for (; *link != NULL; link = &(*link)->next)
    if ((*link)->stream == stream && (*link)->private_id == 0) break;
  xs_stream_pools *sp = *link;
  if (sp == NULL) {
    sp = xs_stream_pools_new_locked(a, stream, 0);
    if (sp == NULL)
      return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                      "out of host memory for the pools of stream %p",
                      (void *)stream);
  } else if (sp != a->streams) {
    *link = sp->next;            /* most recently used goes first */
    sp->next = a->streams;
    a->streams = sp;
  }
  *out = sp;
  return XSEG_OK;
}

/* Rounds a granule setting up to the device's granularity. */
static size_t alloc_granule(const xs_vmm *v, size_t want) {
  size_t g = v->granularity;
  if (want == 0) want = (size_t)2 << 20;
  return (want + g - 1) / g * g;
}

/* PyTorch's reservation: 9/8 of the device's memory, or xseg_reserve_mb,
   but never more: a larger range could never be filled, and its page map
   would cost host memory in proportion (64 TiB of 2 MiB granules: 32 M
   entries). */
static void alloc_sizes(xseg_allocator *a) {
  size_t most = a->vmm.total_memory / 8 * 9;
  size_t want = a->cfg.reserve_size != 0 && a->cfg.reserve_size < most
                    ? a->cfg.reserve_size
                    : most;
  a->granule[XS_POOL_SMALL] = alloc_granule(&a->vmm, a->cfg.small_granule);
  a->granule[XS_POOL_LARGE] = alloc_granule(&a->vmm, a->cfg.large_granule);
  for (int k = 0; k < 2; k++) {
    size_t g = a->granule[k];
    a->reserve[k] = want < g ? g : (want + g - 1) / g * g;
  }
  a->cap = (size_t)(a->cfg.memory_fraction * (double)a->vmm.total_memory);
}

/* Debug builds: XSEG_DEBUG_CHECK=N validates everything every N operations
   (the tests set it; see allocator.h). Release builds ignore it. */
static void alloc_debug_checks(xseg_allocator *a) {
#ifndef NDEBUG
  const char *every = getenv("XSEG_DEBUG_CHECK");
  a->debug_check_every = every != NULL ? (uint32_t)strtoul(every, NULL, 10)
                                       : 0;
#else
  (void)a;
#endif
}

xseg_status xseg_create(int device, const char *conf, xseg_allocator **out) {
  if (out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_create: out is NULL");
  *out = NULL;
  xseg_allocator *a = calloc(1, sizeof *a);
  if (a == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  xseg_status st = xs_config_parse(conf, &a->cfg);
  if (st == XSEG_OK) st = xs_vmm_open(&a->vmm, a->cfg.driver, device);
  if (st != XSEG_OK) {
    xs_vmm_close(&a->vmm);
    free(a);
    return st;
  }
  alloc_sizes(a);
  alloc_debug_checks(a);
  if (!xs_ptrtable_init(&a->live)) {
    xs_vmm_close(&a->vmm);
    free(a);
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  }
  xs_event_pool_init(&a->events, &a->vmm);
  xs_pending_init(&a->pending, &a->events);
  atomic_init(&a->lock.state, 0);
  *out = a;
  return XSEG_OK;
}

/* Reports live blocks on stderr (a leak in the caller) before they go. */
static void alloc_report_live(xseg_allocator *a) {
  size_t n = a->live.count;
  if (n == 0) return;
  const xs_ptrtable_slot *slot = a->live.slot;
  while (slot->addr == 0) slot++;
  const xs_block *some = slot->block;
  int64_t bytes = xs_stats_current(&a->stats, XS_GAUGE_allocated_bytes);
  fprintf(stderr,
          "xseg_destroy: device %d still has %zu live blocks (%lld bytes), "
          "e.g. %p of %zu bytes; releasing them\n",
          a->vmm.device, n, (long long)bytes, (void *)(uintptr_t)some->addr,
          some->requested);
  xs_error(XSEG_ERR_INVALID_ARGUMENT,
           "xseg_destroy: %zu live blocks (%lld bytes) on device %d", n,
           (long long)bytes, a->vmm.device);
}

/* Pending frees still wait on recorded work that may use their memory:
   wait for it (on the events alone) before everything is unmapped. Block
   structs go with the pools; the recorded-stream arrays of pending and
   live blocks go here. */
static void alloc_destroy_pending(xseg_allocator *a, bool entered) {
  if (entered && xs_alloc_has_pending(a)) {
    a->n_captures = 0;          /* nothing captures into a dying allocator */
    a->n_implicit = 0;
    xs_alloc_process_pending_locked(a, true);
  }
  for (xs_stream_pools *sp = a->streams; sp != NULL; sp = sp->next)
    for (int k = 0; k < 2; k++)
      for (xs_segment *s = sp->pool[k].segments; s != NULL; s = s->next)
        for (xs_block *b = s->first; b != NULL; b = b->next)
          xs_stream_set_clear(&b->uses);
}

void xseg_destroy(xseg_allocator *a) {
  if (a == NULL) return;
  xs_alloc_lock(a);
  alloc_report_live(a);
  xs_ptrtable_destroy(&a->live);
  CUcontext saved;
  bool entered = xs_vmm_ctx_enter(&a->vmm, &saved) == XSEG_OK;
  alloc_destroy_pending(a, entered);
  xs_ipc_destroy_locked(a, entered);
  while (a->streams != NULL) {
    xs_stream_pools *sp = a->streams;
    for (int k = 0; k < 2; k++) xs_pool_destroy(&sp->pool[k]);
    xs_stream_pools_free_locked(a, sp);
  }
  xs_vmm_alias_destroy(&a->vmm);        /* after the pools' unmaps */
  xs_vmm_unreleased_destroy(&a->vmm);   /* after the pools' releases */
  if (entered) {
    xs_pending_destroy(&a->pending);
    xs_event_pool_destroy(&a->events);
    xs_vmm_ctx_leave(&a->vmm, saved);
  }
  free(a->deferred);
  free(a->captures);
  xs_trace_resize(&a->trace, 0);
  xs_blocks_destroy(&a->blocks);
  xs_vmm_close(&a->vmm);
#ifndef NDEBUG
  a->debug_check_every = 0;              /* nothing is left to check */
#endif
  xs_alloc_unlock(a);
  free(a);
}

void xs_alloc_account_live(xseg_allocator *a, const xs_block *b, int sign) {
  xs_pool_kind k = b->seg->pool->kind;
  xs_stats_move(&a->stats, XS_GAUGE_allocation, k, sign);
  xs_stats_move(&a->stats, XS_GAUGE_allocated_bytes, k,
                sign * (int64_t)b->size);
  xs_stats_move(&a->stats, XS_GAUGE_requested_bytes, k,
                sign * (int64_t)b->requested);
  /* active stays: it is derived from allocation (segments/stats.h). */
  xs_stats_held_move(&a->stats, XS_GAUGE_active, k, sign, 0);
  xs_stats_held_move(&a->stats, XS_GAUGE_active_bytes, k,
                     sign * (int64_t)b->size, 0);
}

void xs_alloc_account_active(xseg_allocator *a, const xs_block *b,
                             int sign) {
  assert(sign < 0 && "active rises only with a malloc");
  xs_pool_kind k = b->seg->pool->kind;
  xs_stats_held_move(&a->stats, XS_GAUGE_active, k, 0, sign);
  xs_stats_held_move(&a->stats, XS_GAUGE_active_bytes, k, 0,
                     sign * (int64_t)b->size);
}

/* Nothing announces the end of a capture found by the driver: ask, lest
   the stream keep allocating to its pool after it ended. */
static xseg_status alloc_capture_refresh_locked(xseg_allocator *a) {
  if (a->n_implicit == 0) return XSEG_OK;
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  st = xs_capture_refresh_locked(a);
  xs_vmm_ctx_leave(&a->vmm, saved);
  return st;
}

/* The cached path's accounting: live and active together, the direction
   known at compile time (no sign multiplications, decreases without peak
   checks). The same as xs_alloc_account_live and _active together. */
static inline void alloc_account_malloc(xseg_allocator *a, const xs_block *b,
                                        xs_pool_kind k) {
  xs_stats_inc(&a->stats, XS_GAUGE_allocation, k, 1);
  xs_stats_inc(&a->stats, XS_GAUGE_allocated_bytes, k, (int64_t)b->size);
  xs_stats_inc(&a->stats, XS_GAUGE_requested_bytes, k, (int64_t)b->requested);
  /* active follows allocation (derived); its peak needs a look only while
     freed blocks are still active. */
  if (__builtin_expect(a->stats.all[XS_GAUGE_active].current != 0, 0))
    xs_stats_held_peak(&a->stats, k);
}

static inline void alloc_account_free(xseg_allocator *a, const xs_block *b) {
  xs_pool_kind k = b->seg->pool->kind;
  xs_stats_dec(&a->stats, XS_GAUGE_allocation, k, 1);
  xs_stats_dec(&a->stats, XS_GAUGE_allocated_bytes, k, (int64_t)b->size);
  xs_stats_dec(&a->stats, XS_GAUGE_requested_bytes, k, (int64_t)b->requested);
}

/* The pools a request on `stream` draws from: a private pool while the
   stream captures into one (one counter load when nothing captures). */
static xseg_status alloc_pools_locked(xseg_allocator *a,
                                      struct CUstream_st *stream,
                                      xs_stream_pools **out) {
  if (__builtin_expect(xs_alloc_capturing(a), 0)) {
    xseg_status st = alloc_capture_refresh_locked(a);
    if (st != XSEG_OK) return st;
    xs_stream_pools *sp = xs_capture_pools_locked(a, stream);
    if (sp != NULL) return *out = sp, XSEG_OK;
  }
  return xs_stream_pools_get_locked(a, stream, out);
}

/* A block just taken from pool p becomes the caller's. */
static inline void alloc_hand_out_locked(xseg_allocator *a, xs_pool *p,
                                         xs_block *b, size_t size,
                                         struct CUstream_st *stream) {
  b->requested = size;
  b->stream = stream;
  xs_ptrtable_add(&a->live, b);
  alloc_account_malloc(a, b, p->kind);
  xs_trace_record(&a->trace, XS_TRACE_ALLOC, b->addr, b->size, stream);
}

static xseg_status alloc_block_locked(xseg_allocator *a, size_t size,
                                      size_t rounded,
                                      struct CUstream_st *stream,
                                      xs_block **out) {
  if (!xs_ptrtable_reserve(&a->live))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for the pointer table");
  xs_stream_pools *sp;
  xseg_status st = alloc_pools_locked(a, stream, &sp);
  if (st != XSEG_OK) return st;
  xs_pool *p = &sp->pool[xs_alloc_kind(rounded)];
  xs_block *b = xs_alloc_find_free(a, p, rounded);
  if (b == NULL) st = xs_alloc_grow_locked(a, &p, stream, rounded, size, &b);
  if (st != XSEG_OK) return st;
  xs_pool_take(p, b, rounded, xs_alloc_should_split(a, p, b, rounded));
  alloc_hand_out_locked(a, p, b, size, stream);
  *out = b;
  return XSEG_OK;
}

void xs_alloc_settle_locked(xseg_allocator *a) {
  xs_alloc_park_stats_locked(a);
  for (xs_stream_pools *sp = a->streams; sp != NULL && a->n_parked != 0;
       sp = sp->next)
    for (int k = 0; k < 2; k++) xs_alloc_settle_pool_locked(a, &sp->pool[k]);
  assert(a->n_parked == 0);
}

/* The cached malloc with blocks parked (allocator.h): the one of the
   request's pool when the request is its size and settling then taking
   the best fit would hand out exactly it (xs_pool_retake). False (nothing
   changed) otherwise: the caller settles and goes the usual way. Pending
   frees and captures go the usual way, in the usual order. */
static bool alloc_retake_locked(xseg_allocator *a, size_t size,
                                size_t rounded, struct CUstream_st *stream,
                                xs_block **out) {
  if (xs_alloc_has_pending(a) || xs_alloc_capturing(a) ||
      !xs_ptrtable_reserve(&a->live))
    return false;
  xs_stream_pools *sp;
  if (xs_stream_pools_get_locked(a, stream, &sp) != XSEG_OK) return false;
  xs_pool *p = &sp->pool[xs_alloc_kind(rounded)];
  xs_block *b = p->parked;
  if (b == NULL || b->size != rounded) return false;
  /* The merged block must be one the policy takes and splits. */
  size_t merged = rounded + b->next->size;
  if (!xs_alloc_fit_takes(a, merged, rounded) ||
      !xs_alloc_splits(a, p->kind, merged, rounded))
    return false;
  /* Another pool's merge goes in the stats before this one's moves. */
  if (a->park_stats != p) xs_alloc_park_stats_locked(a);
  if (!xs_pool_retake(p, a->park_stats != p)) return false;
  a->park_stats = NULL;
  a->n_parked--;
  alloc_hand_out_locked(a, p, b, size, stream);
  *out = b;
  return true;
}

/* xs_config_round_size, with its common case inline: every size up to
   1 MiB falls in the first roundup_power2_divisions interval, and without
   divisions there it is rounded to 512 bytes. */
static inline size_t alloc_round(const xs_config *c, size_t size) {
  if (size <= XS_SMALL_SIZE && c->roundup_power2_divisions[0] <= 1)
    return size <= XS_MIN_BLOCK ? XS_MIN_BLOCK
                                : (size + XS_MIN_BLOCK - 1) & ~(XS_MIN_BLOCK - 1);
  return xs_config_round_size(c, size);
}

xseg_status xseg_malloc(xseg_allocator *a, size_t size,
                        struct CUstream_st *stream, void **ptr) {
  if (ptr != NULL) *ptr = NULL;           /* NULL on every failure */
  if (a == NULL || ptr == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_malloc(%zu bytes): %s",
                    size, a == NULL ? "allocator is NULL" : "ptr is NULL");
  size_t rounded = alloc_round(&a->cfg, size);
  if (rounded == 0 || rounded > XS_MAX_REQUEST)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_malloc(%zu bytes): the size overflows when rounded "
                    "to blocks and granules", size);
  xs_alloc_lock_cached(a);
  xs_block *b = NULL;
  xseg_status st = XSEG_OK;
  /* A miss settles every pool: growth and pending frees look at other
     streams' pools. */
  if (a->n_parked != 0 && !alloc_retake_locked(a, size, rounded, stream, &b))
    xs_alloc_settle_locked(a);
  if (b == NULL) {
    /* Frees waiting on other streams are settled first, as PyTorch's
       process_events; a counter check when none waits. A failed query
       only leaves them waiting: the allocation goes on. */
    if (__builtin_expect(xs_alloc_has_pending(a), 0))
      xs_alloc_process_pending_locked(a, false);
    st = alloc_block_locked(a, size, rounded, stream, &b);
  }
  xs_alloc_unlock(a);
  *ptr = st == XSEG_OK ? (void *)(uintptr_t)b->addr : NULL;
  return st;
}

/* The one way a block stops being live. A block used on other streams
   (xseg_record_stream) waits, pending, until the work they had queued at
   this free is done (deferred.c); any other goes back to its pool at once,
   where its own stream may reuse it (stream order makes that safe). */
static xseg_status alloc_release_block_locked(xseg_allocator *a,
                                              xs_block *b) {
  XS_ASSERT_LOCKED(a);
  xs_trace_record(&a->trace, XS_TRACE_FREE_REQUESTED, b->addr, b->size,
                  b->stream);
  xs_pool *p = b->seg->pool;
  /* Its pool's parked block merges first, as at its own free. */
  xs_alloc_settle_pool_locked(a, p);
  if (__builtin_expect(a->ipc != NULL || b->uses.n != 0, 0)) {
    /* Shared or deferred frees may look at other pools: none parked. */
    if (a->n_parked != 0) xs_alloc_settle_locked(a);
    /* Exported and held by another process: pending until it lets go. */
    if (a->ipc != NULL && xs_ipc_hold_free_locked(a, b)) return XSEG_OK;
    if (b->uses.n != 0) return xs_alloc_defer_free_locked(a, b);
  }
  alloc_account_free(a, b);
  if (!xs_pool_parkable(b)) {
    xs_alloc_give_locked(a, b);
    return XSEG_OK;
  }
  /* Stamped and traced as xs_alloc_give_locked does, merged later. */
  xs_alloc_stamp_locked(a, b);
  xs_pool_park(p, b);
  a->n_parked++;
  a->park_stats = p;
  return XSEG_OK;
}

xseg_status xseg_free(xseg_allocator *a, void *ptr) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_free(%p): allocator is "
                    "NULL", ptr);
  if (ptr == NULL) return XSEG_OK;          /* as free(NULL) */
  uint64_t addr = (uint64_t)(uintptr_t)ptr;
  xs_alloc_lock_cached(a);
  /* The last park's merge counts before this free's moves. */
  xs_alloc_park_stats_locked(a);
  size_t slot = xs_ptrtable_find(&a->live, addr);
  if (slot == SIZE_MAX) {
    xs_alloc_unlock(a);
    return xs_error(XSEG_ERR_UNKNOWN_POINTER,
                    "xseg_free(%p): not a live block of the allocator of "
                    "device %d (never allocated here, already freed, or not "
                    "the start of a block)", ptr, a->vmm.device);
  }
  xs_block *b = a->live.slot[slot].block;
  xs_ptrtable_remove_at(&a->live, slot);
  xseg_status st = alloc_release_block_locked(a, b);
  if (st != XSEG_OK) {
    /* Still live, as the caller sees it: back in the table, where the
       slot just freed leaves room. */
    xs_ptrtable_add(&a->live, b);
  }
  xs_alloc_unlock(a);
  return st;
}
