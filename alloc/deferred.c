/* deferred.c: frees of blocks used on other streams (xseg_record_stream).
 *
 * A block may still be read or written by work queued on the streams it
 * was recorded on. Its free records one pooled event on each of them (the
 * point each had reached) and makes the block pending: it is no longer the
 * caller's (allocation and allocated_bytes drop), but stays active, out of
 * every tree, until every one of its events has fired. Work queued on those
 * streams after the free does not delay it.
 *
 * Each pair of pools keeps the queues of its own blocks' frees, under its
 * lock: a cross-stream free on the cached path and the next malloc of the
 * same pair, which polls that pair's pending blocks first (as PyTorch's
 * process_events), take that lock alone; the malloc polls the other
 * streams' pairs' too, each by a try of its lock (alloc/pairs.c).
 * empty_cache, the out-of-memory path and every malloc that takes every
 * lock complete every pair's. Each stream's queue is polled in order up to
 * its first unfired event (streams/pending.h), so a slow stream holds
 * back only its own frees.
 *
 * While a graph capture is under way no event may be queried, and events
 * recorded into a capture would describe the graph, not the work: frees
 * then only list the block in a->deferred, its events unrecorded, and they
 * are recorded once no capture is under way (PyTorch's
 * needs_events_deferred_until_no_capture). xseg knows of announced
 * captures and of those a slow malloc detected on its own stream, but any
 * of a block's streams may capture unseen, so each is asked first: a free
 * (or an unrecorded free's recording) that finds one capturing waits
 * unrecorded, or stays so, the same way. An event recorded there would
 * be the capture's, and cuEventQuery of it fails
 * (CUDA_ERROR_CAPTURED_EVENT) and invalidates the capture.
 */
#include <assert.h>
#include <stdlib.h>

#include "alloc/account.h"
#include "alloc/capture.h"
#include "alloc/deferred.h"
#include "alloc/enter.h"
#include "alloc/pairs.h"
#include "alloc/park.h"
#include "alloc/ranges.h"
#include "alloc/types.h"
#include "streams/stream_query.h"
#include "streams/stream_set.h"
#include "vmm/array.h"
#include "vmm/error.h"

/* Pair lock held: records `stream` as a user of live block b (its own
   stream orders itself); its free is no repeated size's park any more. */
static xseg_status record_use(xs_block *b, struct CUstream_st *stream) {
  if (stream == b->stream) return XSEG_OK;
  xs_pool_forget_retake(b->seg->pool, b);
  return xs_stream_set_add(&b->uses, stream);
}

/* No lock held: xseg_record_stream under the block's pair lock alone, which
   it takes. A live block's recorded streams are read and written only by
   operations that hold its pair's lock (every slow path holds all of them),
   and recording one changes nothing outside the block. False when the range
   table does not lead to a live block (a new range, a dead pair, or a block
   freed and parked, whose entry stays in the pair's table until it settles):
   the caller looks for it under every lock, which settles parked blocks. */
static bool record_cached(xseg_allocator *a, uint64_t addr,
                          struct CUstream_st *stream, xseg_status *st) {
  xs_pair *pair = xs_ranges_find(a, addr);
  if (pair == NULL) return false;
  xs_pair_take(pair);
  size_t slot = pair->dead ? SIZE_MAX : xs_ptrtable_find(&pair->live, addr);
  xs_block *b = slot != SIZE_MAX ? pair->live.slot[slot].block : NULL;
  bool live = b != NULL && b->allocated;
  if (live) *st = record_use(b, stream);
  xs_pair_drop(pair);
  if (live) xs_alloc_debug_after_cached(a);
  return live;
}

