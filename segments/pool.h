/* pool.h: the blocks of one (stream, size class): PyTorch's BlockPool.
 *
 * A pool owns its segments and two best-fit trees: free mapped blocks (the
 * cached path: a fit costs no driver call) and unmapped blocks (holes left
 * by page-granular release, and each segment's unmapped tail, where growth
 * maps new granules). All functions expect the pool's pair lock held (the
 * cached path) or every lock of the allocator (alloc/pairs.c); those that
 * call the driver expect the device's context current.
 */
#ifndef XS_SEGMENTS_POOL_H
#define XS_SEGMENTS_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include <assert.h>

#include "segments/block.h"
#include "segments/freetree.h"
#include "segments/segment.h"
#include "segments/stats.h"
#include "vmm/vmm.h"

struct xs_pool;
/* Told of every range release.c unmaps (the allocator's segment_unmap
   trace); NULL: nobody listens. */
typedef void (*xs_pool_unmap_fn)(void *ctx, const struct xs_pool *p,
                                 uint64_t addr, size_t size);

typedef struct xs_pool {
  xs_freetree free;             /* free mapped blocks */
  xs_freetree unmapped;         /* unmapped blocks (all free) */
  xs_segment *segments;         /* newest first */
  xs_pool_kind kind;
  struct CUstream_st *stream;
  xs_vmm *vmm;
  xs_blocks *blocks;            /* the allocator's block struct cache */
  xs_stats *stats;              /* the allocator's stats */
  /* Free blocks stamped at or below it (xs_block.free_epoch) are past the
     work queued on the stream before their free, and only they may be
     unmapped (streams/guard.h keeps it). UINT64_MAX after xs_pool_init:
     a pool used without the streams layer trusts every free block. */
  uint64_t safe_epoch;
  xs_pool_unmap_fn on_unmap;
  void *on_unmap_ctx;
  /* Retiring blocks (lent aliases waiting for the guard; release.c),
     chained through retire_next. */
  xs_block *retiring;
  size_t n_retiring;
  xs_block *parked;             /* freed, not merged yet (lazy merging) */
  /* The parked block last found to be the best fit once merged (and
     taken by the allocator's policy; xs_pool_retake_fits), while neither tree
     has changed since: the retake then needs no tree walk. Every change
     of either tree clears it (xs_pool_trees_changed). */
  xs_block *retake_known;
  /* Whether the block retake_known merges into is a piece of a larger
     range (xs_pool_parked_merge_split), found with it: the neighbours
     that decide it change only through a tree too. */
  bool retake_piece;
} xs_pool;

/* `free_bins`: the bins of the index of free mapped blocks (freetree.h),
   kept by the caller as long as the pool, or NULL for none. */
void xs_pool_init(xs_pool *p, xs_pool_kind kind, struct CUstream_st *stream,
                  xs_vmm *vmm, xs_blocks *blocks, xs_stats *stats,
                  xs_freebin *free_bins);

/* Puts a free block in the tree of its mapped state / takes it out,
   keeping the inactive_split stats. */
void xs_pool_index(xs_pool *p, xs_block *b);
void xs_pool_unindex(xs_pool *p, xs_block *b);

/* Allocates `size` bytes from the front of free mapped block b, splitting
   off the rest when `split` (the rest goes back to the free tree). */
void xs_pool_take(xs_pool *p, xs_block *b, size_t size, bool split);
/* Frees an allocated block: merges it with free neighbours of the same
   mapped state and indexes the result, which is returned. */
xs_block *xs_pool_give(xs_pool *p, xs_block *b);

/* Which neighbours live block b's give would merge it with: free ones of
   its mapped state (a live block is mapped). */
enum { XS_MERGE_PREV = 1, XS_MERGE_NEXT = 2 };
static inline unsigned xs_pool_merges(const xs_block *b) {
  const xs_block *prev = b->prev, *next = b->next;
  assert(b->mapped);
  return (prev != NULL && !prev->allocated && prev->mapped ? XS_MERGE_PREV
                                                          : 0) |
         (next != NULL && !next->allocated && next->mapped ? XS_MERGE_NEXT
                                                          : 0);
}

