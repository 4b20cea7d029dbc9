/* thread.h: what each thread keeps of the allocator it last used
 * (xs_pairs_thread, types.h; thread.c).
 */
#ifndef XS_ALLOC_THREAD_H
#define XS_ALLOC_THREAD_H

#include "alloc/types.h"

/* The calling thread's count of uses, for pairs' recency (thread.c). */
uint64_t xs_pairs_use(void);
extern __thread xs_pairs_thread xs_pairs_tls;
/* &xs_pairs_tls, for a hot path that reads it more than once: the empty
   asm hides where the address came from, so the compiler keeps it in a
   register rather than recomputing it at each use (a TLS-descriptor
   sequence of three instructions, CMakeLists.txt). */
static inline xs_pairs_thread *xs_pairs_self(void) {
  xs_pairs_thread *t = &xs_pairs_tls;
  __asm__("" : "+r"(t));
  return t;
}

#endif /* XS_ALLOC_THREAD_H */