xseg_status xseg_record_stream(xseg_allocator *a, void *ptr,
                               struct CUstream_st *stream) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_record_stream(%p): allocator is NULL", ptr);
  uint64_t addr = (uint64_t)(uintptr_t)ptr;
  /* Any context's stream: a free records events of the stream's own
     context on it (streams/pending.h), as PyTorch's insert_events does
     on the stream's device. */
  xseg_status st = XSEG_OK;
  if (record_cached(a, addr, stream, &st)) return st;
  xs_alloc_enter(a);
  size_t slot;
  xs_block *b = xs_alloc_find_live_locked(a, addr, &slot);
  if (b == NULL)
    st = xs_error(XSEG_ERR_UNKNOWN_POINTER,
                  "xseg_record_stream(%p, stream %p): not the start of a live "
                  "block of the allocator of device %d", ptr, (void *)stream,
                  a->vmm.device);
  else
    st = record_use(b, stream);
  xs_alloc_leave(a);
  return st;
}

/* The last event of a pending block fired: it is free (its pair's lock
   held; its pool has no parked block). */
static void deferred_complete(xseg_allocator *a, xs_block *b) {
  assert(b->pending && b->pending_events == 0);
  assert(b->seg->pool->parked == NULL);
  b->pending = false;
  xs_stream_set_clear(&b->uses);
  xs_alloc_pending_count(a, b, -1);
  xs_alloc_account_active(b, -1);
  xs_pair_give_block(a, b);
}

static void deferred_fired(void *ctx, void *block) {
  xs_block *b = block;
  assert(b->pending_events > 0 && "one event per recorded stream");
  if (--b->pending_events == 0) deferred_complete(ctx, b);
}

/* Pair lock held: drops from b's recorded streams those the caller has
   destroyed: no event can be recorded on them, and their work is over
   (streams/stream_query.h). True when any went. The queries run in relaxed
   capture mode (capture_mode.c): a cached free gets here without it, and
   cuStreamQuery in global mode would break another thread's capture. */
static bool deferred_drop_dead(xseg_allocator *a, xs_block *b) {
  CUstreamCaptureMode mode;
  if (xs_capture_mode_relax(a, &mode) != XSEG_OK) return false;
  xs_stream_set alive = {0};
  bool dropped = false;
  for (uint32_t i = 0; i < b->uses.n; i++) {
    struct CUstream_st *s = xs_stream_set_at(&b->uses, i);
    CUresult r;
    if (xs_stream_query(a->vmm.drv, s, &r) == XS_STREAM_GONE)
      dropped = true;
    else if (xs_stream_set_add(&alive, s) != XSEG_OK) {
      dropped = false;                      /* host OOM: keep them all */
      break;
    }
  }
  xs_capture_mode_restore(a, mode);
  if (!dropped) {
    xs_stream_set_clear(&alive);
    return false;
  }
  xs_stream_set_clear(&b->uses);
  b->uses = alive;
  return true;
}

/* Pair lock held: queues the events of b (pending) on its recorded streams;
   none when every one of them has been destroyed (pending_events 0: the
   caller completes the free). *later, nothing done, when one of them
   captures: the events wait until it no longer does. */
static xseg_status deferred_record(xseg_allocator *a, xs_block *b,
                                   bool *later) {
  xseg_status st = xs_capture_any_on(a, &b->uses, later);
  if (st != XSEG_OK || *later) return st;
  xs_pending *queues = &xs_pool_pair(b->seg->pool)->pending;
  st = xs_pending_add_all(queues, &b->uses, b);
  if (st == XSEG_ERR_DRIVER && deferred_drop_dead(a, b))
    st = b->uses.n == 0 ? XSEG_OK : xs_pending_add_all(queues, &b->uses, b);
  if (st == XSEG_OK) b->pending_events = b->uses.n;
  return st;
}

/* Lists pending block b in a->deferred, its events still to record. */
static xseg_status deferred_add_unrecorded_locked(xseg_allocator *a,
                                                  xs_block *b) {
  if (!XS_ARRAY_RESERVE(a->deferred, a->cap_deferred, a->n_deferred + 1, 16))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory deferring the free of %p",
                    (void *)(uintptr_t)b->addr);
  a->deferred[a->n_deferred++] = b;
  return XSEG_OK;
}

