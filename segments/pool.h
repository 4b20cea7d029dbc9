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
  /* Lazy merging (below): the run of blocks freed and not merged yet,
     from its top (the lowest, parked last) to the free block they merge
     into, which alone of them is in the index. NULL: nothing parked
     (park_rest is then stale). */
  xs_block *parked;
  xs_block *park_rest;
  /* The top last found to be the best fit once merged (and taken by the
     allocator's policy; xs_pool_retake_fits) while it was all that was
     parked, and neither tree has changed since: the retake then needs no
     tree walk. Every change of either tree clears it
     (xs_pool_trees_changed). */
  xs_block *retake_known;
  /* Whether the block retake_known merges into is a piece of a larger
     range (xs_pool_run_piece), found with it: the neighbours that decide
     it change only through a tree too. */
  bool retake_piece;
  /* Parkable frees that start no run, left to merge at once
     (xs_pool_park_pays): a run settles without being taken back, and the
     next ones are not parked. */
  unsigned park_skip;
  /* Whether inactive_split counts the pool's free pieces (segment.h,
     xs_segment.counts_split): true after xs_pool_init; alloc/ clears it
     for expandable segments, as PyTorch leaves them out. Set before the
     first segment, which copies it. */
  bool counts_split;
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
   own): a take of a whole free mapped block or of its front, and the
   give of a block that merges with nothing, or with its neighbours where
   no stat moves (measured with bench/callgrind.sh, xs_pool_give ->
   inline, instructions per pair: with the next neighbour alone, mixed
   10000 -6.9, random 10000 -2.3, layers -0.3, repeat 0; with either,
   mixed 10000 -8.3 more, random 10000 -1.3). They move the same as
   xs_pool_take and xs_pool_give. `s` and `kind` are p's stats and kind,
   given apart so that a caller that knows where they are folds the
   offsets. */

/* inactive_split of free mapped block b of pool p as it enters (+1) or
   leaves (-1) the index, where p counts split pieces: its is_split can
   change only while it is out (a neighbour merged into it, or a split),
   so both see the same value. */
static inline __attribute__((always_inline)) void xs_pool_split_stat(
    const xs_pool *p, xs_stats *s, xs_pool_kind kind, const xs_block *b,
    int sign) {
  if (!p->counts_split || !xs_block_is_split(b)) return;
  /* By the sign, a constant where inlined: the size's sign is not. */
  if (sign > 0) {
    xs_stats_inc(s, XS_GAUGE_inactive_split, kind, 1);
    xs_stats_inc(s, XS_GAUGE_inactive_split_bytes, kind, (int64_t)b->size);
  } else {
    xs_stats_dec(s, XS_GAUGE_inactive_split, kind, 1);
    xs_stats_dec(s, XS_GAUGE_inactive_split_bytes, kind, (int64_t)b->size);
  }
}
/* inactive_split as `out_n` split blocks of `out` bytes in all leave the
   index and `in_n` of `in` bytes enter it (a split or a merge): the same
   as xs_pool_split_stat(-1) for each leaving block then (+1) for each
   entering one. The values in between are at most the current ones, so
   only the end values can set a peak (xs_stats_swap). `s` and `kind` as
   above. */
static inline __attribute__((always_inline)) void xs_pool_split_move(
    xs_stats *s, xs_pool_kind kind, int64_t out_n, size_t out, int64_t in_n,
    size_t in) {
  /* As many leave as enter (a split's usual case): the count only adds
     to its total of increases. */
  if (out_n == in_n)
    s->pool[kind][XS_GAUGE_inactive_split].allocated += in_n;
  else
    xs_stats_swap(s, XS_GAUGE_inactive_split, kind, out_n, in_n);
  xs_stats_swap(s, XS_GAUGE_inactive_split_bytes, kind, (int64_t)out,
                (int64_t)in);
}
/* One block counting `out` bytes leaves (0: not a piece), one counting
   `in` enters (a split or merge in place; a block is never empty). */
