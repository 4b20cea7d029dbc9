/* freetree.h: the best-fit index of free blocks.
 *
 * The best fit for a request is the smallest block that holds it. Among
 * blocks of equal size, two tie-breaks, one per structure, split at
 * XS_FREETREE_BIN_MAX (1 MiB, the largest request the small pool serves):
 *
 *   bins     2048 of them, one per size from 512 B to 1 MiB in 512-byte
 *            steps (block sizes are multiples of 512, so a bin holds one
 *            size exactly). Each is a list, the block indexed last first
 *            (LIFO).
 *   classes  the sizes above the bins in segregated classes, as TLSF's:
 *            16 per power of two (the class of a size is its top five
 *            bits; every size under 8 KiB a class of its own, every size
 *            from 2 TiB up one class). Each is a red-black tree ordered by
 *            (size, address), its first block cached: among equal sizes
 *            the lowest address first, as PyTorch's BlockPool.
 *
 * Bins and classes are slots in one order: slot i < 2048 is bin i, slot
 * 2048 + c is class c. Each slot holds sizes all below the next one's, so
 * the whole order is the slots' in index order, a bin newest first, a
 * class in its tree's order. A two-level bitmap says which slots hold
 * blocks:
 *
 *   words               bit w set <=> bits[w] != 0   (40 words)
 *   bits[w]             bit j set <=> slot 64 * w + j holds a block
 *
 * A request takes the first block of the first non-empty slot after its
 * own (a bit scan in its word, else one in `words` and one in the word it
 * names, then one pointer), or a block of its own slot: a bin's newest
 * (any block there holds it), a class's first when that holds it, else
 * the class tree's lower bound of the request. O(1) but for that lower
 * bound, a descent of a tree of one class's blocks alone.
 *
 * Why classes and not one tree of every block above 1 MiB: an insert and
 * a remove in a tree of n blocks cost a descent of log n steps and a
 * rebalancing each; a class holds the few free blocks of 1/16 of a power
 * of two, so its tree is shallow, and the first block of the next class
 * is one pointer. Measured with bench/callgrind.sh mixed 10000
 * (bench/README.md, "The mixed case: size classes above the bins"): the
 * trees' own work 36 -> 14 instructions per pair, the pair 626 -> 621
 * (the class of a size is computed at each insert and remove).
 *
 * Why a bin is LIFO and not by address: frees and merges insert and remove
 * anywhere in a bin, many times per malloc+free pair under random sizes,
 * and a list does either in O(1) with a few stores, where a by-address
 * red-black tree paid a rebalancing each way. Measured with
 * bench/callgrind.sh random 10000 (bench/README.md, "The cached path and
 * threads"): 702 -> 597 instructions per pair (insert 89 -> 21, remove
 * 69 -> 34, including the bitmap). Which of two free blocks of the same
 * size under 1 MiB is reused first was measured too: every bundled
 * trace's numbers (fragmentation, reserved bytes, driver calls, with and
 * without lag, in all three modes) are the same as with address order, and
 * varbatch in classic mode reserves 2-4 MiB less (bench/README.md). The
 * newest block of a size is also the one a stream's most recent work
 * touched last, as in the exact-size caches of host allocators. Large
 * blocks keep address order: placement there decides how segments grow.
 *
 * Memory: the bins are 32 KiB of host memory, kept by the caller and
 * given at xs_freetree_init; an index given none keeps every block in a
 * class (address order at every size; the classes under 1 MiB are used
 * there alone). Only the small pool's index of free mapped blocks has
 * bins (alloc/pairs.c): a large pool serves requests above 1 MiB, and
 * unmapped blocks are whole granules. The classes are in the index, 16
 * bytes each (7.3 KiB).
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
/* Classes: a size of u steps with top bit l (u < 2^XS_FREETREE_CLASS_TOP)
   is in class ((l - SUB + 1) << SUB) + the SUB bits below its top bit (u
   itself while l < SUB); every larger size is in the last class. */
#define XS_FREETREE_CLASS_SUB 4u
#define XS_FREETREE_CLASS_TOP 32u
#define XS_FREETREE_CLASSES                                                  \
  ((((size_t)XS_FREETREE_CLASS_TOP - XS_FREETREE_CLASS_SUB + 1)              \
    << XS_FREETREE_CLASS_SUB) + 1)
#define XS_FREETREE_SLOTS (XS_FREETREE_BINS + XS_FREETREE_CLASSES)
#define XS_FREETREE_WORDS ((XS_FREETREE_SLOTS + 63) / 64)

RB_HEAD(xs_freetree_rb, xs_block);

/* One size's free blocks, a list through xs_block.bin from newest (the
   best fit) to oldest. Invariant: newest and oldest are NULL together,
   exactly when the bin's bitmap bit is clear. */
typedef struct xs_freebin {
  xs_block *newest, *oldest;
} xs_freebin;

/* One class's free blocks, a tree in (size, address) order. Invariant:
   first is the tree's first block, NULL exactly when the tree is empty and
   the class's bitmap bit is clear. */
typedef struct xs_freeclass {
  struct xs_freetree_rb root;
  xs_block *first;
} xs_freeclass;

