/* physical.c: the acts on physical memory that the policy (flow.c) and the
 * release passes (reclaim.c) decide on: advancing a pair's unmap guard,
 * unmapping the aliases it proved done, taking whole free handles from a
 * pair of pools, stealing behind an event, creating and releasing handles.
 * Nothing here decides whose memory moves, and nothing waits on the host
 * unless a caller asks for the blocking guard.
 */
#include <assert.h>

#include "alloc/capture.h"
#include "alloc/flow.h"
#include "alloc/pairs.h"
#include "alloc/reclaim.h"
#include "alloc/types.h"
#include "vmm/error.h"

xseg_status xs_alloc_guard_advance_locked(xseg_allocator *a,
                                          xs_pair *pair, bool wait) {
  uint64_t target = xs_pool_unsafe_epoch(&pair->pool[0]);
  uint64_t t1 = xs_pool_unsafe_epoch(&pair->pool[1]);
  if (t1 > target) target = t1;
  if (target == 0) return XSEG_OK;
  CUstreamCaptureMode mode;   /* unknown captures: see capture_mode.c */
  xseg_status st = xs_capture_mode_relax(a, &mode);
  if (st != XSEG_OK) return st;
  st = xs_guard_advance(&pair->guard, &a->events, pair->stream, target,
                        pair->clock, wait);
  xs_capture_mode_restore(a, mode);
  for (int k = 0; k < 2; k++) pair->pool[k].safe_epoch = pair->guard.safe;
  return st;
}

xseg_status xs_alloc_retire_aliases_locked(xseg_allocator *a,
                                           xs_pair *pair) {
  assert(!xs_alloc_capturing(a) && "nothing is unmapped during a capture");
  (void)a;
  xseg_status first = XSEG_OK;
  for (int k = 0; k < 2; k++) {
    if (pair->pool[k].n_retiring == 0) continue;
    xseg_status st = xs_pool_retire(&pair->pool[k]);
    if (first == XSEG_OK) first = st;
  }
  return first;
}

size_t xs_phys_take_locked(xseg_allocator *a, xs_pair *pair,
                           xs_pool *first, size_t granule, size_t want,
                           size_t max, const xs_block *keep,
                           uint64_t lend_upto, uint64_t *handles) {
  XS_ASSERT_LOCKED(a);
  assert(!xs_alloc_capturing(a) && "nothing is unmapped during a capture");
  (void)a;
  size_t got = 0;
  xs_pool_kind k0 = first != NULL ? first->kind : XS_POOL_SMALL;
  for (int i = 0; i < 2 && got < want; i++) {
    xs_pool *p = &pair->pool[i == 0 ? k0 : !k0];
    xseg_status st;   /* a failed harvest only means fewer handles */
    got += xs_pool_harvest(p, granule, want - got, max - got, keep,
                           lend_upto, handles + got, &st);
  }
  return got;
}

size_t xs_phys_steal_locked(xseg_allocator *a, xs_pair *thief,
                            xs_pair *donor, unsigned pools,
                            size_t granule, size_t want, size_t max,
                            uint64_t *handles) {
  XS_ASSERT_LOCKED(a);
  assert(!xs_alloc_capturing(a));
  /* An event recorded now covers every free so far; the wait captures it
     when queued, so the event goes back to the pool at once (as a stream
     wait on a re-recorded event waits on the record it saw). */
  xs_driver *drv = a->vmm.drv;
  CUevent ev;
  if (xs_event_pool_take(&a->events, &ev) != XSEG_OK) return 0;
  CUresult r = XS_DRV(drv, cuEventRecord, ev, (CUstream)donor->stream);
  if (r != CUDA_SUCCESS) {
    xs_event_pool_discard(&a->events, ev);
    xs_driver_error(drv, r, "cuEventRecord(stream %p, before stream %p "
                    "takes its memory)", (void *)donor->stream,
                    (void *)thief->stream);
    return 0;
  }
  r = XS_DRV(drv, cuStreamWaitEvent, (CUstream)thief->stream, ev, 0);
  xs_event_pool_give(&a->events, ev);
  if (r != CUDA_SUCCESS) {
    xs_driver_error(drv, r, "cuStreamWaitEvent(stream %p on %p)",
                    (void *)thief->stream, (void *)donor->stream);
    return 0;
  }
  size_t got = 0;
  for (int k = 0; k < 2 && got < want; k++) {
    if ((pools & (1u << k)) == 0) continue;
    xseg_status st;
    got += xs_pool_harvest(&donor->pool[k], granule, want - got, max - got,
                           NULL, donor->clock, handles + got, &st);
  }
  return got;
}

xseg_status xs_phys_create_locked(xseg_allocator *a, size_t bytes,
                                  uint64_t *out) {
  xseg_status st = xs_vmm_handle_create(&a->vmm, bytes, false, out);
  if (st == XSEG_OK) a->shared_stats.counter[XS_COUNTER_num_device_alloc]++;
  return st;
}

void xs_phys_release_locked(xseg_allocator *a, const uint64_t *handles,
                            size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && handles[i] == handles[i - 1]) continue;
    /* Lent (or taken from a mapping it was lent from): an alias still maps
       it, so its memory stays until that alias is unmapped, and its bytes
       count until then (segments/release.c releases it there). */
    xs_vmm_alias orphan;
    if (xs_vmm_alias_orphan(&a->vmm, handles[i], &orphan)) {
      xs_stats_move(&a->shared_stats, XS_GAUGE_reserved_bytes,
                    (xs_pool_kind)orphan.tag, (int64_t)orphan.size);
      /* Counted again, at its first alias, where the snapshot shows it
         (a "retiring" segment) until segments/release.c unmaps it. */
      xs_trace_record(&a->trace, XS_TRACE_SEGMENT_MAP, orphan.addr,
                      orphan.size, NULL);
      continue;
    }
    /* The growth's own failure is the message; a failed release is kept
       for a retry (vmm/unreleased.c). */
    xs_vmm_handle_release_quietly(&a->vmm, handles[i]);
    a->shared_stats.counter[XS_COUNTER_num_device_free]++;
  }
}
