/* Differential test: random malloc/free against a brute-force reference
   model of best fit, split and merge. The model keeps its own list of every
   block (address, size, state) and predicts, for each malloc that a cached
   block can serve, exactly which address comes back (smallest fitting free
   mapped block of the pool; among equals the one freed last in the small
   pool's bins, sizes up to 1 MiB, else the lowest address) and how the
   block splits; for each free, how the neighbours merge. After every
   operation the model and the allocator's own blocks must be identical.
   Growth and empty_cache are the allocator's to decide: the model copies
   the result, and the order of its bins then. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/policy.h"
#include "alloc/types.h"
#include "alloc_helpers.h"

typedef struct mblock {
  uint64_t addr, seg;
  uint64_t stamp;               /* free: when it was last indexed */
  size_t size, requested;
  int kind;
  bool allocated, mapped;
} mblock;

typedef struct model {
  mblock *b;
  size_t n, cap;
  uint64_t clock;               /* the last stamp given */
} model;

/* Whether free blocks of this size sit in a LIFO bin: both pools' of up
   to 1 MiB (a large request never takes one). */
static bool model_binned(size_t size) {
  return size <= XS_FREETREE_BIN_MAX;
}

/* Free block b's stamp as the allocator's bin order has it: the number
   of older blocks in its bin on top of m's clock (a run of parked
   blocks, merged when settled, goes first: above every bin). */
static uint64_t model_stamp_of(const model *m, const xs_pool *p,
                               const xs_block *b) {
  if (b == p->parked) return m->clock + (1u << 20);
  if (b->allocated || !b->mapped || !model_binned(b->size)) return 0;
  uint64_t older = 0;
  for (const xs_block *o = b->bin.older; o != NULL; o = o->bin.older) older++;
  return m->clock + 1 + older;
}

static int mblock_cmp(const void *x, const void *y) {
  uint64_t a = ((const mblock *)x)->addr, b = ((const mblock *)y)->addr;
  return a < b ? -1 : a > b;
}

