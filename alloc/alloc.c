/* alloc.c: the public entry points xseg_malloc, its cached path and its
 * slow path, and xseg_malloc_from_pool, the slow path from the pools its
 * caller chose (free is free.c's; an allocator's creation, destruction and
 * check are create.c's).
 *
 * The cached path (a free block fits) makes no driver call and no heap
 * allocation once warm: a best-fit lookup, a split from the block cache,
 * one pointer-table insert, all under the lock of the stream's pair of
 * pools alone (the pair found from the stream; pairs.h). Anything else (a
 * miss, pending frees of a busy pair, captures, tracing, shared blocks)
 * drops that lock and runs with every lock held (enter.h). A free that
 * would only merge the block back into the rest it was split from parks
 * it instead (free.c), and a malloc of the same size on the same pool
 * takes it back when that is what merging and splitting would give (lazy
 * merging, segments/pool.h, park.h), counting neither the free nor the
 * malloc when it asks for what the free gave back (the refill); every
 * other entry point settles first.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/capture.h"
#include "alloc/deferred.h"
#include "alloc/enter.h"
#include "alloc/frees.h"
#include "alloc/grow.h"
#include "alloc/pairs.h"
#include "alloc/park.h"
#include "alloc/policy.h"
#include "streams/stream_set.h"
#include "vmm/error.h"

/* Larger requests cannot be rounded to granules without overflow. */
#define XS_MAX_REQUEST ((size_t)1 << 62)

/* Nothing announces the end of a capture found by the driver: ask, lest
   the stream keep allocating to its pool after it ended. */
static xseg_status alloc_capture_refresh_locked(xseg_allocator *a) {
  if (a->n_implicit == 0) return XSEG_OK;
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  st = xs_capture_refresh_locked(a);
  xs_vmm_ctx_leave(&a->vmm, saved);
  return st;
}


/* The cached path's accounting: live and active together, the direction
   known at compile time (no sign multiplications, decreases without peak
   checks), in the block's pair's shard. The same as xs_alloc_account_live
   and _active together. active's peak needs a look only while freed blocks
   are still active (`pending`: pending_blocks, any pair's). */
static inline __attribute__((always_inline)) void alloc_account_malloc(
    xs_stats *s, const xs_block *b, xs_pool_kind k, bool pending) {
  xs_stats_inc(s, XS_GAUGE_allocation, k, 1);
  xs_stats_inc(s, XS_GAUGE_allocated_bytes, k, (int64_t)b->size);
  xs_stats_inc(s, XS_GAUGE_requested_bytes, k, (int64_t)b->requested);
  if (__builtin_expect(pending, 0)) xs_stats_pending_peak(s, k);
}

/* A free whose count was deferred (types.h, park_stats) and the
   malloc that takes the same block back for the same requested size, in
   one: each gauge falls and rises back to the value it had, which is
   under its threshold (xs_park_cancel_under), so only the totals of
   increases move. */
static inline void alloc_account_refill(xs_stats *s, const xs_block *b,
                                        xs_pool_kind k) {
  s->pool[k][XS_GAUGE_allocation].allocated += 1;
  s->pool[k][XS_GAUGE_allocated_bytes].allocated += (int64_t)b->size;
  s->pool[k][XS_GAUGE_requested_bytes].allocated += (int64_t)b->requested;
}

/* The pools a request on `stream` draws from: a private pool while the
   stream captures into one (one counter load when nothing captures), else
   the stream's own, `own` when the cached path found it already. */
static xseg_status alloc_pools_locked(xseg_allocator *a,
                                      struct CUstream_st *stream,
                                      xs_pair *own,
                                      xs_pair **out) {
  if (__builtin_expect(xs_alloc_capturing(a), 0)) {
    xseg_status st = alloc_capture_refresh_locked(a);
    if (st != XSEG_OK) return st;
    xs_pair *pair = xs_capture_pools_locked(a, stream);
    if (pair != NULL) return *out = pair, XSEG_OK;
  }
  if (own == NULL) return xs_pairs_lookup_locked(a, stream, out);
  assert(own->stream == stream && own->private_id == 0 && !own->dead);
  xs_pairs_touch_locked(a, own);
  *out = own;
  return XSEG_OK;
}

