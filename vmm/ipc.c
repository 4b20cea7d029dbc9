/* ipc.c: export and import of physical handles as file descriptors; see
 * ipc.h.
 */
#include <stdint.h>

#include "vmm/ipc.h"

xseg_status xs_vmm_handle_export(xs_vmm *v, uint64_t handle, int *fd) {
  int out = -1;
  CUresult r = XS_DRV(v->drv, cuMemExportToShareableHandle, &out,
                      (CUmemGenericAllocationHandle)handle,
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r,
                           "cuMemExportToShareableHandle(handle 0x%llx, "
                           "POSIX_FILE_DESCRIPTOR) on device %d%s",
                           (unsigned long long)handle, v->device,
                           v->shareable ? ""
                                        : " (the driver refused exportable "
                                          "handles at creation)");
  *fd = out;
  return XSEG_OK;
}

xseg_status xs_vmm_handle_import(xs_vmm *v, int fd, uint64_t *handle) {
  CUmemGenericAllocationHandle h;
  CUresult r = XS_DRV(v->drv, cuMemImportFromShareableHandle, &h,
                      (void *)(intptr_t)fd,
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r,
                           "cuMemImportFromShareableHandle(fd %d, "
                           "POSIX_FILE_DESCRIPTOR) on device %d", fd,
                           v->device);
  *handle = (uint64_t)h;
  return XSEG_OK;
}
