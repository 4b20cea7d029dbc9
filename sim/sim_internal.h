/* sim_internal.h: what the emulator's files share.
 *
 * Ownership of the emulator's files:
 *   sim_control.c  counters, fault injection, modeled latency, environment
 *                  knobs, xsim_reset, xsim_get_live, the leak report
 *   sim_device.c   cuInit, driver version, devices, attributes, primary
 *                  contexts, current context (thread-local), cuMemGetInfo,
 *                  error names and strings, cuGetProcAddress
 *   sim_vmm.c      reservations, physical handles (memfd), mappings, access
 *   sim_ipc.c      export / import of shareable handles (POSIX fds)
 *   sim_stream.c   streams (one worker thread each), the legacy default
 *                  stream, host functions, memset / memcpy, cuCtxSynchronize
 *   sim_event.c    events
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
#include <stdint.h>
#include <cuda.h>
#include "xsim.h"

#define XSIM_MAX_DEVICES 16

/* ---- sim_control.c ---------------------------------------------------- */

/* Counts a call of `name` (the unversioned name), sleeps its modeled latency
   and returns the injected error for this call, or CUDA_SUCCESS. */
CUresult xsim_enter(const char *name);

#define XSIM_ENTER(name)                                                     \
  do {                                                                       \
    CUresult xsim_injected_ = xsim_enter(name);                              \
    if (xsim_injected_ != CUDA_SUCCESS) return xsim_injected_;               \
  } while (0)

/* Knobs as read from the environment (or set through xsim.h). */
int      xsim_knob_device_count(void);
uint64_t xsim_knob_device_memory(int device);
uint64_t xsim_knob_granularity(void);

/* ---- sim_device.c ------------------------------------------------------ */

/* CUDA_ERROR_NOT_INITIALIZED until cuInit succeeded. */
CUresult xsim_require_init(void);
/* The device of the calling thread's current context, or
   CUDA_ERROR_INVALID_CONTEXT when none is current (most driver calls need
   one). Implies xsim_require_init. */
CUresult xsim_current_device(int *device);

/* ---- sim_vmm.c --------------------------------------------------------- */

/* Live counts for xsim_get_live and the leak report. */
void xsim_vmm_live(xsim_live *out);
uint64_t xsim_vmm_report_live(FILE *out);
/* Bytes held by live handles on a device (for cuMemGetInfo). */
uint64_t xsim_vmm_used_bytes(int device);

/* ---- sim_stream.c / sim_event.c ---------------------------------------- */

void xsim_stream_live(xsim_live *out);    /* fills streams and events */

#endif /* XSIM_INTERNAL_H */
