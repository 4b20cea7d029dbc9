/* torch_legacy.c: another context's default stream, as PyTorch names it.
 *
 * PyTorch's record_stream hook gets a stream's handle alone, and every
 * device's default stream is NULL (CUDAStream::stream()): the legacy
 * stream of whichever context is current. So a block of device 0 recorded
 * on NULL while device 1's context is current means device 1's default
 * stream, which device 0's allocator would read as its own (and, the block
 * allocated on its own default stream, record nothing: the block was
 * reused while device 1 still read it). PyTorch's own allocator records on
 * the stream's device.
 *
 * Nor can the hook tell which device's default stream NULL names:
 * PyTorch's record_stream sets no device, so the block's own device's
 * default stream comes as NULL too, whatever device is current. So such a
 * use is recorded on both: on NULL (the block's own device's default
 * stream, as the allocator reads it) and, when another context is
 * current, on a stream of that context that stands in for its legacy
 * stream: a blocking stream (no CU_STREAM_NON_BLOCKING), on which an event
 * waits for the legacy stream's earlier work (cuda.h's implicit
 * synchronisation with stream 0). The free waits for both. One stand-in
 * per context, made on first need and kept until xs_torch_destroy_all:
 * the blocks recorded on it wait on it.
 * The per-thread default stream does not synchronise so; it is passed on
 * as it is.
 */
#include <pthread.h>

#include "alloc/torch.h"
#include "alloc/types.h"
#include "vmm/error.h"

typedef struct torch_legacy_proxy {
  CUcontext ctx;
  CUstream stream;
  xs_driver *drv;
} torch_legacy_proxy;

static pthread_mutex_t proxies_lock = PTHREAD_MUTEX_INITIALIZER;
static torch_legacy_proxy proxies[XS_TORCH_MAX_DEVICES];
static int n_proxies;

/* proxies_lock held: ctx's stand-in, made in ctx (current) if need be. */
static xseg_status legacy_proxy_of(xs_driver *drv, CUcontext ctx,
                                   CUstream *out) {
  for (int i = 0; i < n_proxies; i++)
    if (proxies[i].ctx == ctx) return *out = proxies[i].stream, XSEG_OK;
  if (n_proxies == XS_TORCH_MAX_DEVICES)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "the default streams of %d "
                    "contexts were recorded already: no room for context %p's",
                    XS_TORCH_MAX_DEVICES, (void *)ctx);
  CUresult r = XS_DRV(drv, cuStreamCreate, out, CU_STREAM_DEFAULT);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(drv, r, "cuStreamCreate(a stream standing in for "
                           "the default stream of context %p)", (void *)ctx);
  proxies[n_proxies++] = (torch_legacy_proxy){ctx, *out, drv};
  return XSEG_OK;
}

xseg_status xs_torch_record_standin(xseg_allocator *a, void *ptr,
                                    struct CUstream_st *stream) {
  if (stream != NULL && stream != CU_STREAM_LEGACY) return XSEG_OK;
  CUcontext current;
  CUresult r = XS_DRV(a->vmm.drv, cuCtxGetCurrent, &current);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(a->vmm.drv, r, "cuCtxGetCurrent (whose default "
                           "stream record_stream names)");
  if (current == NULL || current == a->vmm.ctx) return XSEG_OK;
  pthread_mutex_lock(&proxies_lock);
  CUstream proxy;
  xseg_status st = legacy_proxy_of(a->vmm.drv, current, &proxy);
  pthread_mutex_unlock(&proxies_lock);
  return st == XSEG_OK ? xseg_record_stream(a, ptr, proxy) : st;
}

void xs_torch_legacy_forget_all(void) {
  pthread_mutex_lock(&proxies_lock);
  for (int i = 0; i < n_proxies; i++)
    XS_DRV(proxies[i].drv, cuStreamDestroy, proxies[i].stream);
  n_proxies = 0;
  pthread_mutex_unlock(&proxies_lock);
}
