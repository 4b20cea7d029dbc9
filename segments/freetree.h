/* freetree.h: the best-fit index of free blocks.
 *
 * The best fit for a request is the smallest block that holds it. Among
 * blocks of equal size, two tie-breaks, one per structure, split at
 * XS_FREETREE_BIN_MAX (1 MiB, the largest request the small pool serves):
 *
 *   bins  2048 of them, one per size from 512 B to 1 MiB in 512-byte steps
 *         (block sizes are multiples of 512, so a bin holds one size
 *         exactly). Each is a list, the block indexed last first (LIFO).
 *   tree  a red-black tree ordered by (size, address) of every block above
 *         1 MiB: the lowest address first, as PyTorch's BlockPool.
 *
 * A two-level bitmap says which bins hold blocks:
 *
 *   bin_words               bit w set <=> bin_bits[w] != 0   (32 words)
 *   bin_bits[w]             bit j set <=> bins[64 * w + j] holds a block
 *   bins[i].newest          the head of its list: the best fit of its size
 *
 * Bin i sorts before bin i + 1 and every bin before the tree, so the whole
 * order is the bins' in index order, each newest first, then the tree's.
 * A request of at most 1 MiB takes the newest block of the first non-empty
 * bin at or above its size: a bit scan in its own word, else one in
 * bin_words and one in the word it names, then one pointer; O(1). When no
 * bin has one it takes the tree's smallest block, also cached. A larger
 * request takes the tree's lower bound, O(log n).
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
 * touched last, as in the exact-size caches of host allocators. Blocks
 * above 1 MiB keep address order: placement there decides how segments
 * grow.
 *
 * Memory: the bins are 16 KiB of host memory, kept by the caller and
 * given at xs_freetree_init; an index given none keeps every block in the
 * tree (address order at every size). Both pools' indexes of free mapped
 * blocks have bins (alloc/pairs.c). The large pool's requests are all
 * above 1 MiB, so no best fit of its looks at its bins; they hold the
 * rests its splits leave, which outnumbered the blocks a request can take
 * six to one under mixed sizes (twenty to one with large ones alone) and
 * made every move in its tree several levels deeper (bench/README.md,
 * "The large pool's rests in bins"). Unmapped
 * blocks are whole granules: those indexes have none.
 */
#ifndef XS_SEGMENTS_FREETREE_H
#define XS_SEGMENTS_FREETREE_H

#include <assert.h>
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

/* One size's free blocks, a list through xs_block.bin from newest (the
   best fit) to oldest. Invariant: newest is NULL exactly when the bin's
   bitmap bit is clear. The list has no tail pointer: only a walk down the
   order asks for a bin's oldest block, and a walk enters only bins at or
   above the size it stops at, whose blocks it is after
   (xs_freetree_smaller); a tail cost a store at many mallocs and frees
   (measured in bench/README.md, "The bins without a tail"). */
typedef struct xs_freebin {
  xs_block *newest;
} xs_freebin;

