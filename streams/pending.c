/* pending.c: per-stream queues of recorded frees; see pending.h. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "streams/pending.h"
#include "vmm/array.h"
#include "vmm/error.h"

void xs_pending_init(xs_pending *p, xs_event_pool *events) {
  *p = (xs_pending){.events = events};
}

/* Frees q's rings and its own events (another context's), if any. */
static void pending_queue_free(xs_pending *p, xs_pending_queue *q) {
  assert(q->count == 0 && q->bcount == 0);
  if (q->pool != p->events) {
    xs_event_pool_destroy(q->pool);
    free(q->pool);
  }
  free(q->events);
  free(q->blocks);
}

void xs_pending_destroy(xs_pending *p) {
  assert(p->entries == 0 && "pending frees were drained before destroy");
  for (size_t i = 0; i < p->n_queues; i++)
    pending_queue_free(p, &p->queues[i]);
  free(p->queues);
  *p = (xs_pending){.events = p->events};
}

/* Position i of a ring of capacity cap (a power of two). */
static inline size_t pending_wrap(size_t i, size_t cap) {
  assert(cap != 0 && (cap & (cap - 1)) == 0);
  return i & (cap - 1);
}

/* Doubles a ring of `size`-byte items, unrolling it so that head is 0.
   Capacities are powers of two (16, then doubled), so that a position
   wraps with a mask (pending_wrap). */
static bool pending_ring_grow(void **ring, size_t size, size_t *head,
                              size_t count, size_t *cap) {
  size_t nc = *cap ? 2 * *cap : 16;
  char *n = malloc(nc * size), *old = *ring;
  if (n == NULL) return false;
  for (size_t i = 0; i < count; i++)
    memcpy(n + i * size, old + pending_wrap(*head + i, *cap) * size, size);
  free(old);
  *ring = n;
  *head = 0;
  *cap = nc;
  return true;
}

/* Room for one more block, and one more event unless at the bound. */
static bool pending_queue_room(xs_pending_queue *q) {
  if (q->bcount == q->bcap &&
      !pending_ring_grow((void **)&q->blocks, sizeof *q->blocks, &q->bhead,
                         q->bcount, &q->bcap))
    return false;
  return q->count < q->cap || q->count >= XS_PENDING_MAX_EVENTS ||
         pending_ring_grow((void **)&q->events, sizeof *q->events, &q->head,
                           q->count, &q->cap);
}

/* Host memory ran out making room for a free on `stream`. */
static xseg_status pending_no_room(struct CUstream_st *stream) {
  return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                  "out of host memory queueing a free on stream %p",
                  (void *)stream);
}

/* The index of `stream`'s queue, or n_queues when it has none. */
static size_t pending_queue_index(const xs_pending *p,
                                  struct CUstream_st *stream) {
  size_t i = 0;
  while (i < p->n_queues && p->queues[i].stream != stream) i++;
  return i;
}

/* The queue of `stream` in *out, made on first use with room for one more
   block (and event); nothing made when that fails (host memory, or the
   driver asked for the stream's context). Queues may move (realloc):
   callers keep indices, not pointers, across calls. A stream of another
   context gets a pool of that context's events. */
static xseg_status pending_queue_find(xs_pending *p,
                                      struct CUstream_st *stream,
                                      xs_pending_queue **out) {
  size_t i = pending_queue_index(p, stream);
  xs_pending_queue *q = i < p->n_queues ? &p->queues[i] : NULL;
  if (q == NULL) {
    xs_vmm *vmm = p->events->vmm;
    CUcontext ctx;
    xseg_status st = xs_vmm_stream_ctx(vmm, stream, &ctx);
    if (st != XSEG_OK) return st;
    xs_event_pool *pool = p->events;
    if (!XS_ARRAY_RESERVE(p->queues, p->cap_queues, p->n_queues + 1, 8) ||
        (ctx != vmm->ctx && (pool = malloc(sizeof *pool)) == NULL))
      return pending_no_room(stream);
    if (pool != p->events) xs_event_pool_init_in(pool, vmm, ctx);
    q = &p->queues[p->n_queues++];
    *q = (xs_pending_queue){.stream = stream, .pool = pool};
  }
  if (!pending_queue_room(q)) return pending_no_room(stream);
  *out = q;
  return XSEG_OK;
}

static xs_pending_event *pending_tail(xs_pending_queue *q) {
  assert(q->count > 0);
  return &q->events[pending_wrap(q->head + q->count - 1, q->cap)];
}

/* Marks the point `q`'s stream has reached: a new event in *fresh, or, at
   the bound, the newest event recorded again (*fresh NULL). */
static xseg_status pending_mark(xs_pending *p, xs_pending_queue *q,
                                CUevent *fresh) {
  xs_driver *drv = p->events->vmm->drv;
  *fresh = NULL;
  CUevent ev;
  if (q->count >= XS_PENDING_MAX_EVENTS) {
    ev = pending_tail(q)->event;
  } else {
    xseg_status st = xs_event_pool_take(q->pool, &ev);
    if (st != XSEG_OK) return st;
  }
  CUresult r = XS_DRV(drv, cuEventRecord, ev, (CUstream)q->stream);
  if (r != CUDA_SUCCESS) {
    /* A fresh one goes (xs_event_pool_discard says why); the tail's
       stays the queue's. */
    if (q->count < XS_PENDING_MAX_EVENTS) xs_event_pool_discard(q->pool, ev);
    return xs_driver_error(drv, r, "cuEventRecord(stream %p)",
                           (void *)q->stream);
  }
  if (q->count < XS_PENDING_MAX_EVENTS) *fresh = ev;
  return XSEG_OK;
}

