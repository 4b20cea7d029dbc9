/* The best-fit index of segments/freetree.h on its own: the exact-size LIFO
   bins and their two-level bitmap, the (size, address) tree above them,
   and the boundary between the two. Every order it gives (best fit,
   largest then smaller, larger) is one total order: size first, then the
   newest first in a bin and the lowest address first in the tree, which a
   sorted array of the same blocks stands for here. No driver is needed:
   the blocks are metadata over made-up addresses. */
#include <stdlib.h>
#include <string.h>

#include "segments/block.h"
#include "segments/freetree.h"
#include "xseg_test.h"

enum { STEP = 512 };
#define BIN_MAX XS_FREETREE_BIN_MAX

/* An index and its bins in one allocation (the index first: free(t)
   frees both). */
typedef struct binned_tree {
  xs_freetree t;
  xs_freebin bins[XS_FREETREE_BINS];
} binned_tree;

static xs_freetree *tree_new(void) {
  binned_tree *bt = malloc(sizeof *bt);
  xs_freetree_init(&bt->t, bt->bins);
  return &bt->t;
}

/* An index without bins: every block in the tree. */
static xs_freetree *tree_new_unbinned(void) {
  xs_freetree *t = malloc(sizeof *t);
  xs_freetree_init(t, NULL);
  return t;
}

static void put(xs_block *b, size_t size, uint64_t addr) {
  memset(b, 0, sizeof *b);
  b->size = size;
  b->addr = addr;
  b->mapped = true;
}

static bool valid(xs_freetree *t) {
  char msg[256] = "";
  bool ok = xs_freetree_is_valid(t, msg, sizeof msg);
  if (!ok) XSEG_FAIL("invalid index: %s", msg);
  return ok;
}

XSEG_TEST(segments_freetree, equal_sizes_give_the_newest_first) {
  xs_freetree *t = tree_new();
  xs_block b[4];
  put(&b[0], 4096, 0x40000);
  put(&b[1], 4096, 0x10000);
  put(&b[2], 4096, 0x30000);
  put(&b[3], 4096, 0x20000);
  for (int i = 0; i < 4; i++) xs_freetree_insert(t, &b[i]);
  XSEG_EXPECT_TRUE(valid(t));
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 1) == &b[3]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 4096) == &b[3]);
  /* The order among equals is by age, whichever way it is walked. */
  XSEG_EXPECT_TRUE(xs_freetree_largest(t, 0) == &b[0]);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &b[0], 0) == &b[1]);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &b[1], 0) == &b[2]);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &b[2], 0) == &b[3]);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &b[3], 0) == NULL);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &b[3]) == &b[2]);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &b[0]) == NULL);
  /* Taking the newest hands the next newest on; an insert displaces it,
     whatever its address. */
  xs_freetree_remove(t, &b[3]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 4096) == &b[2]);
  xs_block high;
  put(&high, 4096, 0x80000);
  xs_freetree_insert(t, &high);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 4096) == &high);
  /* Removals in the middle and at the end leave the head alone. */
  xs_freetree_remove(t, &b[1]);
  xs_freetree_remove(t, &b[0]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 4096) == &high);
  XSEG_EXPECT_TRUE(xs_freetree_largest(t, 0) == &b[2]);
  XSEG_EXPECT_TRUE(valid(t));
  xs_freetree_remove(t, &high);
  xs_freetree_remove(t, &b[2]);
  XSEG_EXPECT_EQ(t->count, 0);
  XSEG_EXPECT_EQ(t->bin_words, 0);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 1) == NULL);
  XSEG_EXPECT_TRUE(valid(t));
  free(t);
}

/* Without bins, equal sizes go by address (the large pools' order, and
   PyTorch's). */
XSEG_TEST(segments_freetree, without_bins_equal_sizes_give_the_lowest_address) {
  xs_freetree *t = tree_new_unbinned();
  xs_block b[3];
  put(&b[0], 4096, 0x30000);
  put(&b[1], 4096, 0x10000);
  put(&b[2], 4096, 0x20000);
  for (int i = 0; i < 3; i++) xs_freetree_insert(t, &b[i]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 4096) == &b[1]);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &b[1]) == &b[2]);
  XSEG_EXPECT_TRUE(xs_freetree_before(t, 4096, 0x18000, &b[2]));
  XSEG_EXPECT_FALSE(xs_freetree_before(t, 4096, 0x28000, &b[2]));
  for (int i = 0; i < 3; i++) xs_freetree_remove(t, &b[i]);
  XSEG_EXPECT_TRUE(valid(t));
  free(t);
}

