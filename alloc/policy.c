/* policy.c: PyTorch's caching-allocator rules (CUDACachingAllocator.cpp):
 * how large a classic segment is. Which pool a request goes to, which free
 * block it may take and when the block is split are asked on every cached
 * malloc, so they are inline in policy.h.
 */
#include "alloc/policy.h"
#include "alloc/types.h"

/* kMinLargeAlloc / kRoundLarge of PyTorch (its kLargeBuffer is the default
   of large_segment_size_mb, config.c). */
#define XS_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define XS_ROUND_LARGE ((size_t)2 << 20)

/* get_allocation_size: 2 MiB segments for the small pool,
   large_segment_size_mb (20 MiB unless set) for requests under 10 MiB,
   else the request rounded up to 2 MiB; and a multiple of the device's
   granularity. */
size_t xs_alloc_classic_size(const xseg_allocator *a, size_t rounded) {
  size_t size;
  if (rounded <= XS_SMALL_SIZE)
    size = XS_ROUND_LARGE;
  else if (rounded < XS_MIN_LARGE_ALLOC)
    size = a->cfg.large_segment_size;
  else
    size = (rounded + XS_ROUND_LARGE - 1) / XS_ROUND_LARGE * XS_ROUND_LARGE;
  size_t g = a->vmm.granularity;
  return (size + g - 1) / g * g;
}