/* Queues block behind the mark (room was made first). */
static void pending_push(xs_pending *p, xs_pending_queue *q, CUevent fresh,
                         void *block) {
  if (fresh != NULL) {
    assert(q->count < q->cap);
    q->events[pending_wrap(q->head + q->count++, q->cap)] =
        (xs_pending_event){fresh, 0};
  }
  pending_tail(q)->n_blocks++;
  assert(q->bcount < q->bcap);
  q->blocks[pending_wrap(q->bhead + q->bcount++, q->bcap)] = block;
  p->entries++;
}

/* One stream's share of an add: its queue (an index: queues may move
   while later streams' are made) and its new event (NULL: the newest
   recorded again, or none yet). */
typedef struct pending_mark_at {
  size_t queue;
  CUevent fresh;
} pending_mark_at;

/* Makes every stream's queue and room first (queues may move meanwhile),
   noting each one's index in at[]. */
static xseg_status pending_make_room(xs_pending *p, const xs_stream_set *set,
                                     pending_mark_at *at) {
  for (uint32_t i = 0; i < set->n; i++) {
    xs_pending_queue *q = NULL;
    xseg_status st = pending_queue_find(p, xs_stream_set_at(set, i), &q);
    if (st != XSEG_OK) return st;
    at[i] = (pending_mark_at){.queue = (size_t)(q - p->queues)};
  }
  return XSEG_OK;
}

xseg_status xs_pending_add_all(xs_pending *p, const xs_stream_set *streams,
                               void *block) {
  enum { ON_STACK = 8 };
  pending_mark_at stack[ON_STACK], *at = stack;
  if (streams->n > ON_STACK && (at = malloc(streams->n * sizeof *at)) == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory for events");
  xseg_status st = pending_make_room(p, streams, at);
  uint32_t done = 0;          /* streams marked */
  while (st == XSEG_OK && done < streams->n) {
    st = pending_mark(p, &p->queues[at[done].queue], &at[done].fresh);
    if (st == XSEG_OK) done++;
  }
  /* Undo: fresh events go back; one recorded again only waits longer. */
  for (uint32_t i = 0; st != XSEG_OK && i < done; i++)
    if (at[i].fresh != NULL)
      xs_event_pool_give(p->queues[at[i].queue].pool, at[i].fresh);
  for (uint32_t i = 0; st == XSEG_OK && i < streams->n; i++)
    pending_push(p, &p->queues[at[i].queue], at[i].fresh, block);
  if (at != stack) free(at);
  return st;
}

/* Pops the head event of q, which has fired, and reports its blocks. */
static size_t pending_queue_pop(xs_pending *p, xs_pending_queue *q,
                                xs_pending_ready_fn ready, void *ctx) {
  assert(q->count > 0);
  xs_pending_event e = q->events[q->head];
  q->head = pending_wrap(q->head + 1, q->cap);
  q->count--;
  xs_event_pool_give(q->pool, e.event);
  assert(e.n_blocks > 0 && e.n_blocks <= q->bcount);
  for (size_t i = 0; i < e.n_blocks; i++) {
    void *b = q->blocks[q->bhead];
    q->bhead = pending_wrap(q->bhead + 1, q->bcap);
    q->bcount--;
    p->entries--;
    ready(ctx, b);
  }
  return e.n_blocks;
}

/* Drains one queue; `wait` synchronises on each head instead of querying. */
static size_t pending_queue_drain(xs_pending *p, size_t qi, bool wait,
                                  xs_pending_ready_fn ready, void *ctx,
                                  xseg_status *error) {
  xs_driver *drv = p->events->vmm->drv;
  size_t fired = 0;
  /* `ready` may free blocks but never adds entries: q stays put. */
  xs_pending_queue *q = &p->queues[qi];
  while (q->count > 0) {
    CUevent ev = q->events[q->head].event;
    CUresult r = wait ? XS_DRV(drv, cuEventSynchronize, ev)
                      : XS_DRV(drv, cuEventQuery, ev);
    if (r == CUDA_ERROR_NOT_READY) break;
    if (r != CUDA_SUCCESS) {
      if (*error == XSEG_OK)
        *error = xs_driver_error(drv, r, "%s(event of stream %p)",
                                 wait ? "cuEventSynchronize" : "cuEventQuery",
                                 (void *)q->stream);
      break;
    }
    fired += pending_queue_pop(p, q, ready, ctx);
  }
  return fired;
}

static size_t pending_drain_all(xs_pending *p, bool wait,
                                xs_pending_ready_fn ready, void *ctx,
                                xseg_status *error) {
  *error = XSEG_OK;
  size_t fired = 0;
  for (size_t i = 0; i < p->n_queues; i++)
    fired += pending_queue_drain(p, i, wait, ready, ctx, error);
  return fired;
}

size_t xs_pending_poll(xs_pending *p, xs_pending_ready_fn ready, void *ctx,
                       xseg_status *error) {
  return pending_drain_all(p, false, ready, ctx, error);
}

size_t xs_pending_drain(xs_pending *p, xs_pending_ready_fn ready, void *ctx,
                        xseg_status *error) {
  return pending_drain_all(p, true, ready, ctx, error);
}

bool xs_pending_has_queue(const xs_pending *p, struct CUstream_st *stream) {
  return pending_queue_index(p, stream) < p->n_queues;
}

xseg_status xs_pending_forget(xs_pending *p, struct CUstream_st *stream,
                              xs_pending_ready_fn ready, void *ctx) {
  size_t i = pending_queue_index(p, stream);
  if (i == p->n_queues) return XSEG_OK;
  xseg_status st = XSEG_OK;
  pending_queue_drain(p, i, true, ready, ctx, &st);
  if (st != XSEG_OK) return st;
  pending_queue_free(p, &p->queues[i]);
  p->queues[i] = p->queues[--p->n_queues];
  return XSEG_OK;
}
