/* capture.h: graph capture's private pools (capture.c) and the calling
 * thread's capture mode around xseg's own queries (capture_mode.c).
 */
#ifndef XS_ALLOC_CAPTURE_H
#define XS_ALLOC_CAPTURE_H

#include "alloc/types.h"

/* Graph capture (capture.c). */
static inline bool xs_alloc_capturing(const xseg_allocator *a) {
  return a->n_captures != 0;
}
/* The private pools that allocations on `stream` go to, or NULL. */
xs_stream_pools *xs_capture_pools_locked(xseg_allocator *a,
                                         struct CUstream_st *stream);
/* Slow path: an unannounced capture on `stream` (cuStreamGetCaptureInfo)
   becomes an implicit entry, whose private pools are returned in *out
   (NULL when the stream does not capture). Context current. */
xseg_status xs_capture_detect_locked(xseg_allocator *a,
                                     struct CUstream_st *stream,
                                     xs_stream_pools **out);
/* Drops implicit entries whose capture ended. Context current. */
xseg_status xs_capture_refresh_locked(xseg_allocator *a);
/* Before releasing memory: drops implicit entries whose capture ended and
   detects unannounced captures on every stream with pools. Context
   current. */
xseg_status xs_capture_sweep_locked(xseg_allocator *a);

/* The calling thread's stream-capture mode, relaxed around xseg's own
   event and stream queries (capture_mode.c); *saved is the caller's mode,
   which xs_capture_mode_restore puts back. */
xseg_status xs_capture_mode_relax(xseg_allocator *a,
                                  CUstreamCaptureMode *saved);
void xs_capture_mode_restore(xseg_allocator *a, CUstreamCaptureMode saved);

#endif /* XS_ALLOC_CAPTURE_H */