/* Pair lock held: b, whose events were recorded (or whose streams are
   all gone), becomes pending: no longer the caller's, still active. */
static void deferred_begin(xseg_allocator *a, xs_block *b) {
  xs_pool_forget_retake(b->seg->pool, b);
  b->pending = true;
  xs_alloc_pending_count(a, b, 1);
  xs_alloc_account_live(b, -1);
  if (b->uses.n == 0) deferred_complete(a, b);  /* its streams are gone */
}

xseg_status xs_alloc_defer_free_pair(xseg_allocator *a, xs_block *b,
                                     bool *later) {
  assert(b->allocated && !b->pending && b->uses.n > 0);
  assert(!xs_alloc_capturing(a) && "captures send frees the slow way");
  XS_ASSERT_PAIR_LOCKED(a, xs_pool_pair(b->seg->pool));
  *later = false;
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  st = deferred_record(a, b, later);
  xs_vmm_ctx_leave(&a->vmm, saved);
  if (st == XSEG_OK && !*later) deferred_begin(a, b);
  return st;
}

xseg_status xs_alloc_defer_free_locked(xseg_allocator *a, xs_block *b) {
  XS_ASSERT_LOCKED(a);
  assert(b->allocated && !b->pending && b->uses.n > 0);
  /* Unrecorded during a capture xseg knows of, or one it finds on b's
     streams. */
  if (!xs_alloc_capturing(a)) {
    bool later;
    xseg_status st = xs_alloc_defer_free_pair(a, b, &later);
    if (st != XSEG_OK || !later) return st;
  }
  xseg_status st = deferred_add_unrecorded_locked(a, b);
  if (st == XSEG_OK) deferred_begin(a, b);
  return st;
}

/* Records the events of frees made during a capture. One that fails, or
   one of whose streams captures, stays unrecorded, listed for the next
   call; the first failure is returned. */
static xseg_status deferred_record_unrecorded_locked(xseg_allocator *a) {
  xseg_status first = XSEG_OK;
  size_t kept = 0;
  for (size_t i = 0; i < a->n_deferred; i++) {
    xs_block *b = a->deferred[i];
    bool later;
    xseg_status st = deferred_record(a, b, &later);
    if (st != XSEG_OK || later) a->deferred[kept++] = b;
    else if (b->uses.n == 0) deferred_complete(a, b);  /* streams gone */
    if (first == XSEG_OK) first = st;
  }
  a->n_deferred = kept;
  return first;
}

xseg_status xs_alloc_defer_unrecorded_locked(xseg_allocator *a, xs_block *b) {
  XS_ASSERT_LOCKED(a);
  assert(b->pending && b->pending_events == 0 && b->uses.n > 0);
  return deferred_add_unrecorded_locked(a, b);
}

xseg_status xs_alloc_process_pending_locked(xseg_allocator *a, bool wait) {
  XS_ASSERT_LOCKED(a);
  /* An announced capture lasts until xseg_end_allocate_to_pool; only a
     detected one must be asked whether it is still going on. */
  if (!xs_alloc_has_pending(a) || a->n_captures > a->n_implicit)
    return XSEG_OK;
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  if (a->n_implicit != 0) st = xs_capture_refresh_locked(a);
  /* Captures xseg does not know of may be under way (capture_mode.c). */
  CUstreamCaptureMode mode;
  if (st == XSEG_OK && !xs_alloc_capturing(a))
    st = xs_capture_mode_relax(a, &mode);
  if (st != XSEG_OK || xs_alloc_capturing(a)) {
    xs_vmm_ctx_leave(&a->vmm, saved);
    return st;
  }
  if (a->n_deferred != 0) st = deferred_record_unrecorded_locked(a);
  xseg_status qs = XSEG_OK;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    if (pair->pending.entries == 0) continue;
    xseg_status e;
    if (wait)
      xs_pending_drain(&pair->pending, deferred_fired, a, &e);
    else
      xs_pending_poll(&pair->pending, deferred_fired, a, &e);
    if (qs == XSEG_OK) qs = e;
  }
  xs_capture_mode_restore(a, mode);
  xs_vmm_ctx_leave(&a->vmm, saved);
  return st != XSEG_OK ? st : qs;
}

