/* check.h: the walk of every rule of the allocator (check.c), for
 * xseg_check and the debug builds' XSEG_DEBUG_CHECK.
 */
#ifndef XS_ALLOC_CHECK_H
#define XS_ALLOC_CHECK_H

#include "alloc/types.h"


#ifndef NDEBUG
/* Runs xseg_check's walk, every lock held; prints the broken rule and
   aborts (check.c). */
void xs_alloc_debug_check_locked(xseg_allocator *a);
#endif
/* xseg_check's walk, every lock held: XSEG_OK, or the first broken rule
   as XSEG_ERR_INVALID_ARGUMENT with its message (check.c). */
xseg_status xs_alloc_check_locked(xseg_allocator *a);

#endif /* XS_ALLOC_CHECK_H */
