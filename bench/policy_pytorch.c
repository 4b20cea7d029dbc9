/* policy_pytorch.c: PyTorch's caching allocator with expandable_segments:True.
 *
 * DeviceCachingAllocator's malloc and free as c10/cuda/CUDACachingAllocator.cpp
 * runs them for expandable segments, with PyTorch's defaults (no
 * max_split_size, no garbage collection, no record_stream) and --conf's
 * roundup_power2_divisions (round_size); a --conf that sets what is not
 * modelled (max_split_size_mb, garbage_collection_threshold, a memory
 * fraction, expandable_segments:False) is refused, naming it, not ignored,
 * so that no row runs under other settings than the command gave. xseg's
 * own keys (xseg_*) do not apply to PyTorch's allocator.
 *
 *   malloc: round_size (512 B, or the divisions); the small pool for at
 *   most 1 MiB, else the large one; get_free_block (best fit by size, then the expandable_size
 *   walk); else try_allocate_expandable_block (find_expandable_block: the
 *   lowest unmapped block of the pool, with the free block before it, that
 *   has room, else a new ExpandableSegment; map_block until the candidate
 *   is big enough); on out-of-memory release_cached_blocks (unmap every
 *   free block's whole pages, free segments left with nothing mapped) and
 *   try once more. The found block is split when 512 B or more remain.
 *   free: merge with free neighbours of the same mapped state, back into
 *   the pool. Nothing is unmapped at a free.
 *
 * A pool here is PyTorch's BlockPool restricted to one stream (its sets are
 * ordered by stream first, so a lookup never leaves the stream): blocks are
 * reused by the stream that allocated them only. Each pool grows one
 * ExpandableSegment (the unmapped tail of 9/8 of the device always has
 * room, so find_expandable_block makes a second one only when a request
 * does not fit in it).
 *
 * Reserved bytes are the pages mapped, as PyTorch's reserved_bytes counts
 * them for expandable segments. release_cached_blocks is also
 * torch.cuda.empty_cache(); a replay has no such event, so it runs only on
 * the out-of-memory path, where each unmap's stream synchronize is a host
 * wait.
 */
#include <assert.h>
#include <stddef.h>
#include <stdlib.h>

#include "alloc/config.h"
#include "pytorch_blocks.h"
#include "vmm/error.h"

/* RB_GENERATE marks what it generates __unused, which libbsd's cdefs.h
   leaves undefined on Linux. */
#define __unused __attribute__((__unused__))
RB_GENERATE(pt_by_size, pt_block, link, pt_by_size_cmp)
RB_GENERATE(pt_by_addr, pt_block, link, pt_by_addr_cmp)
#undef __unused

static pt_pool *pool_of(xb_pytorch *x, CUstream stream, bool small) {
  for (size_t i = 0; i < x->n_pools; i++)
    if (x->pools[i].stream == stream && x->pools[i].small == small)
      return &x->pools[i];
  if (x->n_pools == sizeof x->pools / sizeof x->pools[0]) return NULL;
  pt_pool *p = &x->pools[x->n_pools++];
  p->stream = stream;
  p->small = small;
  RB_INIT(&p->blocks);
  RB_INIT(&p->unmapped);
  return p;
}

/* round_size without roundup_power2_divisions. */
/* round_size: 512 B below it, else a multiple of 512 B, or of the
   size's power of two over its interval's divisions (--conf's
   roundup_power2_divisions); 0 on overflow. */
static uint64_t pt_round_size(const xb_pytorch *x, uint64_t size) {
  return xs_config_round_size(&x->cfg, (size_t)size);
}

static pt_block *block_new(pt_pool *pool, xb_pt_segment *seg, uint64_t ptr,
                           uint64_t size, bool mapped) {
  pt_block *b = calloc(1, sizeof *b);
  if (b == NULL) return NULL;
  *b = (pt_block){.seg = seg, .pool = pool, .ptr = ptr, .size = size,
                  .mapped = mapped};
  return b;
}

