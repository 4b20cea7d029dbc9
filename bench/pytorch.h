/* pytorch.h: PyTorch's CUDACachingAllocator with expandable_segments:True,
 * replayed as a bench policy ("pytorch-expandable").
 *
 * Written from c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x): its
 * ExpandableSegment is pytorch_segment.c, the part of DeviceCachingAllocator
 * that serves an expandable pool is policy_pytorch.c. Both go through vmm's
 * driver table, so the policy runs on the emulator and on a real driver.
 */
#ifndef XB_PYTORCH_H
#define XB_PYTORCH_H

#include "bench.h"

/* PyTorch's constants (kMinBlockSize, kSmallSize, kSmallBuffer,
   kLargeBuffer). */
enum {
  XB_PT_MIN_BLOCK = 512,
  XB_PT_SMALL_SIZE = 1 << 20,       /* largest request of the small pool */
  XB_PT_SMALL_PAGE = 2 << 20,       /* the small pool's page */
  XB_PT_LARGE_PAGE = 20 << 20       /* the large pool's page */
};

/* One ExpandableSegment: a reserved range of 9/8 of the device's memory,
   rounded up to whole pages, mapped page by page, each page its own
   physical handle. Invariant: handles[i] is meaningful exactly where
   present[i]; a page is present from its map until its unmap. */
typedef struct xb_pt_segment {
  struct xb_pt_segment *next;       /* the policy's list of live segments */
  xs_vmm *v;
  CUstream stream;                  /* synchronised before each unmap */
  uint64_t base, page;
  size_t n_pages;
  uint64_t *handles;
  bool *present;
} xb_pt_segment;

/* Reserves page * ceil((total + total / 8) / page) bytes: one
   cuMemAddressReserve. */
xseg_status xb_pt_segment_create(xs_vmm *v, CUstream stream, uint64_t page,
                                 uint64_t total_memory, xb_pt_segment **out);
/* Maps the pages covering [addr, addr + size), addr page-aligned and none
   of them mapped: one cuMemCreate and one cuMemMap per page, then one
   cuMemSetAccess for the run. *mapped gets the bytes mapped. When a
   cuMemCreate runs out of memory the handles already created are released
   and XSEG_ERR_OUT_OF_MEMORY returned with nothing mapped. */
xseg_status xb_pt_segment_map(xb_pt_segment *s, uint64_t addr, uint64_t size,
                              uint64_t *mapped);
/* The whole pages inside [addr, addr + size): *inner_addr and *inner_size
   (0: none). */
void xb_pt_segment_inner(const xb_pt_segment *s, uint64_t addr,
                         uint64_t size, uint64_t *inner_addr,
                         uint64_t *inner_size);
/* Unmaps the mapped pages [addr, addr + size), page-aligned and not empty:
   a cuStreamSynchronize of the segment's stream first (PyTorch's:
   cuMemUnmap does not wait for the device), then per page cuMemUnmap and
   cuMemRelease. */
xseg_status xb_pt_segment_unmap(xb_pt_segment *s, uint64_t addr,
                                uint64_t size);
/* Unmaps what is mapped (with the stream synchronised first) and frees the
   range (cuMemAddressFree). */
void xb_pt_segment_destroy(xb_pt_segment *s);

#endif /* XB_PYTORCH_H */