/* A walk down to a size (the releases', down to a granule) stops there:
   blocks of exactly that size are in it, smaller ones not, and it reads
   nothing of a bin below it. A bin keeps no tail, so entering one means
   walking its list to its oldest block; every growth walks its pools down
   to a granule, past small bins that may hold 10^5 blocks. The list of
   the bin below is made to fault if walked. */
XSEG_TEST(segments_freetree, a_walk_down_to_a_size_enters_no_bin_below_it) {
  xs_freetree *t = tree_new();
  xs_block older, newer, at_floor, big;
  put(&older, STEP, 0x1000000);
  put(&newer, STEP, 0x1001000);
  put(&at_floor, BIN_MAX, 0x2000000);
  put(&big, 4 * BIN_MAX, 0x3000000);
  xs_freetree_insert(t, &older);
  xs_freetree_insert(t, &newer);
  xs_freetree_insert(t, &at_floor);
  xs_freetree_insert(t, &big);
  XSEG_EXPECT_TRUE(valid(t));
  /* Every block: the tree's, then each bin from its oldest. */
  XSEG_EXPECT_TRUE(xs_freetree_largest(t, 0) == &big);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &big, 0) == &at_floor);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &at_floor, 0) == &older);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &older, 0) == &newer);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &newer, 0) == NULL);
  /* Above every block, above every bin, at a bin's size. */
  XSEG_EXPECT_TRUE(xs_freetree_largest(t, 4 * BIN_MAX + 1) == NULL);
  XSEG_EXPECT_TRUE(xs_freetree_largest(t, 2 * BIN_MAX) == &big);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &big, 2 * BIN_MAX) == NULL);
  older.bin.older = (xs_block *)(uintptr_t)8;   /* faults if followed */
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &big, BIN_MAX) == &at_floor);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &at_floor, BIN_MAX) == NULL);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &big, STEP + 1) == &at_floor);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &at_floor, STEP + 1) == NULL);
  /* With the tree alone above the floor. */
  xs_freetree_remove(t, &at_floor);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &big, STEP + 1) == NULL);
  older.bin.older = NULL;
  XSEG_EXPECT_TRUE(valid(t));
  free(t);
}

/* Bins in the first and last bitmap words and on both sides of a word
   boundary: a fit within the request's word is found by the first level,
   one in a later word through the summary word. */
XSEG_TEST(segments_freetree, bins_at_both_bitmap_levels) {
  xs_freetree *t = tree_new();
  xs_block first, last_of_word0, first_of_word1, last;
  put(&first, STEP, 0x1000000);                 /* bin 0 */
  put(&last_of_word0, 64 * STEP, 0x2000000);    /* bin 63 */
  put(&first_of_word1, 65 * STEP, 0x3000000);   /* bin 64 */
  put(&last, BIN_MAX, 0x4000000);               /* bin 2047 */
  xs_freetree_insert(t, &last);
  XSEG_EXPECT_EQ(t->bin_words,
                 (uint64_t)1 << (XS_FREETREE_BIN_WORDS - 1));
  /* Only the last bin: every request of at most 1 MiB finds it through the
     summary word. */
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 1) == &last);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, BIN_MAX - STEP + 1) == &last);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, BIN_MAX) == &last);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, BIN_MAX + 1) == NULL);
  xs_freetree_insert(t, &first_of_word1);
  xs_freetree_insert(t, &last_of_word0);
  xs_freetree_insert(t, &first);
  XSEG_EXPECT_EQ(t->bin_words,
                 3 | (uint64_t)1 << (XS_FREETREE_BIN_WORDS - 1));
  XSEG_EXPECT_TRUE(valid(t));
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 1) == &first);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, STEP + 1) == &last_of_word0);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 64 * STEP) == &last_of_word0);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 64 * STEP + 1) == &first_of_word1);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 65 * STEP + 1) == &last);
  /* Walks cross words both ways. */
  XSEG_EXPECT_TRUE(xs_freetree_largest(t, 0) == &last);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &last, 0) == &first_of_word1);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &first_of_word1, 0) ==
                   &last_of_word0);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &last_of_word0, 0) == &first);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &first, 0) == NULL);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &first) == &last_of_word0);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &last_of_word0) == &first_of_word1);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &first_of_word1) == &last);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &last) == NULL);
  /* Emptying word 0 clears its summary bit; bin 64 still answers. */
  xs_freetree_remove(t, &first);
  xs_freetree_remove(t, &last_of_word0);
  XSEG_EXPECT_EQ(t->bin_bits[0], 0);
  XSEG_EXPECT_EQ(t->bin_words & 1, 0);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 1) == &first_of_word1);
  XSEG_EXPECT_TRUE(valid(t));
  xs_freetree_remove(t, &first_of_word1);
  xs_freetree_remove(t, &last);
  XSEG_EXPECT_EQ(t->bin_words, 0);
  XSEG_EXPECT_TRUE(valid(t));
  free(t);
}

