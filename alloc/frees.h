/* frees.h: the completion of every free that waits (frees.c): first those
 * other processes let go of (ipc_export.c), then those behind events
 * (deferred.c).
 */
#ifndef XS_ALLOC_FREES_H
#define XS_ALLOC_FREES_H

#include "alloc/types.h"

/* Every free that waits: blocks other processes let go of (IPC) go
   pending, then xs_alloc_process_pending_locked; `wait` blocks on their
   events. */
xseg_status xs_alloc_complete_frees_locked(xseg_allocator *a, bool wait);

#endif /* XS_ALLOC_FREES_H */
