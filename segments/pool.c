/* pool.c: one (stream, size class) pool: the cached path (take a fitting
 * free block, give it back and merge), segments coming and going, and where
 * and how growth maps new granules.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "segments/pool.h"
#include "vmm/error.h"

void xs_pool_init(xs_pool *p, xs_pool_kind kind, struct CUstream_st *stream,
                  xs_vmm *vmm, xs_blocks *blocks, xs_stats *stats,
                  xs_freebin *free_bins) {
  memset(p, 0, sizeof *p);
  xs_freetree_init(&p->free, free_bins);
  xs_freetree_init(&p->unmapped, NULL);
  p->kind = kind;
  p->stream = stream;
  p->vmm = vmm;
  p->blocks = blocks;
  p->stats = stats;
  p->safe_epoch = UINT64_MAX;
  p->counts_split = true;
}

/* inactive_split of a free mapped block (xs_pool_split_stat); unmapped
   blocks count nothing. */
static inline __attribute__((always_inline)) void pool_split_stat(
    xs_pool *p, const xs_block *b, int sign) {
  if (!b->mapped) return;
  /* The kind a constant in each copy: the stats' offsets fold. */
  if (p->kind == XS_POOL_SMALL)
    xs_pool_split_stat(p, p->stats, XS_POOL_SMALL, b, sign);
  else
    xs_pool_split_stat(p, p->stats, XS_POOL_LARGE, b, sign);
}

/* The index of b's mapped state. */
static xs_freetree *pool_tree(xs_pool *p, const xs_block *b) {
  return b->mapped ? &p->free : &p->unmapped;
}

/* What inactive_split_bytes counts for b of pool p as it is now (0:
   nothing). */
static size_t pool_split_bytes(const xs_pool *p, const xs_block *b) {
  return p->counts_split && b->mapped && xs_block_is_split(b) ? b->size : 0;
}

static inline __attribute__((always_inline)) void pool_split_move(
    xs_pool *p, int64_t out_n, size_t out, int64_t in_n, size_t in) {
  if (!p->counts_split) return;
  /* The kind a constant in each copy: the stats' offsets fold. */
  if (p->kind == XS_POOL_SMALL)
    xs_pool_split_move(p->stats, XS_POOL_SMALL, out_n, out, in_n, in);
  else
    xs_pool_split_move(p->stats, XS_POOL_LARGE, out_n, out, in_n, in);
}

/* xs_pool_index and _unindex, inline in the take and the coalesce. */
static inline __attribute__((always_inline)) void pool_index(xs_pool *p,
                                                             xs_block *b) {
  xs_pool_trees_changed(p);
  xs_freetree_insert(b->mapped ? &p->free : &p->unmapped, b);
  pool_split_stat(p, b, +1);
}
static inline __attribute__((always_inline)) void pool_unindex(xs_pool *p,
                                                               xs_block *b) {
  xs_pool_trees_changed(p);
  xs_freetree_remove(b->mapped ? &p->free : &p->unmapped, b);
  pool_split_stat(p, b, -1);
}

void xs_pool_index(xs_pool *p, xs_block *b) { pool_index(p, b); }

void xs_pool_unindex(xs_pool *p, xs_block *b) { pool_unindex(p, b); }

void xs_pool_take(xs_pool *p, xs_block *b, size_t size, bool split) {
  assert(!b->allocated && b->mapped && b->size >= size);
  /* The kind a constant in each copy: the stats' offsets fold. */
  if (split && b->size > size)
    p->kind == XS_POOL_SMALL
        ? xs_pool_take_front(p, p->stats, XS_POOL_SMALL, b, size)
        : xs_pool_take_front(p, p->stats, XS_POOL_LARGE, b, size);
  else
    pool_unindex(p, b);
  b->allocated = true;
}

static bool pool_mergeable(const xs_block *a, const xs_block *b) {
  return a != NULL && b != NULL && !a->allocated && !b->allocated &&
         a->mapped == b->mapped;
}

/* The split bytes of a free block leaving the index for a merge, added
   to a pool_split_move's `out`. */
static inline void pool_merge_out(const xs_pool *p, const xs_block *b,
                                  int64_t *out_n, size_t *out) {
  size_t bytes = pool_split_bytes(p, b);
  *out_n += bytes != 0;
  *out += bytes;
}

/* xs_pool_coalesce, inline in the give. The stats move once for the
   blocks merged and the block indexed (pool_split_move). */
