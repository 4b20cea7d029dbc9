/* reclaim.c: taking free physical memory back — release passes
 * (empty_cache, the out-of-memory path) and garbage collection. Which
 * memory serves a growth is flow.c's; the guard, retire and handle acts are
 * physical.c's.
 *
 * Lent memory (segments/release.c) retires here too: each guard pass
 * unmaps the aliases whose old work it has proven done.
 *
 * Every pass first makes sure no graph capture is under way (announced, or
 * seen by cuStreamGetCaptureInfo on a stream with pools): a capture forbids
 * the queries below and may use any cached block. Then it completes pending
 * frees and advances the unmap guard of each pair of pools that has unsafe
 * free memory (streams/guard.h): an idle stream costs one cuStreamQuery, a
 * busy one a recorded event that a later pass finds fired. Only blocks
 * whose free the guard has passed are cut (segments/release.c). Nothing
 * waits on the host unless the caller asks for the blocking form, which
 * waits on those events alone, never on a stream or the device; except
 * once after a private pool's release, whose graph's replays no event
 * covers (xs_alloc_sync_released_locked waits for the device).
 */
#include <assert.h>
#include <stdlib.h>

#include "alloc/account.h"
#include "alloc/capture.h"
#include "alloc/capture_mode.h"
#include "alloc/deferred.h"
#include "alloc/flow.h"
#include "alloc/frees.h"
#include "alloc/pairs.h"
#include "alloc/reclaim.h"
#include "alloc/types.h"
#include "vmm/error.h"

xseg_status xs_alloc_guards_locked(xseg_allocator *a, bool wait) {
  xseg_status first = XSEG_OK;
  if (xs_alloc_capturing(a)) return first;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    if (!xs_pools_reclaimable(pair)) continue;
    xseg_status st = xs_alloc_guard_advance_locked(a, pair, wait);
    xseg_status rs = xs_alloc_retire_aliases_locked(a, pair);
    if (first == XSEG_OK) first = st != XSEG_OK ? st : rs;
  }
  return first;
}

/* A released private pool's memory may still be in use by a replay of
   its graph queued on any stream: PyTorch replays a graph on the current
   stream, not on the capture's, and releases the pool at the graph's
   reset without waiting for it; no event of xseg's covers that stream.
   PyTorch gives such memory back with cudaFree, which waits for the
   device; so the first release pass or out-of-memory retry that may take
   it waits for the device here, once for every pool released before
   (until then, xs_pools_reclaimable leaves it alone, and so do garbage
   collection and a growth's search of other streams' memory, which never
   block). */
bool xs_alloc_sync_owed_locked(const xseg_allocator *a) {
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    if (pair->sync_owed) return true;
  return false;
}

xseg_status xs_alloc_sync_released_locked(xseg_allocator *a) {
  XS_ASSERT_LOCKED(a);
  assert(!xs_alloc_capturing(a) && "no device wait during a capture");
  if (!xs_alloc_sync_owed_locked(a)) return XSEG_OK;
  /* Captures xseg does not know of may be under way (capture_mode.c). */
  CUstreamCaptureMode mode;
  xseg_status st = xs_capture_mode_relax(a, &mode);
  if (st != XSEG_OK) return st;
  CUresult r = XS_DRV(a->vmm.drv, cuCtxSynchronize);
  xs_capture_mode_restore(a, mode);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(a->vmm.drv, r, "cuCtxSynchronize (device %d, "
                           "before taking released private pools' memory, "
                           "which a replay of their graphs may still use)",
                           a->vmm.device);
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    pair->sync_owed = false;
  return XSEG_OK;
}

/* What every pass does first (see the top); a release pass (`release`,
   not garbage collection) also waits for the device when released
   private pools ask it, before the guards, which then cover their pairs
   too. False when a capture is under way, or the capture state could not
   be read (*st then says why). */
static bool reclaim_prepare_locked(xseg_allocator *a, bool wait,
                                   bool release, xseg_status *st) {
  *st = xs_capture_sweep_locked(a);
  if (*st != XSEG_OK || xs_alloc_capturing(a)) return false;
  if (wait) a->shared_stats.counter[XS_COUNTER_num_sync_all_streams]++;
  *st = xs_alloc_complete_frees_locked(a, wait);
  xseg_status ss = release ? xs_alloc_sync_released_locked(a) : XSEG_OK;
  xseg_status gs = xs_alloc_guards_locked(a, wait);
  if (*st == XSEG_OK) *st = ss != XSEG_OK ? ss : gs;
  return true;
}

