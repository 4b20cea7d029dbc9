/* freetree.c: the best-fit index of free blocks: exact-size LIFO bins
 * for sizes up to 1 MiB, segregated size classes above, each a
 * (size, address)-ordered red-black tree (BSD sys/tree.h), all under one
 * two-level bitmap (see freetree.h).
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
  for (size_t c = 0; c < XS_FREETREE_CLASSES; c++)
    RB_INIT(&t->classes[c].root);
  if (bins != NULL) memset(bins, 0, XS_FREETREE_BINS * sizeof *bins);
  t->bins = bins;
  t->bin_limit = bins != NULL ? XS_FREETREE_BIN_MAX : 0;
}

/* Whether a block of this size lives in a bin (else in a class). */
static bool freetree_binned(const xs_freetree *t, size_t size) {
  return size <= t->bin_limit;
}

/* The slot a block of this size lives in: its bin, or its class's slot.
   Inline: every insert and remove asks it. */
static inline __attribute__((always_inline)) size_t freetree_slot(const xs_freetree *t, size_t size) {
  assert(size > 0 && size % XS_FREETREE_BIN_STEP == 0 &&
         "block sizes are exact steps");
  if (freetree_binned(t, size)) return size / XS_FREETREE_BIN_STEP - 1;
  return XS_FREETREE_BINS + xs_freetree_class_of(size / XS_FREETREE_BIN_STEP);
}

static xs_freeclass *freetree_class(xs_freetree *t, size_t slot) {
  assert(slot >= XS_FREETREE_BINS && slot < XS_FREETREE_SLOTS);
  return &t->classes[slot - XS_FREETREE_BINS];
}

/* ---- the bitmap ------------------------------------------------------- */

static void freetree_mark(xs_freetree *t, size_t i) {
  t->bits[i / 64] |= (uint64_t)1 << (i % 64);
  t->words |= (uint64_t)1 << (i / 64);
}

static void freetree_unmark(xs_freetree *t, size_t i) {
  t->bits[i / 64] &= ~((uint64_t)1 << (i % 64));
  if (t->bits[i / 64] == 0) t->words &= ~((uint64_t)1 << (i / 64));
}

/* The last non-empty slot below slot i (i <= XS_FREETREE_SLOTS), or
   XS_FREETREE_SLOTS when there is none. */
static size_t freetree_slot_below(const xs_freetree *t, size_t i) {
  if (i == 0) return XS_FREETREE_SLOTS;
  size_t j = i - 1, w = j / 64;
  uint64_t bits = t->bits[w] & (~(uint64_t)0 >> (63 - j % 64));
  if (bits == 0) {
    uint64_t words = t->words & (((uint64_t)1 << w) - 1);  /* below w */
    if (words == 0) return XS_FREETREE_SLOTS;
    w = 63 - (size_t)__builtin_clzll(words);
    bits = t->bits[w];
  }
  return w * 64 + 63 - (size_t)__builtin_clzll(bits);
}

/* The last block of slot i (not empty) in the order: a bin's oldest, a
   class's largest. */
static xs_block *freetree_last_of(xs_freetree *t, size_t i) {
  if (i < XS_FREETREE_BINS) return t->bins[i].oldest;
  return RB_MAX(xs_freetree_rb, &freetree_class(t, i)->root);
}

/* ---- one bin ---------------------------------------------------------- */

/* b goes first: the newest of its size. */
static void freebin_insert(xs_freetree *t, size_t i, xs_block *b) {
  xs_freebin *bin = &t->bins[i];
  xs_block *head = bin->newest;
  b->bin.newer = NULL;
  b->bin.older = head;
  if (head == NULL) {
    bin->oldest = b;
    freetree_mark(t, i);
  } else {
    head->bin.newer = b;
  }
  bin->newest = b;
}