static inline __attribute__((always_inline)) void xs_pool_split_swap(
    xs_stats *s, xs_pool_kind kind, size_t out, size_t in) {
  xs_pool_split_move(s, kind, out != 0, out, in != 0, in);
}
/* xs_pool_take(p, b, b->size, false). */
static inline __attribute__((always_inline)) void xs_pool_take_whole(
    xs_pool *p, xs_stats *s, xs_pool_kind kind, xs_block *b) {
  assert(!b->allocated && b->mapped && s == p->stats && kind == p->kind);
  xs_pool_trees_changed(p);
  xs_freetree_remove(&p->free, b);
  xs_pool_split_stat(p, s, kind, b, -1);
  b->allocated = true;
}
/* xs_pool_take(p, b, size, true) of a block larger than `size`: the front
   `size` bytes split off, the rest taking b's node in the index when it
   sorts where b did (a front cut only shrinks the key, and in a class the
   usual case), else b goes out and the rest goes in; the stats move as
   an unindex of b and an index of the rest, in one step. Out of host
   memory for the rest's struct, the whole block is taken rather than
   fail (the slack merges back at free). Inline: measured with
   bench/callgrind.sh (out of line -> inline in the cached malloc),
   instructions per pair: mixed 10000 -15.9, random 10000 -1.6, layers
   and repeat unchanged. */
static inline __attribute__((always_inline)) void xs_pool_take_front(
    xs_pool *p, xs_stats *s, xs_pool_kind kind, xs_block *b, size_t size) {
  assert(!b->allocated && b->mapped && b->size > size && s == p->stats &&
         kind == p->kind);
  xs_block *spare = xs_blocks_get(p->blocks);
  if (spare == NULL) {
    xs_pool_take_whole(p, s, kind, b);
    return;
  }
  size_t old = b->size;
  size_t out = p->counts_split && xs_block_is_split(b) ? old : 0;
  xs_pool_trees_changed(p);
  if (xs_freetree_fits_at(&p->free, b, old - size, b->addr + size)) {
    xs_segment_split(b->seg, b, size, spare);
    xs_freetree_replace(&p->free, b, old, spare);
  } else {
    xs_freetree_remove(&p->free, b);
    xs_freetree_insert(&p->free, xs_segment_split(b->seg, b, size, spare));
  }
  /* The rest is a piece: b is before it. */
  if (p->counts_split) xs_pool_split_swap(s, kind, out, spare->size);
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
  xs_pool_split_stat(p, s, kind, b, +1);
}
/* The merge itself, shared by the give and the coalesce: b, free and
   out of tree t, absorbs the neighbours `merges` names (XS_MERGE_PREV,
   XS_MERGE_NEXT: free, of b's mapped state, in t), their structs go back
   to the pool's cache, and the result goes into t and is returned. No
   stat moves: a caller that counts pieces moves them first. */
static inline __attribute__((always_inline)) xs_block *xs_pool_absorb(
    xs_pool *p, xs_freetree *t, xs_block *b, unsigned merges) {
  if (merges & XS_MERGE_PREV) {
    xs_block *prev = b->prev;
    xs_freetree_remove(t, prev);
    xs_blocks_put(p->blocks, xs_segment_absorb_next(b->seg, prev));
    b = prev;
  }
  if (merges & XS_MERGE_NEXT) {
    xs_freetree_remove(t, b->next);
    xs_blocks_put(p->blocks, xs_segment_absorb_next(b->seg, b));
  }
  xs_freetree_insert(t, b);
  return b;
}
/* xs_pool_give(p, b) in a pool that counts no pieces (counts_split
   false: expandable segments), where merges move no stat; `merges`: b's
   xs_pool_merges, not 0. */
static inline __attribute__((always_inline)) void xs_pool_give_merged(
    xs_pool *p, xs_block *b, unsigned merges) {
  assert(b->allocated && merges != 0 && merges == xs_pool_merges(b) &&
         !p->counts_split);
  b->allocated = false;
  b->requested = 0;
  xs_pool_trees_changed(p);
  xs_pool_absorb(p, &p->free, b, merges);
}
/* Indexes b after merging it with free neighbours of its mapped state. */
xs_block *xs_pool_coalesce(xs_pool *p, xs_block *b);

