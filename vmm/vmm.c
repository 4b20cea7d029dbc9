/* vmm.c: reserve, create, map, grant access, unmap and release, each one
 * driver call with its failure turned into a message naming the call, the
 * address and the size; and the two run helpers the segments grow and shrink
 * with, which never leave a half-mapped run behind.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/error.h"
#include "vmm/vmm.h"

#define XS_CHECK(v, call, ...)                                               \
  do {                                                                       \
    CUresult r_ = (call);                                                    \
    if (r_ != CUDA_SUCCESS) return xs_driver_error((v)->drv, r_, __VA_ARGS__); \
  } while (0)

static CUmemAllocationProp vmm_prop(const xs_vmm *v, bool exportable) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = v->device;
  prop.requestedHandleTypes = exportable
                                  ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                  : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

static xseg_status vmm_query_device(xs_vmm *v, CUdevice dev) {
  int vmm_supported = 0;
  XS_CHECK(v, XS_DRV(v->drv, cuDeviceGetAttribute, &vmm_supported,
                     CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                     dev),
           "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, "
           "device %d)", v->device);
  if (!vmm_supported)
    return xs_error(XSEG_ERR_UNSUPPORTED,
                    "device %d does not support virtual memory management",
                    v->device);
  XS_CHECK(v, XS_DRV(v->drv, cuDeviceTotalMem, &v->total_memory, dev),
           "cuDeviceTotalMem(device %d)", v->device);
  CUmemAllocationProp prop = vmm_prop(v, false);
  XS_CHECK(v, XS_DRV(v->drv, cuMemGetAllocationGranularity, &v->granularity,
                     &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           "cuMemGetAllocationGranularity(device %d)", v->device);
  return XSEG_OK;
}

xseg_status xs_vmm_open(xs_vmm *v, const char *driver_path, int device) {
  memset(v, 0, sizeof *v);
  v->device = device;
  xseg_status st = xs_driver_load(driver_path, &v->drv);
  if (st != XSEG_OK) return st;
  int count = 0;
  XS_CHECK(v, XS_DRV(v->drv, cuDeviceGetCount, &count), "cuDeviceGetCount");
  if (device < 0 || device >= count)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "device %d does not exist (the driver has %d)", device,
                    count);
  CUdevice dev;
  XS_CHECK(v, XS_DRV(v->drv, cuDeviceGet, &dev, device), "cuDeviceGet(%d)",
           device);
  st = vmm_query_device(v, dev);
  if (st != XSEG_OK) return st;
  XS_CHECK(v, XS_DRV(v->drv, cuDevicePrimaryCtxRetain, &v->ctx, dev),
           "cuDevicePrimaryCtxRetain(device %d)", device);
  v->access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  v->access[0].location.id = device;
  v->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  v->n_access = 1;
  /* Every handle is exportable, so that any live block can be shared
     (alloc/ipc_export.c): the handle type costs nothing until exported. */
  v->shareable = true;
  return XSEG_OK;
}

void xs_vmm_close(xs_vmm *v) {
  if (v->ctx == NULL) return;
  CUdevice dev;
  if (XS_DRV(v->drv, cuDeviceGet, &dev, v->device) == CUDA_SUCCESS)
    XS_DRV(v->drv, cuDevicePrimaryCtxRelease, dev);
  v->ctx = NULL;
}

xseg_status xs_vmm_stream_ctx(xs_vmm *v, struct CUstream_st *stream,
                              CUcontext *ctx) {
  *ctx = v->ctx;
  if (stream == NULL || stream == CU_STREAM_LEGACY ||
      stream == CU_STREAM_PER_THREAD)
    return XSEG_OK;
  CUcontext c = NULL;
  CUresult r = XS_DRV(v->drv, cuStreamGetCtx, stream, &c);
  if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_CONTEXT_IS_DESTROYED)
    return XSEG_OK;
  XS_CHECK(v, r, "cuStreamGetCtx(stream %p)", (void *)stream);
  if (c != NULL) *ctx = c;
  return XSEG_OK;
}

xseg_status xs_vmm_stream_allocates(xs_vmm *v, const char *what,
                                    struct CUstream_st *stream) {
  CUcontext ctx;
  xseg_status st = xs_vmm_stream_ctx(v, stream, &ctx);
  if (st != XSEG_OK || ctx == v->ctx) return st;
  return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "%s on stream %p: the stream is another context's (another "
                  "device's) than the allocator of device %d, which allocates "
                  "only on its own device's streams", what, (void *)stream,
                  v->device);
}

xseg_status xs_vmm_ctx_switch(xs_vmm *v, CUcontext ctx, CUcontext *saved) {
  XS_CHECK(v, XS_DRV(v->drv, cuCtxGetCurrent, saved), "cuCtxGetCurrent");
  if (*saved == ctx) return XSEG_OK;
  if (ctx == v->ctx)
    XS_CHECK(v, XS_DRV(v->drv, cuCtxSetCurrent, ctx),
             "cuCtxSetCurrent(primary context of device %d)", v->device);
  else
    XS_CHECK(v, XS_DRV(v->drv, cuCtxSetCurrent, ctx),
             "cuCtxSetCurrent(context %p of a recorded stream)", (void *)ctx);
  return XSEG_OK;
}

