/* trace.c: building a workload's event array.
 *
 * Traces name blocks by the address they had in the recorded run, and reuse
 * addresses after a free. The builder maps each live address to a slot with
 * a hash table (uthash) once, at load time; a freed entry is kept with its
 * slot on a recycle list and handed to the next allocation, so slots stay
 * dense (n_slots is the most blocks ever live at once) and the replay indexes
 * plain arrays.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* A library must never exit on OOM: uthash reports it through this flag and
   the caller turns it into an error. */
static _Thread_local bool xb_hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (xb_hash_oom = true)
#include <uthash.h>

typedef struct xb_live {
  uint64_t key;                     /* address in the recorded run */
  uint64_t size;
  uint32_t slot;
  UT_hash_handle hh;
} xb_live;

void xb_trace_init(xb_trace *t, const char *name) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
}

static bool trace_push(xb_trace *t, xb_event ev, xb_error *err) {
  if (t->n_events == t->cap_events) {
    size_t cap = t->cap_events ? t->cap_events * 2 : 4096;
    xb_event *p = realloc(t->events, cap * sizeof *p);
    if (p == NULL)
      return xb_fail(err, "out of host memory for %zu events", cap);
    t->events = p;
    t->cap_events = cap;
  }
  ev.time_ns = t->now_ns;
  t->events[t->n_events++] = ev;
  return true;
}

/* The dense index of a Stream value, adding it on first sight. */
static bool trace_stream(xb_trace *t, int64_t id, uint16_t *out,
                         xb_error *err) {
  for (int i = 0; i < t->n_streams; i++)
    if (t->stream_ids[i] == id) return *out = (uint16_t)i, true;
  if (t->n_streams == XB_MAX_STREAMS)
    return xb_fail(err, "more than %d distinct streams", XB_MAX_STREAMS);
  t->stream_ids[t->n_streams] = id;
  *out = (uint16_t)t->n_streams++;
  return true;
}

/* An entry for a new live block: a recycled one keeps its slot. */
static xb_live *trace_entry_new(xb_trace *t) {
  xb_live *e = t->recycled;
  if (e != NULL) {
    t->recycled = e->hh.next;
    return e;
  }
  e = calloc(1, sizeof *e);
  if (e != NULL) e->slot = t->n_slots++;
  return e;
}

static void trace_entry_recycle(xb_trace *t, xb_live *e) {
  e->hh.next = t->recycled;
  t->recycled = e;
}

static void trace_live_add(xb_trace *t, uint64_t size) {
  t->live_bytes += xb_round_up(size, XB_ROUND);
  if (t->live_bytes > t->peak_live_bytes) {
    t->peak_live_bytes = t->live_bytes;
    t->peak_event = t->n_events - 1;
  }
}

bool xb_trace_alloc(xb_trace *t, uint64_t key, uint64_t size, int64_t stream,
                    xb_error *err) {
  if (size > XB_MAX_SIZE)
    return xb_fail(err, "allocate of %llu bytes, above 2^62 (xseg's "
                   "largest request)", (unsigned long long)size);
  xb_live *e = NULL;
  HASH_FIND(hh, t->live, &key, sizeof key, e);
  if (e != NULL)
    return xb_fail(err, "allocate at 0x%llx, which is live already",
                   (unsigned long long)key);
  xb_event ev = {.size = size, .action = XB_EV_ALLOC};
  if (!trace_stream(t, stream, &ev.stream, err)) return false;
  e = trace_entry_new(t);
  if (e == NULL) return xb_fail(err, "out of host memory");
  e->key = key;
  e->size = size;
  xb_hash_oom = false;
  HASH_ADD(hh, t->live, key, sizeof e->key, e);
  if (xb_hash_oom) {
    trace_entry_recycle(t, e);
    return xb_fail(err, "out of host memory for the pointer table");
  }
  ev.slot = e->slot;
  if (!trace_push(t, ev, err)) return false;
  t->n_allocs++;
  trace_live_add(t, size);
  return true;
}

bool xb_trace_free(xb_trace *t, uint64_t key, uint64_t size, int64_t stream,
                   xb_error *err) {
  xb_live *e = NULL;
  HASH_FIND(hh, t->live, &key, sizeof key, e);
  if (e == NULL)
    return xb_fail(err, "free of unknown pointer 0x%llx (not live)",
                   (unsigned long long)key);
  if (size != UINT64_MAX && size != e->size)
    return xb_fail(err, "free of 0x%llx with size %llu; it was allocated "
                   "with size %llu", (unsigned long long)key,
                   (unsigned long long)size, (unsigned long long)e->size);
  xb_event ev = {.size = e->size, .slot = e->slot, .action = XB_EV_FREE};
  if (!trace_stream(t, stream, &ev.stream, err)) return false;
  if (!trace_push(t, ev, err)) return false;
  HASH_DELETE(hh, t->live, e);
  trace_entry_recycle(t, e);
  t->n_frees++;
  t->live_bytes -= xb_round_up(ev.size, XB_ROUND);
  return true;
}

static void trace_entries_free(xb_live *e) {
  while (e != NULL) {
    xb_live *next = e->hh.next;
    free(e);
    e = next;
  }
}

void xb_trace_done(xb_trace *t) {
  xb_live *e, *tmp;
  HASH_ITER(hh, t->live, e, tmp) {
    HASH_DELETE(hh, t->live, e);
    free(e);
  }
  trace_entries_free(t->recycled);
  t->live = t->recycled = NULL;
}

void xb_trace_release(xb_trace *t) {
  xb_trace_done(t);
  free(t->events);
  t->events = NULL;
  t->n_events = t->cap_events = 0;
}