/* Lazy merging. The cached free's common case is a block whose next
   neighbour is free (the rest of the block it was split from) and whose
   previous one is not, and the next malloc on the pool often asks for the
   same size again: merging then splitting the same two blocks back costs
   two tree updates for nothing. The allocator may instead park such a
   block: free, in no tree, not merged yet. The block before a parked one
   parks on top of it in turn (a model's layer of tensors freed in reverse
   order of allocation), so a pool's parked blocks are one run of address
   neighbours, `parked` (the top, lowest) to `park_rest` (the free block
   of the index that they all merge into when they settle). A malloc of
   the top's size takes the top back when merging the whole run and then
   taking the best fit would cut exactly the top off it (mallocs in the
   order of allocation): the layer comes and goes without a tree update
   or a split. A parked block keeps its requested size for the caller
   (alloc/park.h), who counts its free and merge as they would have
   happened, or none of it when the same request takes it back; a retake
   counts merge and split together. Until they settle the pool breaks block.h's rules for the
   run alone, so nothing but these functions may look at the pool
   meanwhile (alloc/ settles before any other operation on it, and every
   pool before anything that looks at more than one). */
/* Whether live block b's give would merge it with its next neighbour
   alone (a parked block counts as free). */
static inline bool xs_pool_parkable(const xs_block *b) {
  return xs_pool_merges(b) == XS_MERGE_NEXT;
}
/* Whether parkable block b may park: nothing is parked, or b is just
   before the top of the run. */
static inline bool xs_pool_may_park(const xs_pool *p, const xs_block *b) {
  return p->parked == NULL || p->parked == b->next;
}
/* Whether a parkable free that would start a run (nothing is parked) is
   worth parking: not just after a run settled untaken (xs_pool_settle),
   as when requests come in random sizes, where each park cost a
   pointer-table lookup and a later merge; one in XS_PARK_SKIP + 1 is
   parked anyway, lest a pool that mallocs the same sizes again never
   find it out. Either way the pool ends the same (lazy merging changes
   no result), with one exception: with host memory exhausted, a skipped
   park gives its neighbour's block struct back to the pair's cache at
   once, not at the settle, so the pair's other pool may split a block
   that it would otherwise have handed out whole (never the reverse).
   Measured with bench/callgrind.sh (always parked -> this):
   mixed 10000 543.5 -> 529.5 instructions per pair, random 10000 392.7
   -> 389.6, layers 249.6 -> 250.9 (the look at each run's start),
   repeat 127.0 -> 127.0. A skip of 32 gave mixed 10000 528.2 alone:
   not worth the longer blindness after a pool's sizes turn regular. */
enum { XS_PARK_SKIP = 8 };
static inline bool xs_pool_park_pays(xs_pool *p) {
  assert(p->parked == NULL);
  if (__builtin_expect(p->park_skip == 0, 1)) return true;
  p->park_skip--;
  return false;
}
/* The last block of the run that block b heads or joins (the rest, in
   the index): b's next neighbour when nothing is parked (`first`). */
static inline const xs_block *xs_pool_run_last(const xs_pool *p,
                                               const xs_block *b, bool first) {
  return first ? b->next : p->park_rest;
}
/* Frees parkable block b without merging it (xs_pool_may_park; its
   requested size stays, for the caller's stats): the top
   of a new run when nothing is parked (`first`: p->parked is NULL, read
   by the caller, who may know it already), else on top of the run. */
