/* create.c: an allocator's life: xseg_create (configuration, the pools'
 * granules and reservation sizes) and xseg_destroy (what is still live is
 * reported, pending frees waited for, every handle released); and
 * xseg_check, whose walk is check.c's. Beside alloc.c and free.c, whose
 * malloc and free are the rest of the entry points.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/capture_mode.h"
#include "alloc/check.h"
#include "alloc/deferred.h"
#include "alloc/enter.h"
#include "alloc/frees.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "alloc/park.h"
#include "vmm/error.h"

/* Rounds a granule setting up to the device's granularity. */
static size_t create_granule(const xs_vmm *v, size_t want) {
  size_t g = v->granularity;
  if (want == 0) want = (size_t)2 << 20;
  return (want + g - 1) / g * g;
}

/* PyTorch's reservation: 9/8 of the device's memory, or xseg_reserve_mb,
   but never more: a larger range could never be filled, and its page map
   would cost host memory in proportion (64 TiB of 2 MiB granules: 32 M
   entries). */
static void create_sizes(xseg_allocator *a) {
  size_t most = a->vmm.total_memory / 8 * 9;
  size_t want = a->cfg.reserve_size != 0 && a->cfg.reserve_size < most
                    ? a->cfg.reserve_size
                    : most;
  a->granule[XS_POOL_SMALL] = create_granule(&a->vmm, a->cfg.small_granule);
  a->granule[XS_POOL_LARGE] = create_granule(&a->vmm, a->cfg.large_granule);
  for (int k = 0; k < 2; k++) {
    size_t g = a->granule[k];
    a->reserve[k] = want < g ? g : (want + g - 1) / g * g;
  }
  a->cap = (size_t)(a->cfg.memory_fraction * (double)a->vmm.total_memory);
}

/* Debug builds: XSEG_DEBUG_CHECK=N validates everything every N operations
   (the tests set it; see types.h). Release builds ignore it. */
static void create_debug_checks(xseg_allocator *a) {
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
  /* On lines of its own: its parts keep apart (types.h). */
  xseg_allocator *a = xs_lines_alloc(sizeof *a);
  if (a == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  memset(a, 0, sizeof *a);
  xseg_status st = xs_config_parse(conf, &a->cfg);
  if (st == XSEG_OK) st = xs_vmm_open(&a->vmm, a->cfg.driver, device);
  if (st != XSEG_OK) {
    xs_vmm_close(&a->vmm);
    free(a);
    return st;
  }
  create_sizes(a);
  create_debug_checks(a);
  xs_event_pool_init(&a->events, &a->vmm);
  atomic_init(&a->lock.state, 0);
  a->id = xs_pairs_new_id();
  xs_stats_group_init(&a->stats);
  a->shared_stats.rare = true;
  xs_stats_group_add(&a->stats, &a->shared_stats);
  *out = a;
  return XSEG_OK;
}

/* Reports live blocks on stderr (a leak in the caller) before they go. */
static void destroy_report_live_locked(xseg_allocator *a) {
  size_t n = xs_alloc_live_count_locked(a);
  if (n == 0) return;
  const xs_pair *pair = a->streams;
  while (pair->live.count == 0) pair = pair->next;
  const xs_ptrtable_slot *slot = pair->live.slot;
  while (slot->addr == 0) slot++;
  const xs_block *some = slot->block;
  int64_t bytes = xs_alloc_current(a, XS_GAUGE_allocated_bytes);
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
static void destroy_pending_locked(xseg_allocator *a, bool entered) {
  if (entered && xs_alloc_has_pending(a)) {
    a->n_captures = 0;          /* nothing captures into a dying allocator */
    a->n_implicit = 0;
    xs_alloc_complete_frees_locked(a, true);
  }
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (xs_segment *s = pair->pool[k].segments; s != NULL; s = s->next)
        for (xs_block *b = s->first; b != NULL; b = b->next)
          xs_stream_set_clear(&b->uses);
}

/* Work a stream queued before freeing a block on that same stream (a
   stream-ordered free: the block went back to the stream's cache at once)
   may still use it, and the old mapping of a handle lent to a newer block
   (an alias, segments/release.c) is its old work's until the pair's guard
   passes it. So before the pools unmap anything, each pair's guard waits
   for its newest free (on one event; a stream the caller destroyed proves
   itself idle, streams/guard.h). A guard that cannot be advanced leaves
   the whole context to wait for, and so does a released private pool
   whose graph's replays no guard covers (reclaim.c's sync_owed). Captures
   are over: a dying allocator serves none. */
static void destroy_guards_locked(xseg_allocator *a) {
  bool wait_device = false;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    wait_device |= pair->sync_owed;
    if (pair->guard.safe >= pair->clock) continue;
    CUstreamCaptureMode mode;
    xseg_status st = xs_capture_mode_relax(a, &mode);
    if (st != XSEG_OK) {
      wait_device = true;
      continue;
    }
    st = xs_guard_advance(&pair->guard, &a->events, pair->stream, pair->clock,
                          pair->clock, true);
    xs_capture_mode_restore(a, mode);
    wait_device |= st != XSEG_OK;
  }
  if (!wait_device) return;
  CUresult r = XS_DRV(a->vmm.drv, cuCtxSynchronize);
  if (r == CUDA_SUCCESS) return;
  xs_driver_error(a->vmm.drv, r, "cuCtxSynchronize (xseg_destroy, device %d)",
                  a->vmm.device);
  fprintf(stderr, "xseg_destroy: %s; unmapping without knowing that queued "
          "work is done\n", xseg_last_error());
}

void xseg_destroy(xseg_allocator *a) {
  if (a == NULL) return;
  xs_alloc_enter(a);
  destroy_report_live_locked(a);
  CUcontext saved;
  bool entered = xs_vmm_ctx_enter(&a->vmm, &saved) == XSEG_OK;
  destroy_pending_locked(a, entered);
  if (entered) destroy_guards_locked(a);
  xs_ipc_destroy_locked(a, entered);
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    for (int k = 0; k < 2; k++) xs_pool_destroy(&pair->pool[k]);
    xs_guard_drop(&pair->guard, &a->events);
  }
  xs_vmm_alias_destroy(&a->vmm);        /* after the pools' unmaps */
  xs_vmm_unreleased_destroy(&a->vmm);   /* after the pools' releases */
  if (entered) {
    for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
      xs_pending_destroy(&pair->pending);
      xs_event_pool_destroy(&pair->events);
    }
    xs_event_pool_destroy(&a->events);
    xs_vmm_ctx_leave(&a->vmm, saved);
  }
  free(a->deferred);
  free(a->captures);
  xs_trace_resize(&a->trace, 0);
  xs_vmm_close(&a->vmm);
  xs_alloc_leave_destroyed(a);
  free(a);
}

/* The walk is check.c's; the locks are taken here, with the other entry
   points, so that check.c stays below pairs.c (whose unlock runs the
   debug builds' check). */
xseg_status xseg_check(xseg_allocator *a) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_check: allocator is "
                    "NULL");
  xs_alloc_enter(a);
  xseg_status st = xs_alloc_check_locked(a);
  xs_alloc_leave(a);
  return st;
}