/* Released private pools that hold nothing any more go away. */
static void reclaim_drop_released_locked(xseg_allocator *a) {
  xs_pair *pair = a->streams;
  while (pair != NULL) {
    xs_pair *next = pair->next;
    if (pair->released && pair->pool[0].segments == NULL &&
        pair->pool[1].segments == NULL)
      xs_pairs_free_locked(a, pair);
    pair = next;
  }
}

xseg_status xs_alloc_release_locked(xseg_allocator *a, size_t goal,
                                    bool wait) {
  XS_ASSERT_LOCKED(a);
  xseg_status first;
  if (!reclaim_prepare_locked(a, wait, true, &first)) return first;
  /* Handles whose release failed before go first. */
  xseg_status rs = xs_vmm_unreleased_retry(&a->vmm);
  if (first == XSEG_OK) first = rs;
  size_t done = 0;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2 && done < goal && xs_pools_reclaimable(pair); k++) {
      size_t bytes = 0;
      /* SIZE_MAX stays "all" from pool to pool, whatever went before. */
      size_t left = goal == SIZE_MAX ? SIZE_MAX : goal - done;
      xseg_status st = xs_pool_release(&pair->pool[k], left, &bytes);
      if (first == XSEG_OK) first = st;
      done += bytes;
    }
  reclaim_drop_released_locked(a);
  return first;
}

/* Gives back every free granule of `stream`'s reclaimable pairs that
   their guards allow. */
static xseg_status reclaim_stream_pools_locked(xseg_allocator *a,
                                               struct CUstream_st *stream) {
  xseg_status first = XSEG_OK;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++) {
      if (pair->stream != stream || !xs_pools_reclaimable(pair)) continue;
      size_t bytes;
      xseg_status st = xs_pool_release(&pair->pool[k], SIZE_MAX, &bytes);
      if (first == XSEG_OK) first = st;
    }
  return first;
}

bool xs_alloc_stream_holds_memory_locked(const xseg_allocator *a,
                                         const struct CUstream_st *stream) {
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    if (pair->stream == stream &&
        (pair->pool[0].segments != NULL || pair->pool[1].segments != NULL))
      return true;
  return false;
}

xseg_status xs_alloc_release_stream_locked(xseg_allocator *a,
                                           struct CUstream_st *stream) {
  XS_ASSERT_LOCKED(a);
  xseg_status first = xs_capture_sweep_locked(a);
  if (first != XSEG_OK || xs_alloc_capturing(a)) return first;
  /* Without waiting: frees made during a capture get their events, and
     those whose events fired (other pairs' too) complete. */
  first = xs_alloc_complete_frees_locked(a, false);
  xseg_status ss = xs_alloc_sync_released_locked(a);
  if (first == XSEG_OK) first = ss;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    if (pair->stream != stream || !xs_pools_reclaimable(pair)) continue;
    /* In this order: completed frees give blocks back, whose work the
       guard then covers. */
    xseg_status ds = xs_alloc_drain_pair_locked(a, pair);
    xseg_status gs = xs_alloc_guard_advance_locked(a, pair, true);
    xseg_status rs = xs_alloc_retire_aliases_locked(a, pair);
    if (first == XSEG_OK) first = ds != XSEG_OK ? ds : gs != XSEG_OK ? gs : rs;
  }
  xseg_status ps = reclaim_stream_pools_locked(a, stream);
  if (first == XSEG_OK) first = ps;
  /* Memory the stream took from another stream stays pinned while that
     stream's old mapping of it lasts (an alias, retiring behind its own
     guard, segments/release.c): the guards of the pairs with retiring
     aliases are waited for, those alone, and the pools released again. */
  if (first == XSEG_OK && xs_alloc_stream_holds_memory_locked(a, stream)) {
    for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
      if (pair->stream == stream || !xs_pools_reclaimable(pair) ||
          pair->pool[0].n_retiring + pair->pool[1].n_retiring == 0)
        continue;
      xseg_status gs = xs_alloc_guard_advance_locked(a, pair, true);
      xseg_status rs = xs_alloc_retire_aliases_locked(a, pair);
      if (first == XSEG_OK) first = gs != XSEG_OK ? gs : rs;
    }
    ps = reclaim_stream_pools_locked(a, stream);
    if (first == XSEG_OK) first = ps;
  }
  reclaim_drop_released_locked(a);
  return first;
}

/* ---- garbage collection ------------------------------------------------- */

typedef struct gc_candidate {
  xs_pool *pool;
  xs_block *block;
} gc_candidate;

static int gc_older(const void *x, const void *y) {
  uint64_t a = ((const gc_candidate *)x)->block->free_epoch;
  uint64_t b = ((const gc_candidate *)y)->block->free_epoch;
  return a < b ? -1 : a > b;
}

/* Every releasable free block of every reclaimable pool; NULL when there
   are none or host memory ran out. */