static inline void xs_pool_park(xs_pool *p, xs_block *b, bool first) {
  assert(b->allocated && xs_pool_parkable(b) && xs_pool_may_park(p, b) &&
         first == (p->parked == NULL));
  if (first) p->park_rest = b->next;
  b->allocated = false;
  p->parked = b;
}
/* For block b of pool p heading or joining a run that ends with `last`
   (xs_pool_run_last): whether inactive_split counts the block it merges
   into (a piece of a larger range, in a pool that counts pieces); what
   inactive_split_bytes counts for what follows b up to `last` (always a
   piece: b is before it; 0 where the pool counts none), and for the
   merged block (0: a whole segment, or not counted). The merge moves the
   stats from the second to the third, the retake's split back. */
static inline bool xs_pool_run_piece(const xs_pool *p, const xs_block *b,
                                     const xs_block *last) {
  return p->counts_split && (b->prev != NULL || last->next != NULL);
}
static inline size_t xs_pool_merge_rest(const xs_pool *p, const xs_block *b,
                                        const xs_block *last) {
  /* b->next starts where b ends: with one block, its size. */
  return p->counts_split ? (size_t)(xs_block_end(last) - b->next->addr) : 0;
}
static inline size_t xs_pool_merge_whole(const xs_pool *p,
                                         const xs_block *b,
                                         const xs_block *last) {
  return xs_pool_run_piece(p, b, last)
             ? (size_t)(xs_block_end(last) - b->addr)
             : 0;
}
/* Merges p's run into one block of the index, as xs_pool_give would have
   at each park; returns the merged block. */
xs_block *xs_pool_settle(xs_pool *p);
/* Whether the top of p's run, handed out again for a request of its
   size, is exactly what settling the run and then taking the best fit
   would give: the merged block is the best fit for that size (the caller
   checks that its policy would take and split it), and the split gives
   back the top and what follows as they are. When the top is all that is
   parked, the answer, when true, is kept (retake_known) until either
   tree changes, so that a repeated retake of the same block walks no
   tree. Inline for the common case of a layer's run: the rest is the
   only free block of the pool. */
static inline void xs_pool_retake_fits_found(xs_pool *p);
bool xs_pool_retake_fits_among(xs_pool *p);
static inline bool xs_pool_retake_fits(xs_pool *p) {
  if (p->free.count != 1) return xs_pool_retake_fits_among(p);
  xs_pool_retake_fits_found(p);
  return true;
}
/* Whether xs_pool_retake_fits is known to hold for p's top (the caller's
   policy then took it too: the sizes are the same as then). */
static inline bool xs_pool_retake_known(const xs_pool *p) {
  assert(p->parked != NULL);
  return p->retake_known == p->parked;
}
/* xs_pool_retake_fits found the top to fit: kept when it is all that is
   parked (neither the trees nor the sizes of the top and the rest change
   until a tree does: a block's size changes only out of its tree, or
   with a neighbour's merge or split, which go through the tree). */
static inline void xs_pool_retake_fits_found(xs_pool *p) {
  xs_block *b = p->parked;
  if (b->next != p->park_rest) return;
  p->retake_known = b;
  p->retake_piece = xs_pool_run_piece(p, b, p->park_rest);
}
/* The block at addr if it is the one p last knew to retake and is live
   again (nothing parked), neither tree having changed since:
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
/* xs_pool_run_piece of p's top, known to retake (the top alone parked). */
static inline bool xs_pool_retake_piece(const xs_pool *p) {
  assert(xs_pool_retake_known(p) && p->park_rest == p->parked->next &&
         p->retake_piece == xs_pool_run_piece(p, p->parked, p->park_rest));
  return p->retake_piece;
}
/* Whether the top's merge, p's top known to retake and its park the only
   one held back, passes no peak: its merge and split then move nothing
   but the totals of increases (xs_pool_retake_under). `s` is p's stats
   and `kind` its kind, given apart so that a caller that knows where they
   are folds the loads. */
static inline bool xs_pool_retake_under_peaks(const xs_pool *p,
                                              const xs_stats *s,
                                              xs_pool_kind kind) {
  assert(s == p->stats && kind == p->kind);
  return !xs_pool_retake_piece(p) ||
         xs_stats_rise_under(s, XS_GAUGE_inactive_split_bytes, kind,
                             (int64_t)p->parked->size);
}
/* The totals of increases of the top's merge and split together: every
   count and byte returns to where it is (the bytes up by the top's size
   in between, when the merged block is a piece), so only the totals
   move. `piece`: xs_pool_run_piece of the top; `rest`: its
   xs_pool_merge_rest. `s` and `kind` as above. */