/* The allocator's blocks, sorted by address. */
static void model_read(xseg_allocator *a, model *m) {
  m->n = 0;
  for (xs_pair *pair = a->streams; pair; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (xs_segment *s = pair->pool[k].segments; s; s = s->next)
        for (xs_block *b = s->first; b; b = b->next) {
          if (m->n == m->cap) {
            m->cap = m->cap ? m->cap * 2 : 256;
            m->b = realloc(m->b, m->cap * sizeof *m->b);
          }
          m->b[m->n++] = (mblock){b->addr, s->base,
                                  model_stamp_of(m, &pair->pool[k], b),
                                  b->size, b->requested, k, b->allocated,
                                  b->mapped};
          /* A run of parked blocks (lazy merging) is its merge with
             the rest: free (a parked block keeps its requested size
             while its stats are held back). */
          if (b == pair->pool[k].parked)
            do {
              m->b[m->n - 1].requested = 0;
              b = b->next;
              m->b[m->n - 1].size += b->size;
            } while (b != pair->pool[k].park_rest);
        }
  qsort(m->b, m->n, sizeof *m->b, mblock_cmp);
  m->clock += (1u << 20) + 1;   /* past every stamp just given */
}

static bool model_equal(const model *x, const model *y) {
  if (x->n != y->n) return false;
  for (size_t i = 0; i < x->n; i++)
    if (x->b[i].addr != y->b[i].addr || x->b[i].seg != y->b[i].seg ||
        x->b[i].size != y->b[i].size ||
        x->b[i].requested != y->b[i].requested ||
        x->b[i].kind != y->b[i].kind ||
        x->b[i].allocated != y->b[i].allocated ||
        x->b[i].mapped != y->b[i].mapped)
      return false;
  return true;
}

/* Brute-force best fit; -1 when no cached block fits. */
static long model_best_fit(const model *m, int kind, size_t rounded) {
  long best = -1;
  for (size_t i = 0; i < m->n; i++) {
    const mblock *b = &m->b[i];
    if (b->kind != kind || b->allocated || !b->mapped || b->size < rounded)
      continue;
    if (best < 0 || b->size < m->b[best].size ||
        (b->size == m->b[best].size && model_binned(b->size) &&
         b->stamp > m->b[best].stamp))
      best = (long)i;
  }
  return best;   /* scanning in address order keeps the lowest on ties */
}

static void model_insert(model *m, size_t at, mblock b) {
  if (m->n == m->cap) {
    m->cap = m->cap ? m->cap * 2 : 256;
    m->b = realloc(m->b, m->cap * sizeof *m->b);
  }
  memmove(&m->b[at + 1], &m->b[at], (m->n - at) * sizeof *m->b);
  m->b[at] = b;
  m->n++;
}

static void model_take(model *m, long i, size_t rounded, size_t requested) {
  mblock *b = &m->b[i];
  if (b->size - rounded >= 512) {   /* expandable: split off >= 512 */
    mblock rest = *b;
    rest.addr += rounded;
    rest.size -= rounded;
    rest.stamp = ++m->clock;
    b->size = rounded;
    model_insert(m, (size_t)i + 1, rest);
    b = &m->b[i];
  }
  b->allocated = true;
  b->requested = requested;
}

static bool model_mergeable(const mblock *x, const mblock *y) {
  return x->seg == y->seg && !x->allocated && !y->allocated &&
         x->mapped == y->mapped && x->addr + x->size == y->addr;
}

static void model_free(model *m, uint64_t addr) {
  size_t i = 0;
  while (m->b[i].addr != addr) i++;
  m->b[i].allocated = false;
  m->b[i].requested = 0;
  m->b[i].stamp = ++m->clock;
  if (i + 1 < m->n && model_mergeable(&m->b[i], &m->b[i + 1])) {
    m->b[i].size += m->b[i + 1].size;
    memmove(&m->b[i + 1], &m->b[i + 2], (m->n - i - 2) * sizeof *m->b);
    m->n--;
  }
  if (i > 0 && model_mergeable(&m->b[i - 1], &m->b[i])) {
    m->b[i - 1].size += m->b[i].size;
    m->b[i - 1].stamp = m->b[i].stamp;
    memmove(&m->b[i], &m->b[i + 1], (m->n - i - 1) * sizeof *m->b);
    m->n--;
  }
}

static size_t diff_size(uint64_t *seed) {
  uint64_t r = at_rand(seed);
  switch (r % 4) {
    case 0: return (size_t)(r >> 8) % 4096;
    case 1: return (size_t)(r >> 8) % (1 << 20);
    case 2: return (size_t)(r >> 8) % (8 * MiB);
    default: return 512 * (1 + (size_t)(r >> 8) % 16);  /* repeats */
  }
}

static void diff_run(uint64_t seed, int ops, const char *conf) {
  xseg_allocator *a = at_create(conf);
  model m = {0}, now = {0};
  enum { SLOTS = 300 };
  void *live[SLOTS] = {0};
  int mismatches = 0, predicted = 0;
  for (int op = 0; op < ops && mismatches == 0; op++) {
    int i = (int)(at_rand(&seed) % SLOTS);
    if (op % 997 == 996) {
      XSEG_ASSERT_OK(xseg_empty_cache(a));
      model_read(a, &m);
      continue;
    }
    if (live[i] != NULL) {
      XSEG_ASSERT_OK(xseg_free(a, live[i]));
      model_free(&m, (uint64_t)(uintptr_t)live[i]);
      XSEG_EXPECT_STATUS(xseg_free(a, live[i]), XSEG_ERR_UNKNOWN_POINTER);
      live[i] = NULL;
    } else {
      size_t size = diff_size(&seed);
      size_t rounded = xs_config_round_size(&a->cfg, size);
      long fit = model_best_fit(&m, xs_alloc_kind(rounded), rounded);
      XSEG_ASSERT_OK(xseg_malloc(a, size, NULL, &live[i]));
      if (fit >= 0) {
        predicted++;
        if ((uint64_t)(uintptr_t)live[i] != m.b[fit].addr) {
          XSEG_FAIL("op %d: malloc(%zu) gave %p, best fit is 0x%llx", op,
                    size, live[i], (unsigned long long)m.b[fit].addr);
          mismatches++;
        }
        model_take(&m, fit, rounded, size);
      } else {
        model_read(a, &m);   /* growth: the allocator's choice */
      }
    }
    model_read(a, &now);
    if (!model_equal(&m, &now)) {
      XSEG_FAIL("op %d: the allocator's blocks differ from the model", op);
      mismatches++;
    }
  }
  XSEG_EXPECT_GT(predicted, ops / 4);
  XSEG_EXPECT_OK(xseg_check(a));
  for (int i = 0; i < SLOTS; i++)
    if (live[i] != NULL) XSEG_EXPECT_OK(xseg_free(a, live[i]));
  free(m.b);
  free(now.b);
  xseg_destroy(a);
}

XSEG_TEST(alloc_diff, best_fit_split_merge_match_the_model) {
  diff_run(11, 20000, NULL);
}

XSEG_TEST(alloc_diff, small_reservations_and_many_segments) {
  diff_run(23, 10000, "xseg_reserve_mb:16");
}
