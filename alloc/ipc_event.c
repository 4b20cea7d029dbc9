/* ipc_event.c: ordering a consumer after the producer's work, without the
 * producer waiting: xseg_ipc_record and xseg_ipc_wait.
 *
 * The producer records an interprocess event on the stream that wrote the
 * block and sends its handle with the block's; the consumer opens it and
 * makes its own stream wait for it, on the device. The driver's rule for
 * such events (vmm/ipc_event.h: the exported event must outlive every use
 * of an import) decides where the events live: one per (allocator,
 * stream), recorded again at each send and kept until xseg_destroy. A
 * consumer that opens a handle late then waits for the stream's latest
 * record, which on one stream follows the one it was sent with: it may
 * wait for more work than it needed, never for less. A consumer opens,
 * waits and destroys at once (cuEventDestroy does not wait: the queued
 * wait stays).
 */
#include <stdlib.h>
#include <string.h>

#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "vmm/array.h"
#include "vmm/error.h"
#include "vmm/ipc_event.h"

_Static_assert(XSEG_IPC_EVENT_BYTES == sizeof(CUipcEventHandle),
               "xseg.h's size of an event handle is the driver's");

typedef struct xs_ipc_stream_event {
  struct CUstream_st *stream;
  CUevent event;
} xs_ipc_stream_event;

/* The events this allocator records: one per stream it was asked to
   record on, in the order of their first use. */
typedef struct xs_ipc_events {
  xs_ipc_stream_event *v;
  size_t n, cap;
} xs_ipc_events;

void xs_ipc_events_destroy_locked(xseg_allocator *a, bool entered) {
  xs_ipc_events *e = a->ipc != NULL ? a->ipc->events : NULL;
  if (e == NULL) return;
  for (size_t i = 0; entered && i < e->n; i++)
    xs_vmm_event_destroy(&a->vmm, e->v[i].event);
  free(e->v);
  free(e);
  a->ipc->events = NULL;
}

/* The event recorded on `stream`, created on first use. */
static xseg_status event_of_stream_locked(xseg_allocator *a,
                                          struct CUstream_st *stream,
                                          CUevent *out) {
  xs_ipc *ipc = xs_ipc_get_locked(a);
  if (ipc == NULL) return XSEG_ERR_OUT_OF_MEMORY;
  if (ipc->events == NULL && (ipc->events = calloc(1, sizeof *ipc->events))
                                 == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_ipc_record: out of host "
                    "memory");
  xs_ipc_events *e = ipc->events;
  for (size_t i = 0; i < e->n; i++)
    if (e->v[i].stream == stream) return *out = e->v[i].event, XSEG_OK;
  if (!XS_ARRAY_RESERVE(e->v, e->cap, e->n + 1, 4))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_ipc_record: out of host "
                    "memory");
  xseg_status st = xs_vmm_ipc_event_create(&a->vmm, out);
  if (st == XSEG_OK) e->v[e->n++] = (xs_ipc_stream_event){stream, *out};
  return st;
}

xseg_status xseg_ipc_record(xseg_allocator *a, struct CUstream_st *stream,
                            void *event_handle) {
  if (a == NULL || event_handle == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_record: %s is NULL",
                    a == NULL ? "allocator" : "event_handle");
  xs_alloc_enter(a);
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st == XSEG_OK) {
    CUevent ev;
    CUipcEventHandle h;
    st = event_of_stream_locked(a, stream, &ev);
    if (st == XSEG_OK) st = xs_vmm_ipc_event_record(&a->vmm, ev, stream, &h);
    if (st == XSEG_OK) memcpy(event_handle, &h, sizeof h);
    xs_vmm_ctx_leave(&a->vmm, saved);
  }
  xs_alloc_leave(a);
  return st;
}

xseg_status xseg_ipc_wait(xseg_allocator *a, const void *event_handle,
                          struct CUstream_st *stream) {
  if (a == NULL || event_handle == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_wait: %s is NULL",
                    a == NULL ? "allocator" : "event_handle");
  CUipcEventHandle h;
  memcpy(&h, event_handle, sizeof h);
  xs_alloc_enter(a);
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st == XSEG_OK) {
    CUevent ev;
    bool own_event;
    st = xs_vmm_ipc_event_open(&a->vmm, &h, &ev, &own_event);
    if (st == XSEG_OK) {
      st = xs_vmm_ipc_event_wait(&a->vmm, ev, stream);
      if (!own_event) xs_vmm_event_destroy(&a->vmm, ev);
    }
    xs_vmm_ctx_leave(&a->vmm, saved);
  }
  xs_alloc_leave(a);
  return st;
}
