/* freetree.c: the best-fit index of free blocks: exact-size LIFO bins
 * under a two-level bitmap for sizes up to 1 MiB, a (size, address)-ordered
 * red-black tree above (BSD sys/tree.h; see freetree.h, where the bins'
 * insert, remove and fits_at are inline).
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "segments/freetree.h"

static int freetree_cmp(const xs_block *a, const xs_block *b) {
  if (a->size != b->size) return a->size < b->size ? -1 : 1;
  if (a->addr != b->addr) return a->addr < b->addr ? -1 : 1;
  return 0;
}

/* RB_GENERATE_STATIC marks what it generates __unused, which libbsd's
   cdefs.h leaves undefined on Linux (a struct member there has the name). */
#define __unused __attribute__((__unused__))
RB_GENERATE_STATIC(xs_freetree_rb, xs_block, link, freetree_cmp)
#undef __unused

void xs_freetree_init(xs_freetree *t, xs_freebin *bins) {
  memset(t, 0, sizeof *t);
  RB_INIT(&t->root);
  if (bins != NULL) memset(bins, 0, XS_FREETREE_BINS * sizeof *bins);
  t->bins = bins;
  t->bin_limit = bins != NULL ? XS_FREETREE_BIN_MAX : 0;
}

/* Whether blocks of these sizes share a structure: one bin (a bin holds
   one size) or the tree. */
static inline bool freetree_same_structure(const xs_freetree *t, size_t a,
                                           size_t b) {
  return a == b || (!xs_freetree_binned(t, a) && !xs_freetree_binned(t, b));
}

/* ---- the bitmap ------------------------------------------------------- */

/* The first non-empty bin at or above bin i, or XS_FREETREE_BINS. */
static size_t freetree_bin_from(const xs_freetree *t, size_t i) {
  if (i >= XS_FREETREE_BINS) return XS_FREETREE_BINS;
  size_t w = i / 64;
  uint64_t bits = t->bin_bits[w] & (~(uint64_t)0 << (i % 64));
  if (bits == 0) {
    uint64_t words = t->bin_words & (~(uint64_t)1 << w);
    if (words == 0) return XS_FREETREE_BINS;
    w = (size_t)__builtin_ctzll(words);
    bits = t->bin_bits[w];
  }
  return w * 64 + (size_t)__builtin_ctzll(bits);
}

/* The last non-empty bin below bin i (i <= XS_FREETREE_BINS), or
   XS_FREETREE_BINS when there is none. */
static size_t freetree_bin_below(const xs_freetree *t, size_t i) {
  if (i == 0) return XS_FREETREE_BINS;
  size_t j = i - 1, w = j / 64;
  uint64_t bits = t->bin_bits[w] & (~(uint64_t)0 >> (63 - j % 64));
  if (bits == 0) {
    uint64_t words = t->bin_words & (((uint64_t)1 << w) - 1);  /* below w */
    if (words == 0) return XS_FREETREE_BINS;
    w = 63 - (size_t)__builtin_clzll(words);
    bits = t->bin_bits[w];
  }
  return w * 64 + 63 - (size_t)__builtin_clzll(bits);
}

/* ---- one bin ---------------------------------------------------------- */

/* The last block of bin i (not empty) in the order: its oldest, found by
   walking the list (a bin keeps no tail; freetree.h). A walk down the
   order (xs_freetree_smaller) walks each bin it enters twice at most. */
static xs_block *freebin_last(xs_freetree *t, size_t i) {
  assert(i < XS_FREETREE_BINS && t->bins[i].newest != NULL);
  xs_block *b = t->bins[i].newest;
  while (b->bin.older != NULL) b = b->bin.older;
  return b;
}

/* ---- the index -------------------------------------------------------- */

void xs_freetree_tree_insert(xs_freetree *t, xs_block *b) {
  assert(!xs_freetree_binned(t, b->size));
  xs_block *dup = RB_INSERT(xs_freetree_rb, &t->root, b);
  assert(dup == NULL && "(size, address) is unique: blocks never overlap");
  (void)dup;
  if (t->tree_min == NULL || freetree_cmp(b, t->tree_min) < 0)
    t->tree_min = b;
  t->count++;
}

void xs_freetree_tree_remove(xs_freetree *t, xs_block *b) {
  assert(!xs_freetree_binned(t, b->size));
  if (t->tree_min == b) t->tree_min = RB_NEXT(xs_freetree_rb, &t->root, b);
  RB_REMOVE(xs_freetree_rb, &t->root, b);
  t->count--;
}

