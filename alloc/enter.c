/* enter.c: the one way into and out of every slow operation (enter.h):
 * lock everything, settle, put the pairs in recency order; on the way
 * out, check (debug builds), publish the slow flag, refresh the range
 * table, unlock. Above the pairs (pairs.c: the locks themselves), the
 * range table (ranges.c) and the check (check.c), below every room with
 * an entry point.
 */
#include <stdatomic.h>

#include "alloc/capture_mode.h"
#include "alloc/check.h"
#include "alloc/enter.h"
#include "alloc/pairs.h"
#include "alloc/park.h"
#include "alloc/ranges.h"

void xs_alloc_enter(xseg_allocator *a) {
  xs_pairs_lock_all(a);
  xs_pairs_settle_all_locked(a);
  xs_pairs_sort_by_use_locked(a);
}

/* Whether the cached path must go the slow way (pairs.h): frees made
   during a capture still to record, captures, shared blocks, tracing. */
static bool enter_slow(const xseg_allocator *a) {
  return a->n_deferred != 0 || xs_alloc_capturing(a) || a->ipc != NULL ||
         a->trace.cap != 0;
}

/* Every lock held, dropped here: the way out without the debug builds'
   check. */
static void enter_leave(xseg_allocator *a) {
  atomic_store_explicit(&a->slow, enter_slow(a), memory_order_relaxed);
  xs_ranges_refresh_locked(a);
  xs_pairs_unlock_all(a);
}

#ifndef NDEBUG
/* Whether this operation is one that XSEG_DEBUG_CHECK validates after. */
static bool enter_debug_due(xseg_allocator *a) {
  if (a->debug_check_every == 0) return false;
  unsigned ops = atomic_fetch_add_explicit(&a->debug_ops, 1,
                                           memory_order_relaxed) + 1;
  return ops % a->debug_check_every == 0;
}

static void enter_debug_check_locked(xseg_allocator *a) {
  xs_pairs_settle_all_locked(a);
  xs_alloc_debug_check_locked(a);
}

void xs_alloc_debug_after_cached(xseg_allocator *a) {
  if (!enter_debug_due(a)) return;
  xs_alloc_enter(a);
  enter_debug_check_locked(a);
  enter_leave(a);
}
#endif

void xs_alloc_leave(xseg_allocator *a) {
#ifndef NDEBUG
  if (enter_debug_due(a)) enter_debug_check_locked(a);
#endif
  enter_leave(a);
}

void xs_alloc_leave_destroyed(xseg_allocator *a) {
  xs_ranges_destroy(a);
  xs_pairs_unlock_destroyed(a);
}
