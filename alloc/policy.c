/* policy.c: PyTorch's caching-allocator rules (CUDACachingAllocator.cpp):
 * which pool a request goes to, which free block it may take, when the
 * block is split, and how large a classic segment is.
 */
#include <assert.h>

#include "alloc/allocator.h"
#include "segments/freetree.h"

/* kLargeBuffer / kMinLargeAlloc / kRoundLarge of PyTorch. */
#define XS_LARGE_BUFFER ((size_t)20 << 20)
#define XS_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define XS_ROUND_LARGE ((size_t)2 << 20)

xs_pool_kind xs_alloc_kind(size_t rounded) {
  return rounded <= XS_SMALL_SIZE ? XS_POOL_SMALL : XS_POOL_LARGE;
}

/* get_free_block: the best fit, unless it is an oversize block (at least
   max_split_size, never split) that a smaller request must not take, or
   far too large for an oversize request. */
xs_block *xs_alloc_find_free(const xseg_allocator *a, xs_pool *p,
                             size_t rounded) {
  xs_block *b = xs_freetree_best_fit(&p->free, rounded);
  if (b == NULL) return NULL;
  size_t max_split = a->cfg.max_split_size;
  if (rounded < max_split && b->size >= max_split) return NULL;
  if (rounded >= max_split &&
      b->size - rounded >= a->cfg.max_non_split_rounding)
    return NULL;
  return b;
}

/* should_split: expandable segments split off any remainder of at least
   512 bytes (every byte of a segment is reachable, so slivers cost
   nothing); classic large blocks only when the request is below
   max_split_size and more than 1 MiB would remain. */
bool xs_alloc_should_split(const xseg_allocator *a, const xs_pool *p,
                           const xs_block *b, size_t rounded) {
  assert(b->size >= rounded);
  size_t remaining = b->size - rounded;
  if (p->kind == XS_POOL_SMALL || a->cfg.expandable_segments)
    return remaining >= XS_MIN_BLOCK;
  return rounded < a->cfg.max_split_size && remaining > XS_SMALL_SIZE;
}

/* get_allocation_size: 2 MiB segments for the small pool, 20 MiB for
   requests under 10 MiB, else the request rounded up to 2 MiB; and a
   multiple of the device's granularity. */
size_t xs_alloc_classic_size(const xseg_allocator *a, size_t rounded) {
  size_t size;
  if (rounded <= XS_SMALL_SIZE)
    size = XS_ROUND_LARGE;
  else if (rounded < XS_MIN_LARGE_ALLOC)
    size = XS_LARGE_BUFFER;
  else
    size = (rounded + XS_ROUND_LARGE - 1) / XS_ROUND_LARGE * XS_ROUND_LARGE;
  size_t g = a->vmm.granularity;
  return (size + g - 1) / g * g;
}
