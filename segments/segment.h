/* segment.h: an expandable segment, one reserved range of virtual addresses
 * whose granules are mapped and unmapped one physical handle at a time.
 *
 * A handle may span several granules (growth creates one handle for a run
 * of fresh granules: one cuMemCreate and one cuMemMap instead of one per
 * granule). The driver maps and unmaps whole handles only, so the page map
 * records which granules share one:
 *
 *     granule:   0    1    2    3    4    5    6    7
 *     mapped:    1    1    1    1    1    0    0    1
 *     handle:    A    A    A    B    C    0    0    D
 *     hlen:      3    3    3    1    1    0    0    1
 *                `-- one mapping --'
 *
 * Invariants (checked by xs_segment_is_valid):
 *   - [base, base + size) is reserved; size is a multiple of granule.
 *   - Blocks tile [base, base + size) exactly (see block.h); `first` starts
 *     at base, `last` ends at base + size.
 *   - Granule i is mapped iff mapped[i]; then handle[i] is the physical
 *     allocation mapped there. XS_PAGE_OWNED: owned by this segment and by
 *     no other, counted in mapped_granules (and so in reserved bytes).
 *     XS_PAGE_ALIAS: lent — the handle has been mapped again elsewhere,
 *     which owns it now, and this old mapping waits for its stream's guard
 *     before it is unmapped (a retiring block covers it; counted in
 *     alias_granules, never in reserved bytes); handle[i] then holds the
 *     address of the alias mapping's first granule, not the handle, so
 *     that each mapping stays its own run.
 *   - A handle of k granules is mapped at k consecutive granules, each with
 *     handle[i] == that handle and hlen[i] == k; handle values are unique,
 *     so a maximal run of equal handle values is exactly one handle. Only
 *     whole runs are ever unmapped.
 *   - Every granule touched by a mapped block is mapped; every granule of an
 *     unmapped block is unmapped.
 * A classic segment (expandable_segments:False) is the same thing with one
 * granule as large as the segment, mapped once at creation.
 */
#ifndef XS_SEGMENTS_SEGMENT_H
#define XS_SEGMENTS_SEGMENT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "segments/block.h"

struct xs_pool;

/* Values of xs_segment.mapped[g]. */
enum { XS_PAGE_UNMAPPED = 0, XS_PAGE_OWNED = 1, XS_PAGE_ALIAS = 2 };

typedef struct xs_segment {
  uint64_t base;
  size_t size;                  /* reserved bytes */
  size_t granule;               /* bytes per physical handle */
  size_t n_granules;            /* size / granule */
  size_t mapped_granules;       /* XS_PAGE_OWNED granules */
  size_t alias_granules;        /* XS_PAGE_ALIAS granules */
  uint64_t *handle;             /* page map: handle of each mapped granule */
  uint32_t *hlen;               /* page map: granules in that handle */
  uint8_t *mapped;              /* page map: XS_PAGE_* of each granule */
  /* Whether inactive_split counts this segment's free pieces: a classic
     segment's, as PyTorch counts them, not an expandable segment's (its
     free_block: "we simply just exclude expandable segments from
     inactive_split"; any free granule of one can be unmapped). Its
     pool's (xs_pool.counts_split), copied for the walk. */
  bool counts_split;
  xs_block *first, *last;
  struct xs_pool *pool;
  struct xs_segment *next;      /* in the pool's list */
} xs_segment;

static inline size_t xs_segment_granule_of(const xs_segment *s, uint64_t a) {
  return (size_t)((a - s->base) / s->granule);
}

/* Splits b at b->addr + offset (0 < offset < b->size, within one mapped
   state); `spare` becomes the upper piece, which is returned. The caller
   keeps the trees straight: b must be out of them. Inline, as the merge
   below: every cached malloc that splits and every free that merges
   calls them. */
