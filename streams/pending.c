/* pending.c: per-stream queues of recorded frees; see pending.h. */
#include <assert.h>
#include <stdlib.h>

#include "streams/pending.h"
#include "vmm/error.h"

void xs_pending_init(xs_pending *p, xs_event_pool *events) {
  *p = (xs_pending){.events = events};
}

void xs_pending_destroy(xs_pending *p) {
  assert(p->entries == 0 && "pending frees were drained before destroy");
  for (size_t i = 0; i < p->n_queues; i++) free(p->queues[i].ring);
  free(p->queues);
  *p = (xs_pending){.events = p->events};
}

static xs_pending_queue *pending_queue_find(xs_pending *p,
                                            struct CUstream_st *stream) {
  for (size_t i = 0; i < p->n_queues; i++)
    if (p->queues[i].stream == stream) return &p->queues[i];
  if (p->n_queues == p->cap_queues) {
    size_t cap = p->cap_queues ? 2 * p->cap_queues : 8;
    xs_pending_queue *q = realloc(p->queues, cap * sizeof *q);
    if (q == NULL) return NULL;
    p->queues = q;
    p->cap_queues = cap;
  }
  xs_pending_queue *q = &p->queues[p->n_queues++];
  *q = (xs_pending_queue){.stream = stream};
  return q;
}

/* Doubles the ring, unrolling it so that head is 0. */
static int pending_queue_grow(xs_pending_queue *q) {
  size_t cap = q->cap ? 2 * q->cap : 16;
  xs_pending_entry *ring = malloc(cap * sizeof *ring);
  if (ring == NULL) return -1;
  for (size_t i = 0; i < q->count; i++)
    ring[i] = q->ring[(q->head + i) % q->cap];
  free(q->ring);
  q->ring = ring;
  q->head = 0;
  q->cap = cap;
  return 0;
}

xseg_status xs_pending_add(xs_pending *p, struct CUstream_st *stream,
                           void *block) {
  xs_pending_queue *q = pending_queue_find(p, stream);
  if (q == NULL || (q->count == q->cap && pending_queue_grow(q) != 0))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory queueing a free on stream %p",
                    (void *)stream);
  CUevent ev;
  xseg_status st = xs_event_pool_take(p->events, &ev);
  if (st != XSEG_OK) return st;
  xs_driver *drv = p->events->vmm->drv;
  CUresult r = XS_DRV(drv, cuEventRecord, ev, (CUstream)stream);
  if (r != CUDA_SUCCESS) {
    xs_event_pool_give(p->events, ev);
    return xs_driver_error(drv, r, "cuEventRecord(stream %p)", (void *)stream);
  }
  q->ring[(q->head + q->count) % q->cap] = (xs_pending_entry){ev, block};
  q->count++;
  p->entries++;
  return XSEG_OK;
}

static void pending_queue_push(xs_pending *p, xs_pending_queue *q,
                               CUevent ev, void *block) {
  assert(q->count < q->cap && "room was made first");
  q->ring[(q->head + q->count) % q->cap] = (xs_pending_entry){ev, block};
  q->count++;
  p->entries++;
}

/* Room for one more entry on the queue of every stream of the set. Queues
   may move (realloc), so nothing is kept but the room. */
static xseg_status pending_make_room(xs_pending *p, const xs_stream_set *set) {
  for (uint32_t i = 0; i < set->n; i++) {
    struct CUstream_st *s = xs_stream_set_at(set, i);
    xs_pending_queue *q = pending_queue_find(p, s);
    if (q == NULL || (q->count == q->cap && pending_queue_grow(q) != 0))
      return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                      "out of host memory queueing a free on stream %p",
                      (void *)s);
  }
  return XSEG_OK;
}

/* Takes an event and records it on s. */
static xseg_status pending_record(xs_pending *p, struct CUstream_st *s,
                                  CUevent *out) {
  xseg_status st = xs_event_pool_take(p->events, out);
  if (st != XSEG_OK) return st;
  xs_driver *drv = p->events->vmm->drv;
  CUresult r = XS_DRV(drv, cuEventRecord, *out, (CUstream)s);
  if (r == CUDA_SUCCESS) return XSEG_OK;
  xs_event_pool_give(p->events, *out);
  return xs_driver_error(drv, r, "cuEventRecord(stream %p)", (void *)s);
}

xseg_status xs_pending_add_all(xs_pending *p, const xs_stream_set *streams,
                               void *block) {
  enum { ON_STACK = 8 };
  CUevent stack[ON_STACK], *ev = stack;
  if (streams->n > ON_STACK && (ev = malloc(streams->n * sizeof *ev)) == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory for events");
  xseg_status st = pending_make_room(p, streams);
  uint32_t done = 0;          /* events taken and recorded */
  while (st == XSEG_OK && done < streams->n) {
    st = pending_record(p, xs_stream_set_at(streams, done), &ev[done]);
    if (st == XSEG_OK) done++;
  }
  if (st != XSEG_OK) {
    while (done-- > 0) xs_event_pool_give(p->events, ev[done]);
  } else {
    for (uint32_t i = 0; i < streams->n; i++)
      pending_queue_push(p, pending_queue_find(p, xs_stream_set_at(streams, i)),
                         ev[i], block);
  }
  if (ev != stack) free(ev);
  return st;
}

/* Pops the head of q, which has fired, and reports it. */
static void pending_queue_pop(xs_pending *p, xs_pending_queue *q,
                              xs_pending_ready_fn ready, void *ctx) {
  assert(q->count > 0);
  xs_pending_entry e = q->ring[q->head];
  q->head = (q->head + 1) % q->cap;
  q->count--;
  p->entries--;
  xs_event_pool_give(p->events, e.event);
  ready(ctx, e.block);
}

/* Drains one queue; `wait` synchronises on each head instead of querying. */
static size_t pending_queue_drain(xs_pending *p, xs_pending_queue *q,
                                  bool wait, xs_pending_ready_fn ready,
                                  void *ctx, xseg_status *error) {
  xs_driver *drv = p->events->vmm->drv;
  size_t fired = 0;
  while (q->count > 0) {
    CUevent ev = q->ring[q->head].event;
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
    pending_queue_pop(p, q, ready, ctx);
    fired++;
  }
  return fired;
}

static size_t pending_drain_all(xs_pending *p, bool wait,
                                xs_pending_ready_fn ready, void *ctx,
                                xseg_status *error) {
  *error = XSEG_OK;
  size_t fired = 0;
  for (size_t i = 0; i < p->n_queues; i++)
    fired += pending_queue_drain(p, &p->queues[i], wait, ready, ctx, error);
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