/* Pair lock held: a block just taken from pool p (of `kind`, given apart so
   that a caller that knows it at compile time folds it) becomes the caller's,
   its entry in the pair's pointer table already there (a parked block keeps
   its own). `pending`: a free is pending (xs_alloc_has_pending, read once by
   the caller). */
static inline __attribute__((always_inline)) void alloc_hand_out_listed(
    xseg_allocator *a, xs_pair *pair, xs_pool *p, xs_pool_kind kind,
    xs_block *b, size_t size, struct CUstream_st *stream, bool slow,
    bool pending) {
  (void)p;
  assert(xs_pool_pair(p) == pair && p->kind == kind);
  assert(xs_ptrtable_get(&pair->live, b->addr) == b);
  XS_ASSERT_PAIR_LOCKED(a, pair);
  b->requested = size;
  b->stream = stream;
  alloc_account_malloc(&pair->stats, b, kind, pending);
  /* Tracing sends the cached path the slow way (pairs.c). */
  assert(slow || a->trace.cap == 0);
  if (slow)
    xs_trace_record(&a->trace, XS_TRACE_ALLOC, b->addr, b->requested,
                    stream);
}

/* Pair lock held: the same for a block taken from the free tree, its
   entry put in (room in the pair's pointer table was reserved). */
static inline void alloc_hand_out(xseg_allocator *a, xs_pair *pair,
                                  xs_pool *p, xs_block *b, size_t size,
                                  struct CUstream_st *stream, bool slow,
                                  bool pending) {
  xs_ptrtable_add(&pair->live, b);
  alloc_hand_out_listed(a, pair, p, p->kind, b, size, stream, slow, pending);
}

/* The pools the caller of xseg_malloc_from_pool chose: the stream's own
   (pool 0), else the stream's pair of private pool `pool`, whatever the
   stream is announced to. */
static xseg_status alloc_chosen_pools_locked(xseg_allocator *a,
                                             struct CUstream_st *stream,
                                             xseg_pool_id pool,
                                             xs_pair **out) {
  if (pool == 0) return xs_pairs_lookup_locked(a, stream, out);
  return xs_capture_private_pair_locked(a, "xseg_malloc_from_pool", pool,
                                        stream, out);
}

/* `chosen`: the pools xseg_malloc_from_pool named, or NULL: where the
   stream sends the request (its announced or detected capture's pool,
   else its own). */
static xseg_status alloc_block_locked(xseg_allocator *a, size_t size,
                                      size_t rounded,
                                      struct CUstream_st *stream,
                                      xs_pair *own,
                                      const xseg_pool_id *chosen,
                                      xs_block **out) {
  xs_pair *pair;
  xseg_status st =
      chosen != NULL ? alloc_chosen_pools_locked(a, stream, *chosen, &pair)
                     : alloc_pools_locked(a, stream, own, &pair);
  if (st != XSEG_OK) return st;
  if (!xs_ptrtable_reserve(&pair->live))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for the pointer table");
  xs_pool *p = &pair->pool[xs_alloc_kind(rounded)];
  xs_block *b = xs_alloc_find_free(a, p, rounded);
  if (b == NULL)
    st = xs_alloc_grow_locked(a, &p, stream, rounded, size, chosen == NULL,
                              &b);
  if (st != XSEG_OK) return st;
  /* An unannounced capture found while growing moved the request to a
     private pair: room in its table too. */
  if (!xs_ptrtable_reserve(&xs_pool_pair(p)->live))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for the pointer table");
  xs_pool_take(p, b, rounded, xs_alloc_should_split(a, p, b, rounded));
  alloc_hand_out(a, xs_pool_pair(p), p, b, size, stream, true,
                 xs_alloc_has_pending(a));
  *out = b;
  return XSEG_OK;
}

/* Whether the run of p, merged, is a block the policy takes and splits
   for a request of its top's size (`rounded`), as settling and taking
   the best fit would (the best fit itself: xs_pool_retake_fits). */
static inline bool alloc_retake_policy(const xseg_allocator *a,
                                       const xs_pool *p, xs_pool_kind kind,
                                       size_t rounded) {
  size_t merged = (size_t)(xs_block_end(p->park_rest) - p->parked->addr);
  return xs_alloc_fit_takes(a, merged, rounded) &&
         xs_alloc_splits(a, kind, merged, rounded);
}

