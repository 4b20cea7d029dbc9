/* capture.c: allocation during CUDA graph capture, into private pools
 * (PyTorch's beginAllocateToPool / endAllocateToPool / releasePool).
 *
 * A graph replays the addresses it captured, so the memory a capture
 * allocates must stay the graph's: a private pool (a pair of pools keyed by
 * the pool id, xs_pair.private_id) that no other allocation draws
 * from and no release pass takes from, until xseg_release_pool. Then its
 * free memory is released (or moved to other streams) like any other, once
 * the device has been waited for (a replay of the graph may be queued on
 * any stream: reclaim.c, xs_alloc_sync_released_locked), and the pair
 * goes away once it holds nothing.
 *
 * The caller announces a capture with xseg_begin_allocate_to_pool, as
 * PyTorch requires. An unannounced capture is detected on the slow path
 * only (cuStreamGetCaptureInfo before growing), so the cached path makes no
 * extra driver call: it becomes an implicit entry whose pool id is
 * XSEG_CAPTURE_POOL(capture id). Blocks handed out from the stream's own
 * cache before that detection are not in the private pool: announce.
 *
 * While any entry exists, nothing queries an event, synchronises or unmaps
 * (CUDA forbids the first two during a global-mode capture, and a graph may
 * use any cached block); frees that need events wait in a->deferred.
 */
#include <assert.h>
#include <stdlib.h>

#include "alloc/capture.h"
#include "alloc/enter.h"
#include "alloc/pairs.h"
#include "alloc/types.h"
#include "vmm/array.h"
#include "vmm/error.h"

/* A private pool keeps a pair per stream (see xseg.h): a block that one
   stream freed may still be used by work that stream queued, which another
   stream's allocation would not wait for. */
static xs_pair *capture_pair_find_locked(xseg_allocator *a, xseg_pool_id id,
                                         struct CUstream_st *stream) {
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    if (pair->private_id == id && pair->stream == stream && !pair->released)
      return pair;
  return NULL;
}

static xs_capture *capture_of_stream_locked(xseg_allocator *a,
                                            struct CUstream_st *stream) {
  for (size_t i = 0; i < a->n_captures; i++)
    if (a->captures[i].stream == stream) return &a->captures[i];
  return NULL;
}

xs_pair *xs_capture_pools_locked(xseg_allocator *a,
                                 struct CUstream_st *stream) {
  xs_capture *c = capture_of_stream_locked(a, stream);
  return c != NULL ? capture_pair_find_locked(a, c->pool, stream) : NULL;
}

xseg_status xs_capture_private_pair_locked(xseg_allocator *a,
                                           const char *what,
                                           xseg_pool_id pool,
                                           struct CUstream_st *stream,
                                           xs_pair **out) {
  *out = capture_pair_find_locked(a, pool, stream);
  if (*out != NULL) return XSEG_OK;
  return xs_pairs_new_locked(a, what, stream, pool, out);
}

/* A new entry; its private pair is found or created (`what`: the caller,
   as xs_capture_private_pair_locked's). */
static xseg_status capture_add_locked(xseg_allocator *a, const char *what,
                                      xs_capture c, xs_pair **out) {
  if (!XS_ARRAY_RESERVE(a->captures, a->cap_captures, a->n_captures + 1, 4))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for private pool %llu",
                    (unsigned long long)c.pool);
  xs_pair *pair;
  xseg_status st =
      xs_capture_private_pair_locked(a, what, c.pool, c.stream, &pair);
  if (st != XSEG_OK) return st;
  a->captures[a->n_captures++] = c;
  a->n_implicit += c.implicit;
  if (out != NULL) *out = pair;
  return XSEG_OK;
}

static void capture_remove_locked(xseg_allocator *a, size_t i) {
  assert(i < a->n_captures);
  a->n_implicit -= a->captures[i].implicit;
  a->captures[i] = a->captures[--a->n_captures];
}

