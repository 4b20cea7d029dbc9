/* torch.c: the entry points of PyTorch's CUDAPluggableAllocator.
 *
 * PyTorch calls a pluggable allocator through plain function pointers that
 * carry a device and a stream but no allocator, so these keep one
 * process-wide allocator per device, created on first use from
 * XSEG_ALLOC_CONF (xseg_create with a NULL conf) and never destroyed while
 * the process runs: PyTorch frees tensors until the very end.
 *
 * The signatures are those PyTorch's C++ setters accept:
 *   CUDAPluggableAllocator(alloc_fn, free_fn)   xseg_torch_malloc / _free
 *   set_record_stream_fn(void(void*, cudaStream_t))   xseg_torch_record_stream
 *   set_reset_fn(void())                        xseg_torch_empty_cache
 *   set_memory_fraction_fn(void(double, int))   xseg_torch_set_memory_fraction
 * The graph-pool setters take a MempoolId_t (a pair of unsigned long long)
 * and a std::function, which C cannot receive: a two-line C++ lambda passes
 * the pair's halves and the capturing stream (see include/xseg.h).
 *
 * None of them can return an error to PyTorch, so a failure is kept as the
 * calling thread's xseg_torch_last_error(), which python/xseg_torch.py turns
 * into torch.cuda.OutOfMemoryError with xseg's message; malloc returns NULL.
 */
#define _GNU_SOURCE   /* open_memstream */
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/torch.h"
#include "xseg.h"

enum { XS_TORCH_MAX_DEVICES = 64 };

static _Atomic(xseg_allocator *) torch_allocators[XS_TORCH_MAX_DEVICES];
static pthread_mutex_t torch_create_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local char torch_error[1024];

/* Keeps the failure of entry point `fn` for xseg_torch_last_error. */
static void torch_error_set(const char *fn, xseg_status st) {
  snprintf(torch_error, sizeof torch_error, "%s: %s: %s", fn,
           xseg_status_name(st), xseg_last_error());
}

const char *xseg_torch_last_error(void) { return torch_error; }

void xseg_torch_clear_error(void) { torch_error[0] = '\0'; }

static bool torch_device_valid(const char *fn, int device) {
  if (device >= 0 && device < XS_TORCH_MAX_DEVICES) return true;
  snprintf(torch_error, sizeof torch_error,
           "%s: XSEG_ERR_INVALID_ARGUMENT: device %d is not in [0, %d)", fn,
           device, XS_TORCH_MAX_DEVICES);
  return false;
}

/* The allocator of `device`, created on first use. Creation is serialised
   (two threads' first calls make one allocator); later calls take no lock. */
static xseg_allocator *torch_allocator(const char *fn, int device) {
  if (!torch_device_valid(fn, device)) return NULL;
  xseg_allocator *a =
      atomic_load_explicit(&torch_allocators[device], memory_order_acquire);
  if (a != NULL) return a;
  pthread_mutex_lock(&torch_create_lock);
  a = atomic_load_explicit(&torch_allocators[device], memory_order_acquire);
  if (a == NULL) {
    xseg_status st = xseg_create(device, NULL, &a);
    if (st == XSEG_OK)
      atomic_store_explicit(&torch_allocators[device], a,
                            memory_order_release);
    else
      torch_error_set(fn, st);
  }
  pthread_mutex_unlock(&torch_create_lock);
  return a;
}

/* The allocator of `device` if it exists; never creates one. */
static xseg_allocator *torch_existing(int device) {
  return atomic_load_explicit(&torch_allocators[device], memory_order_acquire);
}

void *xseg_torch_malloc(ssize_t size, int device, struct CUstream_st *stream) {
  xseg_allocator *a = torch_allocator("xseg_torch_malloc", device);
  if (a == NULL) return NULL;
  if (size < 0) {
    snprintf(torch_error, sizeof torch_error,
             "xseg_torch_malloc: XSEG_ERR_INVALID_ARGUMENT: size %zd < 0",
             size);
    return NULL;
  }
  void *ptr = NULL;
  xseg_status st = xseg_malloc(a, (size_t)size, stream, &ptr);
  if (st != XSEG_OK) {
    torch_error_set("xseg_torch_malloc", st);
    return NULL;
  }
  return ptr;
}

void xseg_torch_free(void *ptr, ssize_t size, int device,
                     struct CUstream_st *stream) {
  (void)size;     /* xseg knows each block's size */
  (void)stream;   /* and its stream */
  if (ptr == NULL || !torch_device_valid("xseg_torch_free", device)) return;
  xseg_allocator *a = torch_existing(device);
  xseg_status st = a != NULL ? xseg_free(a, ptr) : XSEG_ERR_UNKNOWN_POINTER;
  if (st == XSEG_OK) return;
  if (a == NULL)
    snprintf(torch_error, sizeof torch_error,
             "xseg_torch_free: XSEG_ERR_UNKNOWN_POINTER: %p: device %d has "
             "no allocator", ptr, device);
  else
    torch_error_set("xseg_torch_free", st);
  /* PyTorch ignores a free's outcome: a lost free must not go unseen. */
  fprintf(stderr, "xseg: %s\n", torch_error);
}

