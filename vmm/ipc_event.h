/* ipc_event.h: interprocess events, which order work of another process
 * after work queued here without either host waiting (cuEventCreate with
 * CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, cuIpcGetEventHandle,
 * cuIpcOpenEventHandle, cuStreamWaitEvent).
 *
 * cuda.h: "Performing operations on the imported event after the exported
 * event has been freed with cuEventDestroy will result in undefined
 * behavior": whoever exports an event keeps it as long as an importer may
 * still open it or wait on it. Like the rest of vmm/, these need the
 * device's context current.
 */
#ifndef XS_VMM_IPC_EVENT_H
#define XS_VMM_IPC_EVENT_H

#include "vmm/vmm.h"

xseg_status xs_vmm_ipc_event_create(xs_vmm *v, CUevent *out);
/* Records e on stream and writes its interprocess handle. */
xseg_status xs_vmm_ipc_event_record(xs_vmm *v, CUevent e, CUstream stream,
                                    CUipcEventHandle *out);
/* The event exported as h, opened here; or, when this process exported
   it, the event itself (*own_event true: the caller must not destroy it). */
xseg_status xs_vmm_ipc_event_open(xs_vmm *v, const CUipcEventHandle *h,
                                  CUevent *out, bool *own_event);
/* Makes stream wait (on the device) for e's latest record. */
xseg_status xs_vmm_ipc_event_wait(xs_vmm *v, CUevent e, CUstream stream);
/* Destroys an event that xs_vmm_ipc_event_create made or _open opened. */
void        xs_vmm_event_destroy(xs_vmm *v, CUevent e);

#endif /* XS_VMM_IPC_EVENT_H */