/* b between before and after (either may be NULL). */
static void block_splice(pt_block *b, pt_block *before, pt_block *after) {
  if (before != NULL) before->next = b;
  if (after != NULL) after->prev = b;
  b->prev = before;
  b->next = after;
}

static void pool_insert(pt_block *b) {
  if (b->mapped)
    pt_by_size_RB_INSERT(&b->pool->blocks, b);
  else
    pt_by_addr_RB_INSERT(&b->pool->unmapped, b);
}

static void pool_remove(pt_block *b) {
  if (b->mapped)
    pt_by_size_RB_REMOVE(&b->pool->blocks, b);
  else
    pt_by_addr_RB_REMOVE(&b->pool->unmapped, b);
}

/* try_merge_blocks: src, a neighbour of dst (which is in no set), joins
   dst when it is unallocated with the same mapped state. */
static void try_merge(pt_block *dst, pt_block *src) {
  if (src == NULL || src->allocated || src->mapped != dst->mapped) return;
  if (dst->prev == src) {           /* [src dst] */
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != NULL) dst->prev->next = dst;
  } else {                          /* [dst src] */
    dst->next = src->next;
    if (dst->next != NULL) dst->next->prev = dst;
  }
  dst->size += src->size;
  pool_remove(src);
  free(src);
}

/* What a free block could grow to: itself and the unmapped block after. */
static uint64_t expandable_size(const pt_block *b) {
  return b->size + (b->next != NULL && !b->next->mapped ? b->next->size : 0);
}

/* get_free_block: the smallest free block of at least `size`, then, while
   the next larger one could expand less far, that one (a block at the
   mapped end of a segment expands over the whole unmapped rest, so best
   fit prefers a block inside). Taken out of the pool. */
static pt_block *get_free_block(pt_pool *pool, uint64_t size) {
  pt_block key = {.size = size, .ptr = 0};
  pt_block *it = pt_by_size_RB_NFIND(&pool->blocks, &key);
  if (it == NULL) return NULL;
  for (pt_block *next = pt_by_size_RB_NEXT(it);
       next != NULL && expandable_size(next) < expandable_size(it);
       next = pt_by_size_RB_NEXT(it))
    it = next;
  pool_remove(it);
  return it;
}

static bool allocatable(const pt_block *b) {
  return b != NULL && !b->allocated;
}

/* Whether unallocated blocks from b on span `size` bytes. */
static bool has_room(const pt_block *b, uint64_t size) {
  uint64_t bytes = 0;
  for (; bytes < size && allocatable(b); b = b->next) bytes += b->size;
  return bytes >= size;
}

/* find_expandable_block: the lowest unmapped block of the pool, or the
   free block just before it, from which `size` bytes of free and unmapped
   blocks follow; else the unmapped range of a new segment. */
static xseg_status find_expandable_block(xb_pytorch *x, pt_pool *pool,
                                         uint64_t size, pt_block **out) {
  pt_block *c;
  RB_FOREACH(c, pt_by_addr, &pool->unmapped) {
    pt_block *from = allocatable(c->prev) ? c->prev : c;
    if (has_room(from, size)) {
      *out = from;
      return XSEG_OK;
    }
  }
  xb_pt_segment *seg;
  uint64_t page = pool->small ? XB_PT_SMALL_PAGE : XB_PT_LARGE_PAGE;
  xseg_status st = xb_pt_segment_create(x->v, pool->stream, page,
                                        x->total_memory, &seg);
  if (st != XSEG_OK) return st;
  pt_block *b = block_new(pool, seg, seg->base, seg->n_pages * page, false);
  if (b == NULL) {
    xb_pt_segment_destroy(seg);
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  }
  seg->next = x->segments;
  x->segments = seg;
  pool_insert(b);
  *out = b;
  return XSEG_OK;
}

static void mapped_add(xb_pytorch *x, uint64_t bytes) {
  x->mapped += bytes;
  if (x->mapped > x->window_peak) x->window_peak = x->mapped;
}

/* map_block: maps the pages under the first `size` bytes of the unmapped
   block b, which becomes free and mapped (merged with free mapped
   neighbours, in the pool); what is left of it stays unmapped after it.
   *merged is the mapped block b became part of. */
