/* grow.h: the slow path of malloc (grow.c).
 */
#ifndef XS_ALLOC_GROW_H
#define XS_ALLOC_GROW_H

#include "alloc/types.h"

/* The slow path of malloc (grow.c): a free block of at least `rounded`
   bytes for a request on `stream` from *p, which an unannounced capture
   detected here turns into a private pool's (`detect`: the request goes
   where its stream sends it; false when its caller chose the pools,
   xseg_malloc_from_pool); growth and the out-of-memory path. Enters the
   device's context itself. */
xseg_status xs_alloc_grow_locked(xseg_allocator *a, xs_pool **p,
                                 struct CUstream_st *stream, size_t rounded,
                                 size_t requested, bool detect,
                                 xs_block **out);

#endif /* XS_ALLOC_GROW_H */
