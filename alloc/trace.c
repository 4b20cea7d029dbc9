/* trace.c: the ring of device_traces entries; see trace.h. */
#include <assert.h>
#include <stdlib.h>
#include <time.h>

#include "alloc/trace.h"
#include "vmm/error.h"

static const char *const trace_names[XS_TRACE_ACTION_COUNT] = {
#define XS_TRACE_NAME_(id, name) name,
    XS_TRACE_ACTIONS(XS_TRACE_NAME_)
#undef XS_TRACE_NAME_
};

const char *xs_trace_action_name(xs_trace_action a) {
  assert(a < XS_TRACE_ACTION_COUNT);
  return trace_names[a];
}

void xs_trace_record_slow(xs_trace *t, xs_trace_action action, uint64_t addr,
                          uint64_t size, struct CUstream_st *stream) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  t->ring[t->next] = (xs_trace_entry){
      .addr = addr, .size = size, .stream = stream, .action = action,
      .time_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000};
  t->next = (t->next + 1) % t->cap;
  if (t->count < t->cap) t->count++;
}

xseg_status xs_trace_resize(xs_trace *t, size_t cap) {
  xs_trace_entry *ring = NULL;
  if (cap != 0 && (cap > SIZE_MAX / sizeof *ring ||
                   (ring = calloc(cap, sizeof *ring)) == NULL))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "out of host memory for %zu trace entries", cap);
  /* The newest entries that fit stay, oldest first (PyTorch clears its
     history only when recording stops or is asked to). */
  size_t keep = t->count < cap ? t->count : cap;
  for (size_t i = 0; i < keep; i++)
    ring[i] = *xs_trace_at(t, t->count - keep + i);
  free(t->ring);
  *t = (xs_trace){.ring = ring, .cap = cap, .count = keep,
                  .next = cap != 0 ? keep % cap : 0};
  return XSEG_OK;
}

const xs_trace_entry *xs_trace_at(const xs_trace *t, size_t i) {
  assert(i < t->count);
  size_t oldest = (t->next + t->cap - t->count) % t->cap;
  return &t->ring[(oldest + i) % t->cap];
}