static inline __attribute__((always_inline)) xs_block *pool_coalesce(
    xs_pool *p, xs_block *b) {
  /* Merges go out of the tree and back in, never in place: measured, a
     merged block taking its neighbour's node (as xs_pool_take_front does)
     saves nothing on a repeated size and costs ~600 instructions per pair
     with 10^6 blocks live (bench/callgrind.sh random 1000000). */
  unsigned merges = 0;
  int64_t out_n = 0;
  size_t out = 0;
  if (pool_mergeable(b->prev, b)) {
    merges |= XS_MERGE_PREV;
    pool_merge_out(p, b->prev, &out_n, &out);
  }
  if (pool_mergeable(b, b->next)) {
    merges |= XS_MERGE_NEXT;
    pool_merge_out(p, b->next, &out_n, &out);
  }
  xs_pool_trees_changed(p);
  b = xs_pool_absorb(p, pool_tree(p, b), b, merges);
  size_t in = pool_split_bytes(p, b);
  pool_split_move(p, out_n, out, in != 0, in);
  return b;
}

xs_block *xs_pool_coalesce(xs_pool *p, xs_block *b) {
  return pool_coalesce(p, b);
}

xs_block *xs_pool_give(xs_pool *p, xs_block *b) {
  assert(b->allocated && b->mapped && "only live blocks are freed");
  b->allocated = false;
  b->requested = 0;
  return pool_coalesce(p, b);
}

xs_block *xs_pool_settle(xs_pool *p) {
  xs_block *b = p->parked, *rest = p->park_rest;
  assert(b != NULL && !b->allocated && !rest->allocated && rest->mapped);
  p->parked = NULL;
  p->park_skip = XS_PARK_SKIP;          /* settled untaken */
  xs_pool_trees_changed(p);
  /* xs_pool_coalesce's merges, their stats moved by xs_pool_park_stats
     at each park. */
  xs_freetree_remove(&p->free, rest);
  xs_block *last;
  do {
    last = xs_segment_absorb_next(b->seg, b);
    xs_blocks_put(p->blocks, last);
  } while (last != rest);
  xs_freetree_insert(&p->free, b);
  return b;
}

/* Whether the merged block that p's run settles into is the best fit
   for `size`: the merged block (indexed at the last park, so the newest
   of its size) against the best fit among the other free blocks, which
   is the real best fit unless that is the rest, and then the one after
   it. */
static bool pool_merged_fits(xs_pool *p, size_t size) {
  xs_block *b = p->parked, *rest = p->park_rest;
  assert(b != NULL && !b->allocated && !rest->allocated && rest->mapped);
  /* The rest alone indexed (a layer's usual case): no other block. */
  if (p->free.count == 1) return true;
  xs_block *other = xs_freetree_best_fit(&p->free, size);
  if (other == rest) other = xs_freetree_larger(&p->free, rest);
  return other == NULL ||
         xs_freetree_before(&p->free, (size_t)(xs_block_end(rest) - b->addr),
                            b->addr, other);
}

bool xs_pool_retake_fits_among(xs_pool *p) {
  xs_block *b = p->parked, *rest = p->park_rest;
  if (!pool_merged_fits(p, b->size)) return false;
  /* The top alone: the split then indexes the rest anew. In a bin it goes
     first, so a rest that is not its bin's newest would sit elsewhere
     than where the retake leaves it. (Deeper in the run, what follows
     the top settles later, reindexed as the split would have: nothing
     else touches the trees before.) */
  if (b->next == rest &&
      !xs_freetree_fits_at(&p->free, rest, rest->size, rest->addr))
    return false;
  xs_pool_retake_fits_found(p);
  return true;
}

static xs_segment *pool_segment_new(size_t size, size_t granule) {
  xs_segment *s = xs_lines_alloc(sizeof *s);
  if (s == NULL) return NULL;
  memset(s, 0, sizeof *s);
  s->size = size;
  s->granule = granule;
  s->n_granules = size / granule;
  if (!xs_segment_alloc_page_map(s, s->n_granules)) {
    free(s);
    return NULL;
  }
  return s;
}

static void pool_segment_free(xs_segment *s) {
  xs_segment_free_page_map(s);
  free(s);
}

