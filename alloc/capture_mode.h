/* capture_mode.h: what every room may ask about graph capture: whether
 * xseg knows of one under way, and the calling thread's capture mode,
 * relaxed around xseg's own event and stream queries (capture_mode.c).
 * The private pools of captures are capture.h's.
 */
#ifndef XS_ALLOC_CAPTURE_MODE_H
#define XS_ALLOC_CAPTURE_MODE_H

#include "alloc/types.h"

/* Whether a capture xseg knows of is under way (capture.c keeps them):
   while one is, no event is queried, no stream synchronised and nothing
   unmapped. */
static inline bool xs_alloc_capturing(const xseg_allocator *a) {
  return a->n_captures != 0;
}

/* The calling thread's stream-capture mode, relaxed around xseg's own
   event and stream queries (capture_mode.c); *saved is the caller's mode,
   which xs_capture_mode_restore puts back. */
xseg_status xs_capture_mode_relax(xseg_allocator *a,
                                  CUstreamCaptureMode *saved);
void xs_capture_mode_restore(xseg_allocator *a, CUstreamCaptureMode saved);

#endif /* XS_ALLOC_CAPTURE_MODE_H */
