/* stream_query.h: what cuStreamQuery tells xseg about a stream.
 *
 * Asked in two places (a guard proving a stream idle, a deferred free
 * recording events on its streams) that must read the answer the same way.
 * A stream the caller destroyed answers CUDA_ERROR_INVALID_HANDLE on the
 * emulator (and answered so on an H100 once): no work can be queued on it
 * any more, and what it had queued before cuStreamDestroy is the caller's
 * to have finished, so it is as good as idle, but no event can be recorded
 * on it. A real driver promises nothing for a destroyed handle (tests that
 * destroyed a stream xseg knew crashed inside an H200's driver), so
 * xseg.h asks that such streams outlive the allocator; this reading keeps
 * the emulator's answer useful.
 */
#ifndef XS_STREAMS_STREAM_QUERY_H
#define XS_STREAMS_STREAM_QUERY_H

#include "vmm/driver.h"

typedef enum xs_stream_state {
  XS_STREAM_IDLE,     /* everything queued on it is done */
  XS_STREAM_BUSY,     /* work still queued (CUDA_ERROR_NOT_READY) */
  XS_STREAM_GONE,     /* destroyed by the caller: idle, takes no event */
  XS_STREAM_FAILED,   /* any other answer: *r says which */
} xs_stream_state;

static inline xs_stream_state xs_stream_query(xs_driver *drv,
                                              struct CUstream_st *stream,
                                              CUresult *r) {
  *r = XS_DRV(drv, cuStreamQuery, (CUstream)stream);
  switch (*r) {
    case CUDA_SUCCESS: return XS_STREAM_IDLE;
    case CUDA_ERROR_NOT_READY: return XS_STREAM_BUSY;
    case CUDA_ERROR_INVALID_HANDLE: return XS_STREAM_GONE;
    default: return XS_STREAM_FAILED;
  }
}

#endif /* XS_STREAMS_STREAM_QUERY_H */
