/* lock.c: the contended paths of the futex lock (see lock.h). */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vmm/lock.h"

/* A short spin first: the cached path holds the lock for well under a
   microsecond, so a waiter usually gets it without a system call. */
enum { XS_LOCK_SPINS = 100 };

static inline void lock_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void lock_futex(xs_lock *l, int op, int val) {
  syscall(SYS_futex, &l->state, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

void xs_lock_wait(xs_lock *l) {
  for (int i = 0; i < XS_LOCK_SPINS; i++) {
    int free_ = 0;
    if (atomic_load_explicit(&l->state, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_weak_explicit(&l->state, &free_, 1,
                                              memory_order_acquire,
                                              memory_order_relaxed))
      return;
    lock_relax();
  }
  /* Announce a waiter (state 2) and sleep until the state may be 0. */
  while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
    lock_futex(l, FUTEX_WAIT, 2);
}

void xs_lock_wake(xs_lock *l) {
  atomic_store_explicit(&l->state, 0, memory_order_release);
  lock_futex(l, FUTEX_WAKE, 1);
}
