/* freetree.h: the best-fit index of free blocks.
 *
 * A red-black tree (BSD sys/tree.h) ordered by (size, address): the lower
 * bound of (size, 0) is the smallest block that fits, the lowest address
 * among equals, found in O(log n). Insert and remove are O(log n).
 */
#ifndef XS_SEGMENTS_FREETREE_H
#define XS_SEGMENTS_FREETREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "segments/block.h"

RB_HEAD(xs_freetree_rb, xs_block);

typedef struct xs_freetree {
  struct xs_freetree_rb root;
  size_t count;                 /* blocks in the tree */
  size_t bytes;                 /* sum of their sizes */
} xs_freetree;

void xs_freetree_init(xs_freetree *t);
/* b must not be in any tree; its size and address must not change while it
   is in this one, except through xs_freetree_replace. */
void xs_freetree_insert(xs_freetree *t, xs_block *b);
void xs_freetree_remove(xs_freetree *t, xs_block *b);
/* Whether a block keyed (size, addr) would sit exactly where b sits in the
   order (b's neighbours bracket the key), so that it may take b's node. */
bool xs_freetree_fits_at(xs_freetree *t, xs_block *b, size_t size,
                         uint64_t addr);
/* `repl` takes the node of `old` (a block in t, whose size was old_size
   when it went in) without rebalancing: the cached path splits the front
   off a free block, and in the usual case the piece left over sorts where
   the block was.
   xs_freetree_fits_at must have said so; repl may be old itself, resized.
   O(1). */
void xs_freetree_replace(xs_freetree *t, xs_block *old, size_t old_size,
                         xs_block *repl);
/* The smallest block of at least `size` bytes (lowest address among equal
   sizes), or NULL: RB_NFIND of (size, 0), written out inline because every
   cached malloc starts here. */
static inline xs_block *xs_freetree_best_fit(xs_freetree *t, size_t size) {
  xs_block *b = RB_ROOT(&t->root), *fit = NULL;
  while (b != NULL) {
    if (b->size >= size) {
      fit = b;                  /* (size, 0) <= b: b fits; look lower */
      b = RB_LEFT(b, link);
    } else {
      b = RB_RIGHT(b, link);
    }
  }
  return fit;
}
/* Largest first, then each next smaller (for reclaiming whole granules). */
xs_block *xs_freetree_largest(xs_freetree *t);
xs_block *xs_freetree_smaller(xs_freetree *t, xs_block *b);
/* The next block up the order (the next fit after b), or NULL. */
xs_block *xs_freetree_larger(xs_freetree *t, xs_block *b);
/* Whether a block keyed (size, addr) sorts before b. */
static inline bool xs_freetree_before(size_t size, uint64_t addr,
                                      const xs_block *b) {
  return size < b->size || (size == b->size && addr < b->addr);
}
/* Order, count and bytes agree with a walk; `msg` gets the first problem. */
bool xs_freetree_is_valid(xs_freetree *t, char *msg, size_t msg_size);

#endif /* XS_SEGMENTS_FREETREE_H */
