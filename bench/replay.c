/* replay.c: a workload through a policy, measured.
 *
 * The loop does per event only what is measured or needed to measure: the
 * policy call between two clock reads, the time stored into an array sized
 * up front, and the live-byte sum. Driver counters are reset before the
 * policy is opened (its set-up is part of its cost) and read before the
 * teardown that frees the blocks still live at the end (which is not).
 * Reserved bytes come from the policy at timeline samples: each sample
 * returns the peak since the previous one, so no peak is missed between.
 *
 * Under --gpu-lag the emulator's virtual clock is moved to each event's
 * trace time before the event (untimed), and each block is touched by a
 * one-byte memset on its stream after its allocation and before its free
 * (untimed): the kernels that use it, which complete `lag` later.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "vmm/error.h"

typedef struct xb_run {
  xb_env *env;
  const xb_trace *t;
  const xb_policy *p;
  void *self;
  const xb_replay_opts *o;
  xb_result *r;
  struct CUstream_st *streams[XB_MAX_STREAMS];
  void **ptr;                       /* per slot */
  uint8_t *live;                    /* per slot: allocated (not OOM) */
  uint32_t *malloc_ns, *free_ns;
  size_t n_malloc, n_free;
  uint64_t allocated, window_allocated;
  size_t stride, max_points;
} xb_run;

bool xb_fn_is_vmm(xs_driver_fn fn) {
  switch (fn) {
    case XS_DRIVER_FN_cuMemAddressReserve: case XS_DRIVER_FN_cuMemAddressFree:
    case XS_DRIVER_FN_cuMemCreate: case XS_DRIVER_FN_cuMemRelease:
    case XS_DRIVER_FN_cuMemMap: case XS_DRIVER_FN_cuMemUnmap:
    case XS_DRIVER_FN_cuMemSetAccess:
      return true;
    default:
      return false;
  }
}

static uint32_t ns_clamp(uint64_t ns) {
  return ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
}

static void run_sample(xb_run *run, size_t event) {
  xb_usage u;
  run->p->usage(run->self, &u);
  xb_result *r = run->r;
  if (u.reserved_peak > r->peak_reserved) r->peak_reserved = u.reserved_peak;
  if (run->max_points > 0 && r->n_points < run->max_points)
    r->timeline[r->n_points++] = (xb_point){(uint32_t)event,
                                            run->window_allocated,
                                            u.reserved_peak};
  run->window_allocated = run->allocated;
}

static bool run_snapshot(xb_run *run, xb_error *err) {
  size_t size = 0;
  FILE *f = open_memstream(&run->r->snapshot, &size);
  if (f == NULL) return xb_fail(err, "out of host memory for the snapshot");
  xseg_status st = run->p->snapshot(run->self, f);
  fclose(f);
  if (st != XSEG_OK)
    return xb_fail(err, "snapshot at the peak failed: %s", xseg_last_error());
  return true;
}

static bool run_fail(xb_run *run, size_t i, xb_error *err) {
  const xb_event *e = &run->t->events[i];
  return xb_fail(err, "%s, %s mode, event %zu (%s of %llu bytes): %s",
                 run->t->name, run->p->name, i,
                 e->action == XB_EV_ALLOC ? "allocate" : "free",
                 (unsigned long long)e->size, xseg_last_error());
}

/* A kernel's use of the block: queued on its stream under lag. */
static bool run_use(xb_run *run, const xb_event *e, void *ptr) {
  if (run->o->gpu_lag_us == 0 || ptr == NULL || e->size == 0) return true;
  CUresult r = run->env->memset_async((CUdeviceptr)(uintptr_t)ptr, 0, 1,
                                      run->streams[e->stream]);
  if (r == CUDA_SUCCESS) return true;
  xs_error(XSEG_ERR_DRIVER, "cuMemsetD8Async on the block failed (%d)",
           (int)r);
  return false;
}