static xseg_status map_block(xb_pytorch *x, pt_block *b, uint64_t size,
                             pt_block **merged) {
  assert(!b->mapped && size <= b->size);
  /* What stays unmapped after the pages, made first: nothing can fail
     once they are mapped. */
  pt_block *rest = NULL;
  if (xb_round_up(size, b->seg->page) < b->size &&
      (rest = block_new(b->pool, b->seg, 0, 0, false)) == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  uint64_t mapped;
  xseg_status st = xb_pt_segment_map(b->seg, b->ptr, size, &mapped);
  if (st != XSEG_OK) {
    free(rest);
    return st;
  }
  assert(mapped >= size && (mapped < b->size) == (rest != NULL));
  pool_remove(b);
  b->mapped = true;
  if (rest != NULL) {
    rest->ptr = b->ptr + mapped;
    rest->size = b->size - mapped;
    block_splice(rest, b, b->next);
    b->size = mapped;
    pool_insert(rest);
  }
  try_merge(b, b->prev);
  try_merge(b, b->next);
  pool_insert(b);
  mapped_add(x, mapped);
  *merged = b;
  return XSEG_OK;
}

/* try_allocate_expandable_block: maps at the candidate until a free block
   of `size` bytes is there, and takes it out of the pool. Out of memory
   leaves what was mapped free in the pool. */
static xseg_status try_allocate_expandable(xb_pytorch *x, pt_pool *pool,
                                           uint64_t size, pt_block **out) {
  pt_block *c = NULL;
  xseg_status st = find_expandable_block(x, pool, size, &c);
  if (st == XSEG_OK && !c->mapped)
    st = map_block(x, c, c->size < size ? c->size : size, &c);
  while (st == XSEG_OK && c->size < size) {
    pt_block *next = c->next;       /* free -> unmapped -> ... */
    uint64_t rest = size - c->size;
    /* Only a request beyond 9/8 of the device runs off the segment's end,
       and the device ran out before that. */
    if (next == NULL)
      return xs_error(XSEG_ERR_OUT_OF_MEMORY, "%llu bytes exceed a segment",
                      (unsigned long long)size);
    st = map_block(x, next, rest < next->size ? rest : next->size, &c);
  }
  if (st != XSEG_OK) return st;
  pool_remove(c);
  *out = c;
  return XSEG_OK;
}

/* unmap_block: unmaps the whole pages of the free block b; the partial
   pages at its ends stay free and mapped beside it. */
static xseg_status unmap_block(xb_pytorch *x, pt_block *b) {
  uint64_t addr, size;
  xb_pt_segment_inner(b->seg, b->ptr, b->size, &addr, &size);
  if (size == 0) return XSEG_OK;
  /* The partial pages' blocks are made first: nothing can fail once the
     pages are gone. */
  pt_block *before = NULL, *after = NULL;
  uint64_t before_size = addr - b->ptr;
  uint64_t after_size = b->size - before_size - size;
  if (before_size > 0)
    before = block_new(b->pool, b->seg, b->ptr, before_size, true);
  if (after_size > 0)
    after = block_new(b->pool, b->seg, addr + size, after_size, true);
  xseg_status st = (before_size > 0 && before == NULL) ||
                           (after_size > 0 && after == NULL)
                       ? xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory")
                       : xb_pt_segment_unmap(b->seg, addr, size);
  if (st != XSEG_OK) {
    free(before);
    free(after);
    return st;
  }
  pool_remove(b);
  if (before != NULL) {
    block_splice(before, b->prev, b);
    pool_insert(before);
  }
  if (after != NULL) {
    block_splice(after, b, b->next);
    pool_insert(after);
  }
  b->ptr = addr;
  b->size = size;
  b->mapped = false;
  try_merge(b, b->prev);
  try_merge(b, b->next);
  pool_insert(b);
  x->mapped -= size;
  return XSEG_OK;
}

/* release_expandable_segment: b is the whole, unmapped segment. */
static void release_segment(xb_pytorch *x, pt_block *b) {
  assert(!b->mapped && b->prev == NULL && b->next == NULL);
  xb_pt_segment **p = &x->segments;
  while (*p != b->seg) p = &(*p)->next;
  *p = b->seg->next;
  pool_remove(b);
  xb_pt_segment_destroy(b->seg);
  free(b);
}

/* release_blocks of one pool: unmaps every free block (gathered first:
   unmapping changes the set), and releases segments left whole. */
static xseg_status release_pool(xb_pytorch *x, pt_pool *pool) {
  size_t n = 0, i = 0;
  pt_block *b;
  RB_FOREACH(b, pt_by_size, &pool->blocks) n++;
  pt_block **all = malloc((n ? n : 1) * sizeof *all);
  if (all == NULL) return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  RB_FOREACH(b, pt_by_size, &pool->blocks) all[i++] = b;
  xseg_status st = XSEG_OK;
  for (i = 0; i < n && st == XSEG_OK; i++) {
    st = unmap_block(x, all[i]);
    if (st == XSEG_OK && all[i]->prev == NULL && all[i]->next == NULL)
      release_segment(x, all[i]);
  }
  free(all);
  return st;
}

/* release_cached_blocks (empty_cache): the large pools, then the small. */
static xseg_status release_cached_blocks(xb_pytorch *x) {
  xseg_status st = XSEG_OK;
  for (int small = 0; small < 2; small++)
    for (size_t i = 0; i < x->n_pools && st == XSEG_OK; i++)
      if (x->pools[i].small == (small == 1))
        st = release_pool(x, &x->pools[i]);
  return st;
}

/* alloc_found_block's split: b (out of the pool) keeps its first `size`
   bytes when 512 B or more would remain (should_split for expandable
   segments); the rest goes back to the pool. Returns the block handed out. */
static pt_block *split_found(pt_block *b, uint64_t size) {
  if (b->size - size < XB_PT_MIN_BLOCK) return b;
  pt_block *front = block_new(b->pool, b->seg, b->ptr, size, true);
  if (front == NULL) return NULL;
  block_splice(front, b->prev, b);
  b->ptr += size;
  b->size -= size;
  pool_insert(b);
  return front;
}

static xseg_status pytorch_malloc(void *self, uint32_t slot, size_t request,
                                  struct CUstream_st *stream, void **ptr) {
  xb_pytorch *x = self;
  x->slot[slot] = NULL;
  *ptr = NULL;
  if (request == 0) return XSEG_OK;   /* raw_alloc(0) is nullptr */
  uint64_t size = pt_round_size(x, request);
  if (size == 0)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "%zu bytes overflow when "
                    "rounded", request);
  pt_pool *pool = pool_of(x, stream, size <= XB_PT_SMALL_SIZE);
  if (pool == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "more than %d streams",
                    XB_MAX_STREAMS);
  pt_block *b = get_free_block(pool, size);
  xseg_status st = XSEG_OK;
  if (b == NULL) {
    st = try_allocate_expandable(x, pool, size, &b);
    if (st == XSEG_ERR_OUT_OF_MEMORY) {
      st = release_cached_blocks(x);
      if (st == XSEG_OK) st = try_allocate_expandable(x, pool, size, &b);
    }
  }
  if (st != XSEG_OK) return st;
  pt_block *out = split_found(b, size);
  if (out == NULL) {
    pool_insert(b);
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  }
  out->allocated = true;
  x->slot[slot] = out;
  *ptr = (void *)(uintptr_t)out->ptr;
  return XSEG_OK;
}

