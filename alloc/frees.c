/* frees.c: completing every free that still waits.
 *
 * A freed block may wait on other processes that hold it (IPC,
 * ipc_export.c) and then on the work of its recorded streams
 * (deferred.c). ipc_export.c hands a block its holders let go to
 * deferred.c, so the one call that completes both lives here, above the two,
 * and neither calls back into the other.
 */
#include "alloc/deferred.h"
#include "alloc/frees.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"

xseg_status xs_alloc_complete_frees_locked(xseg_allocator *a, bool wait) {
  XS_ASSERT_LOCKED(a);
  /* Blocks other processes held may be free now (no driver call). */
  if (a->ipc_held_frees != 0) xs_ipc_reap_locked(a);
  return xs_alloc_process_pending_locked(a, wait);
}