/* Whether p's top, of the request's size (`rounded`), is what settling
   the run and taking the best fit would hand out. With the top alone
   parked, the pool keeps the answer until a tree changes (the sizes
   cannot change before). */
static inline __attribute__((always_inline)) bool alloc_retake_fits(
    const xseg_allocator *a, xs_pool *p, xs_pool_kind kind, size_t rounded) {
  if (xs_pool_retake_known(p)) return true;
  return alloc_retake_policy(a, p, kind, rounded) && xs_pool_retake_fits(p);
}

/* Pair lock held: the refill, a malloc that takes back the newest held-back
   park, the top of pool `kind`, for the same requested size as its free (a
   layer's tensors allocated again in the order of the batch before, as models
   do), when settling the run and taking the best fit would hand out exactly
   that block and no threshold is passed on the way. Free, merges, split and
   malloc together then leave every gauge where it is (inactive_split_bytes
   rising by the held-back merges in between, which stay under their
   thresholds), so only the totals of increases move and nothing is called:
   xseg_malloc gets there without the cached path's frame. In two steps: the
   checks (false, nothing changed, when it does not apply; the cached path,
   alloc_retake, then pays what is held back and retakes, with the same
   result), then the moves. */
static inline __attribute__((always_inline)) bool alloc_refill_fits(
    const xseg_allocator *a, const xs_pair *pair, xs_pool_kind kind,
    size_t size, size_t rounded) {
  const xs_pool *p = &pair->pool[kind];
  /* The caller found p's park the newest held back (alloc_malloc_refill). */
  assert(pair->park_stats == p);
  /* While a free is pending, active = allocation + pending may pass its
     peak at a malloc that only restores allocation: no refill then,
     active's peak gets its look. (Read first: an atomic load makes the
     compiler read the pool's fields again.) */
  if (xs_alloc_has_pending(a)) return false;
  const xs_block *b = p->parked;
  assert(b != NULL && "a pool holding parks back has a run");
  if (b->size != rounded || b->requested != size) return false;
  /* The rest alone free in p: the merged block is the best fit without a
     look at a tree (the walk, out of line, is alloc_retake's). */
  if (!xs_pool_retake_known(p) &&
      (p->free.count != 1 || !alloc_retake_policy(a, p, kind, rounded)))
    return false;
  /* The top of the merges: where every held-back merge of the pool took
     inactive_split_bytes, the other pool's held too. */
  int64_t up = xs_park_held_split_bytes(pair, p);
  if (up > 0 &&
      !xs_park_split_under(&pair->stats, kind, up,
                           xs_park_held_split_bytes(pair, &pair->pool[!kind])))
    return false;
  return xs_park_cancel_under(pair, kind);
}
static inline __attribute__((always_inline)) xs_block *alloc_refill(
    xs_pair *pair, xs_pool_kind kind, size_t size,
    struct CUstream_st *stream) {
  xs_pool *p = &pair->pool[kind];
  xs_block *b = p->parked;
  if (!xs_pool_retake_known(p)) xs_pool_retake_fits_found(p);
  xs_park_owed_cancel(pair, p, kind);
  xs_pool_retake_cancelled(p, &pair->stats, kind);
  b->requested = size;
  alloc_account_refill(&pair->stats, b, kind);
  b->stream = stream;
  return b;
}

/* The cached malloc with blocks parked (xs_pair_parked): the top of
   the request's pool when the request is its size and settling then
   taking the best fit would hand out exactly it, every held-back park
   counted first (a refill, which counts none, was tried before, by
   alloc_malloc_refill). NULL (nothing changed) otherwise: the caller
   settles and goes the usual way. */
static inline __attribute__((always_inline)) xs_block *alloc_retake(
    xseg_allocator *a, xs_pair *pair, xs_pool_kind kind, size_t size,
    size_t rounded, struct CUstream_st *stream, bool pending) {
  xs_pool *p = &pair->pool[kind];
  xs_block *b = p->parked;
  if (b == NULL || b->size != rounded) return NULL;
  if (!alloc_retake_fits(a, p, kind, rounded)) return NULL;
  /* Every park not counted yet (the other pool's, or this one's) goes
     in the stats before this one's moves. */
  xs_park_owed_pay(pair);
  xs_pool_retake_counted(p, &pair->stats, kind);
  alloc_hand_out_listed(a, pair, p, kind, b, size, stream, false, pending);
  return b;
}