/* free_block: merges with free neighbours, back into the pool. */
static xseg_status pytorch_free(void *self, uint32_t slot, void *ptr) {
  (void)ptr;
  xb_pytorch *x = self;
  pt_block *b = x->slot[slot];
  if (b == NULL) return XSEG_OK;
  x->slot[slot] = NULL;
  b->allocated = false;
  try_merge(b, b->prev);
  try_merge(b, b->next);
  pool_insert(b);
  return XSEG_OK;
}

static void pytorch_usage(void *self, xb_usage *u) {
  xb_pytorch *x = self;
  u->reserved = x->mapped;
  u->reserved_peak = x->window_peak;
  x->window_peak = x->mapped;
}

static void pool_drop(pt_pool *pool) {
  pt_block *b, *next;
  RB_FOREACH_SAFE(b, pt_by_size, &pool->blocks, next) {
    pt_by_size_RB_REMOVE(&pool->blocks, b);
    free(b);
  }
  RB_FOREACH_SAFE(b, pt_by_addr, &pool->unmapped, next) {
    pt_by_addr_RB_REMOVE(&pool->unmapped, b);
    free(b);
  }
}

static void pytorch_release(xb_pytorch *x) {
  for (size_t i = 0; i < x->n_pools; i++) pool_drop(&x->pools[i]);
  for (uint32_t i = 0; x->slot != NULL && i < x->n_slots; i++)
    free(x->slot[i]);
  while (x->segments != NULL) {
    xb_pt_segment *s = x->segments;
    x->segments = s->next;
    xb_pt_segment_destroy(s);
  }
  free(x->slot);
  free(x);
}

