/* stream_set.c: a block's recorded streams; see stream_set.h. */
#include <stdlib.h>

#include "streams/stream_set.h"
#include "vmm/error.h"

bool xs_stream_set_has(const xs_stream_set *s, struct CUstream_st *stream) {
  for (uint32_t i = 0; i < s->n; i++)
    if (xs_stream_set_at(s, i) == stream) return true;
  return false;
}

static bool stream_set_grow(xs_stream_set *s) {
  uint32_t cap = s->cap_more ? 2 * s->cap_more : 4;
  struct CUstream_st **more = realloc(s->more, cap * sizeof *more);
  if (more == NULL) return false;
  s->more = more;
  s->cap_more = cap;
  return true;
}

xseg_status xs_stream_set_add(xs_stream_set *s, struct CUstream_st *stream) {
  if (xs_stream_set_has(s, stream)) return XSEG_OK;
  if (s->n < XS_STREAM_SET_INLINE) {
    s->inline_[s->n++] = stream;
    return XSEG_OK;
  }
  if (s->n - XS_STREAM_SET_INLINE == s->cap_more && !stream_set_grow(s))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory recording stream %p on a block",
                    (void *)stream);
  s->more[s->n++ - XS_STREAM_SET_INLINE] = stream;
  return XSEG_OK;
}

void xs_stream_set_clear(xs_stream_set *s) {
  free(s->more);
  *s = (xs_stream_set){.n = 0};
}
