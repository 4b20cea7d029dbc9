/* freetree.h: the best-fit index of free blocks.
 *
 * The order is (size, address): the best fit for a request is the smallest
 * block that holds it, the lowest address among equal sizes. Two structures
 * share that order, split at XS_FREETREE_BIN_MAX (1 MiB, the largest
 * request the small pool serves):
 *
 *   bins  2048 of them, one per size from 512 B to 1 MiB in 512-byte steps
 *         (block sizes are multiples of 512, so a bin holds one size
 *         exactly). Each keeps its blocks in a red-black tree keyed by
 *         address (BSD sys/tree.h) and caches its lowest block.
 *   tree  a red-black tree ordered by (size, address) of every block above
 *         1 MiB.
 *
 * A two-level bitmap says which bins hold blocks:
 *
 *   bin_words               bit w set <=> bin_bits[w] != 0   (32 words)
 *   bin_bits[w]             bit j set <=> bins[64 * w + j] holds a block
 *   bins[i].lowest          its lowest address: the best fit of its size
 *
 * Bin i sorts before bin i + 1 and every bin before the tree, so the whole
 * order is the bins' in index order, each by address, then the tree's.
 * A request of at most 1 MiB takes the lowest block of the first non-empty
 * bin at or above its size: a bit scan in its own word, else one in
 * bin_words and one in the word it names, then one pointer; O(1). When no
 * bin has one it takes the tree's smallest block, also cached. A larger
 * request takes the tree's lower bound, O(log n), as before the bins.
 *
 * How a bin keeps address order: a by-address red-black tree, because a
 * bin gives up its lowest block first (the cached path's exact fits) yet
 * frees and merges insert and remove anywhere in it, and the walks below
 * must see it in order. An insert or remove is O(log k) for the k blocks
 * of that one size, with a one-word compare, where the single tree paid
 * O(log n) over every free block of the pool with a two-word compare. A
 * list sorted by address would make an insert O(k), and the many small
 * holes of a long random churn share a handful of bins. Measured with
 * bench/callgrind.sh random 10000 (bench/README.md, "The cached path and
 * threads"): the index's share of a malloc+free pair went from ~295 to
 * ~183 instructions (insert 148 -> 89, best fit 75 -> 25, remove 72 -> 70:
 * a red-black removal's rebalancing does not shrink with the tree).
 *
 * Memory: the bins are 32 KiB of host memory, kept by the caller and
 * given at xs_freetree_init; an index given none keeps every block in the
 * tree (the same order, at the tree's cost). Only the small pool's index
 * of free mapped blocks has bins (alloc/pairs.c): a large pool serves
 * requests above 1 MiB, and unmapped blocks are whole granules.
 */
#ifndef XS_SEGMENTS_FREETREE_H
#define XS_SEGMENTS_FREETREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "segments/block.h"

/* Block sizes are multiples of the step, so bin i holds blocks of exactly
   (i + 1) * XS_FREETREE_BIN_STEP bytes. */
#define XS_FREETREE_BIN_STEP ((size_t)512)
#define XS_FREETREE_BINS ((size_t)2048)
#define XS_FREETREE_BIN_MAX (XS_FREETREE_BINS * XS_FREETREE_BIN_STEP)
#define XS_FREETREE_BIN_WORDS (XS_FREETREE_BINS / 64)

RB_HEAD(xs_freetree_rb, xs_block);
RB_HEAD(xs_freebin_rb, xs_block);

/* One size's free blocks. Invariant: lowest is the tree's minimum, NULL
   exactly when the tree is empty, and then the bin's bitmap bit is clear. */
typedef struct xs_freebin {
  struct xs_freebin_rb root;    /* by address */
  xs_block *lowest;             /* its best fit */
} xs_freebin;

typedef struct xs_freetree {
  struct xs_freetree_rb root;   /* blocks above XS_FREETREE_BIN_MAX */
  xs_block *tree_min;           /* the tree's first block: the fit of a
                                   small request no bin holds (the
                                   repeated-size path's usual case) */
  size_t count;                 /* blocks in the index (bins and tree) */
  size_t bytes;                 /* sum of their sizes */
  uint64_t bin_words;           /* bit w: bin_bits[w] != 0 */
  uint64_t bin_bits[XS_FREETREE_BIN_WORDS];  /* bit i % 64 of word i / 64:
                                                bins[i] is not empty */
  xs_freebin *bins;             /* XS_FREETREE_BINS of them, or NULL */
  size_t bin_limit;             /* XS_FREETREE_BIN_MAX with bins, else 0:
                                   the largest size a bin holds */
} xs_freetree;

_Static_assert(XS_FREETREE_BIN_WORDS <= 64, "one word summarises the bins");

/* An empty index. `bins`: XS_FREETREE_BINS bins the caller keeps for as
   long as the index (cleared here), or NULL: no bins, every block in the
   tree. */
void xs_freetree_init(xs_freetree *t, xs_freebin *bins);
/* b must not be in any tree; its size and address must not change while it
   is in this one, except through xs_freetree_replace. */
void xs_freetree_insert(xs_freetree *t, xs_block *b);
void xs_freetree_remove(xs_freetree *t, xs_block *b);
/* Whether a block keyed (size, addr) would sit exactly where b sits in the
   order (b's neighbours bracket the key) and in the same structure (b's
   bin, or the tree), so that it may take b's node. A block in a bin never
   changes size in place: its bin holds one size. */
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

/* The bin of a block of `size` bytes (a multiple of the step, at most
   XS_FREETREE_BIN_MAX), or of the smallest such block that holds a
   request of `size` bytes (any size up to XS_FREETREE_BIN_MAX; 0 asks for
   any block). */
static inline size_t xs_freetree_bin_of(size_t size) {
  return size == 0 ? 0 : (size - 1) / XS_FREETREE_BIN_STEP;
}

/* The smallest block of at least `size` bytes (lowest address among equal
   sizes), or NULL. Inline because every cached malloc starts here. */
static inline xs_block *xs_freetree_best_fit(xs_freetree *t, size_t size) {
  /* The constant bound tells the compiler what bin_limit's does. */
  if (size <= XS_FREETREE_BIN_MAX && size <= t->bin_limit) {
    /* No bin holds a block: small requests served from a large block (a
       repeated size at the front of the mapped range) stop here. (An
       index without bins comes here for size 0 alone: its tree_min, the
       smallest block of all, is that fit.) */
    if (t->bin_words == 0) return t->tree_min;
    size_t i = xs_freetree_bin_of(size), w = i / 64;
    uint64_t bits = t->bin_bits[w] & (~(uint64_t)0 << (i % 64));
    if (bits == 0) {
      uint64_t words = t->bin_words & (~(uint64_t)1 << w);  /* above w */
      if (words == 0) return t->tree_min;
      w = (size_t)__builtin_ctzll(words);
      bits = t->bin_bits[w];
    }
    return t->bins[w * 64 + (size_t)__builtin_ctzll(bits)].lowest;
  }
  /* RB_NFIND of (size, 0), written out. */
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
/* Bins, bitmap, tree, order, count and bytes agree with a walk; `msg` gets
   the first problem. */
bool xs_freetree_is_valid(xs_freetree *t, char *msg, size_t msg_size);

#endif /* XS_SEGMENTS_FREETREE_H */