/* Sign of (size, addr) against b's key. */
static int freetree_cmp_key(size_t size, uint64_t addr, const xs_block *b) {
  if (size != b->size) return size < b->size ? -1 : 1;
  if (addr != b->addr) return addr < b->addr ? -1 : 1;
  return 0;
}

/* b's neighbours in the order within its own structure: its bin's list
   (the newer one first), or the tree. */
static xs_block *freetree_prev_in(const xs_freetree *t, xs_block *b) {
  return xs_freetree_binned(t, b->size) ? b->bin.newer
                                     : xs_freetree_rb_RB_PREV(b);
}

bool xs_freetree_tree_fits_at(xs_freetree *t, xs_block *b, size_t size,
                              uint64_t addr) {
  assert(!xs_freetree_binned(t, size) && !xs_freetree_binned(t, b->size));
  (void)t;
  /* Moving down the order, only the predecessor can be passed; moving up,
     only the successor. */
  int c = freetree_cmp_key(size, addr, b);
  if (c < 0) {
    xs_block *p = xs_freetree_rb_RB_PREV(b);
    return p == NULL || freetree_cmp_key(size, addr, p) > 0;
  }
  if (c > 0) {
    xs_block *n = xs_freetree_rb_RB_NEXT(b);
    return n == NULL || freetree_cmp_key(size, addr, n) < 0;
  }
  return true;
}

void xs_freetree_replace(xs_freetree *t, xs_block *old, size_t old_size,
                         xs_block *repl) {
  assert(!repl->allocated && "only free blocks are indexed");
  assert(freetree_same_structure(t, old_size, repl->size) &&
         "xs_freetree_fits_at said so: the same bin, or the tree");
  if (repl != old && xs_freetree_binned(t, old_size)) {
    xs_freebin *bin = &t->bins[xs_freetree_bin_index(old_size)];
    xs_block *newer = old->bin.newer, *older = old->bin.older;
    repl->bin = old->bin;
    if (newer == NULL) bin->newest = repl; else newer->bin.older = repl;
    if (older != NULL) older->bin.newer = repl;
  } else if (repl != old) {
    if (t->tree_min == old) t->tree_min = repl;
    repl->link = old->link;
    xs_block *parent = RB_PARENT(old, link);
    if (parent == NULL)
      RB_ROOT(&t->root) = repl;
    else if (RB_LEFT(parent, link) == old)
      RB_LEFT(parent, link) = repl;
    else
      RB_RIGHT(parent, link) = repl;
    if (RB_LEFT(old, link) != NULL) RB_PARENT(RB_LEFT(old, link), link) = repl;
    if (RB_RIGHT(old, link) != NULL)
      RB_PARENT(RB_RIGHT(old, link), link) = repl;
  }
}

/* The oldest block of the last non-empty bin below bin i, when that bin's
   blocks are of at least `min_size` bytes; else NULL. */
static xs_block *freetree_last_below(xs_freetree *t, size_t i,
                                     size_t min_size) {
  i = freetree_bin_below(t, i);
  if (i == XS_FREETREE_BINS || (i + 1) * XS_FREETREE_BIN_STEP < min_size)
    return NULL;
  return freebin_last(t, i);
}

xs_block *xs_freetree_largest(xs_freetree *t, size_t min_size) {
  xs_block *b = RB_MAX(xs_freetree_rb, &t->root);
  if (b != NULL) return b->size >= min_size ? b : NULL;
  return freetree_last_below(t, XS_FREETREE_BINS, min_size);
}

xs_block *xs_freetree_smaller(xs_freetree *t, xs_block *b, size_t min_size) {
  xs_block *p = freetree_prev_in(t, b);
  if (p != NULL) return p->size >= min_size ? p : NULL;
  size_t i = xs_freetree_binned(t, b->size) ? xs_freetree_bin_index(b->size)
                                         : XS_FREETREE_BINS;
  return freetree_last_below(t, i, min_size);
}

xs_block *xs_freetree_larger(xs_freetree *t, xs_block *b) {
  if (!xs_freetree_binned(t, b->size)) return xs_freetree_rb_RB_NEXT(b);
  xs_block *n = b->bin.older;
  if (n != NULL) return n;
  size_t i = freetree_bin_from(t, xs_freetree_bin_index(b->size) + 1);
  return i < XS_FREETREE_BINS ? t->bins[i].newest : t->tree_min;
}

/* ---- the validator ---------------------------------------------------- */

typedef struct freetree_walk {
  size_t count;
  char *msg;
  size_t msg_size;
} freetree_walk;

