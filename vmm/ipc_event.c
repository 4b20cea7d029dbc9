/* ipc_event.c: interprocess events through the driver table; see
 * ipc_event.h.
 */
#include "vmm/ipc_event.h"

xseg_status xs_vmm_ipc_event_create(xs_vmm *v, CUevent *out) {
  CUresult r = XS_DRV(v->drv, cuEventCreate, out,
                      CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r, "cuEventCreate(INTERPROCESS | "
                           "DISABLE_TIMING) on device %d", v->device);
  return XSEG_OK;
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
  return XSEG_OK;
}

xseg_status xs_vmm_ipc_event_open(xs_vmm *v, const CUipcEventHandle *h,
                                  CUevent *out) {
  CUresult r = XS_DRV(v->drv, cuIpcOpenEventHandle, out, *h);
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
  XS_DRV(v->drv, cuEventDestroy, e);
}