/* Any change of a tree may change which block is the best fit: the
   retake known before is known no more. */
static inline void xs_pool_trees_changed(xs_pool *p) {
  p->retake_known = NULL;
}

/* The take and the give in the cached path's common shapes, inline there
   (its frame is paid for already; out of line, each cost a frame of its
   own): a take of a whole free mapped block, and the give of a block that
   merges with nothing. They move the same as xs_pool_take and
   xs_pool_give. `s` and `kind` are p's stats and kind, given apart so that
   a caller that knows where they are folds the offsets. */

/* inactive_split of free mapped block b as it enters (+1) or leaves (-1)
   the index: its is_split can change only while it is out (a neighbour
   merged into it, or a split), so both see the same value. */
static inline __attribute__((always_inline)) void xs_pool_split_stat(
    xs_stats *s, xs_pool_kind kind, const xs_block *b, int sign) {
  if (!xs_block_is_split(b)) return;
  /* By the sign, a constant where inlined: the size's sign is not. */
  if (sign > 0) {
    xs_stats_inc(s, XS_GAUGE_inactive_split, kind, 1);
    xs_stats_inc(s, XS_GAUGE_inactive_split_bytes, kind, (int64_t)b->size);
  } else {
    xs_stats_dec(s, XS_GAUGE_inactive_split, kind, 1);
    xs_stats_dec(s, XS_GAUGE_inactive_split_bytes, kind, (int64_t)b->size);
  }
}
/* xs_pool_take(p, b, b->size, false). */
static inline __attribute__((always_inline)) void xs_pool_take_whole(
    xs_pool *p, xs_stats *s, xs_pool_kind kind, xs_block *b) {
  assert(!b->allocated && b->mapped && s == p->stats && kind == p->kind);
  xs_pool_trees_changed(p);
  xs_freetree_remove(&p->free, b);
  xs_pool_split_stat(s, kind, b, -1);
  b->allocated = true;
}
/* xs_pool_give(p, b) when b merges with nothing (xs_pool_merges 0). */
static inline __attribute__((always_inline)) void xs_pool_give_alone(
    xs_pool *p, xs_stats *s, xs_pool_kind kind, xs_block *b) {
  assert(b->allocated && xs_pool_merges(b) == 0 && s == p->stats &&
         kind == p->kind);
  b->allocated = false;
  b->requested = 0;
  xs_pool_trees_changed(p);
  xs_freetree_insert(&p->free, b);
  xs_pool_split_stat(s, kind, b, +1);
}
/* Indexes b after merging it with free neighbours of its mapped state. */
xs_block *xs_pool_coalesce(xs_pool *p, xs_block *b);

/* Lazy merging. The cached free's common case is a block whose next
   neighbour is free (the rest of the block it was split from) and whose
   previous one is not, and the next malloc on the pool often asks for the
   same size again: merging then splitting the same two blocks back costs
   two tree updates for nothing. The allocator may instead park such a
   block (one per pool): free, in no tree, not merged yet. Freed in
   reverse order of allocation, the block before it joins it
   (xs_pool_park_onto), and mallocs in the order of allocation cut their
   blocks off its front (xs_pool_carve): a model's layer of tensors comes
   and goes without a tree update. The stats must
   count the merge before anything else moves them (xs_pool_park_stats),
   or the retake must count merge and split together. Until it is
   settled the pool breaks block.h's
   rules for that block alone, so nothing but the retake functions and
   xs_pool_settle may look at the pool meanwhile (alloc/ settles before any
   other operation on it, and every pool before anything that looks at
   more than one). */
/* Whether live block b's give would merge it with its next neighbour
   alone. */
