/* array.h: room in the small arrays that grow by doubling.
 *
 * Handles awaiting release, aliases, pending queues, captures, deferred
 * frees, exports, idle events: each is a (pointer, count, capacity) triple
 * that doubles when full. One rule for all of them, kept here once: on host
 * OOM nothing changes (the old array, its items and its capacity stay the
 * caller's), so a failed growth loses nothing and the caller reports it.
 * (uthash's utarray would do the doubling, but it exits or drops the array
 * on OOM, which a library must not.)
 */
#ifndef XS_VMM_ARRAY_H
#define XS_VMM_ARRAY_H

#include <stdbool.h>
#include <stddef.h>

/* Grows the array whose pointer is at `items_at` (the address of a T *) to
   hold at least `need` items of `item_size` bytes: its capacity *cap
   doubles (from `first` when 0) until it does. False, nothing changed, on
   host OOM or a size that overflows. */
bool xs_array_grow(void *items_at, size_t *cap, size_t need, size_t item_size,
                   size_t first);

/* Room for `need` items in array `items` (a T * lvalue) of capacity `cap`
   (a size_t lvalue): true at once when there is, else xs_array_grow. */
#define XS_ARRAY_RESERVE(items, cap, need, first)                            \
  ((need) <= (cap) ||                                                        \
   xs_array_grow(&(items), &(cap), (need), sizeof *(items), (first)))

#endif /* XS_VMM_ARRAY_H */
