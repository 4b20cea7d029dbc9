/* block.h: a block, the unit the allocator hands out, and its invariants.
 *
 * Blocks tile the whole reserved range of their segment, in address order:
 *   - first->addr == seg->base; b->next->addr == b->addr + b->size; the last
 *     block ends at seg->base + seg->size.
 *   - A block is either mapped (every granule it touches is mapped) or
 *     unmapped (it starts and ends on granule boundaries and none of its
 *     granules is mapped). Unmapped blocks are always free, except
 *     retiring ones (aliases waiting to be unmapped, see `retiring`).
 *   - No two adjacent free blocks have the same mapped state: free blocks are
 *     merged at once, and mapped never merges with unmapped.
 *   - A free mapped block is in its pool's free tree, a (free) unmapped block
 *     in its pool's unmapped tree; an allocated block is in neither, and is
 *     in the allocator's pointer table instead, unless it is pending (freed
 *     by the caller, waiting on work recorded on other streams): then it is
 *     in no tree and no table, and still never merges. (A block parked by
 *     lazy merging, segments/pool.h, is free, in no tree, and keeps its
 *     table entry until it settles.)
 * All of this is host-side metadata: nothing is ever stored in device memory.
 */
#ifndef XS_SEGMENTS_BLOCK_H
#define XS_SEGMENTS_BLOCK_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <bsd/sys/tree.h>


struct CUstream_st;
struct xs_segment;

/* The streams other than its own that a live block was used on
 * (xseg_record_stream). Most blocks are used on one or two other streams at
 * most, so two fit inline and only a third makes a heap array (streams/
 * stream_set.c owns the operations). */
enum { XS_STREAM_SET_INLINE = 2 };
typedef struct xs_stream_set {
  struct CUstream_st *inline_[XS_STREAM_SET_INLINE];
  struct CUstream_st **more;   /* n - XS_STREAM_SET_INLINE of them */
  uint32_t n, cap_more;
} xs_stream_set;

typedef struct xs_block xs_block;
struct xs_block {
  uint64_t addr;
  size_t size;                 /* bytes, a multiple of 512 */
  size_t requested;            /* bytes the caller asked for; 0 when free */
  struct CUstream_st *stream;  /* the stream it was allocated on (the seam
                                  for cross-stream frees) */
  struct xs_segment *seg;
  xs_block *prev, *next;       /* address neighbours; NULL at the ends */
  union {                      /* while free, indexed (segments/freetree.h): */
    RB_ENTRY(xs_block) link;   /* in a tree, */
    struct {                   /* or in a size bin's list */
      xs_block *newer, *older;
    } bin;
  };
  xs_stream_set uses;          /* recorded streams, while live */
  /* The allocator's free clock when the block (or the newest of the blocks
     merged into it) was last freed; 0 if never allocated. A merge keeps the
     larger. Unmapping or handing the block to another stream waits until a
     guard on its stream has passed this epoch (streams/guard.h); the
     oldest epochs go first under garbage collection. */
  uint64_t free_epoch;
  uint32_t pending_events;     /* events of a deferred free not yet fired */
  bool allocated;              /* live or pending: in no tree */
  bool pending;                /* freed, waiting on recorded streams
                                  (active_pending_free); implies allocated */
  bool mapped;
  /* Lent: its granules' handles are mapped again elsewhere and owned
     there; this old mapping (XS_PAGE_ALIAS) waits, unusable, until its
     stream's guard passes free_epoch, and is then unmapped. Implies
     allocated (never merges, in no tree) and !mapped (not memory: it
     counts in no stat but the pool's retiring list; a handle it maps that
     no mapping owns any more counts once, as an orphan: vmm/aliases.c). */
  bool retiring;
  xs_block *retire_next;       /* the pool's retiring list */
};

/* True when b is a piece of a larger range (PyTorch's Block::is_split). */
static inline bool xs_block_is_split(const xs_block *b) {
  return b->prev != NULL || b->next != NULL;
}

static inline uint64_t xs_block_end(const xs_block *b) {
  return b->addr + b->size;
}

/* The span that what two threads write must keep apart: two 64-byte
   cache lines, as x86 cores fetch lines in aligned pairs (Intel's L2
   spatial prefetcher completes each line with its pair; AMD's adjacent
   line prefetch does the same), so that a write to one line of a pair
   can still take its neighbour from another core. */
#define XS_LINE 128
/* Host memory on lines of its own (XS_LINE), as malloc (freed with
   free()), for what one pair's cached path writes (block slabs, segments,
   the pointer table): a heap neighbour could be another pair's, written
   by another thread at the same time, and a line both write goes back and
   forth between their cores. */
static inline void *xs_lines_alloc(size_t size) {
  if (size > SIZE_MAX - XS_LINE) return NULL;
  return aligned_alloc(XS_LINE, (size + XS_LINE - 1) / XS_LINE * XS_LINE);
}

/* A cache of block structs, so that the cached path allocates no host
   memory once warm: blocks are carved from slabs and recycled through a
   free list; slabs are freed only with the cache. */
typedef struct xs_blocks {
  xs_block *free_list;          /* chained through ->next */
  void *slabs;                  /* chained through their first word */
  size_t live;                  /* blocks handed out and not put back */
} xs_blocks;

/* Adds a slab to the free list; false when host memory is exhausted. */
bool xs_blocks_refill(xs_blocks *c);
void xs_blocks_destroy(xs_blocks *c);

/* A block struct, its fields as they were (the caller sets every one, as
   xs_segment_split does: zeroing it here first wrote it twice), or NULL
   when host memory is exhausted. Inline: every cached malloc that splits
   takes one. */
static inline xs_block *xs_blocks_get(xs_blocks *c) {
  if (c->free_list == NULL && !xs_blocks_refill(c)) return NULL;
  xs_block *b = c->free_list;
  c->free_list = b->next;
  c->live++;
  return b;
}

static inline void xs_blocks_put(xs_blocks *c, xs_block *b) {
  assert(c->live > 0 && "put without get");
  c->live--;
  b->next = c->free_list;
  c->free_list = b;
}

#endif /* XS_SEGMENTS_BLOCK_H */