static inline xs_block *xs_segment_split(xs_segment *s, xs_block *b,
                                         size_t offset, xs_block *spare) {
  assert(offset > 0 && offset < b->size && "a split leaves two pieces");
  assert(!b->mapped || b->allocated || offset % 512 == 0);
  /* Every field but the index's links (the cache hands the struct out as
     it was): the rest is free, in no index, used on no stream. One by
     one: a compound literal zeroes the whole struct first. */
  spare->addr = b->addr + offset;
  spare->size = b->size - offset;
  spare->requested = 0;
  spare->stream = b->stream;
  spare->seg = s;
  spare->prev = b;
  spare->next = b->next;
  spare->uses = (xs_stream_set){.n = 0};
  spare->free_epoch = b->free_epoch;   /* the spare was free as part of b */
  spare->pending_events = 0;
  spare->allocated = false;
  spare->pending = false;
  spare->mapped = b->mapped;
  spare->retiring = false;
  spare->retire_next = NULL;
  if (b->next != NULL)
    b->next->prev = spare;
  else
    s->last = spare;
  b->next = spare;
  b->size = offset;
  return spare;
}

/* Merges b's upper neighbour into b (both free, same mapped state, neither
   in a tree) and returns the struct that is no longer used. */
static inline xs_block *xs_segment_absorb_next(xs_segment *s,
                                               xs_block *b) {
  xs_block *n = b->next;
  assert(n != NULL && !n->allocated && !b->allocated);
  assert(n->mapped == b->mapped && "mapped never merges with unmapped");
  b->size += n->size;
  /* The merged block is as recently freed as its newest part. */
  if (n->free_epoch > b->free_epoch) b->free_epoch = n->free_epoch;
  b->next = n->next;
  if (n->next != NULL)
    n->next->prev = b;
  else
    s->last = b;
  return n;
}

/* Allocates the page map of n granules (all unmapped); false on host
   OOM. xs_segment_free_page_map frees it. */
bool xs_segment_alloc_page_map(xs_segment *s, size_t n);
void xs_segment_free_page_map(xs_segment *s);

/* The first granule of the handle mapped at granule g (an alias of a
   handle next to its owned mapping is another mapping). */
static inline size_t xs_segment_handle_head(const xs_segment *s, size_t g) {
  while (g > 0 && s->mapped[g - 1] == s->mapped[g] &&
         s->handle[g - 1] == s->handle[g])
    g--;
  return g;
}

/* Records n granules from `addr` as mapped to handles[0..n), one handle
   per maximal run of equal values (a run of k is a handle of k granules,
   given whole). */
void xs_segment_record_map(xs_segment *s, uint64_t addr, size_t n,
                           const uint64_t *handles);
/* Forgets n mapped granules from `addr` (whole handles, all owned or all
   aliases), copying their handles out as record_map takes them. */
void xs_segment_record_unmap(xs_segment *s, uint64_t addr, size_t n,
                             uint64_t *handles_out);
/* Turns n owned granules from `addr` (whole handles) into aliases: their
   handles, copied out as record_map takes them, are to be mapped again
   elsewhere, and this mapping is only unmapped later. */
void xs_segment_record_lend(xs_segment *s, uint64_t addr, size_t n,
                            uint64_t *handles_out);

/* Walks the blocks and the page map; `msg` gets the first broken rule.
   Adds the segment's blocks to the counts in *walk. */
typedef struct xs_segment_walk {
  size_t allocated, allocated_bytes, requested_bytes;  /* live blocks */
  size_t pending, pending_bytes;          /* freed, waiting on streams */
  size_t free_mapped, unmapped;           /* blocks */
  size_t retiring, alias_bytes;           /* retiring blocks (aliases) */
  size_t split_free, split_free_bytes;    /* inactive_split */
  size_t mapped_bytes;
} xs_segment_walk;
bool xs_segment_is_valid(const xs_segment *s, xs_segment_walk *walk,
                         char *msg, size_t msg_size);

#endif /* XS_SEGMENTS_SEGMENT_H */
