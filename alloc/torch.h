/* torch.h: what alloc/torch.c and alloc/torch_pools.c share, and what the
   tests need of them beyond include/xseg.h. */
#ifndef XS_ALLOC_TORCH_H
#define XS_ALLOC_TORCH_H

#include <stdbool.h>

#include "xseg.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { XS_TORCH_MAX_DEVICES = 64 };

/* The allocator of `device`, created on first use; NULL (the failure kept
   for xseg_torch_last_error under entry point `fn`) if the device is out of
   range or creation failed. */
xseg_allocator *xs_torch_allocator(const char *fn, int device);
/* Whether PyTorch may name `device`: below the compiled limit, and below
   the count PyTorch announced once it did; false with the failure kept
   under entry point `fn`. */
bool xs_torch_device_valid(const char *fn, int device);
/* The allocator of `device` if it exists; never creates one. */
xseg_allocator *xs_torch_existing(int device);
/* Keeps a failure of entry point `fn` (status and message) for
   xseg_torch_last_error / xseg_torch_last_status. */
void xs_torch_error(const char *fn, xseg_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Keeps xseg_last_error() of a failed xseg call as entry point fn's. */
void xs_torch_error_from_xseg(const char *fn, xseg_status st);

/* torch_pools.c: where an allocation of `size` bytes on `stream` of
   `device` goes, asked of every open pool's filter at each allocation, as
   PyTorch's allocator does (one atomic load while no pool of the device is
   open): XS_TORCH_BY_STREAM, the caller's xseg_malloc (the stream
   announced to the claiming pool, or to none with none claiming; a claimed
   stream is announced here first); XS_TORCH_CHOSEN, allocated here into
   *ptr with xseg_malloc_from_pool under the pools' lock (the stream is
   announced to another pool than the one claiming it now, or to one while
   none claims it: its own pools); XS_TORCH_ROUTE_FAILED with the failure
   kept (a filter, announcing, or that allocation failed). */
typedef enum xs_torch_route {
  XS_TORCH_ROUTE_FAILED = -1,
  XS_TORCH_BY_STREAM = 0,
  XS_TORCH_CHOSEN = 1
} xs_torch_route;
xs_torch_route xs_torch_pools_route(xseg_allocator *a, int device,
                                    size_t size, struct CUstream_st *stream,
                                    void **ptr);
/* Whether a pool of `device` is open and none of its open pools has
   announced a stream to the core yet: a capture may be under way that the
   core cannot see, and no device-wide wait may run during one. */
bool xs_torch_pools_unseen(int device);
/* Forgets every pool (their filters' contexts freed); for
   xs_torch_destroy_all. */
void xs_torch_pools_forget_all(void);

/* torch_legacy.c: after a use of the block at ptr, a's, on `stream`
   (record_stream's argument) was recorded: when `stream` is a default
   (legacy) stream and another context than a's is current, the use is
   recorded on a stream of that context standing in for its legacy stream
   too (the hook cannot tell whose default stream it is). XSEG_OK at once
   otherwise. */
xseg_status xs_torch_record_standin(xseg_allocator *a, void *ptr,
                                    struct CUstream_st *stream);
/* Destroys the stand-in streams; for xs_torch_destroy_all, after every
   allocator is gone. */
void xs_torch_legacy_forget_all(void);

/* torch_device.c: destroys every device's allocator and forgets the
   device count (xs_torch_destroy_all's second half). */
void xs_torch_devices_destroy(void);

/* Destroys every allocator the xseg_torch_* entry points created, so that a
   test ends with nothing live; the next entry point creates them again. Not
   for use while other threads call them. */
void xs_torch_destroy_all(void);

#ifdef __cplusplus
}
#endif
#endif
