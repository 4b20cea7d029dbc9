/* freetree.c: the (size, address)-ordered red-black tree of free blocks,
 * a thin wrapper over BSD sys/tree.h (see freetree.h).
 */
#include <assert.h>
#include <stdio.h>

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

void xs_freetree_init(xs_freetree *t) {
  RB_INIT(&t->root);
  t->count = 0;
  t->bytes = 0;
}

void xs_freetree_insert(xs_freetree *t, xs_block *b) {
  assert(!b->allocated && "only free blocks are indexed");
  xs_block *dup = RB_INSERT(xs_freetree_rb, &t->root, b);
  assert(dup == NULL && "(size, address) is unique: blocks never overlap");
  (void)dup;
  t->count++;
  t->bytes += b->size;
}

void xs_freetree_remove(xs_freetree *t, xs_block *b) {
  assert(t->count > 0 && t->bytes >= b->size);
  RB_REMOVE(xs_freetree_rb, &t->root, b);
  t->count--;
  t->bytes -= b->size;
}

/* Sign of (size, addr) against b's key. */
static int freetree_cmp_key(size_t size, uint64_t addr, const xs_block *b) {
  if (size != b->size) return size < b->size ? -1 : 1;
  if (addr != b->addr) return addr < b->addr ? -1 : 1;
  return 0;
}

bool xs_freetree_fits_at(xs_freetree *t, xs_block *b, size_t size,
                         uint64_t addr) {
  (void)t;
  /* Moving down the order, only the predecessor can be passed; moving up,
     only the successor. */
  int c = freetree_cmp_key(size, addr, b);
  if (c < 0) {
    xs_block *p = RB_PREV(xs_freetree_rb, &t->root, b);
    return p == NULL || freetree_cmp_key(size, addr, p) > 0;
  }
  if (c > 0) {
    xs_block *n = RB_NEXT(xs_freetree_rb, &t->root, b);
    return n == NULL || freetree_cmp_key(size, addr, n) < 0;
  }
  return true;
}

void xs_freetree_replace(xs_freetree *t, xs_block *old, size_t old_size,
                         xs_block *repl) {
  assert(!repl->allocated && "only free blocks are indexed");
  assert(t->bytes >= old_size);
  if (repl != old) {
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
  t->bytes = t->bytes - old_size + repl->size;
}

xs_block *xs_freetree_largest(xs_freetree *t) {
  return RB_MAX(xs_freetree_rb, &t->root);
}

xs_block *xs_freetree_smaller(xs_freetree *t, xs_block *b) {
  (void)t;
  return RB_PREV(xs_freetree_rb, &t->root, b);
}

xs_block *xs_freetree_larger(xs_freetree *t, xs_block *b) {
  (void)t;
  return RB_NEXT(xs_freetree_rb, &t->root, b);
}

bool xs_freetree_is_valid(xs_freetree *t, char *msg, size_t msg_size) {
  size_t count = 0, bytes = 0;
  const xs_block *prev = NULL;
  xs_block *b;
  RB_FOREACH(b, xs_freetree_rb, &t->root) {
    if (prev != NULL && freetree_cmp(prev, b) >= 0) {
      snprintf(msg, msg_size, "free tree out of order at block 0x%llx",
               (unsigned long long)b->addr);
      return false;
    }
    if (b->allocated) {
      snprintf(msg, msg_size, "allocated block 0x%llx is in a free tree",
               (unsigned long long)b->addr);
      return false;
    }
    count++;
    bytes += b->size;
    prev = b;
  }
  if (count != t->count || bytes != t->bytes) {
    snprintf(msg, msg_size,
             "free tree holds %zu blocks / %zu bytes but counts %zu / %zu",
             count, bytes, t->count, t->bytes);
    return false;
  }
  return true;
}