/* cuStreamGetCaptureInfo: *active when `stream` is in a capture (an
   invalidated one still is, until it ends), with its id; *id_known is
   false for an invalidated capture, whose id cuda.h leaves unspecified
   ("valid only if the status is ACTIVE"; docs/conformance.md, row G3).
   A stream the caller destroyed (CUDA_ERROR_INVALID_HANDLE, as for
   cuStreamQuery: streams/stream_query.h) captures nothing: *active false.
   CUDA ends a capture when its stream is destroyed (cuStreamDestroy
   abandons it), so the entry of a capture xseg detected on it must go, or
   every later refresh would fail. */
static xseg_status capture_query(xseg_allocator *a, struct CUstream_st *s,
                                 bool *active, bool *id_known,
                                 uint64_t *id) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  CUresult r = XS_DRV(a->vmm.drv, cuStreamGetCaptureInfo, (CUstream)s,
                      &status, &cid, NULL, NULL, NULL, NULL);
  if (r == CUDA_ERROR_INVALID_HANDLE)
    status = CU_STREAM_CAPTURE_STATUS_NONE;
  else if (r != CUDA_SUCCESS)
    return xs_driver_error(a->vmm.drv, r, "cuStreamGetCaptureInfo(stream %p)",
                           (void *)s);
  *active = status != CU_STREAM_CAPTURE_STATUS_NONE;
  *id_known = status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  *id = cid;
  return XSEG_OK;
}

xseg_status xs_capture_detect_locked(xseg_allocator *a,
                                     struct CUstream_st *stream,
                                     xs_pair **out) {
  *out = NULL;
  bool active = false;       /* set on success; -O3 cannot tell */
  uint64_t id = 0;
  bool id_known;
  xseg_status st = capture_query(a, stream, &active, &id_known, &id);
  if (st != XSEG_OK || !active) return st;
  xs_capture c = {.stream = stream, .pool = XSEG_CAPTURE_POOL(id),
                  .capture_id = id, .implicit = true};
  return capture_add_locked(a, "a malloc in a graph capture", c, out);
}

xseg_status xs_capture_any_on(xseg_allocator *a, const xs_stream_set *streams,
                              bool *capturing) {
  xs_driver *drv = a->vmm.drv;
  *capturing = false;
  for (uint32_t i = 0; i < streams->n; i++) {
    struct CUstream_st *s = xs_stream_set_at(streams, i);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = XS_DRV(drv, cuStreamIsCapturing, (CUstream)s, &status);
    /* The legacy stream while a blocking stream captures: work queued on
       it would join that capture (cuda.h, cuStreamIsCapturing). */
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
        (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE)) {
      *capturing = true;
      return XSEG_OK;
    }
    /* A destroyed stream captures nothing (as in capture_query). */
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_HANDLE)
      return xs_driver_error(drv, r, "cuStreamIsCapturing(stream %p)",
                             (void *)s);
  }
  return XSEG_OK;
}

xseg_status xs_capture_refresh_locked(xseg_allocator *a) {
  size_t i = 0;
  while (i < a->n_captures) {
    xs_capture *c = &a->captures[i];
    bool active = false, id_known = false;
    uint64_t id = 0;
    if (!c->implicit) { i++; continue; }
    xseg_status st = capture_query(a, c->stream, &active, &id_known, &id);
    if (st != XSEG_OK) return st;
    /* An invalidated capture has not ended, and its id cannot tell it
       from a new one: it keeps its entry until the stream is out of it. */
    if (active && (!id_known || id == c->capture_id))
      i++;
    else
      capture_remove_locked(a, i);     /* ended: its pool stays private */
  }
  return XSEG_OK;
}