static void freebin_remove(xs_freetree *t, size_t i, xs_block *b) {
  xs_freebin *bin = &t->bins[i];
  xs_block *newer = b->bin.newer, *older = b->bin.older;
  if (newer == NULL) bin->newest = older; else newer->bin.older = older;
  if (older == NULL) bin->oldest = newer; else older->bin.newer = newer;
  if (bin->newest == NULL) freetree_unmark(t, i);
}

/* ---- one class -------------------------------------------------------- */

static __attribute__((noinline)) void freeclass_insert(xs_freetree *t, size_t i, xs_block *b) {
  xs_freeclass *c = freetree_class(t, i);
  xs_block *dup = RB_INSERT(xs_freetree_rb, &c->root, b);
  assert(dup == NULL && "(size, address) is unique: blocks never overlap");
  (void)dup;
  if (c->first == NULL) {
    c->first = b;
    freetree_mark(t, i);
  } else if (freetree_cmp(b, c->first) < 0) {
    c->first = b;
  }
}

static __attribute__((noinline)) void freeclass_remove(xs_freetree *t, size_t i, xs_block *b) {
  xs_freeclass *c = freetree_class(t, i);
  if (c->first == b) c->first = xs_freetree_rb_RB_NEXT(b);
  RB_REMOVE(xs_freetree_rb, &c->root, b);
  if (c->first == NULL) freetree_unmark(t, i);
}

xs_block *xs_freetree_class_fit(const xs_freetree *t, size_t size) {
  size_t c = xs_freetree_class_of(
      size == 0 ? 0 : (size - 1) / XS_FREETREE_BIN_STEP + 1);
  const xs_freeclass *cls = &t->classes[c];
  /* In the request's own class, the first block when it holds the
     request, else the tree's lower bound of (size, 0), written out as
     RB_NFIND; in any later class, its first block. */
  if (cls->first != NULL && cls->first->size < size) {
    for (xs_block *b = RB_ROOT(&cls->root), *fit = NULL;; ) {
      if (b == NULL) {
        if (fit != NULL) return fit;
        break;
      }
      if (b->size >= size) {
        fit = b;                /* (size, 0) <= b: b fits; look lower */
        b = RB_LEFT(b, link);
      } else {
        b = RB_RIGHT(b, link);
      }
    }
    c++;                        /* none in the class holds it */
  }
  return xs_freetree_first_from(t, XS_FREETREE_BINS + c);
}

/* ---- the index -------------------------------------------------------- */

/* The counts move first, so that a block of a class ends in a tail call:
   the tree's work, out of line, then costs the bins' path no register
   saves. */
void xs_freetree_insert(xs_freetree *t, xs_block *b) {
  assert(!b->allocated && "only free blocks are indexed");
  t->count++;
  t->bytes += b->size;
  if (freetree_binned(t, b->size))
    freebin_insert(t, freetree_slot(t, b->size), b);
  else
    freeclass_insert(t, freetree_slot(t, b->size), b);
}

void xs_freetree_remove(xs_freetree *t, xs_block *b) {
  assert(t->count > 0 && t->bytes >= b->size);
  t->count--;
  t->bytes -= b->size;
  if (freetree_binned(t, b->size))
    freebin_remove(t, freetree_slot(t, b->size), b);
  else
    freeclass_remove(t, freetree_slot(t, b->size), b);
}

/* Sign of (size, addr) against b's key. */
static int freetree_cmp_key(size_t size, uint64_t addr, const xs_block *b) {
  if (size != b->size) return size < b->size ? -1 : 1;
  if (addr != b->addr) return addr < b->addr ? -1 : 1;
  return 0;
}

/* b's neighbours in the order within its own slot: its bin's list (the
   newer one first), or its class's tree. */
static xs_block *freetree_prev_in(const xs_freetree *t, xs_block *b) {
  return freetree_binned(t, b->size) ? b->bin.newer
                                     : xs_freetree_rb_RB_PREV(b);
}

