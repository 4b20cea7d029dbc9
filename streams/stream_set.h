/* stream_set.h: the streams a live block was used on (xseg_record_stream).
 *
 * The set lives in the block (segments/block.h, xs_stream_set): two streams
 * inline, a heap array from the third on, so the common record_stream of a
 * block used on one or two side streams allocates nothing. A stream is in
 * the set at most once; the block's own stream is never in it.
 */
#ifndef XS_STREAMS_STREAM_SET_H
#define XS_STREAMS_STREAM_SET_H

#include <stdbool.h>

#include "segments/block.h"
#include "xseg.h"

static inline struct CUstream_st *xs_stream_set_at(const xs_stream_set *s,
                                                   uint32_t i) {
  return i < XS_STREAM_SET_INLINE ? s->inline_[i]
                                  : s->more[i - XS_STREAM_SET_INLINE];
}

bool xs_stream_set_has(const xs_stream_set *s, struct CUstream_st *stream);
/* Adds stream unless present; XSEG_ERR_OUT_OF_MEMORY (with a message) when
   the heap array cannot grow, the set unchanged. */
xseg_status xs_stream_set_add(xs_stream_set *s, struct CUstream_st *stream);
/* Empties the set and frees its heap array. */
void xs_stream_set_clear(xs_stream_set *s);

#endif /* XS_STREAMS_STREAM_SET_H */
