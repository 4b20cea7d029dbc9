/* driver.h: the driver table, xseg's only door to the CUDA driver.
 *
 * The allocator never calls a cu* symbol: it calls through an xs_driver that
 * xs_driver_load() filled with dlsym() from "libcuda.so.1", from a configured
 * path, or from the emulator (sim/). The same code therefore runs on a GPU and
 * on the emulator, and every call is counted here (the benchmarks' "driver
 * calls" on a real GPU, where the emulator's counters do not exist).
 *
 * Contract of the functions (as the toolkit's cuda.h documents them), in the
 * terms the allocator relies on:
 *   - cuMemAddressReserve/Free: a reservation is freed whole, with nothing
 *     mapped in it; sizes and addresses are multiples of the granularity.
 *   - cuMemCreate: size a multiple of the granularity; CUDA_ERROR_OUT_OF_MEMORY
 *     when the device is full. cuMemRelease frees the physical memory once
 *     no mapping of it remains.
 *   - cuMemMap: offset 0, the whole handle, into unmapped reserved space; the
 *     mapping has no access until cuMemSetAccess.
 *   - cuMemUnmap: one or more whole mappings, never part of one. It does not
 *     wait for work in flight: the caller must know the memory is idle.
 *   - cuMemSetAccess: any fully mapped range, across mappings.
 * Most calls need a current context: see xs_vmm_ctx_enter in vmm.h.
 */
#ifndef XS_VMM_DRIVER_H
#define XS_VMM_DRIVER_H

#include <stdatomic.h>
#include <stdint.h>
#include <cuda.h>

#include "xseg.h"

/* Every driver function xseg uses. The name is the one cuda.h declares;
   cuda.h's macros turn it into the versioned symbol (cuMemGetInfo ->
   cuMemGetInfo_v2), which is what the table resolves. */
#define XS_DRIVER_FUNCTIONS(X)                                               \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)      \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute)                 \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)                            \
  X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent) X(cuCtxSetCurrent)         \
  X(cuCtxSynchronize) X(cuMemGetInfo)                                        \
  X(cuMemGetAllocationGranularity) X(cuMemAddressReserve)                    \
  X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap)             \
  X(cuMemUnmap) X(cuMemSetAccess) X(cuMemExportToShareableHandle)            \
  X(cuMemImportFromShareableHandle) X(cuMemRetainAllocationHandle)           \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                \
  X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamGetCaptureInfo)            \
  X(cuStreamGetCtx)                                                          \
  X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode)                \
  X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)    \
  X(cuEventDestroy) X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle)

typedef enum xs_driver_fn {
#define XS_DRIVER_ENUM_(name) XS_DRIVER_FN_##name,
  XS_DRIVER_FUNCTIONS(XS_DRIVER_ENUM_)
#undef XS_DRIVER_ENUM_
  XS_DRIVER_FN_COUNT
} xs_driver_fn;

typedef struct xs_driver {
  const char *path;                       /* as given to dlopen */
  void *library;                          /* dlopen handle, never closed */
#define XS_DRIVER_MEMBER_(name) __typeof__(name) *name;
  XS_DRIVER_FUNCTIONS(XS_DRIVER_MEMBER_)
#undef XS_DRIVER_MEMBER_
  _Atomic uint64_t calls[XS_DRIVER_FN_COUNT];
} xs_driver;

/* A call through the table, counted: XS_DRV(d, cuMemMap, ptr, size, ...). */
#define XS_DRV(d, fn, ...)                                                   \
  (atomic_fetch_add_explicit(&(d)->calls[XS_DRIVER_FN_##fn], 1,              \
                             memory_order_relaxed),                          \
   (d)->fn(__VA_ARGS__))

/* Loads (once per process and path) and cuInit()s the driver library at
   `path`: NULL or "" is "libcuda.so.1"; "sim" is the emulator, found by
   xs_driver_sim_path. XSEG_ERR_NO_DRIVER names the library and dlerror()'s
   text. */
xseg_status xs_driver_load(const char *path, xs_driver **out);
/* The emulator's file: $XSEG_SIM_LIBRARY, else one already loaded in the
   process, else one beside libxseg (installed or in the build tree); see
   driver_sim.c. XSEG_ERR_NO_DRIVER names the places it looked. */
xseg_status xs_driver_sim_path(char *out, size_t n);

/* Unversioned name of a table entry ("cuMemMap"), for reports. */
const char *xs_driver_fn_name(xs_driver_fn fn);
uint64_t    xs_driver_call_count(xs_driver *d, xs_driver_fn fn);
void        xs_driver_reset_counts(xs_driver *d);

/* The one place a CUresult becomes an xseg_status and a message:
   "<call> failed: <CUDA_ERROR_NAME> (<driver's text>)", where <call> is
   printf-formatted from fmt (name the function, the address, the size).
   CUDA_ERROR_OUT_OF_MEMORY gives XSEG_ERR_OUT_OF_MEMORY, capture errors
   XSEG_ERR_CAPTURE, CUDA_ERROR_NOT_SUPPORTED XSEG_ERR_UNSUPPORTED, the rest
   XSEG_ERR_DRIVER. */
xseg_status xs_driver_error(xs_driver *d, CUresult r, const char *fmt,
                            ...) __attribute__((format(printf, 3, 4)));

#endif /* XS_VMM_DRIVER_H */