/* 1 MiB is the last bin; 1 MiB + 512 the smallest size of the tree. */
XSEG_TEST(segments_freetree, the_boundary_between_bins_and_tree) {
  xs_freetree *t = tree_new();
  xs_block in_bin, in_tree, big, low_tree;
  put(&in_bin, BIN_MAX, 0x900000);
  put(&in_tree, BIN_MAX + STEP, 0x100000);
  put(&big, 4 * BIN_MAX, 0x80000000);
  put(&low_tree, BIN_MAX + STEP, 0x50000);
  xs_freetree_insert(t, &in_tree);
  xs_freetree_insert(t, &big);
  XSEG_EXPECT_EQ(t->bin_words, 0);               /* both in the tree */
  /* No bin holds anything: a small request takes the tree's smallest. */
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 512) == &in_tree);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, BIN_MAX) == &in_tree);
  xs_freetree_insert(t, &in_bin);
  xs_freetree_insert(t, &low_tree);
  XSEG_EXPECT_TRUE(valid(t));
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 512) == &in_bin);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, BIN_MAX) == &in_bin);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, BIN_MAX + 1) == &low_tree);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, BIN_MAX + STEP + 1) == &big);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &in_bin) == &low_tree);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &low_tree, 0) == &in_bin);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &in_tree, 0) == &low_tree);
  /* A node changes hands only within its own structure. */
  XSEG_EXPECT_FALSE(xs_freetree_fits_at(t, &low_tree, BIN_MAX, 0x50000));
  XSEG_EXPECT_FALSE(xs_freetree_fits_at(t, &in_bin, BIN_MAX + STEP, 0));
  XSEG_EXPECT_FALSE(xs_freetree_fits_at(t, &in_bin, BIN_MAX - STEP,
                                        0x900000 + STEP));
  XSEG_EXPECT_TRUE(xs_freetree_fits_at(t, &in_bin, BIN_MAX, 0x910000));
  /* Front cuts inside the tree keep the node while the order holds... */
  XSEG_EXPECT_TRUE(xs_freetree_fits_at(t, &big, 3 * BIN_MAX, 0x80100000));
  /* ...and not past a neighbour. */
  XSEG_EXPECT_FALSE(xs_freetree_fits_at(t, &big, BIN_MAX + STEP, 0x0));
  xs_freetree_remove(t, &in_bin);
  xs_freetree_remove(t, &in_tree);
  xs_freetree_remove(t, &big);
  xs_freetree_remove(t, &low_tree);
  XSEG_EXPECT_TRUE(valid(t));
  free(t);
}

/* xs_freetree_replace in a bin (a block of the same size at another
   address takes the head's node, and the head with it; only the head: an
   insert goes there) and in the tree (a front cut that sorts where the
   block was). */