static gc_candidate *gc_candidates_locked(xseg_allocator *a, size_t *n) {
  size_t cap = 0;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    cap += pair->pool[0].free.count + pair->pool[1].free.count;
  gc_candidate *c = cap ? malloc(cap * sizeof *c) : NULL;
  *n = 0;
  if (c == NULL) return NULL;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2 && xs_pools_reclaimable(pair); k++) {
      xs_pool *p = &pair->pool[k];
      /* A block under the driver's granularity holds no whole granule. */
      size_t least = p->vmm->granularity;
      for (xs_block *b = xs_freetree_largest(&p->free, least); b != NULL;
           b = xs_freetree_smaller(&p->free, b, least))
        if (xs_pool_block_releasable(p, b)) c[(*n)++] = (gc_candidate){p, b};
    }
  return c;
}

/* Releases the oldest free blocks' granules until `goal` bytes went.
   Cutting a block only touches it and unmapped neighbours, so the other
   candidates (free mapped blocks) stay valid. */
static size_t gc_release_oldest_locked(xseg_allocator *a, size_t goal) {
  size_t n, done = 0;
  gc_candidate *c = gc_candidates_locked(a, &n);
  if (n > 0) qsort(c, n, sizeof *c, gc_older);   /* never qsort(NULL) */
  for (size_t i = 0; i < n && done < goal; i++) {
    size_t g = c[i].block->seg->granule;
    xseg_status st;
    done += xs_pool_release_block(c[i].pool, c[i].block,
                                  (goal - done + g - 1) / g, &st) * g;
  }
  free(c);
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++) xs_pool_drop_empty(&pair->pool[k]);
  reclaim_drop_released_locked(a);
  return done;
}

/* Releases free block b of pool p, whole: its bytes released. */
static size_t oversize_release_locked(xs_pool *p, xs_block *b) {
  size_t g = b->seg->granule;
  xseg_status st;
  return xs_pool_release_block(p, b, SIZE_MAX, &st) * g;
}

/* Whether a free oversize block of p waits on its stream's guard. */
static bool oversize_waits(xs_pool *p, size_t max_split) {
  xs_block *b = xs_freetree_largest(&p->free, max_split);
  for (; b != NULL; b = xs_freetree_smaller(&p->free, b, max_split))
    if (b->free_epoch > p->safe_epoch) return true;
  return false;
}

bool xs_alloc_release_oversize_locked(xseg_allocator *a, xs_pool *p,
                                      size_t rounded) {
  size_t max_split = a->cfg.max_split_size;
  xs_pair *pair = xs_pool_pair(p);
  if (max_split == SIZE_MAX || a->cfg.expandable_segments ||
      !xs_pools_reclaimable(pair))
    return false;
  xseg_status st;
  if (!reclaim_prepare_locked(a, false, false, &st)) return false;
  /* PyTorch's cudaFree of such a block waits for the device: here the
     stream's own recorded work, when an oversize block waits on it (a
     failed wait leaves those blocks where they are). */
  if (oversize_waits(p, max_split)) {
    xs_alloc_guard_advance_locked(a, pair, true);
    xs_alloc_retire_aliases_locked(a, pair);
  }
  size_t want = rounded < max_split ? max_split : rounded;
  /* Oversize blocks are never split (xs_alloc_splits): each is a whole
     segment, as PyTorch's release_block takes it. */
  xs_block *b = xs_freetree_best_fit(&p->free, want);
  size_t done = 0;
  bool one = b != NULL && xs_pool_block_releasable(p, b);
  if (one) {
    done = oversize_release_locked(p, b);
  } else {
    /* No single block is large enough: the largest first, while they are
       oversize. Cutting a block leaves the next smaller one valid. */
    b = xs_freetree_largest(&p->free, max_split);
    while (b != NULL && done < want) {
      xs_block *next = xs_freetree_smaller(&p->free, b, max_split);
      if (xs_pool_block_releasable(p, b)) done += oversize_release_locked(p, b);
      b = next;
    }
  }
  xs_pool_drop_empty(p);
  reclaim_drop_released_locked(a);
  return one ? done > 0 : done >= want;
}

bool xs_alloc_collect_garbage_locked(xseg_allocator *a) {
  double t = a->cfg.garbage_collection_threshold;
  if (t <= 0) return false;
  size_t target = (size_t)(t * (double)a->cap);
  size_t reserved =
      (size_t)xs_alloc_current(a, XS_GAUGE_reserved_bytes);
  if (reserved <= target) return false;
  xseg_status st;
  if (!reclaim_prepare_locked(a, false, false, &st)) return false;
  return gc_release_oldest_locked(a, reserved - target) > 0;
}