/* The cached malloc's best fit from the free tree (nothing parked in
   the pool, no stats held back): NULL (the slow path's turn) on a
   miss. */
static inline __attribute__((always_inline)) xs_block *alloc_cached_fit(
    xseg_allocator *a, xs_pair *pair, xs_pool_kind kind, size_t size,
    size_t rounded, struct CUstream_st *stream, bool pending) {
  if (!xs_ptrtable_reserve(&pair->live)) return NULL;
  xs_pool *p = &pair->pool[kind];
  xs_block *b = xs_alloc_find_free(a, p, rounded);
  if (b == NULL) return NULL;
  if (b->size > rounded && xs_alloc_splits(a, kind, b->size, rounded))
    xs_pool_take_front(p, &pair->stats, kind, b, rounded);
  else
    xs_pool_take_whole(p, &pair->stats, kind, b);
  xs_ptrtable_add(&pair->live, b);
  alloc_hand_out_listed(a, pair, p, kind, b, size, stream, false, pending);
  return b;
}

/* The cached malloc's polling of pending frees (PyTorch's
   process_events): the pair's own (its parked blocks merge first, as the
   completed frees go back to their pools), then the other streams' pairs'
   that a try of their lock gets (xs_alloc_poll_others). False when some
   may be left waiting: every lock completes them all. Out of line: only
   cross-stream frees make it. */
static __attribute__((noinline)) bool alloc_cached_poll(xseg_allocator *a,
                                                          xs_pair *pair) {
  xs_alloc_poll_pair(a, pair);
  return xs_alloc_pending_all_pair(a, pair) || xs_alloc_poll_others(a, pair);
}

/* The cached malloc from pool `kind` of `pair`: its top taken back
   (alloc_retake), else its parked blocks settle and the best fit is
   taken. The other pool's parked blocks stay: only their stats, if held
   back, count first. */
static inline __attribute__((always_inline)) xs_block *alloc_cached_in(
    xseg_allocator *a, xs_pair *pair, xs_pool_kind kind, size_t size,
    size_t rounded, struct CUstream_st *stream, bool pending) {
  xs_pool *p = &pair->pool[kind];
  if (p->parked != NULL) {
    xs_block *b = alloc_retake(a, pair, kind, size, rounded, stream, pending);
    if (b != NULL) return b;
    xs_park_settle_pool(p);               /* counts what is held back */
  } else {
    xs_park_owed_pay(pair);
  }
  return alloc_cached_fit(a, pair, kind, size, rounded, stream, pending);
}

/* The cached malloc, pair lock held: the block handed out, or NULL (the
   slow path's turn) on a miss. Pending frees of the pair are polled
   first. */
static inline __attribute__((always_inline)) xs_block *alloc_cached(
    xseg_allocator *a, xs_pair *pair, size_t size, size_t rounded,
    struct CUstream_st *stream) {
  bool pending = xs_alloc_has_pending(a);
  if (__builtin_expect(pending, 0)) {
    if (!alloc_cached_poll(a, pair)) return NULL;
    pending = xs_alloc_has_pending(a);
  }
  /* The kind a constant in each copy: the stats' offsets fold. */
  return xs_alloc_kind(rounded) == XS_POOL_SMALL
             ? alloc_cached_in(a, pair, XS_POOL_SMALL, size, rounded, stream,
                               pending)
             : alloc_cached_in(a, pair, XS_POOL_LARGE, size, rounded, stream,
                               pending);
}

/* xs_config_round_size, with its common case inline: a size whose
   roundup_power2_divisions interval (floor(log2(size)) - 20, clamped to
   [0, XS_ROUNDUP_INTERVALS - 1]: every size under 2 MiB in the first) has
   no divisions is rounded to 512 bytes, which cannot overflow up to
   XS_MAX_REQUEST. */
