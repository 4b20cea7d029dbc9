/* capture_mode.c: xseg's own event and stream queries run in relaxed
 * stream-capture mode.
 *
 * In the default (global) mode a thread may make no "potentially unsafe"
 * call, cuEventQuery, cuEventSynchronize and cuStreamQuery among them,
 * while it has a capture of its own not begun relaxed, or while any other
 * thread has a global-mode capture under way; the driver refuses the call
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidates that capture
 * (cuda.h, cuThreadExchangeStreamCaptureMode). xseg knows only the captures
 * announced to it or found on the streams it serves, so a capture into
 * another allocator, or on a stream xseg never saw, would be broken by a
 * query of an event that has nothing to do with it. Relaxed mode permits
 * such queries and still refuses what conflicts with a capture (a capturing
 * stream, an event recorded inside a capture), which xseg never queries:
 * deferred.c records no event into a capture, and reclaim.c does nothing
 * while a capture it knows of is under way.
 */
#include "alloc/capture_mode.h"
#include "vmm/error.h"

xseg_status xs_capture_mode_relax(xseg_allocator *a,
                                  CUstreamCaptureMode *saved) {
  *saved = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUresult r = XS_DRV(a->vmm.drv, cuThreadExchangeStreamCaptureMode, saved);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(a->vmm.drv, r,
                           "cuThreadExchangeStreamCaptureMode(relaxed)");
  return XSEG_OK;
}

void xs_capture_mode_restore(xseg_allocator *a, CUstreamCaptureMode saved) {
  /* Hands back the mode the caller had; it was valid when taken, so the
     driver has no reason to refuse it. */
  CUresult r = XS_DRV(a->vmm.drv, cuThreadExchangeStreamCaptureMode, &saved);
  (void)r;
}