static xs_block *freetree_next_in(const xs_freetree *t, xs_block *b) {
  return freetree_binned(t, b->size) ? b->bin.older
                                     : xs_freetree_rb_RB_NEXT(b);
}

bool xs_freetree_class_fits_at(xs_freetree *t, xs_block *b, size_t size,
                               uint64_t addr) {
  assert(!freetree_binned(t, size) && !freetree_binned(t, b->size));
  assert(size % XS_FREETREE_BIN_STEP == 0);
  /* The same slot: the same class. */
  if (size != b->size &&
      xs_freetree_class_of(size / XS_FREETREE_BIN_STEP) !=
          xs_freetree_class_of(b->size / XS_FREETREE_BIN_STEP))
    return false;
  /* Moving down the order, only the predecessor can be passed; moving up,
     only the successor. */
  int c = freetree_cmp_key(size, addr, b);
  if (c < 0) {
    xs_block *p = freetree_prev_in(t, b);
    return p == NULL || freetree_cmp_key(size, addr, p) > 0;
  }
  if (c > 0) {
    xs_block *n = freetree_next_in(t, b);
    return n == NULL || freetree_cmp_key(size, addr, n) < 0;
  }
  return true;
}

void xs_freetree_replace(xs_freetree *t, xs_block *old, size_t old_size,
                         xs_block *repl) {
  assert(!repl->allocated && "only free blocks are indexed");
  assert(t->bytes >= old_size);
  size_t i = freetree_slot(t, old_size);
  assert(i == freetree_slot(t, repl->size) &&
         "xs_freetree_fits_at said so: the same bin, or the same class");
  if (repl != old && i < XS_FREETREE_BINS) {
    xs_freebin *bin = &t->bins[i];
    xs_block *newer = old->bin.newer, *older = old->bin.older;
    repl->bin = old->bin;
    if (newer == NULL) bin->newest = repl; else newer->bin.older = repl;
    if (older == NULL) bin->oldest = repl; else older->bin.newer = repl;
  } else if (repl != old) {
    xs_freeclass *c = freetree_class(t, i);
    if (c->first == old) c->first = repl;
    repl->link = old->link;
    xs_block *parent = RB_PARENT(old, link);
    if (parent == NULL)
      RB_ROOT(&c->root) = repl;
    else if (RB_LEFT(parent, link) == old)
      RB_LEFT(parent, link) = repl;
    else
      RB_RIGHT(parent, link) = repl;
    if (RB_LEFT(old, link) != NULL) RB_PARENT(RB_LEFT(old, link), link) = repl;
    if (RB_RIGHT(old, link) != NULL)
      RB_PARENT(RB_RIGHT(old, link), link) = repl;
  }
  t->bytes = t->bytes - old_size + repl->size;
}

xs_block *xs_freetree_largest(xs_freetree *t) {
  size_t i = freetree_slot_below(t, XS_FREETREE_SLOTS);
  return i < XS_FREETREE_SLOTS ? freetree_last_of(t, i) : NULL;
}

xs_block *xs_freetree_smaller(xs_freetree *t, xs_block *b) {
  xs_block *p = freetree_prev_in(t, b);
  if (p != NULL) return p;
  size_t i = freetree_slot_below(t, freetree_slot(t, b->size));
  return i < XS_FREETREE_SLOTS ? freetree_last_of(t, i) : NULL;
}

xs_block *xs_freetree_larger(xs_freetree *t, xs_block *b) {
  xs_block *n = freetree_next_in(t, b);
  if (n != NULL) return n;
  return xs_freetree_first_from(t, freetree_slot(t, b->size) + 1);
}

/* ---- the validator ---------------------------------------------------- */

typedef struct freetree_walk {
  size_t count, bytes;
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
  w->bytes += b->size;
  return true;
}

