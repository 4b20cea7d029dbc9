/* ranges.c: the range table, from an address to the pair that reserved it,
 * for the cached free (see ranges.h).
 *
 * A sorted array of (base, end, pair) searched without a lock. It changes
 * only with every lock held (xs_alloc_leave, when segments were added
 * since it was made) and is rewritten in place under a sequence count
 * (a seqlock): odd while it is written, so a reader that sees an odd count,
 * or a different one after its search, gives up and takes the slow path.
 * Every word is a relaxed atomic, so a reader racing the writer reads old
 * or new values, never a torn one. An array too small is replaced by one
 * twice its size, the old one kept until xseg_destroy (a reader may still
 * be in it): arrays kept add up to at most twice the largest.
 *
 * Segments that go away stay in the table until the next rewrite: the
 * table is a cache, and the pair's own pointer table decides whether an
 * address is live there.
 */
#include <stdlib.h>

#include "alloc/pairs.h"
#include "alloc/ranges.h"
#include "alloc/thread.h"
#include "alloc/types.h"

static size_t ranges_count(const xseg_allocator *a) {
  size_t n = 0;
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (const xs_segment *s = pair->pool[k].segments; s != NULL; s = s->next)
        n++;
  return n;
}

typedef struct ranges_entry {
  uint64_t base, end;
  xs_pair *pair;
} ranges_entry;

static int ranges_cmp(const void *x, const void *y) {
  uint64_t a = ((const ranges_entry *)x)->base;
  uint64_t b = ((const ranges_entry *)y)->base;
  return a < b ? -1 : a > b;
}

/* An array with room for n entries: the current one, or a new one twice
   as large (NULL on host OOM). */
static xs_range_array *ranges_room(xseg_allocator *a, size_t n) {
  xs_range_array *t = atomic_load_explicit(&a->ranges, memory_order_relaxed);
  if (t != NULL && t->cap >= n) return t;
  size_t cap = t != NULL ? 2 * t->cap : 16;
  while (cap < n) cap *= 2;
  xs_range_array *u = calloc(1, sizeof *u + cap * sizeof *u->range);
  if (u == NULL) return NULL;
  u->retired = t;
  u->cap = cap;
  return u;
}

void xs_ranges_remake_locked(xseg_allocator *a) {
  XS_ASSERT_LOCKED(a);
  uint64_t made = a->vmm.reserves;
  size_t n = ranges_count(a);
  ranges_entry *e = n != 0 ? malloc(n * sizeof *e) : NULL;
  if (n != 0 && e == NULL) return;  /* kept as it was: frees it lacks go the
                                       slow way */
  xs_range_array *t = ranges_room(a, n);
  if (t == NULL) {
    free(e);
    return;
  }
  size_t i = 0;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (const xs_segment *s = pair->pool[k].segments; s != NULL; s = s->next)
        e[i++] = (ranges_entry){s->base, s->base + s->size, pair};
  if (n > 1) qsort(e, n, sizeof *e, ranges_cmp);
  unsigned seq = atomic_load_explicit(&a->ranges_seq, memory_order_relaxed);
  atomic_store_explicit(&a->ranges_seq, seq + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&a->ranges, t, memory_order_relaxed);
  for (i = 0; i < n; i++) {
    atomic_store_explicit(&t->range[i].base, e[i].base, memory_order_relaxed);
    atomic_store_explicit(&t->range[i].end, e[i].end, memory_order_relaxed);
    atomic_store_explicit(&t->range[i].pair, e[i].pair, memory_order_relaxed);
  }
  atomic_store_explicit(&a->n_ranges, n, memory_order_relaxed);
  atomic_store_explicit(&a->ranges_seq, seq + 2, memory_order_release);
  a->ranges_made_at = made;
  free(e);
}

xs_pair *xs_ranges_search(xseg_allocator *a, uint64_t addr) {
  unsigned seq = atomic_load_explicit(&a->ranges_seq, memory_order_acquire);
  xs_range_array *t = atomic_load_explicit(&a->ranges, memory_order_relaxed);
  size_t n = atomic_load_explicit(&a->n_ranges, memory_order_relaxed);
  if ((seq & 1) != 0 || t == NULL) return NULL;
  if (n > t->cap) n = t->cap;           /* a new count with an old array */
  /* The last range starting at or below addr. */
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (atomic_load_explicit(&t->range[mid].base, memory_order_relaxed) <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return NULL;
  xs_range *r = &t->range[lo - 1];
  uint64_t base = atomic_load_explicit(&r->base, memory_order_relaxed);
  uint64_t end = atomic_load_explicit(&r->end, memory_order_relaxed);
  xs_pair *pair = atomic_load_explicit(&r->pair, memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&a->ranges_seq, memory_order_relaxed) != seq ||
      addr >= end)
    return NULL;
  /* Remembered for the thread's next free: valid while seq stays. */
  xs_pairs_thread *c = &xs_pairs_tls;
  c->range_id = a->id;
  c->range_seq = seq;
  c->range_base = base;
  c->range_size = end - base;
  c->range_pair = pair;
  return pair;
}

void xs_ranges_destroy(xseg_allocator *a) {
  xs_range_array *t = atomic_load_explicit(&a->ranges, memory_order_relaxed);
  while (t != NULL) {
    xs_range_array *older = t->retired;
    free(t);
    t = older;
  }
  atomic_store_explicit(&a->ranges, NULL, memory_order_relaxed);
}
