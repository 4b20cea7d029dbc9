/* env.c: the driver a benchmark runs on.
 *
 * The bench never links libcuda: it loads the driver through vmm/ exactly as
 * the allocator does (same path, so the same xs_driver and the same call
 * counters). The emulator's control API is not linked either: it is looked
 * up with dlsym in the loaded driver library, so a real libcuda, which has
 * none of it, just leaves the pointers NULL.
 */
#include <dlfcn.h>
#include <string.h>

#include "bench.h"

/* dlsym's void * to a function pointer without a pedantic cast warning. */
#define XB_DLSYM(lib, name, dst)                                             \
  do {                                                                       \
    void *sym_ = dlsym((lib), (name));                                       \
    memcpy(&(dst), &sym_, sizeof sym_);                                      \
  } while (0)

const char *xb_env_driver_path(const xb_env *env) {
  return strcmp(env->driver, "cuda") == 0 ? "libcuda.so.1" : env->driver;
}

xseg_status xb_env_open(xb_env *env, const char *driver) {
  memset(env, 0, sizeof *env);
  snprintf(env->driver, sizeof env->driver, "%s", driver);
  xseg_status st = xs_vmm_open(&env->vmm, xb_env_driver_path(env), 0);
  if (st != XSEG_OK) return st;
  void *lib = env->vmm.drv->library;
  XB_DLSYM(lib, "xsim_call_count", env->sim_call_count);
  XB_DLSYM(lib, "xsim_reset_counters", env->sim_reset_counters);
  XB_DLSYM(lib, "xsim_set_device_memory", env->sim_set_device_memory);
  XB_DLSYM(lib, "xsim_clock_enable", env->sim_clock_enable);
  XB_DLSYM(lib, "xsim_clock_disable", env->sim_clock_disable);
  XB_DLSYM(lib, "xsim_clock_advance", env->sim_clock_advance);
  XB_DLSYM(lib, "cuMemsetD8Async", env->memset_async);
  return XSEG_OK;
}

void xb_env_close(xb_env *env) { xs_vmm_close(&env->vmm); }

bool xb_env_is_sim(const xb_env *env) { return env->sim_call_count != NULL; }

void xb_env_reset_counts(xb_env *env) {
  xs_driver_reset_counts(env->vmm.drv);
  if (env->sim_reset_counters != NULL) env->sim_reset_counters();
}

/* The emulator counts every call the process makes, the table only those
   that went through vmm/: prefer the emulator's where there is one. */
uint64_t xb_env_call_count(xb_env *env, xs_driver_fn fn) {
  if (env->sim_call_count != NULL)
    return env->sim_call_count(xs_driver_fn_name(fn));
  return xs_driver_call_count(env->vmm.drv, fn);
}

bool xb_env_set_device_memory(xb_env *env, uint64_t bytes) {
  if (env->sim_set_device_memory == NULL) return false;
  env->sim_set_device_memory(env->vmm.device, bytes);
  return true;
}

bool xb_env_clock_start(xb_env *env, uint64_t lag_ns) {
  if (env->sim_clock_enable == NULL || env->sim_clock_advance == NULL ||
      env->sim_clock_disable == NULL || env->memset_async == NULL)
    return false;
  env->sim_clock_enable(lag_ns);
  return true;
}

void xb_env_clock_stop(xb_env *env) {
  if (env->sim_clock_disable != NULL) env->sim_clock_disable();
}

void xb_env_clock_advance(xb_env *env, uint64_t now_ns) {
  env->sim_clock_advance(now_ns);
}

uint64_t xb_env_host_waits(xb_env *env) {
  return xb_env_call_count(env, XS_DRIVER_FN_cuStreamSynchronize) +
         xb_env_call_count(env, XS_DRIVER_FN_cuCtxSynchronize) +
         xb_env_call_count(env, XS_DRIVER_FN_cuEventSynchronize);
}

static xseg_status stream_create(xb_env *env, unsigned flags,
                                 struct CUstream_st **out) {
  xs_vmm *v = &env->vmm;
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(v, &saved);
  if (st != XSEG_OK) return st;
  CUresult r = XS_DRV(v->drv, cuStreamCreate, out, flags);
  if (r != CUDA_SUCCESS) st = xs_driver_error(v->drv, r, "cuStreamCreate");
  xs_vmm_ctx_leave(v, saved);
  return st;
}

xseg_status xb_env_stream_create(xb_env *env, struct CUstream_st **out) {
  return stream_create(env, CU_STREAM_DEFAULT, out);
}

void xb_env_stream_destroy(xb_env *env, struct CUstream_st *s) {
  xs_vmm *v = &env->vmm;
  CUcontext saved;
  if (s == NULL || xs_vmm_ctx_enter(v, &saved) != XSEG_OK) return;
  XS_DRV(v->drv, cuStreamDestroy, s);
  xs_vmm_ctx_leave(v, saved);
}

xseg_status xb_env_stream_sync(xb_env *env, struct CUstream_st *s) {
  xs_vmm *v = &env->vmm;
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(v, &saved);
  if (st != XSEG_OK) return st;
  CUresult r = XS_DRV(v->drv, cuStreamSynchronize, s);
  if (r != CUDA_SUCCESS) st = xs_driver_error(v->drv, r, "cuStreamSynchronize");
  xs_vmm_ctx_leave(v, saved);
  return st;
}

xseg_status xb_env_streams_create(xb_env *env, const xb_trace *t,
                                  struct CUstream_st **out) {
  for (int i = 0; i < t->n_streams; i++) out[i] = NULL;
  xseg_status st = XSEG_OK;
  for (int i = 0; i < t->n_streams && st == XSEG_OK; i++)
    st = stream_create(env, CU_STREAM_NON_BLOCKING, &out[i]);
  if (st != XSEG_OK) xb_env_streams_destroy(env, t, out);
  return st;
}

void xb_env_streams_destroy(xb_env *env, const xb_trace *t,
                            struct CUstream_st **streams) {
  for (int i = 0; i < t->n_streams; i++) {
    xb_env_stream_destroy(env, streams[i]);
    streams[i] = NULL;
  }
}