void xs_alloc_poll_pair(xseg_allocator *a, xs_pair *pair) {
  assert(!xs_alloc_capturing(a) && "captures send mallocs the slow way");
  XS_ASSERT_PAIR_LOCKED(a, pair);
  if (pair->pending.entries == 0) return;
  /* Completions give blocks back to their pools: settled pools. */
  xs_park_settle_pair(pair);
  CUcontext saved;
  if (xs_vmm_ctx_enter(&a->vmm, &saved) != XSEG_OK) return;
  /* Captures xseg does not know of may be under way (capture_mode.c). */
  CUstreamCaptureMode mode;
  if (xs_capture_mode_relax(a, &mode) == XSEG_OK) {
    xseg_status e;
    xs_pending_poll(&pair->pending, deferred_fired, a, &e);
    xs_capture_mode_restore(a, mode);
  }
  xs_vmm_ctx_leave(&a->vmm, saved);
}

xseg_status xs_alloc_forget_pending_locked(xseg_allocator *a,
                                           struct CUstream_st *stream) {
  XS_ASSERT_LOCKED(a);
  assert(!xs_alloc_capturing(a) && "no event wait during a capture");
  CUstreamCaptureMode mode;
  xseg_status st = xs_capture_mode_relax(a, &mode);
  if (st != XSEG_OK) return st;
  for (xs_pair *pair = a->streams; pair != NULL && st == XSEG_OK;
       pair = pair->next) {
    if (!xs_pending_has_queue(&pair->pending, stream)) continue;
    /* Completions give blocks back to their pools: settled pools. */
    xs_park_settle_pair(pair);
    st = xs_pending_forget(&pair->pending, stream, deferred_fired, a);
  }
  xs_capture_mode_restore(a, mode);
  return st;
}

xseg_status xs_alloc_drain_pair_locked(xseg_allocator *a, xs_pair *pair) {
  XS_ASSERT_LOCKED(a);
  assert(!xs_alloc_capturing(a) && "no event query during a capture");
  if (pair->pending.entries == 0) return XSEG_OK;
  xs_park_settle_pair(pair);
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  CUstreamCaptureMode mode;
  st = xs_capture_mode_relax(a, &mode);
  if (st == XSEG_OK) {
    xs_pending_drain(&pair->pending, deferred_fired, a, &st);
    xs_capture_mode_restore(a, mode);
  }
  xs_vmm_ctx_leave(&a->vmm, saved);
  return st;
}

bool xs_alloc_poll_others(xseg_allocator *a, xs_pair *pair) {
  XS_ASSERT_PAIR_LOCKED(a, pair);
  size_t seen = atomic_load_explicit(&pair->n_pending, memory_order_relaxed);
  xs_stream_index *x =
      atomic_load_explicit(&a->stream_index, memory_order_acquire);
  size_t n = x != NULL ? atomic_load_explicit(&x->n, memory_order_acquire) : 0;
  for (size_t i = 0; i < n; i++) {
    xs_pair *q = x->entry[i].pair;
    if (q == pair ||
        atomic_load_explicit(&q->n_pending, memory_order_relaxed) == 0)
      continue;
    if (!xs_pair_try_second(q)) return false;
    /* A stream's pair never dies; the slow flag was down for `pair`'s. */
    assert(!q->dead);
    xs_alloc_poll_pair(a, q);
    seen += atomic_load_explicit(&q->n_pending, memory_order_relaxed);
    xs_pair_drop_second(q);
  }
  return seen ==
         atomic_load_explicit(&a->pending_blocks, memory_order_relaxed);
}