/* PyTorch's record_stream hook names no device: the pointer's own allocator
   is the one that knows it. */
void xseg_torch_record_stream(void *ptr, struct CUstream_st *stream) {
  xseg_status st = XSEG_ERR_UNKNOWN_POINTER;
  for (int d = 0; d < XS_TORCH_MAX_DEVICES && st == XSEG_ERR_UNKNOWN_POINTER;
       d++) {
    xseg_allocator *a = torch_existing(d);
    if (a != NULL) st = xseg_record_stream(a, ptr, stream);
  }
  if (st == XSEG_ERR_UNKNOWN_POINTER)
    snprintf(torch_error, sizeof torch_error,
             "xseg_torch_record_stream: XSEG_ERR_UNKNOWN_POINTER: %p is not "
             "a live block of any device", ptr);
  else if (st != XSEG_OK)
    torch_error_set("xseg_torch_record_stream", st);
}

void xseg_torch_empty_cache(void) {
  for (int d = 0; d < XS_TORCH_MAX_DEVICES; d++) {
    xseg_allocator *a = torch_existing(d);
    xseg_status st = a != NULL ? xseg_empty_cache(a) : XSEG_OK;
    if (st != XSEG_OK) torch_error_set("xseg_torch_empty_cache", st);
  }
}

void xseg_torch_set_memory_fraction(double fraction, int device) {
  xseg_allocator *a =
      torch_allocator("xseg_torch_set_memory_fraction", device);
  xseg_status st = a != NULL ? xseg_set_memory_fraction(a, fraction) : XSEG_OK;
  if (st != XSEG_OK) torch_error_set("xseg_torch_set_memory_fraction", st);
}

/* PyTorch's MempoolId_t {a, b}: {capture id, 0} for a graph's own pool,
   {0, n} for a pool from graph_pool_handle(). Folded into one non-zero id
   below the XSEG_CAPTURE_POOL range. */
static xseg_pool_id torch_pool_id(unsigned long long first,
                                  unsigned long long second) {
  xseg_pool_id id = ((xseg_pool_id)first << 32 ^ (xseg_pool_id)second) &
                    ~((xseg_pool_id)1 << 63);
  return id != 0 ? id : 1;
}

void xseg_torch_begin_allocate_to_pool(int device, unsigned long long first,
                                       unsigned long long second,
                                       struct CUstream_st *stream) {
  const char *fn = "xseg_torch_begin_allocate_to_pool";
  xseg_allocator *a = torch_allocator(fn, device);
  xseg_status st = a != NULL ? xseg_begin_allocate_to_pool(
                                   a, torch_pool_id(first, second), stream)
                             : XSEG_OK;
  if (st != XSEG_OK) torch_error_set(fn, st);
}

void xseg_torch_end_allocate_to_pool(int device, unsigned long long first,
                                     unsigned long long second) {
  const char *fn = "xseg_torch_end_allocate_to_pool";
  xseg_allocator *a = torch_allocator(fn, device);
  xseg_status st =
      a != NULL ? xseg_end_allocate_to_pool(a, torch_pool_id(first, second))
                : XSEG_OK;
  if (st != XSEG_OK) torch_error_set(fn, st);
}

void xseg_torch_release_pool(int device, unsigned long long first,
                             unsigned long long second) {
  const char *fn = "xseg_torch_release_pool";
  xseg_allocator *a = torch_allocator(fn, device);
  xseg_status st = a != NULL ? xseg_release_pool(a, torch_pool_id(first, second))
                             : XSEG_OK;
  if (st != XSEG_OK) torch_error_set(fn, st);
}

xseg_allocator *xseg_torch_allocator(int device) {
  return torch_allocator("xseg_torch_allocator", device);
}

/* What `write` prints, as a malloc'd string; NULL (and the error kept) on
   failure. */
static char *torch_json(const char *fn, int device,
                        xseg_status (*write)(xseg_allocator *, FILE *)) {
  xseg_allocator *a = torch_allocator(fn, device);
  if (a == NULL) return NULL;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (f == NULL) {
    snprintf(torch_error, sizeof torch_error,
             "%s: XSEG_ERR_OUT_OF_MEMORY: out of host memory", fn);
    return NULL;
  }
  xseg_status st = write(a, f);
  if (fclose(f) != 0 && st == XSEG_OK) st = XSEG_ERR_OUT_OF_MEMORY;
  if (st == XSEG_OK) return text;
  torch_error_set(fn, st);
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
  return device >= 0 && device < XS_TORCH_MAX_DEVICES &&
         torch_existing(device) != NULL;
}

void xs_torch_destroy_all(void) {
  pthread_mutex_lock(&torch_create_lock);
  for (int d = 0; d < XS_TORCH_MAX_DEVICES; d++)
    xseg_destroy(atomic_exchange(&torch_allocators[d], NULL));
  pthread_mutex_unlock(&torch_create_lock);
}
