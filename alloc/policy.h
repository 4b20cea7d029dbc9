/* policy.h: PyTorch's pool choice, fit and split rules (policy.c).
 */
#ifndef XS_ALLOC_POLICY_H
#define XS_ALLOC_POLICY_H

#include <assert.h>

#include "alloc/types.h"

/* Policy: PyTorch's pool choice, fit and split rules, inline because
   every cached malloc asks them (the classic segment size is in
   policy.c). */
static inline xs_pool_kind xs_alloc_kind(size_t rounded) {
  return rounded <= XS_SMALL_SIZE ? XS_POOL_SMALL : XS_POOL_LARGE;
}

/* get_free_block's rule: a best fit of `size` bytes (>= rounded) is
   taken, unless it is an oversize block (at least max_split_size, never
   split) that a smaller request must not take, or far too large for an
   oversize request. PyTorch tests the request first; the block first is
   the same rule (the request is no larger than the block), and its usual
   answer in one compare: max_split_size is at least 20 MiB, so every
   block of the small pool's bins is under it. */
static inline bool xs_alloc_fit_takes(const xseg_allocator *a, size_t size,
                                      size_t rounded) {
  assert(size >= rounded && "a fit holds the request");
  size_t max_split = a->cfg.max_split_size;
  if (size < max_split) return true;
  return rounded >= max_split &&
         size - rounded < a->cfg.max_non_split_rounding;
}

/* Pair lock held: get_free_block, the best fit if xs_alloc_fit_takes
   it. */
static inline xs_block *xs_alloc_find_free(const xseg_allocator *a,
                                           xs_pool *p, size_t rounded) {
  xs_block *b = xs_freetree_best_fit(&p->free, rounded);
  return b != NULL && xs_alloc_fit_takes(a, b->size, rounded) ? b : NULL;
}

/* should_split, for a block of `size` bytes in a pool of `kind`:
   expandable segments split off any remainder of at least 512 bytes
   (every byte of a segment is reachable, so slivers cost nothing);
   classic large blocks only when the request is below max_split_size and
   more than 1 MiB would remain. */
static inline bool xs_alloc_splits(const xseg_allocator *a, xs_pool_kind kind,
                                   size_t size, size_t rounded) {
  assert(size >= rounded);
  size_t remaining = size - rounded;
  if (kind == XS_POOL_SMALL || a->cfg.expandable_segments)
    return remaining >= XS_MIN_BLOCK;
  return rounded < a->cfg.max_split_size && remaining > XS_SMALL_SIZE;
}

static inline bool xs_alloc_should_split(const xseg_allocator *a,
                                         const xs_pool *p, const xs_block *b,
                                         size_t rounded) {
  return xs_alloc_splits(a, p->kind, b->size, rounded);
}

size_t xs_alloc_classic_size(const xseg_allocator *a, size_t rounded);

/* The most xseg may have mapped: the cap, or more while a cap lowered
   under what was mapped (xseg_set_memory_fraction) has not been reached
   again. The fraction limits growth only: nothing is unmapped for it, and
   memory that merely moves may stay above it. */
static inline size_t xs_alloc_mapped_most(const xseg_allocator *a) {
  return a->cap_over > a->cap ? a->cap_over : a->cap;
}

#endif /* XS_ALLOC_POLICY_H */
