/* torch_device.c: what PyTorch's entry points (torch.c) and its graph
 * pools (torch_pools.c) share: one process-wide allocator per device,
 * created on first use (xs_torch_allocator), the device count PyTorch
 * announced, and the calling thread's kept failure
 * (xseg_torch_last_error). Apart from torch.c so that the two use it and
 * not each other.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/torch.h"

static _Atomic(xseg_allocator *) torch_allocators[XS_TORCH_MAX_DEVICES];
static pthread_mutex_t torch_create_lock = PTHREAD_MUTEX_INITIALIZER;
/* The device count PyTorch gave xseg_torch_init; 0 until then. */
static atomic_int torch_device_count;
/* The trace length every device records (xseg_torch_record_memory_history),
   given also to allocators made later: PyTorch's recordHistory reaches
   every device's, made or not. Written under torch_create_lock. */
static size_t torch_trace_entries;
static _Thread_local char torch_error[1024];
static _Thread_local xseg_status torch_status;

void xs_torch_error(const char *fn, xseg_status st, const char *fmt, ...) {
  int n = snprintf(torch_error, sizeof torch_error, "%s: %s: ", fn,
                   xseg_status_name(st));
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof torch_error)
    vsnprintf(torch_error + n, sizeof torch_error - (size_t)n, fmt, ap);
  va_end(ap);
  torch_status = st;
}

void xs_torch_error_from_xseg(const char *fn, xseg_status st) {
  xs_torch_error(fn, st, "%s", xseg_last_error());
}

const char *xseg_torch_last_error(void) { return torch_error; }

xseg_status xseg_torch_last_status(void) { return torch_status; }

void xseg_torch_clear_error(void) {
  torch_error[0] = '\0';
  torch_status = XSEG_OK;
}

/* A device PyTorch may name: below the compiled limit, and below the
   count PyTorch announced once it did. */
bool xs_torch_device_valid(const char *fn, int device) {
  int count = atomic_load_explicit(&torch_device_count, memory_order_relaxed);
  int limit = count > 0 ? count : XS_TORCH_MAX_DEVICES;
  if (device >= 0 && device < limit) return true;
  xs_torch_error(fn, XSEG_ERR_INVALID_ARGUMENT, "device %d is not in [0, %d)%s",
                 device, limit, count > 0 ? " (the device count PyTorch "
                 "gave xseg_torch_init)" : "");
  return false;
}

/* Creation is serialised (two threads' first calls make one allocator);
   later calls take no lock. */
xseg_allocator *xs_torch_allocator(const char *fn, int device) {
  if (!xs_torch_device_valid(fn, device)) return NULL;
  xseg_allocator *a =
      atomic_load_explicit(&torch_allocators[device], memory_order_acquire);
  if (a != NULL) return a;
  pthread_mutex_lock(&torch_create_lock);
  a = atomic_load_explicit(&torch_allocators[device], memory_order_acquire);
  if (a == NULL) {
    xseg_status st = xseg_create(device, NULL, &a);
    if (st == XSEG_OK && torch_trace_entries != 0 &&
        (st = xseg_record_memory_history(a, torch_trace_entries)) != XSEG_OK) {
      xseg_destroy(a);
      a = NULL;
    }
    if (st == XSEG_OK)
      atomic_store_explicit(&torch_allocators[device], a,
                            memory_order_release);
    else
      xs_torch_error_from_xseg(fn, st);
  }
  pthread_mutex_unlock(&torch_create_lock);
  return a;
}

void xseg_torch_record_memory_history(size_t max_entries) {
  pthread_mutex_lock(&torch_create_lock);
  torch_trace_entries = max_entries;
  for (int d = 0; d < XS_TORCH_MAX_DEVICES; d++) {
    xseg_allocator *a = atomic_load(&torch_allocators[d]);
    xseg_status st = a != NULL ? xseg_record_memory_history(a, max_entries)
                               : XSEG_OK;
    if (st != XSEG_OK)
      xs_torch_error_from_xseg("xseg_torch_record_memory_history", st);
  }
  pthread_mutex_unlock(&torch_create_lock);
}

xseg_allocator *xs_torch_existing(int device) {
  if (device < 0 || device >= XS_TORCH_MAX_DEVICES) return NULL;
  return atomic_load_explicit(&torch_allocators[device], memory_order_acquire);
}

void xseg_torch_init(int device_count) {
  if (device_count < 0 || device_count > XS_TORCH_MAX_DEVICES) {
    xs_torch_error("xseg_torch_init", XSEG_ERR_UNSUPPORTED,
                   "%d devices: xseg serves devices 0 to %d", device_count,
                   XS_TORCH_MAX_DEVICES - 1);
    return;
  }
  atomic_store_explicit(&torch_device_count, device_count,
                        memory_order_relaxed);
}

int xseg_torch_device_count(void) {
  return atomic_load_explicit(&torch_device_count, memory_order_relaxed);
}

void xs_torch_devices_destroy(void) {
  pthread_mutex_lock(&torch_create_lock);
  for (int d = 0; d < XS_TORCH_MAX_DEVICES; d++)
    xseg_destroy(atomic_exchange(&torch_allocators[d], NULL));
  atomic_store(&torch_device_count, 0);
  torch_trace_entries = 0;
  pthread_mutex_unlock(&torch_create_lock);
}
