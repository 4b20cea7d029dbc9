/* snapshot.c: xseg_snapshot_json, torch.cuda.memory._snapshot()'s schema
 * (docs/DESIGN.md section 6), so PyTorch's memory_viz and scripts read it as is.
 *
 * As PyTorch does for expandable segments, each maximal run of mapped
 * blocks of a reserved range is one segment (unmapped holes are not
 * memory). A block's state is active_allocated (live), active_pending_free
 * (freed, waiting on work recorded on other streams) or inactive (free).
 * device_traces is the allocator's ring (alloc/trace.c), oldest first,
 * empty unless xseg_record_memory_history (here too) turned it on. Written
 * under the allocator's mutex: a consistent picture, while other calls wait.
 */
#include <inttypes.h>
#include <stdio.h>

#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "alloc/types.h"
#include "vmm/error.h"

static const char *snapshot_state(const xs_block *b) {
  if (b->pending) return "active_pending_free";
  return b->allocated ? "active_allocated" : "inactive";
}

/* Sizes of the mapped run from b (PyTorch's SegmentInfo fields). */
typedef struct snapshot_sums {
  uint64_t total, allocated, active, requested;
} snapshot_sums;

static snapshot_sums snapshot_run_sums(const xs_block *b) {
  snapshot_sums s = {0, 0, 0, 0};
  for (; b != NULL && b->mapped; b = b->next) {
    s.total += b->size;
    if (b->allocated && !b->pending) s.allocated += b->size;
    if (b->allocated) {
      s.active += b->size;
      s.requested += b->requested;
    }
  }
  return s;
}

/* Blocks shared with other processes carry xseg's own key "ipc":
   "exported" or "open_by_others" (held by another process now). */
static void snapshot_blocks(FILE *out, xseg_allocator *a, const xs_block *b) {
  for (bool first = true; b != NULL && b->mapped; b = b->next, first = false) {
    const char *ipc = b->allocated ? xs_ipc_block_mark_locked(a, b) : NULL;
    fprintf(out,
            "%s\n      {\"address\": %" PRIu64 ", \"size\": %zu, "
            "\"requested_size\": %zu, \"state\": \"%s\", %s%s%s"
            "\"frames\": []}",
            first ? "" : ",", b->addr, b->size,
            b->allocated ? b->requested : 0, snapshot_state(b),
            ipc ? "\"ipc\": \"" : "", ipc ? ipc : "", ipc ? "\", " : "");
  }
}

/* One segment entry for the mapped run that starts at b. */
static void snapshot_run(FILE *out, xseg_allocator *a,
                         const xs_stream_pools *sp, const xs_pool *p,
                         const xs_block *b, bool *first) {
  snapshot_sums s = snapshot_run_sums(b);
  fprintf(out,
          "%s\n  {\"device\": %d, \"address\": %" PRIu64 ", \"total_size\": "
          "%" PRIu64 ", \"allocated_size\": %" PRIu64 ", \"active_size\": "
          "%" PRIu64 ", \"requested_size\": %" PRIu64 ", \"stream\": %" PRIuPTR
          ", \"segment_type\": \"%s\", \"segment_pool_id\": [0, %" PRIu64
          "], \"is_expandable\": %s, \"frames\": [], \"blocks\": [",
          *first ? "" : ",", a->vmm.device, b->addr, s.total, s.allocated,
          s.active, s.requested, (uintptr_t)p->stream,
          p->kind == XS_POOL_SMALL ? "small" : "large", sp->private_id,
          a->cfg.expandable_segments ? "true" : "false");
  snapshot_blocks(out, a, b);
  fputs("]}", out);
  *first = false;
}

static void snapshot_segments(FILE *out, xseg_allocator *a) {
  bool first = true;
  fputs("{\"segments\": [", out);
  for (const xs_stream_pools *sp = a->streams; sp != NULL; sp = sp->next)
    for (int k = 0; k < 2; k++)
      for (const xs_segment *s = sp->pool[k].segments; s != NULL;
           s = s->next)
        for (const xs_block *b = s->first; b != NULL; b = b->next)
          if (b->mapped && (b->prev == NULL || !b->prev->mapped))
            snapshot_run(out, a, sp, &sp->pool[k], b, &first);
  fputs("\n],\n", out);
}

static void snapshot_traces(FILE *out, const xs_trace *t) {
  fputs("\"device_traces\": [[", out);
  for (size_t i = 0; i < t->count; i++) {
    const xs_trace_entry *e = xs_trace_at(t, i);
    fprintf(out,
            "%s\n  {\"action\": \"%s\", \"addr\": %" PRIu64 ", \"size\": "
            "%" PRIu64 ", \"stream\": %" PRIuPTR ", \"time_us\": %" PRIu64
            ", \"frames\": []}",
            i ? "," : "", xs_trace_action_name(e->action), e->addr, e->size,
            (uintptr_t)e->stream, e->time_us);
  }
  fputs("\n]]}\n", out);
}

xseg_status xseg_snapshot_json(xseg_allocator *a, FILE *out) {
  if (a == NULL || out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_snapshot_json: %s is NULL",
                    a == NULL ? "allocator" : "out");
  xs_alloc_enter(a);
  snapshot_segments(out, a);
  snapshot_traces(out, &a->trace);
  xs_alloc_leave(a);
  if (ferror(out))
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_snapshot_json: writing the snapshot failed");
  return XSEG_OK;
}

xseg_status xseg_record_memory_history(xseg_allocator *a, size_t max_entries) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_record_memory_history: allocator is NULL");
  xs_alloc_enter(a);
  xseg_status st = xs_trace_resize(&a->trace, max_entries);
  xs_alloc_leave(a);
  return st;
}