typedef struct xs_freetree {
  size_t count;                 /* blocks in the index (bins and classes) */
  uint64_t words;               /* bit w: bits[w] != 0 */
  size_t bytes;                 /* sum of their sizes (not beside count:
                                   GCC would join their updates in vector
                                   registers, nine instructions for two) */
  uint64_t bits[XS_FREETREE_WORDS];  /* bit i % 64 of word i / 64: slot i
                                        is not empty */
  xs_freebin *bins;             /* XS_FREETREE_BINS of them, or NULL */
  size_t bin_limit;             /* XS_FREETREE_BIN_MAX with bins, else 0:
                                   the largest size a bin holds */
  xs_freeclass classes[XS_FREETREE_CLASSES];
} xs_freetree;

_Static_assert(XS_FREETREE_WORDS <= 64, "one word summarises the slots");
_Static_assert(XS_FREETREE_SLOTS < XS_FREETREE_WORDS * 64,
               "a slot past the last one has a bit (always clear)");

/* An empty index. `bins`: XS_FREETREE_BINS bins the caller keeps for as
   long as the index (cleared here), or NULL: no bins, every block in a
   class. */
void xs_freetree_init(xs_freetree *t, xs_freebin *bins);
/* b must not be in any tree; its size and address must not change while it
   is in this one, except through xs_freetree_replace. */
void xs_freetree_insert(xs_freetree *t, xs_block *b);
void xs_freetree_remove(xs_freetree *t, xs_block *b);
/* xs_freetree_fits_at of a block in a class and a size above the bins. */
bool xs_freetree_class_fits_at(xs_freetree *t, xs_block *b, size_t size,
                               uint64_t addr);
/* Whether a block keyed (size, addr), indexed now, would sit exactly where
   b sits in the order and in the same slot (b's bin, or b's class), so
   that it may take b's node. In a bin that is its head alone (an insert
   goes first); a block in a bin never changes size in place: its bin
   holds one size. Inline for the bins' answer, the cached split's usual
   case (a split changes the size). */
static inline bool xs_freetree_fits_at(xs_freetree *t, xs_block *b,
                                       size_t size, uint64_t addr) {
  if (size <= t->bin_limit || b->size <= t->bin_limit)
    return size == b->size && b->bin.newer == NULL;
  return xs_freetree_class_fits_at(t, b, size, addr);
}
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

/* The class of sizes of `steps` 512-byte steps (0 for a request of 0
   bytes). */
static inline size_t xs_freetree_class_of(uint64_t steps) {
  const unsigned sub = XS_FREETREE_CLASS_SUB;
  if (steps >> XS_FREETREE_CLASS_TOP != 0) return XS_FREETREE_CLASSES - 1;
  if (steps >> sub == 0) return (size_t)steps;
  unsigned l = 63u - (unsigned)__builtin_clzll(steps);
  return ((size_t)(l - sub + 1) << sub) +
         (size_t)((steps >> (l - sub)) & ((1u << sub) - 1));
}

/* The first non-empty slot at or after slot i (at most
   XS_FREETREE_SLOTS), or XS_FREETREE_SLOTS. */
static inline size_t xs_freetree_slot_from(const xs_freetree *t, size_t i) {
  size_t w = i / 64;
  uint64_t bits = t->bits[w] & (~(uint64_t)0 << (i % 64));
  if (bits == 0) {
    uint64_t words = t->words & (~(uint64_t)1 << w);  /* above w */
    if (words == 0) return XS_FREETREE_SLOTS;
    w = (size_t)__builtin_ctzll(words);
    bits = t->bits[w];
  }
  return w * 64 + (size_t)__builtin_ctzll(bits);
}

/* The first block of the first non-empty slot at or after slot i, or
   NULL. */
static inline xs_block *xs_freetree_first_from(const xs_freetree *t,
                                               size_t i) {
  i = xs_freetree_slot_from(t, i);
  if (i < XS_FREETREE_BINS) return t->bins[i].newest;
  return i < XS_FREETREE_SLOTS ? t->classes[i - XS_FREETREE_BINS].first
                               : NULL;
}

/* xs_freetree_best_fit of a size no bin holds: out of line, as the
   large pool's requests and the unmapped blocks' are the rarer ones. */
xs_block *xs_freetree_class_fit(const xs_freetree *t, size_t size);

/* The smallest block of at least `size` bytes (among equal sizes the
   newest in a bin, the lowest address in a class), or NULL. Inline
   because every cached malloc starts here. */
static inline xs_block *xs_freetree_best_fit(xs_freetree *t, size_t size) {
  /* The constant bound tells the compiler what bin_limit's does. */
  if (size <= XS_FREETREE_BIN_MAX && size <= t->bin_limit)
    return xs_freetree_first_from(t, xs_freetree_bin_of(size));
  return xs_freetree_class_fit(t, size);
}
/* Largest first, then each next smaller (for reclaiming whole granules). */
xs_block *xs_freetree_largest(xs_freetree *t);
xs_block *xs_freetree_smaller(xs_freetree *t, xs_block *b);
/* The next block up the order (the next fit after b), or NULL. */
xs_block *xs_freetree_larger(xs_freetree *t, xs_block *b);
/* Whether a block keyed (size, addr), indexed now, would sort before b,
   which is in t: in a bin, a newer block of the same size goes first. */
static inline bool xs_freetree_before(const xs_freetree *t, size_t size,
                                      uint64_t addr, const xs_block *b) {
  if (size != b->size) return size < b->size;
  return size <= t->bin_limit || addr < b->addr;
}
/* Bins, classes, bitmap, order, count and bytes agree with a walk; `msg`
   gets the first problem. */
bool xs_freetree_is_valid(xs_freetree *t, char *msg, size_t msg_size);

#endif /* XS_SEGMENTS_FREETREE_H */
