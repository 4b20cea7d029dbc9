/* ranges.h: the range table, from an address to the pair that reserved
 * it, for the cached free without a lock (ranges.c).
 */
#ifndef XS_ALLOC_RANGES_H
#define XS_ALLOC_RANGES_H

#include "alloc/types.h"
#include "alloc/pairs.h"
#include "alloc/thread.h"

/* The range table's search for xs_ranges_find (ranges.c). */
xs_pair *xs_ranges_search(xseg_allocator *a, uint64_t addr);
/* The pair whose reserved range holds addr, per the range table, or NULL
   (also while it is being rewritten; see alloc/ranges.c): the range of
   the thread's last free when the table has not changed since, else a
   search. No lock needed. */
static inline xs_pair *xs_ranges_last(xseg_allocator *a,
                                      uint64_t addr);
static inline xs_pair *xs_ranges_find(xseg_allocator *a,
                                      uint64_t addr) {
  xs_pair *pair = xs_ranges_last(a, addr);
  return __builtin_expect(pair != NULL, 1) ? pair : xs_ranges_search(a, addr);
}
/* The thread's last range's pair if it holds addr and the table has not
   changed since, else NULL (no search, no call). */
static inline xs_pair *xs_ranges_last(xseg_allocator *a,
                                      uint64_t addr) {
  xs_pairs_thread *t = &xs_pairs_tls;
  unsigned seq = atomic_load_explicit(&a->ranges_seq, memory_order_acquire);
  if (__builtin_expect(seq == t->range_seq && t->range_id == a->id &&
                           addr - t->range_base < t->range_size, 1))
    return t->range_pair;
  return NULL;
}
/* Makes a new range table (ranges.c). A host OOM keeps the old one: the
   cached free of a block it lacks goes the slow way. */
void xs_ranges_remake_locked(xseg_allocator *a);
/* A new range table when segments were added since the last: every
   segment is a reservation of its own (segments/pool.c), so a table made
   at the current count of reservations lacks none. (IPC's mappings
   reserve too: a remake they cause costs nothing else.) Inline: every
   slow operation asks. */
static inline void xs_ranges_refresh_locked(xseg_allocator *a) {
  XS_ASSERT_LOCKED(a);
  if (__builtin_expect(a->vmm.reserves != a->ranges_made_at, 0))
    xs_ranges_remake_locked(a);
}
/* Frees every table (xseg_destroy). */
void xs_ranges_destroy(xseg_allocator *a);

#endif /* XS_ALLOC_RANGES_H */
