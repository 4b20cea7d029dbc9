/* ipc_event.c: interprocess events through the driver table; see
 * ipc_event.h.
 *
 * The driver opens only another process's events: the process that
 * exported a handle gets CUDA_ERROR_INVALID_CONTEXT for it (an H200 with
 * driver 580). A handle can still come back to its exporter (one
 * allocator sends to another in the same process, or a tensor is passed
 * on and returns), so this process's own exported events are kept by
 * handle, and opening one of them gives the event itself.
 */
#include "vmm/ipc_event.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "vmm/array.h"
#include "vmm/error.h"

typedef struct own_event {
  CUevent event;
  CUipcEventHandle handle;
  bool has_handle;              /* recorded and exported at least once */
} own_event;

/* This process's interprocess events. A forked child inherits the table
   but none of the events (a context does not survive fork), so the table
   belongs to the pid that filled it. */
static struct {
  pthread_mutex_t lock;
  pid_t pid;
  own_event *v;
  size_t n, cap;
} own = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Empties a table inherited through fork. Caller holds own.lock. */
static void own_forget_after_fork(void) {
  if (own.pid == getpid()) return;
  own.pid = getpid();
  own.n = 0;
}

/* e's entry, or NULL. Caller holds own.lock. */
static own_event *own_find(CUevent e) {
  for (size_t i = 0; i < own.n; i++)
    if (own.v[i].event == e) return &own.v[i];
  return NULL;
}

xseg_status xs_vmm_ipc_event_create(xs_vmm *v, CUevent *out) {
  CUresult r = XS_DRV(v->drv, cuEventCreate, out,
                      CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r, "cuEventCreate(INTERPROCESS | "
                           "DISABLE_TIMING) on device %d", v->device);
  pthread_mutex_lock(&own.lock);
  own_forget_after_fork();
  /* An entry of the same value is an event destroyed without this file
     (its context went first), whose value the driver gave again. */
  own_event *e = own_find(*out);
  if (e == NULL && XS_ARRAY_RESERVE(own.v, own.cap, own.n + 1, 4))
    e = &own.v[own.n++];
  if (e != NULL) *e = (own_event){.event = *out};
  pthread_mutex_unlock(&own.lock);
  if (e != NULL) return XSEG_OK;
  XS_DRV(v->drv, cuEventDestroy, *out);
  return xs_error(XSEG_ERR_OUT_OF_MEMORY, "cuEventCreate(INTERPROCESS) on "
                  "device %d: out of host memory for the table of this "
                  "process's events", v->device);
}

xseg_status xs_vmm_ipc_event_record(xs_vmm *v, CUevent e, CUstream stream,
                                    CUipcEventHandle *out) {
  CUresult r = XS_DRV(v->drv, cuEventRecord, e, stream);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r, "cuEventRecord(interprocess event, "
                           "stream %p) on device %d", (void *)stream,
                           v->device);
  r = XS_DRV(v->drv, cuIpcGetEventHandle, out, e);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r, "cuIpcGetEventHandle on device %d",
                           v->device);
  pthread_mutex_lock(&own.lock);
  own_forget_after_fork();
  own_event *o = own_find(e);
  if (o != NULL) o->handle = *out, o->has_handle = true;
  pthread_mutex_unlock(&own.lock);
  return XSEG_OK;
}

xseg_status xs_vmm_ipc_event_open(xs_vmm *v, const CUipcEventHandle *h,
                                  CUevent *out, bool *own_event_out) {
  pthread_mutex_lock(&own.lock);
  own_forget_after_fork();
  for (size_t i = 0; i < own.n; i++) {
    if (own.v[i].has_handle &&
        memcmp(&own.v[i].handle, h, sizeof *h) == 0) {
      *out = own.v[i].event;
      pthread_mutex_unlock(&own.lock);
      return *own_event_out = true, XSEG_OK;
    }
  }
  pthread_mutex_unlock(&own.lock);
  *own_event_out = false;
  CUresult r = XS_DRV(v->drv, cuIpcOpenEventHandle, out, *h);
  if (r == CUDA_ERROR_INVALID_CONTEXT)
    return xs_driver_error(v->drv, r, "cuIpcOpenEventHandle on device %d "
                           "(the handle is this process's own, and its event "
                           "was destroyed: xseg_destroy of the allocator "
                           "that recorded it)", v->device);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r, "cuIpcOpenEventHandle on device %d "
                           "(the exporting process has exited or destroyed "
                           "the event, or the bytes are no event handle)",
                           v->device);
  return XSEG_OK;
}

xseg_status xs_vmm_ipc_event_wait(xs_vmm *v, CUevent e, CUstream stream) {
  CUresult r = XS_DRV(v->drv, cuStreamWaitEvent, stream, e, 0);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r, "cuStreamWaitEvent(stream %p, "
                           "interprocess event) on device %d",
                           (void *)stream, v->device);
  return XSEG_OK;
}

void xs_vmm_event_destroy(xs_vmm *v, CUevent e) {
  pthread_mutex_lock(&own.lock);
  own_forget_after_fork();
  own_event *o = own_find(e);
  if (o != NULL) *o = own.v[--own.n];
  pthread_mutex_unlock(&own.lock);
  XS_DRV(v->drv, cuEventDestroy, e);
}
