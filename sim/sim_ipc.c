/* sim_ipc.c: sharing physical memory between processes through POSIX file
 * descriptors (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
 *
 * A handle's memory is a memfd, so exporting it is a dup of that fd, and any
 * process that receives the fd (fork, or SCM_RIGHTS over a Unix socket) maps
 * the very same pages. The properties an importer needs (device, requested
 * handle types, allocation flags) travel in the memfd's name, which the
 * kernel shows as the target of /proc/self/fd/N:
 *
 *     /memfd:xsim:<device>:<handle types>:<compression>:<rdma>:<usage> (deleted)
 *
 * An fd that does not carry such a name is not emulator memory.
 */
#define _GNU_SOURCE
#include "sim_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#define XSIM_MEMFD_FORMAT "xsim:%d:%u:%u:%u:%u"

int xsim_ipc_memfd_create(const CUmemAllocationProp *prop) {
  char name[96];
  snprintf(name, sizeof name, XSIM_MEMFD_FORMAT, prop->location.id,
           (unsigned)prop->requestedHandleTypes,
           (unsigned)prop->allocFlags.compressionType,
           (unsigned)prop->allocFlags.gpuDirectRDMACapable,
           (unsigned)prop->allocFlags.usage);
  return memfd_create(name, MFD_CLOEXEC);
}

/* The properties the exporter gave the memory behind fd; false when fd is
   not an emulator memfd. */
static bool xsim_memfd_prop_read(int fd, CUmemAllocationProp *prop) {
  char path[64], target[256];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  int dev;
  unsigned types, compression, rdma, usage;
  if (sscanf(target, "/memfd:" XSIM_MEMFD_FORMAT, &dev, &types, &compression,
             &rdma, &usage) != 5)
    return false;
  *prop = (CUmemAllocationProp){
      .type = CU_MEM_ALLOCATION_TYPE_PINNED,
      .requestedHandleTypes = (CUmemAllocationHandleType)types,
      .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
  };
  prop->allocFlags.compressionType = (unsigned char)compression;
  prop->allocFlags.gpuDirectRDMACapable = (unsigned char)rdma;
  prop->allocFlags.usage = (unsigned short)usage;
  return true;
}

/* Handle types the emulator cannot share: valid in cuda.h, not on Linux
   without a fabric (CUDA_ERROR_NOT_SUPPORTED); anything else is not a
   handle type at all (CUDA_ERROR_INVALID_VALUE). */
static CUresult xsim_handle_type_check(CUmemAllocationHandleType type) {
  switch (type) {
    case CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: return CUDA_SUCCESS;
    case CU_MEM_HANDLE_TYPE_WIN32:
    case CU_MEM_HANDLE_TYPE_WIN32_KMT:
    case CU_MEM_HANDLE_TYPE_FABRIC: return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

/* cuda.h (cuMemExportToShareableHandle): for a POSIX file descriptor the
   shareable handle is an int written to *shareableHandle; flags are
   "Reserved, must be zero". The caller owns (and closes) the fd. Only a
   handle created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in
   prop->requestedHandleTypes is exportable: otherwise
   CUDA_ERROR_INVALID_VALUE (cuda.h names no code; this is the argument
   error it lists). */
CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                      CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags) {
  XSIM_ENTER("cuMemExportToShareableHandle");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (shareableHandle == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((r = xsim_handle_type_check(handleType)) != CUDA_SUCCESS) return r;
  int fd;
  if ((r = xsim_vmm_handle_export_fd(handle, &fd)) != CUDA_SUCCESS) return r;
  *(int *)shareableHandle = fd;
  return CUDA_SUCCESS;
}

/* cuda.h (cuMemImportFromShareableHandle): osHandle is the fd itself, cast
   to void *; the import is a new handle (cuda.h: "no guarantee that the
   contents of handle will be the same CUDA memory handle"), paired with its
   own cuMemRelease. The caller keeps its fd. Memory this process "cannot
   support" (not an emulator memfd, or on a device it does not have) is
   CUDA_ERROR_NOT_SUPPORTED; a closed fd is CUDA_ERROR_INVALID_VALUE. The
   imported handle's requestedHandleTypes is 0 (observed on H100, driver
   580, with cuMemGetAllocationPropertiesFromHandle), so it cannot be
   exported again. */
CUresult cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle *handle, void *osHandle,
    CUmemAllocationHandleType shHandleType) {
  XSIM_ENTER("cuMemImportFromShareableHandle");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (handle == NULL) return CUDA_ERROR_INVALID_VALUE;
  if ((r = xsim_handle_type_check(shHandleType)) != CUDA_SUCCESS) return r;
  int fd = (int)(intptr_t)osHandle;
  if (fd < 0 || fcntl(fd, F_GETFD) < 0) return CUDA_ERROR_INVALID_VALUE;
  CUmemAllocationProp prop;
  if (!xsim_memfd_prop_read(fd, &prop) ||
      xsim_device_check(prop.location.id) != CUDA_SUCCESS)
    return CUDA_ERROR_NOT_SUPPORTED;
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;  /* out of descriptors */
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  return xsim_vmm_handle_import_fd(own, &prop, handle);
}
