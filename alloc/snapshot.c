/* snapshot.c: xseg_snapshot_json, torch.cuda.memory._snapshot()'s schema
 * (docs/DESIGN.md section 6), so PyTorch's memory_viz and scripts read it as is.
 *
 * As PyTorch does for expandable segments, each maximal run of mapped
 * blocks of a reserved range is one segment (unmapped holes are not
 * memory). A handle that a failed growth gave up while its old mapping (an
 * alias, segments/release.c) still maps it is memory too: the driver holds
 * it, and reserved_bytes counts it, until its stream's guard lets the
 * alias go; it is a segment of its own, one inactive block marked
 * "retiring". So the segments' total_size always adds up to
 * reserved_bytes, as PyTorch's do. A block's state is active_allocated (live), active_pending_free
 * (freed, waiting on work recorded on other streams) or inactive (free).
 * device_traces is the allocator's ring (alloc/trace.c), oldest first,
 * empty unless xseg_record_memory_history (here too) turned it on. Written
 * with every lock held: a consistent picture, while other calls wait.
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
static void snapshot_blocks_locked(FILE *out, xseg_allocator *a,
                                   const xs_block *b) {
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

/* A segment entry's fields up to its blocks' list. */
static void snapshot_segment_head_locked(
    FILE *out, xseg_allocator *a, uint64_t addr, const snapshot_sums *s,
    const void *stream, xs_pool_kind kind, xseg_pool_id private_id,
    bool *first) {
  fprintf(out,
          "%s\n  {\"device\": %d, \"address\": %" PRIu64 ", \"total_size\": "
          "%" PRIu64 ", \"allocated_size\": %" PRIu64 ", \"active_size\": "
          "%" PRIu64 ", \"requested_size\": %" PRIu64 ", \"stream\": %" PRIuPTR
          ", \"segment_type\": \"%s\", \"segment_pool_id\": [0, %" PRIu64
          "], \"is_expandable\": %s, \"frames\": [], \"blocks\": [",
          *first ? "" : ",", a->vmm.device, addr, s->total, s->allocated,
          s->active, s->requested, (uintptr_t)stream,
          kind == XS_POOL_SMALL ? "small" : "large", private_id,
          a->cfg.expandable_segments ? "true" : "false");
  *first = false;
}

/* One segment entry for the mapped run that starts at b. */
static void snapshot_run_locked(FILE *out, xseg_allocator *a,
                                const xs_pair *pair, const xs_pool *p,
                                const xs_block *b, bool *first) {
  snapshot_sums s = snapshot_run_sums(b);
  snapshot_segment_head_locked(out, a, b->addr, &s, p->stream, p->kind,
                               pair->private_id, first);
  snapshot_blocks_locked(out, a, b);
  fputs("]}", out);
}

/* The pool whose retiring block holds address addr (an alias lies in the
   block its handles were lent from), and its pair; false if none does. */
static bool snapshot_retiring_pool_locked(xseg_allocator *a, uint64_t addr,
                                          const xs_pair **pair_out,
                                          const xs_pool **p_out) {
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (const xs_block *r = pair->pool[k].retiring; r != NULL;
           r = r->retire_next)
        if (addr >= r->addr && addr - r->addr < r->size) {
          *pair_out = pair;
          *p_out = &pair->pool[k];
          return true;
        }
  return false;
}

/* One segment per orphan handle (see the top), at its first alias: the
   one its bytes are counted for (vmm/aliases.c). */
static void snapshot_orphans_locked(FILE *out, xseg_allocator *a,
                                    bool *first) {
  const xs_vmm *v = &a->vmm;
  for (size_t i = 0; i < v->n_aliases; i++) {
    const xs_vmm_alias *e = &v->aliases[i];
    bool counted = e->orphan;
    for (size_t j = 0; j < i && counted; j++)
      counted = v->aliases[j].handle != e->handle;
    if (!counted) continue;
    const xs_pair *pair = NULL;
    const xs_pool *p = NULL;
    bool known = snapshot_retiring_pool_locked(a, e->addr, &pair, &p);
    snapshot_sums s = {.total = e->size};
    snapshot_segment_head_locked(out, a, e->addr, &s, known ? p->stream : NULL,
                                 known ? p->kind : (xs_pool_kind)e->tag,
                                 known ? pair->private_id : 0, first);
    fprintf(out,
            "\n      {\"address\": %" PRIu64 ", \"size\": %zu, "
            "\"requested_size\": 0, \"state\": \"inactive\", "
            "\"retiring\": true, \"frames\": []}]}",
            e->addr, e->size);
  }
}

static void snapshot_segments_locked(FILE *out, xseg_allocator *a) {
  bool first = true;
  fputs("{\"segments\": [", out);
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next)
    for (int k = 0; k < 2; k++)
      for (const xs_segment *s = pair->pool[k].segments; s != NULL;
           s = s->next)
        for (const xs_block *b = s->first; b != NULL; b = b->next)
          if (b->mapped && (b->prev == NULL || !b->prev->mapped))
            snapshot_run_locked(out, a, pair, &pair->pool[k], b, &first);
  snapshot_orphans_locked(out, a, &first);
  fputs("\n],\n", out);
}

static void snapshot_traces(FILE *out, const xs_trace *t) {
  fputs("\"device_traces\": [[", out);
  for (size_t i = 0; i < t->count; i++) {
    const xs_trace_entry *e = xs_trace_at(t, i);
    /* An oom entry's addr is the device's free memory (device_free). */
    const char *addr_key = e->action == XS_TRACE_OOM ? "device_free" : "addr";
    fprintf(out,
            "%s\n  {\"action\": \"%s\", \"%s\": %" PRIu64 ", \"size\": "
            "%" PRIu64 ", \"stream\": %" PRIuPTR ", \"time_us\": %" PRIu64
            ", \"frames\": []}",
            i ? "," : "", xs_trace_action_name(e->action), addr_key, e->addr,
            e->size, (uintptr_t)e->stream, e->time_us);
  }
  fputs("\n]]}\n", out);
}

xseg_status xseg_snapshot_json(xseg_allocator *a, FILE *out) {
  if (a == NULL || out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_snapshot_json: %s is NULL",
                    a == NULL ? "allocator" : "out");
  xs_alloc_enter(a);
  snapshot_segments_locked(out, a);
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