static bool run_alloc(xb_run *run, const xb_event *e) {
  void *ptr = NULL;
  uint64_t t0 = xb_now_ns();
  xseg_status st = run->p->malloc(run->self, e->slot, e->size,
                                  run->streams[e->stream], &ptr);
  uint64_t t1 = xb_now_ns();
  run->malloc_ns[run->n_malloc++] = ns_clamp(t1 - t0);
  if (st == XSEG_ERR_OUT_OF_MEMORY) {
    run->r->ooms++;
    return true;
  }
  if (st != XSEG_OK) return false;
  run->ptr[e->slot] = ptr;
  run->live[e->slot] = 1;
  run->allocated += xb_round_up(e->size, XB_ROUND);
  if (run->allocated > run->window_allocated)
    run->window_allocated = run->allocated;
  if (run->allocated > run->r->peak_allocated)
    run->r->peak_allocated = run->allocated;
  return run_use(run, e, ptr);
}

/* The free of a block whose allocation ran out of memory is skipped. */
static bool run_free(xb_run *run, const xb_event *e) {
  if (!run->live[e->slot]) return true;
  if (!run_use(run, e, run->ptr[e->slot])) return false;
  uint64_t t0 = xb_now_ns();
  xseg_status st = run->p->free(run->self, e->slot, run->ptr[e->slot]);
  uint64_t t1 = xb_now_ns();
  run->free_ns[run->n_free++] = ns_clamp(t1 - t0);
  if (st != XSEG_OK) return false;
  run->live[e->slot] = 0;
  run->allocated -= xb_round_up(e->size, XB_ROUND);
  return true;
}

static bool run_events(xb_run *run, xb_error *err) {
  const xb_trace *t = run->t;
  for (size_t i = 0; i < t->n_events; i++) {
    const xb_event *e = &t->events[i];
    if (run->o->gpu_lag_us > 0) xb_env_clock_advance(run->env, e->time_ns);
    bool ok = e->action == XB_EV_ALLOC ? run_alloc(run, e) : run_free(run, e);
    if (!ok) return run_fail(run, i, err);
    if (i == t->peak_event && run->o->snapshot && run->p->snapshot != NULL &&
        !run_snapshot(run, err))
      return false;
    if ((i + 1) % run->stride == 0 || i + 1 == t->n_events)
      run_sample(run, i);
  }
  return true;
}

