/* enter.h: the way into and out of every operation but the cached path
 * (enter.c). Every entry point that is not the cached malloc or free runs
 * between xs_alloc_enter and xs_alloc_leave, and so sees the allocator
 * whole: every lock held, every parked block settled, the pairs in
 * recency order; and leaves it with the slow flag and the range table
 * current, checked whole every XSEG_DEBUG_CHECK operations in debug
 * builds.
 */
#ifndef XS_ALLOC_ENTER_H
#define XS_ALLOC_ENTER_H

#include "alloc/types.h"
#include "vmm/lock.h"

/* Every lock (xs_pairs_lock_all); then every parked block settles, so
   that every pool keeps block.h's rules, and the pair list is put in
   recency order. */
void xs_alloc_enter(xseg_allocator *a);
/* Publishes what changed (slow flag, range table) and drops every lock;
   debug builds check the whole allocator first when it is due. */
void xs_alloc_leave(xseg_allocator *a);
/* xseg_destroy's leave: frees every pair (their pools destroyed), every
   table, and drops the allocator's lock. */
void xs_alloc_leave_destroyed(xseg_allocator *a);

/* Debug builds: the cached path's share of XSEG_DEBUG_CHECK, after its
   pair lock is dropped. */
#ifndef NDEBUG
void xs_alloc_debug_after_cached(xseg_allocator *a);
#else
static inline void xs_alloc_debug_after_cached(xseg_allocator *a) {
  (void)a;
}
#endif
/* A cached operation dropped its pair lock (xs_pair_drop_wake_later) with
   a waiter on it: wakes it, then as xs_alloc_debug_after_cached. Out of
   line and cold, but a copy in each file that calls it (alloc.c, free.c):
   a call to a local function clobbers only the registers it uses (GCC's
   -fipa-ra), where an external one clobbers every caller-saved register,
   which costs the cached paths 4 instructions a pair. */
static __attribute__((noinline, cold, unused)) xseg_status
xs_alloc_wake_after_cached(xseg_allocator *a, xs_pair *pair) {
  xs_lock_wake(&pair->lock);
  xs_alloc_debug_after_cached(a);
  return XSEG_OK;
}

#endif /* XS_ALLOC_ENTER_H */
