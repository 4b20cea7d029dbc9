/* ptrtable.c: growth, deletion and validation of the pointer table (see
 * ptrtable.h; add, find and removal are inline for the cached path).
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/ptrtable.h"

/* The table starts at 2^12 slots and holds at most a quarter of its slots
   (ptrtable.h). */
enum { XS_PTRTABLE_INITIAL_BITS = 12, XS_PTRTABLE_LOAD_BITS = 2 };

static bool ptrtable_alloc(xs_ptrtable *t, unsigned bits) {
  /* On lines of its own: the cached path writes it (segments/block.h). */
  size_t n = (size_t)1 << bits;
  if (n > SIZE_MAX / sizeof(xs_ptrtable_slot)) return false;
  size_t bytes = n * sizeof(xs_ptrtable_slot);
  xs_ptrtable_slot *s = xs_lines_alloc(bytes);
  if (s == NULL) return false;
  memset(s, 0, bytes);
  *t = (xs_ptrtable){.slot = s, .mask = ((size_t)1 << bits) - 1,
                     .count = 0,
                     .limit = (size_t)1 << (bits - XS_PTRTABLE_LOAD_BITS),
                     .shift = 64 - bits};
  return true;
}

bool xs_ptrtable_init(xs_ptrtable *t) {
  return ptrtable_alloc(t, XS_PTRTABLE_INITIAL_BITS);
}

void xs_ptrtable_destroy(xs_ptrtable *t) {
  free(t->slot);
  *t = (xs_ptrtable){.slot = NULL};
}

bool xs_ptrtable_grow(xs_ptrtable *t) {
  xs_ptrtable bigger;
  if (!ptrtable_alloc(&bigger, 64 - t->shift + 1)) return false;
  for (size_t i = 0; i <= t->mask; i++)
    if (t->slot[i].addr != 0) xs_ptrtable_add(&bigger, t->slot[i].block);
  assert(bigger.count == t->count);
  free(t->slot);
  *t = bigger;
  return true;
}

bool xs_ptrtable_is_valid(const xs_ptrtable *t, char *msg, size_t msg_size) {
  size_t n = 0;
  for (size_t i = 0; i <= t->mask; i++) {
    const xs_ptrtable_slot *s = &t->slot[i];
    if (s->addr == 0) continue;
    n++;
    if (s->block == NULL || s->block->addr != s->addr ||
        xs_ptrtable_find(t, s->addr) != i) {
      snprintf(msg, msg_size, "pointer table slot %zu (0x%llx) is not "
               "reachable or names another block", i,
               (unsigned long long)s->addr);
      return false;
    }
  }
  if (n != t->count || t->limit != (t->mask + 1) >> XS_PTRTABLE_LOAD_BITS ||
      t->count > t->limit) {
    snprintf(msg, msg_size, "pointer table holds %zu entries, counts %zu "
             "(capacity %zu, limit %zu)", n, t->count, t->mask + 1, t->limit);
    return false;
  }
  return true;
}
