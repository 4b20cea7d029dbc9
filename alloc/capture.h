/* capture.h: graph capture's private pools (capture.c). Whether a capture
 * is under way and the thread's capture mode are capture_mode.h's.
 */
#ifndef XS_ALLOC_CAPTURE_H
#define XS_ALLOC_CAPTURE_H

#include "alloc/capture_mode.h"
#include "alloc/types.h"
#include "streams/stream_set.h"

/* The private pools that allocations on `stream` go to, or NULL. */
xs_pair *xs_capture_pools_locked(xseg_allocator *a,
                                 struct CUstream_st *stream);
/* Private pool `pool`'s pair of pools for `stream` in *out, made if need
   be (xseg_malloc_from_pool: the caller chose the pool, whether or not the
   stream is announced to it); a stream of another context is refused, as
   for any new pair (xs_pairs_new_locked), and host OOM said. `what`
   names the caller in a refusal. */
xseg_status xs_capture_private_pair_locked(xseg_allocator *a,
                                           const char *what,
                                           xseg_pool_id pool,
                                           struct CUstream_st *stream,
                                           xs_pair **out);
/* Slow path: an unannounced capture on `stream` (cuStreamGetCaptureInfo)
   becomes an implicit entry, whose private pools are returned in *out
   (NULL when the stream does not capture). Context current. */
xseg_status xs_capture_detect_locked(xseg_allocator *a,
                                     struct CUstream_st *stream,
                                     xs_pair **out);
/* Whether any of `streams` is in a capture now (cuStreamIsCapturing; an
   invalidated capture still counts, a destroyed stream does not), whether
   xseg knows of that capture or not. Reads no allocator state: any lock
   will do. Context current. */
xseg_status xs_capture_any_on(xseg_allocator *a, const xs_stream_set *streams,
                              bool *capturing);
/* Drops implicit entries whose capture ended. Context current. */
xseg_status xs_capture_refresh_locked(xseg_allocator *a);
/* Before releasing memory: drops implicit entries whose capture ended and
   detects unannounced captures on every stream with pools. Context
   current. */
xseg_status xs_capture_sweep_locked(xseg_allocator *a);

#endif /* XS_ALLOC_CAPTURE_H */