static inline bool alloc_rounds_plain(const xs_config *c, size_t size) {
  if (__builtin_expect(size < ((size_t)2 << 20), 1))
    return c->roundup_power2_divisions[0] <= 1;
  unsigned idx = 43u - (unsigned)__builtin_clzll(size);   /* log2 - 20 */
  if (idx > XS_ROUNDUP_INTERVALS - 1) idx = XS_ROUNDUP_INTERVALS - 1;
  return size <= XS_MAX_REQUEST && c->roundup_power2_divisions[idx] <= 1;
}
static inline size_t alloc_round_plain(size_t size) {
  return size <= XS_MIN_BLOCK ? XS_MIN_BLOCK
                              : (size + XS_MIN_BLOCK - 1) & ~(XS_MIN_BLOCK - 1);
}
static inline size_t alloc_round(const xs_config *c, size_t size) {
  return alloc_rounds_plain(c, size) ? alloc_round_plain(size)
                                     : xs_config_round_size(c, size);
}

/* Whether a malloc's arguments hold (an allocator, somewhere to put the
   pointer, a size that rounds without passing XS_MAX_REQUEST), its
   rounding in *rounded; else alloc_malloc_refused says which failed. */
static inline bool alloc_request_valid(const xseg_allocator *a, size_t size,
                                       void **ptr, size_t *rounded) {
  if (a == NULL || ptr == NULL) return false;
  *rounded = alloc_round(&a->cfg, size);
  /* 0 (overflow) wraps above the limit too. */
  return *rounded - 1 < XS_MAX_REQUEST;
}

/* The refusals of `fn` (xseg_malloc or xseg_malloc_from_pool): *ptr NULL
   (when there is one). */
static __attribute__((noinline, cold)) xseg_status alloc_malloc_refused(
    const char *fn, xseg_allocator *a, size_t size, void **ptr) {
  if (ptr != NULL) *ptr = NULL;
  if (a == NULL || ptr == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "%s(%zu bytes): %s", fn,
                    size, a == NULL ? "allocator is NULL" : "ptr is NULL");
  return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "%s(%zu bytes): the size overflows when rounded to blocks "
                  "and granules", fn, size);
}

/* xseg_malloc's slow path, no lock held: takes every lock (after a miss
   of the cached path, or when it may not run). `own`: the stream's own
   pair when the caller found it (it never goes away), else NULL;
   `chosen` as alloc_block_locked's. */
static __attribute__((noinline)) xseg_status alloc_malloc_slow(
    xseg_allocator *a, size_t size, size_t rounded,
    struct CUstream_st *stream, xs_pair *own, const xseg_pool_id *chosen,
    void **ptr) {
  xs_block *b = NULL;
  xs_alloc_enter(a);
  /* Frees waiting on other streams are completed first, as PyTorch's
     process_events; a counter check when none waits. A failed query only
     leaves them waiting: the allocation goes on. */
  if (__builtin_expect(xs_alloc_has_pending(a), 0))
    xs_alloc_complete_frees_locked(a, false);
  xseg_status st =
      alloc_block_locked(a, size, rounded, stream, own, chosen, &b);
  xs_alloc_leave(a);
  *ptr = st == XSEG_OK ? (void *)(uintptr_t)b->addr : NULL;
  return st;
}

/* Pair lock held: the repeated size's malloc, the parked block of the small
   pool taken back, its retake known to fit (the pool keeps the answer), for
   the same requested size as its free, whose stats and merge are still held
   back (park_stats): free, merge, split and malloc together pass no peak and
   leave every gauge at or under its threshold, so only totals of increases
   move. Any other case (the park counted already, another
   requested size, more parks held back) is the refill's or the cached path's
   (alloc_malloc_refill). In two steps: the checks (false, nothing changed,
   when it does not apply), then the moves. Neither calls anything. */
static inline __attribute__((always_inline)) bool alloc_retake_repeated_fits(
    const xseg_allocator *a, xs_pair *pair, size_t size) {
  const xs_pool_kind k = XS_POOL_SMALL;
  xs_pool *p = &pair->pool[k];
  /* The parks not counted yet are the parked block's alone, in p: it is
     all that is parked (retake_known) and nothing is held in the other
     pool. */
  if (pair->park_stats != p || pair->park_first != NULL) return false;
  /* Held frees (any pair's) give active's peak a look: the cached path's,
     as do the pair's own pending frees, which are polled first. (Read
     before the pool's fields: an atomic load makes the compiler read them
     again.) */
  if (xs_alloc_has_pending(a)) return false;
  assert(p->parked != NULL);
  if (p->parked->requested != size) return false;
  if (!xs_pool_retake_known(p) ||
      !xs_pool_retake_under_peaks(p, &pair->stats, k) ||
      !xs_park_cancel_under(pair, k))
    return false;
  /* So the block is the request's size rounded, without a look: it was
     handed out last for `size` (its requested size), and retake_known, never
     cleared since, says that no tree changed since the retake that found
     its size to be a request's rounding (alloc_retake); a block handed out
     any other way comes from a tree (alloc_cached_fit), which clears it. */
  assert(p->parked->size == alloc_round_plain(size));
  return true;
}
static inline __attribute__((always_inline)) void alloc_retake_repeated(
    xs_pair *pair, size_t size, struct CUstream_st *stream) {
  const xs_pool_kind k = XS_POOL_SMALL;
  xs_pool *p = &pair->pool[k];
  xs_block *b = p->parked;
  xs_park_owed_cancel_alone(pair, p, k);
  xs_pool_retake_under(p, &pair->stats, k);
  b->requested = size;
  alloc_account_refill(&pair->stats, b, k);
  b->stream = stream;
}