xseg_status xs_capture_sweep_locked(xseg_allocator *a) {
  xseg_status st = xs_capture_refresh_locked(a);
  for (xs_pair *pair = a->streams; st == XSEG_OK && pair != NULL;
       pair = pair->next) {
    if (pair->private_id != 0 || pair->forgotten ||
        capture_of_stream_locked(a, pair->stream) != NULL)
      continue;
    bool active = false, id_known = false;
    uint64_t id = 0;
    /* A failed query (other than a destroyed stream's, which reads as
       not capturing) only means this one is not, and must not stop the
       pass. */
    if (capture_query(a, pair->stream, &active, &id_known, &id) != XSEG_OK ||
        !active)
      continue;
    xs_capture c = {.stream = pair->stream, .pool = XSEG_CAPTURE_POOL(id),
                    .capture_id = id, .implicit = true};
    st = capture_add_locked(a, "a graph capture", c, NULL);
  }
  return st;
}

/* ---- the public calls ---------------------------------------------------- */

xseg_status xseg_begin_allocate_to_pool(xseg_allocator *a, xseg_pool_id pool,
                                        struct CUstream_st *stream) {
  if (a == NULL || pool == 0)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_begin_allocate_to_pool(%llu, stream %p): %s",
                    (unsigned long long)pool, (void *)stream,
                    a == NULL ? "allocator is NULL" : "pool id 0 is no pool");
  xs_alloc_enter(a);
  xs_capture *c = capture_of_stream_locked(a, stream);
  xseg_status st;
  if (c != NULL && !c->implicit)
    st = xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "xseg_begin_allocate_to_pool(%llu, stream %p): the stream "
                  "already allocates to pool %llu", (unsigned long long)pool,
                  (void *)stream, (unsigned long long)c->pool);
  else {
    if (c != NULL) capture_remove_locked(a, (size_t)(c - a->captures));
    st = capture_add_locked(a, "xseg_begin_allocate_to_pool",
                            (xs_capture){.stream = stream, .pool = pool},
                            NULL);
  }
  xs_alloc_leave(a);
  return st;
}

xseg_status xseg_end_allocate_to_pool(xseg_allocator *a, xseg_pool_id pool) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_end_allocate_to_pool(%llu): allocator is NULL",
                    (unsigned long long)pool);
  xs_alloc_enter(a);
  size_t ended = 0;
  for (size_t i = 0; i < a->n_captures;)
    if (a->captures[i].pool == pool && !a->captures[i].implicit)
      capture_remove_locked(a, i), ended++;
    else
      i++;
  xs_alloc_leave(a);
  if (ended == 0)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_end_allocate_to_pool(%llu): no stream allocates to "
                    "that pool", (unsigned long long)pool);
  return XSEG_OK;
}

static bool capture_pool_exists_locked(const xseg_allocator *a,
                                       xseg_pool_id pool) {
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    if (pair->private_id == pool && !pair->released) return true;
  return false;
}

static bool capture_pool_in_use_locked(const xseg_allocator *a,
                                       xseg_pool_id pool) {
  for (size_t i = 0; i < a->n_captures; i++)
    if (a->captures[i].pool == pool) return true;
  return false;
}

xseg_status xseg_release_pool(xseg_allocator *a, xseg_pool_id pool) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_release_pool(%llu): allocator is NULL",
                    (unsigned long long)pool);
  xs_alloc_enter(a);
  xseg_status st = XSEG_OK;
  if (!capture_pool_exists_locked(a, pool))
    st = xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "xseg_release_pool(%llu): no such private pool (never "
                  "used, or already released)", (unsigned long long)pool);
  else if (capture_pool_in_use_locked(a, pool))
    st = xs_error(XSEG_ERR_CAPTURE,
                  "xseg_release_pool(%llu): a stream still allocates to it "
                  "(xseg_end_allocate_to_pool first)",
                  (unsigned long long)pool);
  else   /* as PyTorch's releasePool: the next release pass (empty_cache,
            garbage collection, growth at the device limit) takes the free
            memory of each of its streams' pairs */
    for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
      if (pair->private_id == pool) pair->released = pair->sync_owed = true;
  xs_alloc_leave(a);
  return st;
}
