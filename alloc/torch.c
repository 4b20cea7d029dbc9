/* torch.c: the entry points of PyTorch's CUDAPluggableAllocator.
 *
 * PyTorch calls a pluggable allocator through plain function pointers that
 * carry a device and a stream but no allocator, so these keep one
 * process-wide allocator per device, created on first use from
 * XSEG_ALLOC_CONF (xseg_create with a NULL conf) and never destroyed while
 * the process runs: PyTorch frees tensors until the very end.
 *
 * They are C: none can throw, so a failure is kept as the calling thread's
 * xseg_torch_last_error() / xseg_torch_last_status(), and malloc returns
 * NULL. PyTorch does not check for NULL; libxseg_torch.so (torch_adapter/)
 * wraps these in the C++ signatures PyTorch's setters take and turns a kept
 * failure into an exception at the failing call. The graph pools, with
 * PyTorch's stream filter, are in torch_pools.c; the allocators per device
 * and the kept failure in torch_device.c.
 */
#define _GNU_SOURCE   /* open_memstream */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/torch.h"
#include "vmm/error.h"

void *xseg_torch_malloc(ssize_t size, int device, struct CUstream_st *stream) {
  const char *fn = "xseg_torch_malloc";
  xseg_allocator *a = xs_torch_allocator(fn, device);
  if (a == NULL) return NULL;
  if (size < 0) {
    xs_torch_error(fn, XSEG_ERR_INVALID_ARGUMENT, "size %zd < 0", size);
    return NULL;
  }
  void *ptr = NULL;
  xs_torch_route route =
      xs_torch_pools_route(a, device, (size_t)size, stream, &ptr);
  if (route == XS_TORCH_ROUTE_FAILED) return NULL;
  if (route == XS_TORCH_CHOSEN) return ptr;
  xseg_status st = xseg_malloc(a, (size_t)size, stream, &ptr);
  if (st != XSEG_OK) {
    xs_torch_error_from_xseg(fn, st);
    return NULL;
  }
  return ptr;
}

void xseg_torch_free(void *ptr, ssize_t size, int device,
                     struct CUstream_st *stream) {
  (void)size;     /* xseg knows each block's size */
  (void)stream;   /* and its stream */
  if (ptr == NULL) return;
  /* A device out of range is kept as the error, as a failed free is. */
  if (xs_torch_device_valid("xseg_torch_free", device)) {
    xseg_allocator *a = xs_torch_existing(device);
    xseg_status st = a != NULL ? xseg_free(a, ptr) : XSEG_ERR_UNKNOWN_POINTER;
    if (st == XSEG_OK) return;
    if (a == NULL)
      xs_torch_error("xseg_torch_free", st, "%p: device %d has no allocator",
                     ptr, device);
    else
      xs_torch_error_from_xseg("xseg_torch_free", st);
  }
  /* PyTorch ignores a free's outcome (it frees from destructors): a lost
     free must not go unseen. */
  fprintf(stderr, "xseg: %s\n", xseg_torch_last_error());
}

/* PyTorch's record_stream hook names no device: the pointer's own allocator
   is the one that knows it. NULL may be any device's default stream
   (torch_legacy.c). */
void xseg_torch_record_stream(void *ptr, struct CUstream_st *stream) {
  xseg_status st = XSEG_ERR_UNKNOWN_POINTER;
  for (int d = 0; d < XS_TORCH_MAX_DEVICES && st == XSEG_ERR_UNKNOWN_POINTER;
       d++) {
    xseg_allocator *a = xs_torch_existing(d);
    if (a == NULL) continue;
    st = xseg_record_stream(a, ptr, stream);
    if (st == XSEG_OK) st = xs_torch_record_standin(a, ptr, stream);
  }
  if (st == XSEG_ERR_UNKNOWN_POINTER)
    xs_torch_error("xseg_torch_record_stream", st,
                   "%p is not a live block of any device", ptr);
  else if (st != XSEG_OK)
    xs_torch_error_from_xseg("xseg_torch_record_stream", st);
}

xseg_status xseg_torch_empty_cache_device(int device, int wait) {
  xseg_allocator *a = xs_torch_existing(device);   /* NULL out of range */
  if (a == NULL) return XSEG_OK;
  /* Released graph pools' memory is taken after a device-wide wait
     (reclaim.c), which would end a capture the core was not told of: a
     graph's pool reaches the core at its first allocation. PyTorch's own
     allocator refuses emptyCache during any capture. */
  if (xs_torch_pools_unseen(device))
    return xs_error(XSEG_ERR_CAPTURE,
                    "a graph pool of device %d is begun and has not "
                    "allocated yet: a capture may be under way that xseg "
                    "cannot see, so empty_cache released nothing (PyTorch's "
                    "own allocator refuses it during a capture)", device);
  xseg_status st = wait ? xseg_empty_cache_blocking(a) : xseg_empty_cache(a);
  /* During a capture the core knows of, it may not wait: what is already
     safe is released. */
  if (wait && st == XSEG_ERR_CAPTURE) st = xseg_empty_cache(a);
  return st;
}

void xseg_torch_empty_cache(void) {
  for (int d = 0; d < XS_TORCH_MAX_DEVICES; d++) {
    xseg_status st = xseg_torch_empty_cache_device(d, 0);
    if (st != XSEG_OK) xs_torch_error_from_xseg("xseg_torch_empty_cache", st);
  }
}

void xseg_torch_set_memory_fraction(double fraction, int device) {
  const char *fn = "xseg_torch_set_memory_fraction";
  xseg_allocator *a = xs_torch_allocator(fn, device);
  xseg_status st = a != NULL ? xseg_set_memory_fraction(a, fraction) : XSEG_OK;
  if (st != XSEG_OK) xs_torch_error_from_xseg(fn, st);
}

xseg_allocator *xseg_torch_allocator(int device) {
  return xs_torch_allocator("xseg_torch_allocator", device);
}

/* What `write` prints, as a malloc'd string; NULL (and the error kept) on
   failure. */
static char *torch_json(const char *fn, int device,
                        xseg_status (*write)(xseg_allocator *, FILE *)) {
  xseg_allocator *a = xs_torch_allocator(fn, device);
  if (a == NULL) return NULL;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (f == NULL) {
    xs_torch_error(fn, XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
    return NULL;
  }
  xseg_status st = write(a, f);
  if (fclose(f) != 0 && st == XSEG_OK) st = XSEG_ERR_OUT_OF_MEMORY;
  if (st == XSEG_OK) return text;
  xs_torch_error_from_xseg(fn, st);
  free(text);
  return NULL;
}

char *xseg_torch_stats_json(int device) {
  return torch_json("xseg_torch_stats_json", device, xseg_stats_json);
}

char *xseg_torch_snapshot_json(int device) {
  return torch_json("xseg_torch_snapshot_json", device, xseg_snapshot_json);
}

void xseg_torch_string_free(char *s) { free(s); }

int xseg_torch_device_limit(void) { return XS_TORCH_MAX_DEVICES; }

int xseg_torch_has_allocator(int device) {
  return xs_torch_existing(device) != NULL;
}

void xs_torch_destroy_all(void) {
  xs_torch_pools_forget_all();
  xs_torch_devices_destroy();
  xs_torch_legacy_forget_all();
}
