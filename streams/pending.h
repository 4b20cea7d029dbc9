/* pending.h: frees that wait on work recorded on other streams.
 *
 * When a block that xseg_record_stream tagged with streams S1..Sk is freed,
 * one event is recorded on each Si (at the point each stream has reached at
 * the free) and the block is appended to Si's queue behind it. The block
 * may be reused once every one of its k entries has fired; the allocator
 * keeps that count on the block, this module only reports each entry that
 * fires.
 *
 * Invariant: within one stream's queue, entries are in recording order, and
 * a stream runs its work in order, so if the head has not fired, nothing
 * behind it has. Polling therefore stops at the first pending head of each
 * stream, and one slow stream never holds back another's entries.
 *
 * Bounded events: a queue holds at most XS_PENDING_MAX_EVENTS events. When
 * frees outrun a stream (its events pile up unfired), the next free
 * records the newest event again instead of taking another, and its block
 * joins that event's blocks: those blocks then also wait for the work
 * queued up to the newest free — later than their own free, never earlier.
 * So a steady state creates no events beyond that bound per stream,
 * whatever the free rate.
 *
 * Another device's stream (PyTorch records them too): its queue takes
 * events of the stream's context from a pool of its own, which makes that
 * context current to create one (streams/event_pool.h); queries and
 * waits need no particular context.
 *
 * Not thread-safe: its owner's lock guards it (each pair of pools keeps
 * one for the frees of its blocks, under the pair's lock).
 * Needs the device's context current.
 */
#ifndef XS_STREAMS_PENDING_H
#define XS_STREAMS_PENDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "streams/event_pool.h"
#include "streams/stream_set.h"

enum { XS_PENDING_MAX_EVENTS = 32 };

/* An event and how many blocks (the next ones of the block ring) wait on
   it. */
typedef struct xs_pending_event {
  CUevent event;
  size_t n_blocks;
} xs_pending_event;

/* One stream's queue: two rings, [head, head+count) modulo cap, of events
   and of the blocks behind them, in order. */
typedef struct xs_pending_queue {
  struct CUstream_st *stream;
  xs_event_pool *pool;        /* its events' pool: the owner's, or its
                                 own for another context's stream */
  xs_pending_event *events;
  size_t head, count, cap;
  void **blocks;
  size_t bhead, bcount, bcap;
} xs_pending_queue;

typedef struct xs_pending {
  xs_event_pool *events;      /* the owner's context's */
  xs_pending_queue *queues;   /* one per stream that ever had an entry */
  size_t n_queues, cap_queues;
  uint64_t entries;           /* blocks queued, over every queue */
} xs_pending;

/* Called once per entry whose event has fired, in each stream's order. */
typedef void (*xs_pending_ready_fn)(void *ctx, void *block);

void xs_pending_init(xs_pending *p, xs_event_pool *events);
/* Frees the queues; every entry must have fired and been drained. */
void xs_pending_destroy(xs_pending *p);

/* Records an event on every stream of `streams` (or records its newest
   event again, at the bound) and queues `block` behind each, all or
   nothing: on failure nothing is queued, every event taken is back in the
   pool (an event already recorded is simply recorded again when it is
   reused) and the message names the failing call. */
xseg_status xs_pending_add_all(xs_pending *p, const xs_stream_set *streams,
                               void *block);

/* Pops, per stream, every head entry whose event has fired, calling `ready`
   for each; returns how many fired. Queries the driver only (never waits).
   A query that fails with an error other than CUDA_ERROR_NOT_READY stops
   that stream's drain and is returned in *error (XSEG_OK otherwise). */
size_t xs_pending_poll(xs_pending *p, xs_pending_ready_fn ready, void *ctx,
                       xseg_status *error);

/* As poll, but waits (cuEventSynchronize, never a stream or device sync) for
   every entry queued now. For the out-of-memory path and destroy. */
size_t xs_pending_drain(xs_pending *p, xs_pending_ready_fn ready, void *ctx,
                        xseg_status *error);

/* Before `stream` is destroyed (xseg_forget_stream): waits for its queue's
   entries, as xs_pending_drain, and drops the queue, so that a stream made
   later at the same address (another context's, maybe) gets a queue of its
   own. XSEG_OK, or the failed wait (the queue then stays). */
xseg_status xs_pending_forget(xs_pending *p, struct CUstream_st *stream,
                              xs_pending_ready_fn ready, void *ctx);
/* Whether p keeps a queue for `stream` (xs_pending_forget has work). */
bool xs_pending_has_queue(const xs_pending *p, struct CUstream_st *stream);

#endif /* XS_STREAMS_PENDING_H */
