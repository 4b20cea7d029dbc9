/* trace.h: the allocator's recent history, PyTorch's device_traces.
 *
 * A bounded ring of (action, address, size, stream, time) entries, the
 * newest overwriting the oldest, written with every lock held and
 * read by xseg_snapshot_json. Off (capacity 0) until
 * xseg_record_memory_history turns it on: then every malloc and free pays
 * for one clock read and one entry, and nothing otherwise.
 */
#ifndef XS_ALLOC_TRACE_H
#define XS_ALLOC_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "xseg.h"

/* The names are PyTorch's TraceEntry actions. */
#define XS_TRACE_ACTIONS(X)                                                  \
  X(ALLOC, "alloc") X(FREE_REQUESTED, "free_requested")                      \
  X(FREE_COMPLETED, "free_completed") X(SEGMENT_MAP, "segment_map")          \
  X(SEGMENT_UNMAP, "segment_unmap") X(SEGMENT_ALLOC, "segment_alloc")        \
  X(SEGMENT_FREE, "segment_free") X(OOM, "oom")

typedef enum xs_trace_action {
#define XS_TRACE_ENUM_(id, name) XS_TRACE_##id,
  XS_TRACE_ACTIONS(XS_TRACE_ENUM_)
#undef XS_TRACE_ENUM_
  XS_TRACE_ACTION_COUNT
} xs_trace_action;

typedef struct xs_trace_entry {
  uint64_t addr;
  uint64_t size;
  struct CUstream_st *stream;
  uint64_t time_us;              /* CLOCK_REALTIME, as PyTorch's time_us */
  xs_trace_action action;
} xs_trace_entry;

typedef struct xs_trace {
  xs_trace_entry *ring;
  size_t cap;                    /* 0: not recording */
  size_t next;                   /* where the next entry goes */
  size_t count;                  /* entries held, <= cap */
} xs_trace;

const char *xs_trace_action_name(xs_trace_action a);

void xs_trace_record_slow(xs_trace *t, xs_trace_action action, uint64_t addr,
                          uint64_t size, struct CUstream_st *stream);
/* One entry, when recording (a branch otherwise). */
static inline void xs_trace_record(xs_trace *t, xs_trace_action action,
                                   uint64_t addr, uint64_t size,
                                   struct CUstream_st *stream) {
  if (__builtin_expect(t->cap != 0, 0))
    xs_trace_record_slow(t, action, addr, size, stream);
}

/* Keeps the last `cap` entries from now on, the newest of those held that
   fit among them (0: stop and forget). */
xseg_status xs_trace_resize(xs_trace *t, size_t cap);
/* The i-th oldest entry held, i < t->count. */
const xs_trace_entry *xs_trace_at(const xs_trace *t, size_t i);

#endif /* XS_ALLOC_TRACE_H */