/* A malloc of a valid size (`rounded`: its rounding) with `pair`'s lock
   held (nothing else), its use counted already (pair->used_at, the
   thread's count: pairs' recency, as xs_pairs_use): the cached path
   (alloc_cached), else every lock. Out of line, for xseg_malloc's
   repeated size: that then makes no call but tail calls, and keeps its
   values in scratch registers; xseg_malloc's arguments come first, in
   its order, so that its tail call leaves them where they are. */
static __attribute__((noinline)) xseg_status alloc_malloc_pair(
    xseg_allocator *a, size_t size, struct CUstream_st *stream, void **ptr,
    xs_pair *pair, size_t rounded) {
  xs_block *b = NULL;
  if (xs_pair_cached_on(a, pair))
    b = alloc_cached(a, pair, size, rounded, stream);
  xs_pair_drop(pair);
  if (__builtin_expect(b != NULL, 1)) {
    xs_alloc_debug_after_cached(a);
    *ptr = (void *)(uintptr_t)b->addr;
    return XSEG_OK;
  }
  return alloc_malloc_slow(a, size, rounded, stream, pair, NULL, ptr);
}

/* A malloc of a valid size (`rounded`) with `pair`'s lock held and its
   use counted, as alloc_malloc_pair's, the cached path allowed
   (xs_pair_cached_on): the refill (alloc_refill_fits), else
   alloc_malloc_pair. Out of line and apart from alloc_malloc_pair: the
   refill needs fewer registers than the cached path, and a request
   with nothing held back (alloc_malloc_by_stream's; xseg_malloc sends
   those to alloc_malloc_pair itself) passes through in a few
   instructions. */
static __attribute__((noinline)) xseg_status alloc_malloc_refill(
    xseg_allocator *a, size_t size, struct CUstream_st *stream, void **ptr,
    xs_pair *pair, size_t rounded) {
  assert(xs_pair_cached_on(a, pair));
  if (pair->park_stats == NULL)                 /* nothing held back */
    return alloc_malloc_pair(a, size, stream, ptr, pair, rounded);
  xs_block *b = NULL;
  if (pair->park_stats == &pair->pool[xs_alloc_kind(rounded)]) {
    /* The kind a constant in each copy: the stats' offsets fold. */
    if (xs_alloc_kind(rounded) == XS_POOL_SMALL) {
      if (alloc_refill_fits(a, pair, XS_POOL_SMALL, size, rounded))
        b = alloc_refill(pair, XS_POOL_SMALL, size, stream);
    } else if (alloc_refill_fits(a, pair, XS_POOL_LARGE, size, rounded)) {
      b = alloc_refill(pair, XS_POOL_LARGE, size, stream);
    }
  }
  if (b == NULL)
    return alloc_malloc_pair(a, size, stream, ptr, pair, rounded);
  *ptr = (void *)(uintptr_t)b->addr;
  if (__builtin_expect(!xs_pair_drop_wake_later(pair), 0))
    return xs_alloc_wake_after_cached(a, pair);
  xs_alloc_debug_after_cached(a);
  return XSEG_OK;
}

/* No lock held: xseg_malloc's every case but the repeated size's, the
   request checked and rounded, the stream's pair found in the stream
   index and its lock taken, then its refill or cached path, else every
   lock (alloc_malloc_slow). */