static inline void xs_pool_retake_totals(xs_stats *s, xs_pool_kind kind,
                                         const xs_block *b, bool piece,
                                         size_t rest) {
  xs_gauge_val *n = &s->pool[kind][XS_GAUGE_inactive_split];
  xs_gauge_val *bytes = &s->pool[kind][XS_GAUGE_inactive_split_bytes];
  if (piece) {
    n->allocated += 2;
    bytes->allocated += (int64_t)(b->size + 2 * rest);
  } else {
    n->allocated += 1;
    bytes->allocated += (int64_t)rest;
  }
}
/* The top handed out: the newer of the two epochs goes to what follows
   it, as the split of the merged block leaves it, and the next block of
   the run, if any, is the top (`last`: the top was all that was
   parked). */
static inline void xs_pool_retake_finish(xs_pool *p, bool last) {
  xs_block *b = p->parked, *next = b->next;
  assert(last == (next == p->park_rest));
  if (b->free_epoch > next->free_epoch) next->free_epoch = b->free_epoch;
  b->allocated = true;
  p->parked = last ? NULL : next;
}
/* Hands p's top out again (xs_pool_retake_fits), the stats of its merge
   counted already: they move as the split's. `s` and `kind` as above. */
static inline __attribute__((always_inline)) void xs_pool_retake_counted(
    xs_pool *p, xs_stats *s, xs_pool_kind kind) {
  const xs_block *b = p->parked, *last = p->park_rest;
  assert(!b->allocated && !last->allocated && last->mapped &&
         s == p->stats && kind == p->kind);
  /* The merged block out of inactive_split, what follows the top in (a
     piece), where the pool counts pieces. */
  if (p->counts_split) {
    size_t rest = xs_pool_merge_rest(p, b, last);
    xs_pool_split_swap(s, kind,
                       xs_pool_run_piece(p, b, last) ? rest + b->size : 0,
                       rest);
  }
  xs_pool_retake_finish(p, b->next == last);
}
/* The same when the top's merge was never counted (its free's stats held
   back and cancelled by the caller), the caller having found that the
   top of the merge passes no threshold (alloc/park.h,
   xs_park_split_under): merge and split undone move nothing but the
   totals of increases, and nothing is called. `s` and `kind` as above. */
static inline __attribute__((always_inline)) void xs_pool_retake_cancelled(
    xs_pool *p, xs_stats *s, xs_pool_kind kind) {
  const xs_block *b = p->parked, *last = p->park_rest;
  assert(!b->allocated && !last->allocated && last->mapped &&
         s == p->stats && kind == p->kind);
  if (p->counts_split)
    xs_pool_retake_totals(s, kind, b, xs_pool_run_piece(p, b, last),
                          xs_pool_merge_rest(p, b, last));
  xs_pool_retake_finish(p, b->next == last);
}
/* xs_pool_retake_cancelled of the top known to retake, held back alone,
   when xs_pool_retake_under_peaks: the totals of increases alone, and no
   call (`s` and `kind` as there). The caller checked the peaks; not asserted
   again here: another pair's crossing may have lowered this shard's
   thresholds since, a threshold its owner sees late, as segments/shards.h
   allows. */
static inline void xs_pool_retake_under(xs_pool *p, xs_stats *s,
                                        xs_pool_kind kind) {
  const xs_block *b = p->parked;
  assert(xs_pool_retake_known(p) && s == p->stats && kind == p->kind);
  /* The top alone is parked: the rest is its neighbour. */
  if (p->counts_split)
    xs_pool_retake_totals(s, kind, b, xs_pool_retake_piece(p),
                          b->next->size);
  xs_pool_retake_finish(p, true);
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
