/* pytorch_blocks.h: the blocks, pools and state of the pytorch-expandable
 * policy (internal to it): policy_pytorch.c runs PyTorch's malloc and free
 * over them, pytorch_check.c checks their invariants.
 */
#ifndef XB_PYTORCH_BLOCKS_H
#define XB_PYTORCH_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>
#include <bsd/sys/tree.h>

#include "alloc/config.h"
#include "pytorch.h"

/* A Block: a run of one segment, allocated, free and mapped (in its pool's
   `blocks`), or unmapped (in its pool's `unmapped`). Invariants: the
   blocks of a segment tile its range in address order through prev/next;
   no two neighbours are both unallocated with the same mapped state;
   unmapped blocks cover whole pages. */
typedef struct pt_block {
  RB_ENTRY(pt_block) link;          /* in blocks or unmapped, never both */
  struct pt_block *prev, *next;
  xb_pt_segment *seg;
  struct pt_pool *pool;
  uint64_t ptr, size;
  bool allocated, mapped;
} pt_block;

static inline int pt_by_size_cmp(const pt_block *a, const pt_block *b) {
  if (a->size != b->size) return a->size < b->size ? -1 : 1;
  return (a->ptr > b->ptr) - (a->ptr < b->ptr);
}

static inline int pt_by_addr_cmp(const pt_block *a, const pt_block *b) {
  return (a->ptr > b->ptr) - (a->ptr < b->ptr);
}

RB_HEAD(pt_by_size, pt_block);
RB_HEAD(pt_by_addr, pt_block);
RB_PROTOTYPE(pt_by_size, pt_block, link, pt_by_size_cmp)
RB_PROTOTYPE(pt_by_addr, pt_block, link, pt_by_addr_cmp)

/* One stream's small or large BlockPool. */
typedef struct pt_pool {
  CUstream stream;
  bool small;
  struct pt_by_size blocks;         /* free and mapped, by (size, address) */
  struct pt_by_addr unmapped;       /* by address */
} pt_pool;

typedef struct xb_pytorch {
  xs_vmm *v;
  CUcontext saved;                  /* the caller's context, for close */
  uint64_t total_memory;            /* cuDeviceTotalMem at open */
  pt_pool pools[2 * XB_MAX_STREAMS];
  size_t n_pools;
  xb_pt_segment *segments;          /* every live ExpandableSegment */
  pt_block **slot;                  /* per slot, while allocated */
  uint32_t n_slots;
  uint64_t mapped, window_peak;
  xs_config cfg;                    /* --conf: roundup_power2_divisions */
} xb_pytorch;

/* The policy's check (xb_policy.check): every segment of every pool
   against the invariants at pt_block, and the mapped bytes against the
   pages. */
bool xb_pt_check(void *self, xb_error *err);

#endif /* XB_PYTORCH_BLOCKS_H */