static inline bool xs_pool_parkable(const xs_block *b) {
  return xs_pool_merges(b) == XS_MERGE_NEXT;
}
/* Frees parkable block b without merging it (p->parked: none yet). */
static inline void xs_pool_park(xs_pool *p, xs_block *b) {
  assert(b->allocated && xs_pool_parkable(b) && p->parked == NULL);
  b->allocated = false;
  b->requested = 0;
  p->parked = b;
}
/* Moves the stats as merging p's parked block would. */
void xs_pool_park_stats(xs_pool *p);
/* A free in reverse order of allocation: live block b, parkable, whose
   next neighbour is p's parked block (its stats counted already), takes
   the parked block's place, merged with it, without the settle's tree
   update: the tree holds the same blocks as when both are settled (the
   rest beyond), only the merge into it waits. The stats move as b's give
   would after the parked block's settle (its free is the caller's); the
   parked block's struct goes back to the cache (its pointer-table entry
   is the caller's to remove first). */
void xs_pool_park_onto(xs_pool *p, xs_block *b);
/* Merges p's parked block as xs_pool_give would have; returns the merged
   block, indexed. */
xs_block *xs_pool_settle(xs_pool *p);
/* Whether p's parked block, handed out again for a request of its size,
   is exactly what settling it and then taking the best fit would give:
   the merged block is the best fit for that size (the caller checks that
   its policy would take and split it), and the split gives back the
   block and its neighbour as they are. The answer, when true, is kept
   (retake_known) until either tree changes, so that a repeated retake of
   the same block walks no tree. */
bool xs_pool_retake_fits(xs_pool *p);
/* Whether a request of `size` bytes, less than p's parked block, would
   take the merged block once the parked block settles (the caller checks
   that its policy takes and splits it): the merged block is the best fit
   for that size. No bin condition, unlike the retake: the rest stays
   where it is until the remainder settles into it, which reindexes it as
   the split would have. */
bool xs_pool_carve_fits(xs_pool *p, size_t size);
/* Whether parked block b merges into the free block at the end of its
   segment's mapped part (nothing mapped after it). */
static inline bool xs_pool_parked_at_end(const xs_block *b) {
  const xs_block *after = b->next->next;
  return after == NULL || !after->mapped;
}
/* Hands out the front `size` bytes of p's parked block
   (xs_pool_carve_fits; its merge counted already); `spare` becomes the
   parked remainder, which merges into the rest later. The stats move as
   the merged block's split. A layer's tensors, freed in reverse order
   onto the parked block (xs_pool_park_onto), are taken back this way, in
   order, with no tree update. */
void xs_pool_carve(xs_pool *p, size_t size, xs_block *spare);
/* Whether xs_pool_retake_fits is known to hold for p's parked block (the
   caller's policy then took it too: the sizes are the same as then). */
static inline bool xs_pool_retake_known(const xs_pool *p) {
  assert(p->parked != NULL);
  return p->retake_known == p->parked;
}
/* The block at addr if it is the one p last knew to retake and is live
   again (not parked), neither tree having changed since:
   its neighbours are then as they were when it was parked (a neighbour
   freed, taken, merged or mapped goes through a tree; a free of the block
   itself gives it back to a tree, parks it or leaves it pending), so it
   is parkable again. NULL otherwise. No pointer-table lookup needed. The
   caller forgets the block (xs_pool_forget_retake) when it makes it more
   than a plain live block (pending, or used beyond its own stream), so
   the block found is one. */
static inline xs_block *xs_pool_parkable_again(const xs_pool *p,
                                               uint64_t addr) {
  xs_block *b = p->retake_known;
  if (b == NULL || b->addr != addr || p->parked != NULL) return NULL;
  assert(b->allocated && !b->pending && xs_pool_parkable(b));
  return b;
}
/* b stops being a plain live block: xs_pool_parkable_again must not find
   it. */
static inline void xs_pool_forget_retake(xs_pool *p, const xs_block *b) {
  if (p->retake_known == b) p->retake_known = NULL;
}
/* Whether the block the parked one merges into is a piece of a larger
   range (inactive_split counts it). */
