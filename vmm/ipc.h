/* ipc.h: physical handles as POSIX file descriptors, for sharing memory
 * with other processes (cuMemExportToShareableHandle and
 * cuMemImportFromShareableHandle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
 *
 * A handle is exportable only when it was created with that handle type
 * requested: xs_vmm_handle_create asks for it whenever v->shareable is set
 * (vmm.c). Like the rest of vmm/, these need the device's context current.
 */
#ifndef XS_VMM_IPC_H
#define XS_VMM_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "vmm/vmm.h"

/* A new file descriptor for the physical memory of `handle`; the caller
   closes it. */
xseg_status xs_vmm_handle_export(xs_vmm *v, uint64_t handle, int *fd);
/* A new handle for the memory behind `fd` (which the caller keeps): it is
   released with xs_vmm_handle_release, like any other. An fd that is not
   a driver's memory handle fails with the driver's CUresult named. */
xseg_status xs_vmm_handle_import(xs_vmm *v, int fd, uint64_t *handle);

#endif /* XS_VMM_IPC_H */