XSEG_TEST(segments_freetree, replace_in_a_bin_and_in_the_tree) {
  xs_freetree *t = tree_new();
  xs_block a, b, c, big, cut;
  put(&a, 2048, 0x10000);
  put(&b, 2048, 0x20000);
  put(&c, 2048, 0x30000);
  put(&big, 8 * BIN_MAX, 0x40000000);
  xs_freetree_insert(t, &a);
  xs_freetree_insert(t, &b);
  xs_freetree_insert(t, &c);
  xs_freetree_insert(t, &big);
  xs_block moved;
  put(&moved, 2048, 0x8000);
  XSEG_ASSERT_TRUE(xs_freetree_fits_at(t, &c, moved.size, moved.addr));
  XSEG_EXPECT_FALSE(xs_freetree_fits_at(t, &a, 2048, 0x8000));
  XSEG_EXPECT_FALSE(xs_freetree_fits_at(t, &c, 1536, 0x30000));
  XSEG_EXPECT_TRUE(xs_freetree_before(t, 2048, 0x40000, &c));
  xs_freetree_replace(t, &c, c.size, &moved);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(t, 2048) == &moved);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &moved) == &b);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &b, 0) == &moved);
  XSEG_EXPECT_TRUE(valid(t));
  /* The oldest replaced: the bin's tail moves too. */
  xs_block last;
  put(&last, 2048, 0x50000);
  xs_freetree_replace(t, &a, a.size, &last);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &b) == &last);
  XSEG_EXPECT_TRUE(xs_freetree_larger(t, &last) == &big);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(t, &big, 0) == &last);
  XSEG_EXPECT_TRUE(valid(t));
  /* The front 1 MiB cut off big: the rest sorts where big was. */
  put(&cut, 7 * BIN_MAX, big.addr + BIN_MAX);
  XSEG_ASSERT_TRUE(xs_freetree_fits_at(t, &big, cut.size, cut.addr));
  xs_freetree_replace(t, &big, big.size, &cut);
  XSEG_EXPECT_TRUE(xs_freetree_largest(t, 0) == &cut);
  XSEG_EXPECT_TRUE(valid(t));
  xs_freetree_remove(t, &moved);
  xs_freetree_remove(t, &b);
  xs_freetree_remove(t, &last);
  xs_freetree_remove(t, &cut);
  XSEG_EXPECT_EQ(t->count, 0);
  free(t);
}

/* ---- against a sorted reference -------------------------------------- */

/* The reference order. Each block's free_epoch (which the index never
   reads) holds when it was inserted; `ref_binned`: the index has bins, so
   that equal sizes up to BIN_MAX go newest first. */
static bool ref_binned;

static bool key_less(const xs_block *a, const xs_block *b) {
  if (a->size != b->size) return a->size < b->size;
  if (ref_binned && a->size <= BIN_MAX) return a->free_epoch > b->free_epoch;
  return a->addr < b->addr;
}

static int key_cmp(const void *x, const void *y) {
  const xs_block *a = *(const xs_block *const *)x;
  const xs_block *b = *(const xs_block *const *)y;
  return key_less(a, b) ? -1 : key_less(b, a);
}

