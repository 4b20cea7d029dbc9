/* lock.h: the mutex of the layers above (a pair of pools, the statistics'
 * shards), a three-state futex lock (Drepper, "Futexes Are Tricky", mutex
 * 3): 0 free, 1 held, 2 held and maybe waited on. Here, in the lowest
 * layer, because more than one layer above takes it.
 *
 * Why not pthread_mutex_t: its uncontended lock + unlock costs ~55
 * instructions (callgrind), a third of the cached path's whole budget of
 * 150 per malloc+free pair, for features the allocator never uses (robust,
 * recursive, error-checking kinds, elision). Here the uncontended path is
 * one compare-and-swap to take and one atomic decrement to drop; a waiter
 * sleeps in the kernel (FUTEX_WAIT), never spins for long, so two threads
 * on two shared cores do not burn each other's time. C11 atomics with
 * acquire/release order, so ThreadSanitizer sees the happens-before edges.
 */
#ifndef XS_VMM_LOCK_H
#define XS_VMM_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>

typedef struct xs_lock {
  atomic_int state;             /* 0 free, 1 held, 2 held with waiters */
} xs_lock;

#define XS_LOCK_INIT {0}

void xs_lock_wait(xs_lock *l);  /* the contended path of xs_lock_take */
void xs_lock_wake(xs_lock *l);  /* the contended path of xs_lock_drop */

/* Takes the lock if it is free: false (nothing changed) if not. */
static inline bool xs_lock_try(xs_lock *l) {
  int free_ = 0;
  return atomic_compare_exchange_strong_explicit(
      &l->state, &free_, 1, memory_order_acquire, memory_order_relaxed);
}

static inline void xs_lock_take(xs_lock *l) {
  if (!xs_lock_try(l)) xs_lock_wait(l);
}

/* Drops the lock; false when a waiter may sleep on it: the caller must
   then call xs_lock_wake (xs_lock_drop does both). Lets a caller keep the
   call to xs_lock_wake out of its common path. */
static inline bool xs_lock_drop_wake_later(xs_lock *l) {
  return atomic_fetch_sub_explicit(&l->state, 1, memory_order_release) == 1;
}

static inline void xs_lock_drop(xs_lock *l) {
  if (!xs_lock_drop_wake_later(l)) xs_lock_wake(l);
}

#endif /* XS_VMM_LOCK_H */