static int ns_cmp(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

static xb_latency latency_of(uint32_t *ns, size_t n) {
  xb_latency l = {0, 0, 0};
  if (n == 0) return l;
  qsort(ns, n, sizeof *ns, ns_cmp);
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += ns[i];
  l.median = ns[n / 2];
  l.p99 = ns[n * 99 / 100 < n ? n * 99 / 100 : n - 1];
  l.mean = sum / n;
  return l;
}

/* Median over mallocs and frees together: merge the two sorted arrays up to
   the middle. */
static uint64_t merged_median(const uint32_t *a, size_t na, const uint32_t *b,
                              size_t nb) {
  size_t want = (na + nb) / 2, i = 0, j = 0;
  uint64_t v = 0;
  for (size_t k = 0; k <= want && k < na + nb; k++)
    v = (j >= nb || (i < na && a[i] <= b[j])) ? a[i++] : b[j++];
  return v;
}

static void run_finish(xb_run *run, xb_env *env) {
  xb_result *r = run->r;
  for (int f = 0; f < XS_DRIVER_FN_COUNT; f++) {
    r->calls[f] = xb_env_call_count(env, (xs_driver_fn)f);
    if (xb_fn_is_vmm((xs_driver_fn)f)) r->vmm_calls += r->calls[f];
  }
  r->host_waits = xb_env_host_waits(env);
  xb_usage u;
  run->p->usage(run->self, &u);
  r->reserved_end = u.reserved;
  r->allocated_end = run->allocated;
  r->malloc_ns = latency_of(run->malloc_ns, run->n_malloc);
  r->free_ns = latency_of(run->free_ns, run->n_free);
  r->ns_per_op =
      merged_median(run->malloc_ns, run->n_malloc, run->free_ns, run->n_free);
  r->fragmentation = r->peak_allocated
                         ? (double)r->peak_reserved / (double)r->peak_allocated
                         : 0.0;
}

/* Frees what is still live, untimed and uncounted. */
static void run_teardown(xb_run *run) {
  for (uint32_t s = 0; s < run->t->n_slots; s++)
    if (run->live[s]) run->p->free(run->self, s, run->ptr[s]);
  run->p->close(run->self);
}

static bool run_alloc_arrays(xb_run *run, xb_error *err) {
  const xb_trace *t = run->t;
  size_t slots = t->n_slots ? t->n_slots : 1;
  run->ptr = calloc(slots, sizeof *run->ptr);
  run->live = calloc(slots, 1);
  run->malloc_ns = malloc((t->n_allocs + 1) * sizeof *run->malloc_ns);
  run->free_ns = malloc((t->n_frees + 1) * sizeof *run->free_ns);
  /* At most a sample per event, however large the ask (whose bytes could
     wrap size_t: the events' array is larger than this one). */
  run->max_points = run->o->max_points;
  if (run->max_points > t->n_events && t->n_events > 0)
    run->max_points = t->n_events;
  run->stride = 1;
  if (run->max_points > 0 && t->n_events > run->max_points)
    run->stride = (t->n_events + run->max_points - 1) / run->max_points;
  if (run->max_points > 0)
    run->r->timeline = malloc(run->max_points * sizeof *run->r->timeline);
  if (run->ptr == NULL || run->live == NULL || run->malloc_ns == NULL ||
      run->free_ns == NULL || (run->max_points && run->r->timeline == NULL))
    return xb_fail(err, "out of host memory for %u slots", t->n_slots);
  return true;
}

static void run_free_arrays(xb_run *run) {
  free(run->ptr);
  free(run->live);
  free(run->malloc_ns);
  free(run->free_ns);
}

static void result_init(xb_result *r, xb_env *env, const xb_trace *t,
                        const xb_policy *p) {
  memset(r, 0, sizeof *r);
  snprintf(r->trace, sizeof r->trace, "%s", t->name);
  snprintf(r->mode, sizeof r->mode, "%s", p->name);
  snprintf(r->driver, sizeof r->driver, "%s", env->driver);
  r->events = t->n_events;
  r->allocs = t->n_allocs;
  r->frees = t->n_frees;
}

/* Under lag the clock starts before the policy opens and stops after it
   closed, once the device has run everything queued. */
static bool run_policy(xb_run *run, xb_env *env, xb_error *err) {
  uint64_t lag = run->o->gpu_lag_us;
  env->gpu_lag_us = lag;
  if (lag > UINT64_MAX / 1000)      /* its nanoseconds would wrap */
    return xb_fail(err, "--gpu-lag %llu is out of range (at most %llu us)",
                   (unsigned long long)lag,
                   (unsigned long long)(UINT64_MAX / 1000));
  if (lag > 0 && !xb_env_clock_start(env, lag * 1000))
    return xb_fail(err, "--gpu-lag %llu needs the emulator's virtual clock "
                   "(driver '%s' has no xsim_clock_enable)",
                   (unsigned long long)lag, env->driver);
  xb_env_reset_counts(env);
  xseg_status st = run->p->open(env, run->o->conf, run->t->n_slots,
                                &run->self);
  if (st != XSEG_OK) {
    if (lag > 0) xb_env_clock_stop(env);
    return xb_fail(err, "%s mode: cannot start: %s", run->p->name,
                   xseg_last_error());
  }
  uint64_t t0 = xb_now_ns();
  bool ok = run_events(run, err);
  run->r->wall_s = (double)(xb_now_ns() - t0) * 1e-9;
  if (ok) run_finish(run, env);
  /* The device finishes its work before the blocks still live go. */
  if (lag > 0) xb_env_clock_advance(env, UINT64_MAX);
  run_teardown(run);
  if (lag > 0) xb_env_clock_stop(env);
  return ok;
}

bool xb_replay(xb_env *env, const xb_trace *t, const xb_policy *p,
               const xb_replay_opts *o, xb_result *r, xb_error *err) {
  xb_run run = {.env = env, .t = t, .p = p, .o = o, .r = r};
  result_init(r, env, t, p);
  r->gpu_lag_us = o->gpu_lag_us;
  bool ok = run_alloc_arrays(&run, err);
  xseg_status st = ok ? xb_env_streams_create(env, t, run.streams) : XSEG_OK;
  if (st != XSEG_OK)
    ok = xb_fail(err, "%s: cannot create streams: %s", t->name,
                 xseg_last_error());
  else if (ok) {
    ok = run_policy(&run, env, err);
    xb_env_streams_destroy(env, t, run.streams);
  }
  run_free_arrays(&run);
  if (!ok) xb_result_release(r);
  return ok;
}

void xb_result_release(xb_result *r) {
  free(r->timeline);
  free(r->snapshot);
  r->timeline = NULL;
  r->snapshot = NULL;
  r->n_points = 0;
}