static void pytorch_close(void *self) {
  xb_pytorch *x = self;
  CUcontext saved = x->saved;
  xs_vmm *v = x->v;
  pytorch_release(x);
  xs_vmm_ctx_leave(v, saved);
}

/* --conf for PyTorch's policy: what it models, or a refusal naming what it
   does not (see the top of this file). */
static xseg_status pytorch_conf(const char *conf, xs_config *cfg) {
  xseg_status st = xs_config_parse(conf, cfg);
  if (st != XSEG_OK) return st;
  const char *unmodelled =
      !cfg->expandable_segments ? "expandable_segments:False"
      : cfg->max_split_size != SIZE_MAX ? "max_split_size_mb"
      : cfg->garbage_collection_threshold != 0 ? "garbage_collection_threshold"
      : cfg->memory_fraction != 1.0
          ? "a memory fraction (per_process_memory_fraction or "
            "xseg_memory_fraction)"
          : NULL;
  if (unmodelled == NULL) return XSEG_OK;
  return xs_error(XSEG_ERR_INVALID_ARGUMENT, "pytorch-expandable models "
                  "PyTorch's defaults and roundup_power2_divisions only, not "
                  "%s (--conf or XSEG_ALLOC_CONF)", unmodelled);
}

static xseg_status pytorch_open(xb_env *env, const char *conf,
                                uint32_t n_slots, void **self) {
  xs_config cfg;
  xseg_status conf_st = pytorch_conf(conf, &cfg);
  if (conf_st != XSEG_OK) return conf_st;
  xb_pytorch *x = calloc(1, sizeof *x);
  if (x == NULL) return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  x->cfg = cfg;
  x->v = &env->vmm;
  x->n_slots = n_slots;
  x->slot = calloc(n_slots ? n_slots : 1, sizeof *x->slot);
  if (x->slot == NULL) {
    free(x);
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for %u slots", n_slots);
  }
  xseg_status st = xs_vmm_ctx_enter(x->v, &x->saved);
  if (st != XSEG_OK) {
    free(x->slot);
    free(x);
    return st;
  }
  /* PyTorch reads cudaDeviceProp::totalGlobalMem at each new segment;
     --device-memory may have changed it since the driver was opened. */
  CUdevice dev;
  size_t total = 0;
  CUresult r = XS_DRV(x->v->drv, cuDeviceGet, &dev, x->v->device);
  if (r == CUDA_SUCCESS) r = XS_DRV(x->v->drv, cuDeviceTotalMem, &total, dev);
  if (r != CUDA_SUCCESS) {
    st = xs_driver_error(x->v->drv, r, "cuDeviceTotalMem");
    pytorch_close(x);
    return st;
  }
  x->total_memory = total;
  *self = x;
  return XSEG_OK;
}

const xb_policy xb_policy_pytorch_expandable = {
    .name = "pytorch-expandable",
    .open = pytorch_open,
    .malloc = pytorch_malloc,
    .free = pytorch_free,
    .usage = pytorch_usage,
    .snapshot = NULL,
    .check = xb_pt_check,
    .close = pytorch_close,
};