/* Set when a xs_vmm_ctx_return failed: the thread is in another context
   than the one its caller (xs_vmm_ctx_enter's, say) takes for current. */
static _Thread_local bool vmm_ctx_displaced;

/* A switch back to the caller's context: a failure is tried once more at
   once, as an unmap is (xs_vmm_unmap_quietly), before it counts. Inline:
   out of line, the leave's tail call to it cost the deferred bench's pair
   8 instructions (bench/callgrind.sh deferred, 1568 -> 1576). */
static inline CUresult vmm_ctx_switch_back(xs_vmm *v, CUcontext saved) {
  CUresult r = XS_DRV(v->drv, cuCtxSetCurrent, saved);
  return r == CUDA_SUCCESS ? r : XS_DRV(v->drv, cuCtxSetCurrent, saved);
}

xseg_status xs_vmm_ctx_return(xs_vmm *v, CUcontext ctx, CUcontext saved) {
  if (saved == ctx) return XSEG_OK;
  CUresult r = vmm_ctx_switch_back(v, saved);
  if (r == CUDA_SUCCESS) return XSEG_OK;
  vmm_ctx_displaced = true;
  return xs_driver_error(v->drv, r, "cuCtxSetCurrent(the caller's context "
                         "%p, back from %p)", (void *)saved, (void *)ctx);
}

xseg_status xs_vmm_ctx_mend(xs_vmm *v) {
  if (!vmm_ctx_displaced) return XSEG_OK;
  XS_CHECK(v, XS_DRV(v->drv, cuCtxSetCurrent, v->ctx),
           "cuCtxSetCurrent(primary context of device %d, after a failed "
           "switch back)", v->device);
  /* The leave still restores its caller's context when that was not
     v's: the flag only forced it when it was. */
  vmm_ctx_displaced = false;
  return XSEG_OK;
}

xseg_status xs_vmm_ctx_enter(xs_vmm *v, CUcontext *saved) {
  return xs_vmm_ctx_switch(v, v->ctx, saved);
}

void xs_vmm_ctx_leave(xs_vmm *v, CUcontext saved) {
  /* Displaced in between: the caller's context is not v's any more, even
     when it was at the enter; one more try. */
  if (saved != v->ctx || vmm_ctx_displaced) {
    vmm_ctx_displaced = false;
    /* The leave has no status to report a failure in, and a later call
       cannot tell a context left current by a failure from one the
       caller chose since (cudaSetDevice makes the allocator's own
       current): after the second try the thread stays in v's context. */
    vmm_ctx_switch_back(v, saved);
  }
}

xseg_status xs_vmm_add_peer(xs_vmm *v, int peer) {
  for (int i = 0; i < v->n_access; i++)
    if (v->access[i].location.id == peer) return XSEG_OK;
  if (v->n_access == XS_VMM_MAX_ACCESS)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "device %d: no room for peer %d (at most %d peers)",
                    v->device, peer, XS_VMM_MAX_ACCESS - 1);
  CUmemAccessDesc *a = &v->access[v->n_access++];
  a->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->location.id = peer;
  a->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return XSEG_OK;
}

xseg_status xs_vmm_reserve(xs_vmm *v, size_t size, uint64_t *addr) {
  assert(size % v->granularity == 0 && "reservations are granule multiples");
  CUdeviceptr p = 0;
  XS_CHECK(v, XS_DRV(v->drv, cuMemAddressReserve, &p, size, 0, 0, 0),
           "cuMemAddressReserve(size %zu) on device %d", size, v->device);
  *addr = (uint64_t)p;
  v->reserves++;
  return XSEG_OK;
}

xseg_status xs_vmm_unreserve(xs_vmm *v, uint64_t addr, size_t size) {
  XS_CHECK(v, XS_DRV(v->drv, cuMemAddressFree, (CUdeviceptr)addr, size),
           "cuMemAddressFree(0x%llx, size %zu)", (unsigned long long)addr,
           size);
  return XSEG_OK;
}

xseg_status xs_vmm_handle_create(xs_vmm *v, size_t size, bool exportable,
                                 uint64_t *handle) {
  assert(size % v->granularity == 0 && "handles are granule multiples");
  CUmemAllocationProp prop = vmm_prop(v, exportable || v->shareable);
  CUmemGenericAllocationHandle h;
  CUresult r = XS_DRV(v->drv, cuMemCreate, &h, size, &prop, 0);
  if (r == CUDA_ERROR_NOT_SUPPORTED && !exportable && v->shareable) {
    v->shareable = false;        /* e.g. a sandbox without fd export */
    prop = vmm_prop(v, false);
    r = XS_DRV(v->drv, cuMemCreate, &h, size, &prop, 0);
  }
  XS_CHECK(v, r, "cuMemCreate(size %zu) on device %d", size, v->device);
  *handle = (uint64_t)h;
  return XSEG_OK;
}