/* One block met in order after `prev`. */
static bool freetree_check_block(freetree_walk *w, const xs_block *prev,
                                 const xs_block *b) {
  if (prev != NULL && freetree_cmp(prev, b) >= 0) {
    snprintf(w->msg, w->msg_size, "free tree out of order at block 0x%llx",
             (unsigned long long)b->addr);
    return false;
  }
  if (b->allocated) {
    snprintf(w->msg, w->msg_size, "allocated block 0x%llx is in a free tree",
             (unsigned long long)b->addr);
    return false;
  }
  w->count++;
  return true;
}

static bool freetree_check_bin(xs_freetree *t, size_t i, freetree_walk *w) {
  xs_freebin *bin = &t->bins[i];
  bool marked = (t->bin_bits[i / 64] >> (i % 64)) & 1;
  if (marked != (bin->newest != NULL)) {
    snprintf(w->msg, w->msg_size, "free bin %zu: newest %p, bitmap bit %d",
             i, (void *)bin->newest, (int)marked);
    return false;
  }
  const xs_block *newer = NULL;
  for (xs_block *b = bin->newest; b != NULL; newer = b, b = b->bin.older) {
    if (b->bin.newer != newer) {
      snprintf(w->msg, w->msg_size,
               "free bin %zu: its list is broken at block 0x%llx", i,
               (unsigned long long)b->addr);
      return false;
    }
    if (b->size != (i + 1) * XS_FREETREE_BIN_STEP) {
      snprintf(w->msg, w->msg_size,
               "block 0x%llx of %zu bytes is in the free bin of %zu",
               (unsigned long long)b->addr, b->size,
               (i + 1) * XS_FREETREE_BIN_STEP);
      return false;
    }
    /* A bin's order is its list's: no key to compare. */
    if (!freetree_check_block(w, NULL, b)) return false;
    /* A cycle would never end: the count bounds the walk. */
    if (w->count > t->count) break;
  }
  return true;
}

static bool freetree_check_words(xs_freetree *t, freetree_walk *w) {
  for (size_t k = 0; k < XS_FREETREE_BIN_WORDS; k++) {
    bool marked = (t->bin_words >> k) & 1;
    if (marked != (t->bin_bits[k] != 0)) {
      snprintf(w->msg, w->msg_size,
               "free bitmap: word %zu is %s but its summary bit is %d", k,
               t->bin_bits[k] != 0 ? "not empty" : "empty", (int)marked);
      return false;
    }
  }
  if ((t->bin_words >> (XS_FREETREE_BIN_WORDS - 1) >> 1) != 0) {
    snprintf(w->msg, w->msg_size, "free bitmap: summary bits past the bins");
    return false;
  }
  return true;
}

static bool freetree_check_tree(xs_freetree *t, freetree_walk *w) {
  xs_block *min = RB_MIN(xs_freetree_rb, &t->root);
  if (t->tree_min != min) {
    snprintf(w->msg, w->msg_size, "free tree: cached first %p, minimum %p",
             (void *)t->tree_min, (void *)min);
    return false;
  }
  const xs_block *prev = NULL;
  xs_block *b;
  RB_FOREACH(b, xs_freetree_rb, &t->root) {
    if (xs_freetree_binned(t, b->size)) {
      snprintf(w->msg, w->msg_size,
               "block 0x%llx of %zu bytes is in the free tree, not a bin",
               (unsigned long long)b->addr, b->size);
      return false;
    }
    if (!freetree_check_block(w, prev, b)) return false;
    prev = b;
  }
  return true;
}

bool xs_freetree_is_valid(xs_freetree *t, char *msg, size_t msg_size) {
  freetree_walk w = {.msg = msg, .msg_size = msg_size};
  if (t->bin_limit != (t->bins != NULL ? XS_FREETREE_BIN_MAX : 0) ||
      (t->bins == NULL && t->bin_words != 0)) {
    snprintf(msg, msg_size, "free tree: bins %p, bin limit %zu, bitmap %llx",
             (void *)t->bins, t->bin_limit,
             (unsigned long long)t->bin_words);
    return false;
  }
  if (!freetree_check_words(t, &w)) return false;
  /* Only the bins the bitmap marks are walked (xseg_check runs after
     every operation in debug builds): a block in an unmarked bin shows as
     a count below t->count. */
  for (size_t i = freetree_bin_from(t, 0); i < XS_FREETREE_BINS;
       i = freetree_bin_from(t, i + 1))
    if (!freetree_check_bin(t, i, &w)) return false;
  if (!freetree_check_tree(t, &w)) return false;
  if (w.count != t->count) {
    snprintf(msg, msg_size,
             "free tree holds %zu blocks but counts %zu", w.count,
             t->count);
    return false;
  }
  return true;
}