static inline bool xs_pool_parked_merge_split(const xs_block *b) {
  return b->prev != NULL || b->next->next != NULL;
}
/* xs_pool_parked_merge_split of p's parked block, known to retake. */
static inline bool xs_pool_retake_piece(const xs_pool *p) {
  assert(xs_pool_retake_known(p) &&
         p->retake_piece == xs_pool_parked_merge_split(p->parked));
  return p->retake_piece;
}
/* What inactive_split_bytes counts when parkable block b merges with its
   next neighbour, `rest` (always a piece: b is before it), and for the
   merged block (0: a whole segment, not a piece). The merge moves the
   stats from the first to the second, the retake's split back. */
static inline size_t xs_pool_merge_rest(const xs_block *b) {
  return b->next->size;
}
static inline size_t xs_pool_merge_whole(const xs_block *b) {
  return xs_pool_parked_merge_split(b) ? b->size + b->next->size : 0;
}
/* The stats of the retake's split alone, its merge already counted
   (xs_pool_park_stats). */
void xs_pool_retake_split_stats(xs_pool *p);
/* The newer of the two epochs goes to the rest, as the split of the
   merged block leaves it; the block is handed out. */
static inline void xs_pool_retake_finish(xs_pool *p) {
  xs_block *b = p->parked, *rest = b->next;
  if (b->free_epoch > rest->free_epoch) rest->free_epoch = b->free_epoch;
  b->allocated = true;
  p->parked = NULL;
}
/* Whether xs_pool_retake(p, kind, false) (p's parked block known to
   retake) passes no peak: its merge and split then move nothing but the
   totals of increases. `s` is p's stats and `kind` its kind, given apart
   so that a caller that knows where they are folds the loads. */
static inline bool xs_pool_retake_under_peaks(const xs_pool *p,
                                              const xs_stats *s,
                                              xs_pool_kind kind) {
  assert(s == p->stats && kind == p->kind);
  return !xs_pool_retake_piece(p) ||
         xs_stats_rise_under(s, XS_GAUGE_inactive_split_bytes, kind,
                             (int64_t)p->parked->size);
}
/* The totals of increases of the retake's merge and split together:
   every count and byte returns to where it is (the bytes up by b's size
   in between, when the merged block is a piece), so only the totals move.
   `s` and `kind` as above. */
static inline void xs_pool_retake_totals(xs_pool *p, xs_stats *s,
                                         xs_pool_kind kind) {
  const xs_block *b = p->parked, *rest = b->next;
  assert(s == p->stats && kind == p->kind);
  xs_gauge_val *n = &s->pool[kind][XS_GAUGE_inactive_split];
  xs_gauge_val *bytes = &s->pool[kind][XS_GAUGE_inactive_split_bytes];
  if (xs_pool_retake_piece(p)) {
    n->allocated += 2;
    bytes->allocated += (int64_t)(b->size + 2 * rest->size);
  } else {
    n->allocated += 1;
    bytes->allocated += (int64_t)rest->size;
  }
}
/* Hands p's parked block out again (xs_pool_retake_known). The stats move
   as the split's, and as the merge's first unless `merge_counted`. `kind`
   is p's, given apart so that a caller that knows it at compile time
   folds the stats' offsets. */
static inline void xs_pool_retake(xs_pool *p, xs_pool_kind kind,
                                  bool merge_counted) {
  const xs_block *b = p->parked;
  assert(xs_pool_retake_known(p) && !b->allocated && !b->next->allocated &&
         b->next->mapped && kind == p->kind);
  if (merge_counted) {
    xs_pool_retake_split_stats(p);
  } else {
    /* The merge's top may be a new peak (no total: those move below). */
    if (xs_pool_retake_piece(p))
      xs_stats_bounce(p->stats, XS_GAUGE_inactive_split_bytes, kind,
                      (int64_t)b->size, 0);
    xs_pool_retake_totals(p, p->stats, kind);
  }
  xs_pool_retake_finish(p);
}
/* xs_pool_retake(p, kind, false) when xs_pool_retake_under_peaks: the
   totals of increases alone, and no call (`s` and `kind` as there). The
   caller checked the peaks; not asserted again here: another pair's
   crossing may have lowered this shard's thresholds since, a threshold
   its owner sees late, as segments/shards.h allows. */
