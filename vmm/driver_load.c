/* driver_load.c: dlopen the driver library and fill the table.
 *
 * Drivers are loaded once per process and path and never unloaded (a driver
 * library does not survive dlclose well, and the handles the allocator holds
 * outlive any one allocator). Lookups go by the versioned symbol names the
 * toolkit's cuda.h defines, which real drivers export beside the old ones.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/driver.h"
#include "vmm/error.h"

#define XS_STR_(x) #x
#define XS_STR(x) XS_STR_(x)

enum { XS_MAX_DRIVERS = 8 };

static pthread_mutex_t drivers_lock = PTHREAD_MUTEX_INITIALIZER;
static xs_driver *drivers[XS_MAX_DRIVERS];
static int drivers_count;

static const char *const fn_names[XS_DRIVER_FN_COUNT] = {
#define XS_DRIVER_NAME_(name) #name,
    XS_DRIVER_FUNCTIONS(XS_DRIVER_NAME_)
#undef XS_DRIVER_NAME_
};

const char *xs_driver_fn_name(xs_driver_fn fn) {
  return (unsigned)fn < XS_DRIVER_FN_COUNT ? fn_names[fn] : "(none)";
}

uint64_t xs_driver_call_count(xs_driver *d, xs_driver_fn fn) {
  return atomic_load_explicit(&d->calls[fn], memory_order_relaxed);
}

void xs_driver_reset_counts(xs_driver *d) {
  for (int i = 0; i < XS_DRIVER_FN_COUNT; i++)
    atomic_store_explicit(&d->calls[i], 0, memory_order_relaxed);
}

/* The file to dlopen for `path`; "sim" is searched for (driver_sim.c). */
static xseg_status driver_path_resolve(const char *path, char *out,
                                       size_t n) {
  if (path != NULL && strcmp(path, "sim") == 0)
    return xs_driver_sim_path(out, n);
  if (path == NULL || path[0] == '\0') path = "libcuda.so.1";
  if ((size_t)snprintf(out, n, "%s", path) >= n)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "driver path is longer than %zu bytes", n - 1);
  return XSEG_OK;
}

/* Resolves every table entry; on a missing symbol names it. */
static xseg_status driver_resolve(xs_driver *d) {
#define XS_DRIVER_RESOLVE_(name)                                             \
  {                                                                          \
    void *sym = dlsym(d->library, XS_STR(name));                             \
    if (sym == NULL)                                                         \
      return xs_error(XSEG_ERR_NO_DRIVER,                                    \
                      "driver library %s lacks %s: %s", d->path,             \
                      XS_STR(name), dlerror());                              \
    memcpy(&d->name, &sym, sizeof sym);                                      \
  }
  XS_DRIVER_FUNCTIONS(XS_DRIVER_RESOLVE_)
#undef XS_DRIVER_RESOLVE_
  return XSEG_OK;
}

static xseg_status driver_open(const char *path, xs_driver **out) {
  xs_driver *d = calloc(1, sizeof *d);
  if (d == NULL) return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  d->path = strdup(path);
  d->library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  xseg_status st = XSEG_OK;
  if (d->path == NULL || d->library == NULL) {
    const char *why = dlerror();
    st = xs_error(XSEG_ERR_NO_DRIVER, "cannot load driver library %s: %s",
                  path, why != NULL ? why : "out of host memory");
  }
  if (st == XSEG_OK) st = driver_resolve(d);
  if (st == XSEG_OK) {
    CUresult r = XS_DRV(d, cuInit, 0);
    if (r != CUDA_SUCCESS) st = xs_driver_error(d, r, "cuInit(0) of %s", path);
  }
  if (st != XSEG_OK) {
    /* Keep the library loaded: unloading a half-initialised driver is
       riskier than the memory it holds. */
    free((void *)d->path);
    free(d);
    return st;
  }
  *out = d;
  return XSEG_OK;
}

xseg_status xs_driver_load(const char *path, xs_driver **out) {
  char resolved[PATH_MAX];
  xseg_status st = driver_path_resolve(path, resolved, sizeof resolved);
  if (st != XSEG_OK) return st;
  pthread_mutex_lock(&drivers_lock);
  xs_driver *found = NULL;
  for (int i = 0; i < drivers_count && found == NULL; i++)
    if (strcmp(drivers[i]->path, resolved) == 0) found = drivers[i];
  if (found == NULL && drivers_count == XS_MAX_DRIVERS)
    st = xs_error(XSEG_ERR_NO_DRIVER,
                  "cannot load %s: %d driver libraries are loaded already",
                  resolved, XS_MAX_DRIVERS);
  if (found == NULL && st == XSEG_OK) {
    st = driver_open(resolved, &found);
    if (st == XSEG_OK) drivers[drivers_count++] = found;
  }
  pthread_mutex_unlock(&drivers_lock);
  if (st == XSEG_OK) *out = found;
  return st;
}

static xseg_status driver_status_of(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY: return XSEG_ERR_OUT_OF_MEMORY;
    case CUDA_ERROR_NOT_SUPPORTED: return XSEG_ERR_UNSUPPORTED;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    case CUDA_ERROR_STREAM_CAPTURE_MERGE:
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
      return XSEG_ERR_CAPTURE;
    default: return XSEG_ERR_DRIVER;
  }
}

xseg_status xs_driver_error(xs_driver *d, CUresult r, const char *fmt, ...) {
  char call[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(call, sizeof call, fmt, ap);
  va_end(ap);
  /* Names are looked up without counting: they are not device work. */
  const char *name = NULL, *text = NULL;
  if (d->cuGetErrorName == NULL || d->cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = NULL;
  if (d->cuGetErrorString == NULL ||
      d->cuGetErrorString(r, &text) != CUDA_SUCCESS)
    text = NULL;
  char code[32];
  snprintf(code, sizeof code, "CUresult %d", (int)r);
  return xs_error(driver_status_of(r), "%s failed: %s (%s)", call,
                  name != NULL ? name : code,
                  text != NULL ? text : "no description");
}
