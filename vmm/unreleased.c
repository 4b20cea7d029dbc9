/* unreleased.c: physical handles whose cuMemRelease failed, and address
 * ranges whose cuMemAddressFree failed.
 *
 * A handle is released only after it was unmapped, and the layers above
 * have by then dropped it from every map: a failed release would lose it
 * for the life of the process (a persistent failure once stranded 40
 * handles). So it is kept here, tried again by every later release pass
 * and at xseg_destroy, and counted in the stats (handles_awaiting_release).
 * An address range that nothing else remembers once it should be gone is
 * kept the same way: the range a closed block of another process was
 * mapped in (IPC), and a segment's range at xseg_destroy. (A pool that
 * lives on keeps its segment, and so the range, when the free fails.)
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

struct xs_vmm_range {
  uint64_t addr;
  size_t size;
  size_t mapped;                /* its first bytes still mapped (0: none),
                                   unmapped before it is freed */
};

static bool unfreed_keep(xs_vmm *v, uint64_t addr, size_t size,
                         size_t mapped) {
  if (!XS_ARRAY_RESERVE(v->unfreed, v->cap_unfreed, v->n_unfreed + 1, 4))
    return false;
  v->unfreed[v->n_unfreed++] = (struct xs_vmm_range){addr, size, mapped};
  return true;
}

xseg_status xs_vmm_unreserve_or_keep(xs_vmm *v, uint64_t addr, size_t size) {
  xseg_status st = xs_vmm_unreserve(v, addr, size);
  if (st == XSEG_OK) return st;
  char cause[512];                      /* as xs_vmm_handle_release_or_keep */
  snprintf(cause, sizeof cause, "%s", xseg_last_error());
  if (unfreed_keep(v, addr, size, 0))
    return xs_error(st, "%s; the range is kept and freed later", cause);
  if (XS_DRV(v->drv, cuMemAddressFree, (CUdeviceptr)addr, size) ==
      CUDA_SUCCESS)
    return XSEG_OK;
  return xs_error(st, "%s; out of host memory to keep the range: lost",
                  cause);
}

void xs_vmm_unreserve_quietly(xs_vmm *v, uint64_t addr, size_t size,
                              size_t mapped) {
  if (mapped != 0 && !xs_vmm_unmap_quietly(v, addr, mapped)) {
    unfreed_keep(v, addr, size, mapped);  /* no room: nothing more to do */
    return;
  }
  if (XS_DRV(v->drv, cuMemAddressFree, (CUdeviceptr)addr, size) !=
          CUDA_SUCCESS &&
      !unfreed_keep(v, addr, size, 0))
    XS_DRV(v->drv, cuMemAddressFree, (CUdeviceptr)addr, size);
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
  kept = 0;
  for (size_t i = 0; i < v->n_unfreed; i++) {
    struct xs_vmm_range *r = &v->unfreed[i];
    xseg_status st = r->mapped != 0 ? xs_vmm_unmap(v, r->addr, r->mapped)
                                    : XSEG_OK;
    if (st == XSEG_OK) {
      r->mapped = 0;
      st = xs_vmm_unreserve(v, r->addr, r->size);
    }
    if (st != XSEG_OK) v->unfreed[kept++] = *r;
    if (first == XSEG_OK) first = st;
  }
  v->n_unfreed = kept;
  return first;
}

void xs_vmm_unreleased_destroy(xs_vmm *v) {
  xs_vmm_unreleased_retry(v);
  if (v->n_unreleased != 0)
    fprintf(stderr, "xseg_destroy: device %d: %zu physical handles could "
            "not be released\n", v->device, v->n_unreleased);
  if (v->n_unfreed != 0)
    fprintf(stderr, "xseg_destroy: device %d: %zu address ranges could "
            "not be freed\n", v->device, v->n_unfreed);
  free(v->unreleased);
  v->unreleased = NULL;
  v->n_unreleased = v->cap_unreleased = 0;
  free(v->unfreed);
  v->unfreed = NULL;
  v->n_unfreed = v->cap_unfreed = 0;
}