static inline void xs_pool_retake_under(xs_pool *p, xs_stats *s,
                                        xs_pool_kind kind) {
  assert(xs_pool_retake_known(p));
  xs_pool_retake_totals(p, s, kind);
  xs_pool_retake_finish(p);
}

/* Reserves a new range of `size` bytes mapped in `granule` units. */
xseg_status xs_pool_add_segment(xs_pool *p, size_t size, size_t granule,
                                xs_segment **out);
/* Gives back the reservation of a segment that is one unmapped block (no
   alias either). */
xseg_status xs_pool_drop_segment(xs_pool *p, xs_segment *s);

/* Where growth maps: n granules at the start of unmapped block `hole`,
   after which the new space merges with `keep` (the free mapped block just
   below the hole, or NULL; never harvested while growing) into a block of
   at least the size asked for. */
typedef struct xs_place {
  xs_segment *seg;
  xs_block *hole;
  xs_block *keep;
  size_t n;
} xs_place;
/* The placement that maps the fewest granules: the best-fitting hole, or
   the end of the newest segment's mapped part. False when no reservation
   has room. */
bool xs_pool_place(xs_pool *p, size_t size, xs_place *out);
/* Maps handles[0..pl->n) at the placement (one cuMemMap per handle, a
   run of equal values being one handle; one cuMemSetAccess) and returns
   the resulting free mapped block, indexed. On failure nothing changed and
   the handles are still the caller's. */
xseg_status xs_pool_map(xs_pool *p, const xs_place *pl,
                        const uint64_t *handles, xs_block **out);

/* Page-granular release (release.c). Only free blocks that
   xs_pool_block_releasable accepts are touched: whole handles inside, and
   a free epoch the stream's guard has passed (p->safe_epoch); the others
   stay mapped for a later pass. Nothing here waits on the host. */
bool xs_pool_block_releasable(const xs_pool *p, const xs_block *b);
/* Largest free epoch of a free block with a whole handle that the guard
   has not passed yet (0: none): how far the guard must get. */
uint64_t xs_pool_unsafe_epoch(xs_pool *p);
/* Unmaps whole free handles, largest blocks first, until at least `want`
   granules (a handle is taken whole, so it may give more, but never more
   than `max`). Handles either come out through handles_out (reuse; one
   entry per granule, a run of equal values being one handle) or, when
   handles_out is NULL, are released to the driver. Blocks the guard has
   not passed but freed at or below `lend_upto` (0: none) are lent instead
   of unmapped (handles_out required; see release.c): the caller must make
   the handles' new users wait for the old work (same stream: stream
   order; another stream: an event). Returns the granule count. */
size_t xs_pool_harvest(xs_pool *p, size_t granule, size_t want, size_t max,
                       const xs_block *keep, uint64_t lend_upto,
                       uint64_t *handles_out, xseg_status *st);
/* The oldest free epoch of a free block of `granule`-sized pages with a
   whole handle that the guard has not passed (0: none). */
uint64_t xs_pool_lendable_epoch(xs_pool *p, size_t granule);
/* Unmaps every retiring block whose free the guard has passed (one call
   each; the handles belong to their new mappings) and merges it into the
   unmapped space. A failed unmap keeps the block for a later pass. */
xseg_status xs_pool_retire(xs_pool *p);
/* Releases whole handles of releasable block b to the driver until at
   least `want` granules went; returns how many (garbage collection picks
   blocks by age). */
size_t xs_pool_release_block(xs_pool *p, xs_block *b, size_t want,
                             xseg_status *st);
/* Releases whole free handles, largest free blocks first, until at least
   `goal` bytes are released (SIZE_MAX: all), then gives back every segment
   left without a mapped granule. */
xseg_status xs_pool_release(xs_pool *p, size_t goal, size_t *released);
/* Gives back every segment without a mapped granule. */
xseg_status xs_pool_drop_empty(xs_pool *p);
/* Unmaps and releases everything, live blocks included, and gives back
   every reservation (xseg_destroy). */
xseg_status xs_pool_destroy(xs_pool *p);

#endif /* XS_SEGMENTS_POOL_H */