xseg_status xs_pool_add_segment(xs_pool *p, size_t size, size_t granule,
                                xs_segment **out) {
  assert(size % granule == 0 && granule % p->vmm->granularity == 0);
  xs_segment *s = pool_segment_new(size, granule);
  xs_block *b = xs_blocks_get(p->blocks);
  if (s == NULL || b == NULL) {
    if (s != NULL) pool_segment_free(s);
    if (b != NULL) xs_blocks_put(p->blocks, b);
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for a segment of %zu bytes", size);
  }
  xseg_status st = xs_vmm_reserve(p->vmm, size, &s->base);
  if (st != XSEG_OK) {
    pool_segment_free(s);
    xs_blocks_put(p->blocks, b);
    return st;
  }
  *b = (xs_block){.addr = s->base, .size = size, .seg = s,
                  .stream = p->stream};
  s->first = s->last = b;
  s->pool = p;
  s->counts_split = p->counts_split;
  s->next = p->segments;
  p->segments = s;
  xs_pool_index(p, b);
  xs_stats_move(p->stats, XS_GAUGE_segment, p->kind, +1);
  *out = s;
  return XSEG_OK;
}

xseg_status xs_pool_drop_segment(xs_pool *p, xs_segment *s) {
  assert(s->first == s->last && !s->first->mapped && !s->first->allocated &&
         s->mapped_granules == 0 && s->alias_granules == 0);
  xseg_status st = xs_vmm_unreserve(p->vmm, s->base, s->size);
  if (st != XSEG_OK) return st;   /* keep it: it is still reserved */
  xs_pool_unindex(p, s->first);
  xs_blocks_put(p->blocks, s->first);
  xs_segment **link = &p->segments;
  while (*link != s) link = &(*link)->next;
  *link = s->next;
  pool_segment_free(s);
  xs_stats_move(p->stats, XS_GAUGE_segment, p->kind, -1);
  return XSEG_OK;
}

/* The placement in unmapped block u for `size` bytes, if it has room. */
static bool pool_place_in(xs_block *u, size_t size, xs_place *out) {
  size_t g = u->seg->granule;
  /* The free block below the hole merges with the new space whatever its
     size, so it must never be harvested meanwhile (harvesting it could
     merge the hole away); it only counts towards the size when it is
     smaller than the request. */
  xs_block *keep = u->prev;
  if (keep != NULL && keep->allocated) keep = NULL;
  size_t have = keep != NULL && keep->size < size ? keep->size : 0;
  size_t n = (size - have + g - 1) / g;
  if (n * g > u->size) return false;
  *out = (xs_place){.seg = u->seg, .hole = u, .keep = keep, .n = n};
  return true;
}

bool xs_pool_place(xs_pool *p, size_t size, xs_place *out) {
  xs_place hole, tail;
  bool have_hole = false, have_tail = false;
  xs_block *u = xs_freetree_best_fit(&p->unmapped, size);
  if (u != NULL) have_hole = pool_place_in(u, size, &hole);
  /* The end of the newest segment: a free block touching the mapped end
     means only the missing granules are mapped. */
  xs_segment *s = p->segments;
  if (s != NULL && !s->last->mapped)
    have_tail = pool_place_in(s->last, size, &tail);
  if (have_tail && (!have_hole || tail.n < hole.n)) hole = tail, have_hole = true;
  if (have_hole) *out = hole;
  return have_hole;
}

xseg_status xs_pool_map(xs_pool *p, const xs_place *pl,
                        const uint64_t *handles, xs_block **out) {
  xs_block *u = pl->hole;
  size_t len = pl->n * pl->seg->granule;
  assert(!u->mapped && u->size >= len && pl->n > 0);
  /* Get the struct first: after the driver calls nothing may fail. */
  xs_block *spare = len < u->size ? xs_blocks_get(p->blocks) : NULL;
  if (len < u->size && spare == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory for a block");
  xseg_status st =
      xs_vmm_map_handles(p->vmm, u->addr, pl->seg->granule, pl->n, handles);
  if (st != XSEG_OK) {
    if (spare != NULL) xs_blocks_put(p->blocks, spare);
    return st;
  }
  xs_pool_unindex(p, u);
  if (spare != NULL) xs_pool_index(p, xs_segment_split(pl->seg, u, len, spare));
  u->mapped = true;
  u->free_epoch = 0;            /* fresh memory: no stream has used it */
  xs_segment_record_map(pl->seg, u->addr, pl->n, handles);
  xs_stats_move(p->stats, XS_GAUGE_reserved_bytes, p->kind, (int64_t)len);
  *out = xs_pool_coalesce(p, u);
  return XSEG_OK;
}