static uint64_t rng(uint64_t *s) {   /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Sizes in steps: mostly a few small bins (many equal sizes), some
   anywhere in the bins, some around the boundary, some in the tree. */
static size_t random_size(uint64_t *s) {
  switch (rng(s) % 4) {
  case 0: return STEP * (1 + rng(s) % 8);
  case 1: return STEP * (1 + rng(s) % XS_FREETREE_BINS);
  case 2: return BIN_MAX - 2 * STEP + STEP * (rng(s) % 5);
  default: return BIN_MAX + STEP * (1 + rng(s) % 4096);
  }
}

/* Both walks visit exactly the sorted order. */
static bool walks_match(xs_freetree *t, xs_block **sorted, size_t n) {
  size_t i = n;
  for (xs_block *b = xs_freetree_largest(t, 0); b != NULL;
       b = xs_freetree_smaller(t, b, 0))
    if (i == 0 || sorted[--i] != b) return false;
  if (i != 0) return false;
  for (xs_block *b = xs_freetree_best_fit(t, 1); b != NULL;
       b = xs_freetree_larger(t, b))
    if (i == n || sorted[i++] != b) return false;
  return i == n;
}

/* The first block in the reference order that holds `want`. */
static xs_block *reference_fit(const xs_block *blk, const bool *in, size_t n,
                               size_t want) {
  const xs_block *best = NULL;
  for (size_t j = 0; j < n; j++)
    if (in[j] && blk[j].size >= want &&
        (best == NULL || key_less(&blk[j], best)))
      best = &blk[j];
  return (xs_block *)best;
}

/* Random inserts and removes of sizes around the bins' edges: best fit
   after every step, both walks and the validator every so often, against
   a sorted reference. */
static void orders_match_reference(xs_freetree *t) {
  enum { N = 2000, STEPS = 20000 };
  xs_block *blk = calloc(N, sizeof *blk);
  xs_block **sorted = calloc(N, sizeof *sorted);
  bool *in = calloc(N, sizeof *in);
  uint64_t seed = 12;
  size_t n_in = 0;
  ref_binned = t->bins != NULL;
  for (int step = 0; step < STEPS; step++) {
    size_t i = rng(&seed) % N;
    if (in[i]) {
      xs_freetree_remove(t, &blk[i]);
      in[i] = false;
      n_in--;
    } else {
      /* Distinct addresses; equal sizes are common. */
      put(&blk[i], random_size(&seed), (uint64_t)i << 32);
      blk[i].free_epoch = (uint64_t)step + 1;
      xs_freetree_insert(t, &blk[i]);
      in[i] = true;
      n_in++;
    }
    size_t want = rng(&seed) % 2 ? random_size(&seed) - rng(&seed) % STEP
                                 : random_size(&seed);
    if (xs_freetree_best_fit(t, want) != reference_fit(blk, in, N, want)) {
      XSEG_FAIL("step %d: best fit for %zu differs from the reference",
                step, want);
      break;
    }
    /* The walks are O(n log n) to check: every 100th step and the
       last 20. */
    if (step % 100 != 0 && step < STEPS - 20) continue;
    size_t n = 0;
    for (size_t j = 0; j < N; j++)
      if (in[j]) sorted[n++] = &blk[j];
    qsort(sorted, n, sizeof *sorted, key_cmp);
    if (!walks_match(t, sorted, n)) {
      XSEG_FAIL("step %d: a walk differs from the sorted order", step);
      break;
    }
    if (step % 1000 == 0 && !valid(t)) break;
  }
  XSEG_EXPECT_EQ(t->count, n_in);
  XSEG_EXPECT_TRUE(valid(t));
  free(in);
  free(sorted);
  free(blk);
  free(t);
}

XSEG_TEST(segments_freetree, orders_match_a_sorted_reference) {
  orders_match_reference(tree_new());
}

/* The same order without bins (the large pools' and the unmapped blocks'
   indexes): every size in the tree. */
XSEG_TEST(segments_freetree, orders_match_a_sorted_reference_without_bins) {
  xs_freetree *t = tree_new_unbinned();
  XSEG_EXPECT_EQ(t->bin_limit, 0u);
  orders_match_reference(t);
}

XSEG_TEST(segments_freetree, validator_catches_bitmap_and_a_broken_list) {
  xs_freetree *t = tree_new();
  xs_block a, b;
  put(&a, 1024, 0x2000);
  put(&b, 1024, 0x1000);
  xs_freetree_insert(t, &a);
  xs_freetree_insert(t, &b);
  char msg[256] = "";
  XSEG_EXPECT_TRUE(xs_freetree_is_valid(t, msg, sizeof msg));
  /* A stale head, then a tail without its head. */
  t->bins[1].newest = &a;
  XSEG_EXPECT_FALSE(xs_freetree_is_valid(t, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "free bin 1") != NULL);
  t->bins[1].newest = NULL;
  XSEG_EXPECT_FALSE(xs_freetree_is_valid(t, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "free bin 1") != NULL);
  t->bins[1].newest = &b;
  /* A bin bit set for an empty bin, then its word's summary bit lost. */
  t->bin_bits[0] |= 1;
  XSEG_EXPECT_FALSE(xs_freetree_is_valid(t, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "free bin 0") != NULL);
  t->bin_bits[0] &= ~(uint64_t)1;
  t->bin_words = 0;
  XSEG_EXPECT_FALSE(xs_freetree_is_valid(t, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "summary") != NULL);
  t->bin_words = 1;
  XSEG_EXPECT_TRUE(xs_freetree_is_valid(t, msg, sizeof msg));
  /* Blocks in a bin the bitmap lost: best fit cannot see them. */
  t->bin_bits[0] = 0;
  t->bin_words = 0;
  XSEG_EXPECT_FALSE(xs_freetree_is_valid(t, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "counts") != NULL);
  t->bin_bits[0] = 2;
  t->bin_words = 1;
  XSEG_EXPECT_TRUE(xs_freetree_is_valid(t, msg, sizeof msg));
  xs_freetree_remove(t, &a);
  xs_freetree_remove(t, &b);
  free(t);
}
