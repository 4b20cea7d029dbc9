/* sim_internal.h: what the emulator's files share.
 *
 * Ownership of the emulator's files:
 *   sim_control.c  counters, fault injection, modeled latency, environment
 *                  knobs, xsim_reset, xsim_get_live, the leak report
 *   sim_device.c   cuInit, driver version, devices, attributes, primary
 *                  contexts, current context (thread-local), cuMemGetInfo,
 *                  error names and strings, cuGetProcAddress
 *   sim_vmm.c      reservations, physical handles (memfd), mappings, access
 *   sim_ipc.c      export / import of shareable handles (POSIX fds), the
 *                  memfd naming that carries a handle's properties
 *   sim_stream.c   streams (one worker thread each), the legacy default
 *                  stream, cuLaunchHostFunc, memset / memcpy,
 *                  cuCtxSynchronize, the modeled device lag and the virtual
 *                  clock
 *   sim_host.c     the one thread that runs every host function, one at a
 *                  time
 *   sim_event.c    events
 *   sim_ipc_event.c  interprocess events: their state shared with other
 *                  processes, cuIpcGetEventHandle / cuIpcOpenEventHandle
 *   sim_graph.c    stream capture, graphs, graph launch
 *
 * Every exported cu* function starts with XSIM_ENTER(name): it counts the
 * call, applies the modeled latency and returns an injected fault, in that
 * order, before the function looks at its arguments.
 */
#ifndef XSIM_INTERNAL_H
#define XSIM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <cuda.h>
#include "xsim.h"

#define XSIM_MAX_DEVICES 16

/* Everything below is internal to the library: hidden, so that the version
   script's xsim_* pattern exports only the control API of xsim.h, and so that
   a second copy of the emulator loaded into the same process (a test's fresh
   instance) calls its own internals, not the first copy's. */
#pragma GCC visibility push(hidden)

/* ---- sim_control.c ---------------------------------------------------- */

/* Counts a call of `name` (the unversioned name), sleeps its modeled latency
   and returns the injected error for this call, or CUDA_SUCCESS. `*slot`
   is the call site's cache of the name's slot (NULL until the first call):
   a slot keeps its name for the life of the process, so each entry point
   looks its name up once. */
CUresult xsim_enter(const char *name, _Atomic(void *) *slot);

#define XSIM_ENTER(name)                                                     \
  do {                                                                       \
    static _Atomic(void *) xsim_slot_;                                       \
    CUresult xsim_injected_ = xsim_enter(name, &xsim_slot_);                 \
    if (xsim_injected_ != CUDA_SUCCESS) return xsim_injected_;               \
  } while (0)

/* Reads the environment once (idempotent; cuInit and every knob call it). */
void     xsim_control_init(void);

/* Knobs as read from the environment (or set through xsim.h). */
int      xsim_knob_device_count(void);
uint64_t xsim_knob_device_memory(int device);
uint64_t xsim_knob_granularity(void);
/* XSIM_GPU_LAG (or xsim_set_gpu_lag) in nanoseconds; 0: none. */
uint64_t xsim_knob_gpu_lag_ns(void);

/* ---- sim_device.c ------------------------------------------------------ */

/* CUDA_ERROR_NOT_INITIALIZED until cuInit succeeded. */
CUresult xsim_require_init(void);
/* The device of the calling thread's current context, or
   CUDA_ERROR_INVALID_CONTEXT when none is current (most driver calls need
   one). Implies xsim_require_init. */
CUresult xsim_current_device(int *device);
/* The calling thread's current context, or NULL. */
CUcontext xsim_ctx_current(void);
/* CUDA_ERROR_INVALID_DEVICE unless 0 <= device < the device count. */
CUresult xsim_device_check(int device);
/* "CUDA_ERROR_OUT_OF_MEMORY" -> CUDA_ERROR_OUT_OF_MEMORY; false if unknown.
   The table behind it also serves cuGetErrorName / cuGetErrorString. */
bool xsim_error_parse(const char *name, CUresult *out);

/* ---- sim_vmm.c --------------------------------------------------------- */

/* Live counts for xsim_get_live and the leak report. */
void xsim_vmm_live(xsim_live *out);
uint64_t xsim_vmm_report_live(FILE *out);
/* Bytes held by live handles on a device (for cuMemGetInfo). */
uint64_t xsim_vmm_used_bytes(int device);
/* Validates an allocation property as cuMemCreate and
   cuMemGetAllocationGranularity require it (PINNED, on a valid device). */
CUresult xsim_vmm_prop_check(const CUmemAllocationProp *prop);
/* For sim_ipc.c (each takes the VMM lock). A dup of the memfd of a handle
   created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requested
   types. */
CUresult xsim_vmm_handle_export_fd(CUmemGenericAllocationHandle handle,
                                   int *fd);
/* A new handle over the memory of memfd `fd` (taken over: closed on
   failure), with the properties the exporter gave it. */
CUresult xsim_vmm_handle_import_fd(int fd, const CUmemAllocationProp *prop,
                                   CUmemGenericAllocationHandle *handle);

/* ---- sim_ipc.c --------------------------------------------------------- */

/* A memfd for a new allocation: its name carries the properties an importer
   in another process needs (see sim_ipc.c). -1 with errno on failure. */
int xsim_ipc_memfd_create(const CUmemAllocationProp *prop);

/* ---- sim_stream.c / sim_event.c ---------------------------------------- */

void xsim_stream_live(xsim_live *out);    /* fills streams and events */
/* Turns the virtual clock off (xsim_reset). */
void xsim_stream_clock_reset(void);

#pragma GCC visibility pop

#endif /* XSIM_INTERNAL_H */