typedef struct xs_freetree {
  struct xs_freetree_rb root;   /* blocks above XS_FREETREE_BIN_MAX */
  xs_block *tree_min;           /* the tree's first block: the fit of a
                                   small request no bin holds (the
                                   repeated-size path's usual case) */
  size_t count;                 /* blocks in the index (bins and tree) */
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
static inline void xs_freetree_insert(xs_freetree *t, xs_block *b);
static inline void xs_freetree_remove(xs_freetree *t, xs_block *b);
/* Whether a block keyed (size, addr), indexed now, would sit exactly where
   b sits in the order (b's neighbours bracket the key) and in the same
   structure (b's bin, or the tree), so that it may take b's node. In a
   bin that is its head alone (an insert goes first); a block in a bin
   never changes size in place: its bin holds one size. */
static inline bool xs_freetree_fits_at(xs_freetree *t, xs_block *b,
                                       size_t size, uint64_t addr);
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
   request of `size` bytes (any size from 1 to XS_FREETREE_BIN_MAX). */
static inline size_t xs_freetree_bin_of(size_t size) {
  assert(size > 0 && "a request of 0 bytes has no bin");
  return (size - 1) / XS_FREETREE_BIN_STEP;
}

/* The smallest block of at least `size` bytes (size > 0; among equal
   sizes the newest in a bin, the lowest address in the tree), or NULL.
   Inline because every cached malloc starts here. */
static inline xs_block *xs_freetree_best_fit(xs_freetree *t, size_t size) {
  assert(size > 0 && "every block holds a request of 0 bytes");
  /* The constant bound tells the compiler what bin_limit's does. */
  if (size <= XS_FREETREE_BIN_MAX && size <= t->bin_limit) {
    /* No bin holds a block: small requests served from a large block (a
       repeated size at the front of the mapped range) stop here. (An
       index without bins never comes here: its bin_limit is 0.) */
    if (t->bin_words == 0) return t->tree_min;
    size_t i = xs_freetree_bin_of(size), w = i / 64;
    uint64_t bits = t->bin_bits[w] & (~(uint64_t)0 << (i % 64));
    if (bits == 0) {
      uint64_t words = t->bin_words & (~(uint64_t)1 << w);  /* above w */
      if (words == 0) return t->tree_min;
      w = (size_t)__builtin_ctzll(words);
      bits = t->bin_bits[w];
    }
    return t->bins[w * 64 + (size_t)__builtin_ctzll(bits)].newest;
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
/* Largest first, then each next smaller, down to blocks of `min_size`
   bytes (0: every block): NULL once the next is smaller. The releases
   walk down to a granule. A walk never enters a bin below its
   `min_size`, where finding the bin's oldest block would walk its list (a
   bin keeps no tail): every growth walks its pools down to a granule,
   past small bins that may hold 10^5 blocks. */
xs_block *xs_freetree_largest(xs_freetree *t, size_t min_size);
xs_block *xs_freetree_smaller(xs_freetree *t, xs_block *b, size_t min_size);
/* The next block up the order (the next fit after b), or NULL. */
xs_block *xs_freetree_larger(xs_freetree *t, xs_block *b);
/* Whether a block keyed (size, addr), indexed now, would sort before b,
   which is in t: in a bin, a newer block of the same size goes first. */
static inline bool xs_freetree_before(const xs_freetree *t, size_t size,
                                      uint64_t addr, const xs_block *b) {
  if (size != b->size) return size < b->size;
  return size <= t->bin_limit || addr < b->addr;
}
/* Bins, bitmap, tree, order and count agree with a walk; `msg` gets
   the first problem. */
bool xs_freetree_is_valid(xs_freetree *t, char *msg, size_t msg_size);

/* ---- inline: the bins' half of insert, remove and fits_at ------------ */

/* Inline because a cached malloc+free pair under mixed sizes moves about
   two and a half blocks in or out of bins, and a call to do it cost more
   than the move. Measured with bench/callgrind.sh (out of line -> inline):
   mixed 10000 555.0 -> 544.3 instructions per pair, random 10000 401.8 ->
   392.7, layers 249.6 -> 249.6, repeat 127.0 -> 127.0; a large pool alone
   (mixed-large 1000, then without bins) paid for the calls now made from
   its callers: 1004.5 -> 1019.4. The tree's half stays out of line
   (freetree.c): it rebalances, and runs far less often where bins
   serve. */
/* The tree's half: blocks above the bins, counted there. */
void xs_freetree_tree_insert(xs_freetree *t, xs_block *b);
void xs_freetree_tree_remove(xs_freetree *t, xs_block *b);
/* xs_freetree_fits_at for a block and a key both above the bins. */
bool xs_freetree_tree_fits_at(xs_freetree *t, xs_block *b, size_t size,
                              uint64_t addr);

/* Whether a block of this size lives in a bin (else in the tree). */
static inline bool xs_freetree_binned(const xs_freetree *t, size_t size) {
  return size <= t->bin_limit;
}

/* The bin a block of `size` bytes lives in, when it lives in one. */
static inline size_t xs_freetree_bin_index(size_t size) {
  assert(size > 0 && size % XS_FREETREE_BIN_STEP == 0 &&
         size <= XS_FREETREE_BIN_MAX && "a bin holds one size exactly");
  size_t i = size / XS_FREETREE_BIN_STEP - 1;
  /* What bin_limit's bound says, told to the compiler (no instruction). */
  if (i >= XS_FREETREE_BINS) __builtin_unreachable();
  return i;
}

static inline void xs_freetree_insert(xs_freetree *t, xs_block *b) {
  assert(!b->allocated && "only free blocks are indexed");
  if (xs_freetree_binned(t, b->size)) {
    /* b goes first: the newest of its size. */
    size_t i = xs_freetree_bin_index(b->size);
    xs_freebin *bin = &t->bins[i];
    xs_block *head = bin->newest;
    b->bin.newer = NULL;
    b->bin.older = head;
    if (head == NULL) {
      t->bin_bits[i / 64] |= (uint64_t)1 << (i % 64);
      t->bin_words |= (uint64_t)1 << (i / 64);
    } else {
      head->bin.newer = b;
    }
    bin->newest = b;
    t->count++;
  } else {
    xs_freetree_tree_insert(t, b);      /* counts too: t is done here */
  }
}

static inline void xs_freetree_remove(xs_freetree *t, xs_block *b) {
  assert(t->count > 0);
  if (xs_freetree_binned(t, b->size)) {
    size_t i = xs_freetree_bin_index(b->size);
    xs_freebin *bin = &t->bins[i];
    xs_block *newer = b->bin.newer, *older = b->bin.older;
    if (newer == NULL) bin->newest = older; else newer->bin.older = older;
    if (older != NULL) older->bin.newer = newer;
    if (bin->newest == NULL) {
      t->bin_bits[i / 64] &= ~((uint64_t)1 << (i % 64));
      if (t->bin_bits[i / 64] == 0)
        t->bin_words &= ~((uint64_t)1 << (i / 64));
    }
    t->count--;
  } else {
    xs_freetree_tree_remove(t, b);      /* counts too: t is done here */
  }
}

static inline bool xs_freetree_fits_at(xs_freetree *t, xs_block *b,
                                       size_t size, uint64_t addr) {
  /* In a bin (one size) the key fits only as its head: an insert goes
     first. */
  if (xs_freetree_binned(t, b->size) || xs_freetree_binned(t, size))
    return size == b->size && b->bin.newer == NULL;
  return xs_freetree_tree_fits_at(t, b, size, addr);
}

#endif /* XS_SEGMENTS_FREETREE_H */
