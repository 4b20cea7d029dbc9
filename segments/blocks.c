/* blocks.c: the block struct cache (see xs_blocks in block.h).
 *
 * Splitting and merging happen on every cached malloc and free; taking the
 * struct from a free list instead of malloc keeps that path free of heap
 * calls. Slabs of XS_BLOCKS_PER_SLAB structs are never returned before
 * xs_blocks_destroy, so a burst of splits costs memory until the allocator
 * goes away — a few hundred bytes per block at its peak count.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "segments/block.h"

enum { XS_BLOCKS_PER_SLAB = 255 };

typedef struct blocks_slab {
  struct blocks_slab *next;
  xs_block block[XS_BLOCKS_PER_SLAB];
} blocks_slab;

bool xs_blocks_refill(xs_blocks *c) {
  blocks_slab *s = xs_lines_alloc(sizeof *s);
  if (s == NULL) return false;
  s->next = c->slabs;
  c->slabs = s;
  for (int i = XS_BLOCKS_PER_SLAB - 1; i >= 0; i--) {
    s->block[i].next = c->free_list;
    c->free_list = &s->block[i];
  }
  return true;
}

void xs_blocks_destroy(xs_blocks *c) {
  blocks_slab *s = c->slabs;
  while (s != NULL) {
    blocks_slab *next = s->next;
    free(s);
    s = next;
  }
  memset(c, 0, sizeof *c);
}
