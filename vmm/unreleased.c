/* unreleased.c: physical handles whose cuMemRelease failed.
 *
 * A handle is released only after it was unmapped, and the layers above
 * have by then dropped it from every map: a failed release would lose it
 * for the life of the process (a persistent failure once stranded 40
 * handles). So it is kept here, tried again by every later release pass
 * and at xseg_destroy, and counted in the stats (handles_awaiting_release).
 */
#include <stdio.h>
#include <stdlib.h>

#include "vmm/array.h"
#include "vmm/error.h"
#include "vmm/vmm.h"

bool xs_vmm_unreleased_keep(xs_vmm *v, uint64_t h) {
  if (!XS_ARRAY_RESERVE(v->unreleased, v->cap_unreleased,
                        v->n_unreleased + 1, 8))
    return false;
  v->unreleased[v->n_unreleased++] = h;
  return true;
}

bool xs_vmm_handle_release_quietly(xs_vmm *v, uint64_t handle) {
  CUmemGenericAllocationHandle h = (CUmemGenericAllocationHandle)handle;
  if (XS_DRV(v->drv, cuMemRelease, h) == CUDA_SUCCESS ||
      xs_vmm_unreleased_keep(v, handle))
    return true;
  return XS_DRV(v->drv, cuMemRelease, h) == CUDA_SUCCESS;
}

xseg_status xs_vmm_handle_release_or_keep(xs_vmm *v, uint64_t handle) {
  xseg_status st = xs_vmm_handle_release(v, handle);
  if (st == XSEG_OK) return st;
  /* The message is copied out first: xs_error formats into the buffer
     that xseg_last_error() returns. */
  char cause[512];
  snprintf(cause, sizeof cause, "%s", xseg_last_error());
  if (xs_vmm_unreleased_keep(v, handle))
    return xs_error(st, "%s; the handle is kept and released later (%zu "
                    "wait)", cause, v->n_unreleased);
  /* Nowhere to keep it: one more try now is all that is left. */
  if (XS_DRV(v->drv, cuMemRelease, (CUmemGenericAllocationHandle)handle) ==
      CUDA_SUCCESS)
    return XSEG_OK;
  return xs_error(st, "%s; out of host memory to keep the handle: lost",
                  cause);
}

xseg_status xs_vmm_unreleased_retry(xs_vmm *v) {
  xseg_status first = XSEG_OK;
  size_t kept = 0;
  for (size_t i = 0; i < v->n_unreleased; i++) {
    xseg_status st = xs_vmm_handle_release(v, v->unreleased[i]);
    if (st != XSEG_OK) v->unreleased[kept++] = v->unreleased[i];
    if (first == XSEG_OK) first = st;
  }
  v->n_unreleased = kept;
  return first;
}

void xs_vmm_unreleased_destroy(xs_vmm *v) {
  xs_vmm_unreleased_retry(v);
  if (v->n_unreleased != 0)
    fprintf(stderr, "xseg_destroy: device %d: %zu physical handles could "
            "not be released\n", v->device, v->n_unreleased);
  free(v->unreleased);
  v->unreleased = NULL;
  v->n_unreleased = v->cap_unreleased = 0;
}