static __attribute__((noinline)) xseg_status alloc_malloc_by_stream(
    xseg_allocator *a, size_t size, struct CUstream_st *stream, void **ptr) {
  size_t rounded;
  if (__builtin_expect(!alloc_request_valid(a, size, ptr, &rounded), 0))
    return alloc_malloc_refused("xseg_malloc", a, size, ptr);
  xs_pair *pair = xs_pairs_of_stream(a, stream);
  /* No pair yet, or the slow flag up (a hint, read without the lock):
     every lock at once, not the pair's first. */
  if (__builtin_expect(pair == NULL || xs_alloc_slow_hint(a), 0)) {
    xs_pairs_use();                       /* as with the pair lock */
    return alloc_malloc_slow(a, size, rounded, stream, pair, NULL, ptr);
  }
  xs_pair_take(pair);
  pair->used_at = xs_pairs_use();
  if (__builtin_expect(!xs_pair_cached_on(a, pair), 0))
    return alloc_malloc_pair(a, size, stream, ptr, pair, rounded);
  return alloc_malloc_refill(a, size, stream, ptr, pair, rounded);
}

/* A size on the thread's last stream, its pair lock free: the repeated
   size's retake (alloc_retake_repeated), else with that lock the cached
   path (alloc_malloc_pair) when nothing is held back, the refill or the
   cached path (alloc_malloc_refill) when something is; anything else is
   alloc_malloc_by_stream's. Nothing held back goes straight to
   alloc_malloc_pair, not through alloc_malloc_refill's first test
   (measured with bench/callgrind.sh: mixed 10000 529.5 -> 523.7
   instructions per pair, random 10000 389.6 -> 383.7, layers 250.9 ->
   249.5, repeat 127.0 -> 128.0). */
xseg_status xseg_malloc(xseg_allocator *a, size_t size,
                        struct CUstream_st *stream, void **ptr) {
  /* One test each: joined by ||, the compiler computes them as flags. */
  if (__builtin_expect(a == NULL, 0))
    return alloc_malloc_by_stream(a, size, stream, ptr);
  if (__builtin_expect(ptr == NULL, 0))
    return alloc_malloc_by_stream(a, size, stream, ptr);
  if (__builtin_expect(!alloc_rounds_plain(&a->cfg, size), 0))
    return alloc_malloc_by_stream(a, size, stream, ptr);
  /* One thread-local access: the use is counted first (a count that a
     fallback counts again only needs to grow). */
  xs_pairs_thread *t = xs_pairs_self();
  uint64_t use = ++t->uses;
  xs_pair *pair = t->pair;
  if (__builtin_expect(t->id != a->id || t->stream != stream, 0) ||
      !xs_pair_try(pair))
    return alloc_malloc_by_stream(a, size, stream, ptr);
  pair->used_at = use;
  if (__builtin_expect(!xs_pair_cached_on(a, pair), 0))
    return alloc_malloc_pair(a, size, stream, ptr, pair,
                             alloc_round_plain(size));
  if (__builtin_expect(!alloc_retake_repeated_fits(a, pair, size), 0)) {
    if (pair->park_stats == NULL)               /* nothing held back */
      return alloc_malloc_pair(a, size, stream, ptr, pair,
                               alloc_round_plain(size));
    return alloc_malloc_refill(a, size, stream, ptr, pair,
                               alloc_round_plain(size));
  }
  /* The address first: its register is free for the moves. */
  *ptr = (void *)(uintptr_t)pair->pool[XS_POOL_SMALL].parked->addr;
  alloc_retake_repeated(pair, size, stream);
  if (__builtin_expect(!xs_pair_drop_wake_later(pair), 0))
    return xs_alloc_wake_after_cached(a, pair);
  xs_alloc_debug_after_cached(a);
  return XSEG_OK;
}

/* Every lock, as the slow path, with the pools the caller chose. */
xseg_status xseg_malloc_from_pool(xseg_allocator *a, size_t size,
                                  struct CUstream_st *stream,
                                  xseg_pool_id pool, void **ptr) {
  size_t rounded;
  if (__builtin_expect(!alloc_request_valid(a, size, ptr, &rounded), 0))
    return alloc_malloc_refused("xseg_malloc_from_pool", a, size, ptr);
  xs_pairs_use();                               /* as xseg_malloc's */
  return alloc_malloc_slow(a, size, rounded, stream, NULL, &pool, ptr);
}