xseg_status xs_vmm_handle_release(xs_vmm *v, uint64_t handle) {
  XS_CHECK(v, XS_DRV(v->drv, cuMemRelease, (CUmemGenericAllocationHandle)handle),
           "cuMemRelease(handle 0x%llx)", (unsigned long long)handle);
  return XSEG_OK;
}

xseg_status xs_vmm_map(xs_vmm *v, uint64_t addr, size_t size,
                       uint64_t handle) {
  XS_CHECK(v, XS_DRV(v->drv, cuMemMap, (CUdeviceptr)addr, size, 0,
                     (CUmemGenericAllocationHandle)handle, 0),
           "cuMemMap(0x%llx, size %zu)", (unsigned long long)addr, size);
  return XSEG_OK;
}

xseg_status xs_vmm_unmap(xs_vmm *v, uint64_t addr, size_t size) {
  XS_CHECK(v, XS_DRV(v->drv, cuMemUnmap, (CUdeviceptr)addr, size),
           "cuMemUnmap(0x%llx, size %zu)", (unsigned long long)addr, size);
  return XSEG_OK;
}

xseg_status xs_vmm_set_access(xs_vmm *v, uint64_t addr, size_t size) {
  XS_CHECK(v, XS_DRV(v->drv, cuMemSetAccess, (CUdeviceptr)addr, size,
                     v->access, (size_t)v->n_access),
           "cuMemSetAccess(0x%llx, size %zu, %d devices)",
           (unsigned long long)addr, size, v->n_access);
  return XSEG_OK;
}

/* Releases handles[0..n) after a failed run, around the message-setting
   wrappers: the message stays the failing call's. */
static void vmm_handles_rollback(xs_vmm *v, const uint64_t *handles, size_t n) {
  for (size_t i = 0; i < n; i++)
    XS_DRV(v->drv, cuMemRelease, (CUmemGenericAllocationHandle)handles[i]);
}

xseg_status xs_vmm_map_run(xs_vmm *v, uint64_t addr, size_t chunk, size_t n,
                           uint64_t *handles_out) {
  assert(n > 0 && chunk % v->granularity == 0);
  size_t created = 0;
  xseg_status st = XSEG_OK;
  for (; created < n; created++) {
    st = xs_vmm_handle_create(v, chunk, false, &handles_out[created]);
    if (st != XSEG_OK) break;
  }
  /* Fresh handles are distinct, so xs_vmm_map_handles maps one a chunk,
     grants access once and unmaps what it mapped if anything fails. */
  if (st == XSEG_OK) st = xs_vmm_map_handles(v, addr, chunk, n, handles_out);
  if (st != XSEG_OK) vmm_handles_rollback(v, handles_out, created);
  return st;
}

xseg_status xs_vmm_unmap_run(xs_vmm *v, uint64_t addr, size_t chunk, size_t n,
                             const uint64_t *handles) {
  /* A failed unmap keeps the handles: released while still mapped, they
     could never be unmapped by handle again. The caller still owns them. */
  xseg_status st = xs_vmm_unmap(v, addr, n * chunk);
  if (st != XSEG_OK) return st;
  xseg_status first = XSEG_OK;
  for (size_t i = 0; i < n; i++) {
    st = xs_vmm_handle_release(v, handles[i]);
    if (first == XSEG_OK) first = st;
  }
  return first;
}

/* Granules from handles[i] on that share its handle (a run of equal
   values is one handle). */
static size_t vmm_handle_run(const uint64_t *handles, size_t i, size_t n) {
  size_t run = 1;
  while (i + run < n && handles[i + run] == handles[i]) run++;
  return run;
}

xseg_status xs_vmm_map_handles(xs_vmm *v, uint64_t addr, size_t chunk,
                               size_t n, const uint64_t *handles) {
  assert(n > 0 && chunk % v->granularity == 0);
  size_t mapped = 0;
  xseg_status st = XSEG_OK;
  while (mapped < n) {
    size_t run = vmm_handle_run(handles, mapped, n);
    st = xs_vmm_map(v, addr + mapped * chunk, run * chunk, handles[mapped]);
    if (st != XSEG_OK) break;
    mapped += run;
  }
  if (st == XSEG_OK) st = xs_vmm_set_access(v, addr, n * chunk);
  if (st != XSEG_OK && mapped > 0)
    xs_vmm_unmap_quietly(v, addr, mapped * chunk);
  return st;
}

bool xs_vmm_unmap_quietly(xs_vmm *v, uint64_t addr, size_t size) {
  /* Around the wrappers: the message stays the failing call's. */
  return XS_DRV(v->drv, cuMemUnmap, (CUdeviceptr)addr, size) ==
             CUDA_SUCCESS ||
         XS_DRV(v->drv, cuMemUnmap, (CUdeviceptr)addr, size) == CUDA_SUCCESS;
}

xseg_status xs_vmm_mem_info(xs_vmm *v, size_t *free_bytes,
                            size_t *total_bytes) {
  XS_CHECK(v, XS_DRV(v->drv, cuMemGetInfo, free_bytes, total_bytes),
           "cuMemGetInfo(device %d)", v->device);
  return XSEG_OK;
}