static bool freetree_check_bin(xs_freetree *t, size_t i, freetree_walk *w) {
  xs_freebin *bin = &t->bins[i];
  bool marked = (t->bits[i / 64] >> (i % 64)) & 1;
  if ((bin->newest == NULL) != (bin->oldest == NULL) ||
      marked != (bin->newest != NULL)) {
    snprintf(w->msg, w->msg_size,
             "free bin %zu: newest %p, oldest %p, bitmap bit %d", i,
             (void *)bin->newest, (void *)bin->oldest, (int)marked);
    return false;
  }
  const xs_block *newer = NULL;
  for (xs_block *b = bin->newest; b != NULL; newer = b, b = b->bin.older) {
    if (b->bin.newer != newer || (b->bin.older == NULL && b != bin->oldest)) {
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
  for (size_t k = 0; k < XS_FREETREE_WORDS; k++) {
    bool marked = (t->words >> k) & 1;
    if (marked != (t->bits[k] != 0)) {
      snprintf(w->msg, w->msg_size,
               "free bitmap: word %zu is %s but its summary bit is %d", k,
               t->bits[k] != 0 ? "not empty" : "empty", (int)marked);
      return false;
    }
  }
  if ((t->words >> (XS_FREETREE_WORDS - 1) >> 1) != 0 ||
      (t->bits[XS_FREETREE_WORDS - 1] >> (XS_FREETREE_SLOTS % 64)) != 0) {
    snprintf(w->msg, w->msg_size, "free bitmap: bits past the slots");
    return false;
  }
  return true;
}

/* Class slot i: its bit, its cached first block, and its tree's blocks,
   each of the class's sizes, in order. */
static bool freetree_check_class(xs_freetree *t, size_t i, freetree_walk *w) {
  xs_freeclass *c = freetree_class(t, i);
  bool marked = (t->bits[i / 64] >> (i % 64)) & 1;
  xs_block *min = RB_MIN(xs_freetree_rb, &c->root);
  if (c->first != min || marked != (min != NULL)) {
    snprintf(w->msg, w->msg_size,
             "free class %zu: cached first %p, minimum %p, bitmap bit %d",
             i - XS_FREETREE_BINS, (void *)c->first, (void *)min,
             (int)marked);
    return false;
  }
  const xs_block *prev = NULL;
  xs_block *b;
  RB_FOREACH(b, xs_freetree_rb, &c->root) {
    if (b->size == 0 || b->size % XS_FREETREE_BIN_STEP != 0 ||
        freetree_slot(t, b->size) != i) {
      snprintf(w->msg, w->msg_size,
               "block 0x%llx of %zu bytes is in free class %zu, not its own",
               (unsigned long long)b->addr, b->size, i - XS_FREETREE_BINS);
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
      (t->bins == NULL &&
       xs_freetree_slot_from(t, 0) < XS_FREETREE_BINS)) {
    snprintf(msg, msg_size, "free tree: bins %p, bin limit %zu, bitmap %llx",
             (void *)t->bins, t->bin_limit, (unsigned long long)t->words);
    return false;
  }
  if (!freetree_check_words(t, &w)) return false;
  /* Only the bins the bitmap marks are walked (xseg_check runs after
     every operation in debug builds): a block in an unmarked bin shows as
     a count below t->count. Every class is looked at: its bit against its
     tree. */
  for (size_t i = xs_freetree_slot_from(t, 0); i < XS_FREETREE_BINS;
       i = xs_freetree_slot_from(t, i + 1))
    if (!freetree_check_bin(t, i, &w)) return false;
  for (size_t i = XS_FREETREE_BINS; i < XS_FREETREE_SLOTS; i++)
    if (!freetree_check_class(t, i, &w)) return false;
  if (w.count != t->count || w.bytes != t->bytes) {
    snprintf(msg, msg_size,
             "free tree holds %zu blocks / %zu bytes but counts %zu / %zu",
             w.count, w.bytes, t->count, t->bytes);
    return false;
  }
  return true;
}
