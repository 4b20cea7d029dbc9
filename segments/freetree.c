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

xs_block *xs_freetree_best_fit(xs_freetree *t, size_t size) {
  xs_block key;
  key.size = size;
  key.addr = 0;
  return RB_NFIND(xs_freetree_rb, &t->root, &key);
}

xs_block *xs_freetree_largest(xs_freetree *t) {
  return RB_MAX(xs_freetree_rb, &t->root);
}

xs_block *xs_freetree_smaller(xs_freetree *t, xs_block *b) {
  (void)t;
  return RB_PREV(xs_freetree_rb, &t->root, b);
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
