/* sim_stream.c: streams, their worker threads, the legacy default stream,
 * cuLaunchHostFunc, memset / memcpy and cuCtxSynchronize.
 *
 * See sim_stream.h for the model: (stream, seq) counters, dependency lists,
 * one lock. The legacy stream follows cuda.h's stream synchronization notes
 * ("CU_STREAM_NON_BLOCKING ... should perform no implicit synchronization
 * with stream 0"): an operation on the legacy stream waits for all work
 * submitted before it to every blocking stream of its device, and an
 * operation on a blocking stream waits for all work submitted before it to
 * the legacy stream. Streams created with CU_STREAM_NON_BLOCKING do neither.
 *
 * Not emulated: CU_STREAM_PER_THREAD (the per-thread default stream) is
 * refused with CUDA_ERROR_INVALID_HANDLE; the _ptsz/_ptds entry points are
 * not exported.
 */
#include "sim_stream.h"

#include <assert.h>
#include <errno.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t xsim_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t xsim_progress = PTHREAD_COND_INITIALIZER;
static struct CUstream_st *xsim_registry;            /* non-legacy streams */
static struct CUstream_st *xsim_legacy[XSIM_MAX_DEVICES];
static uint64_t xsim_next_stream_id = 1;
/* Host functions queued on a stream and not yet handed to the host-function
   thread (see "handing host functions over"). */
static uint64_t xsim_host_queued;

/* The virtual clock (xsim.h): off, or on with a lag; `now` only grows.
   host_waits counts threads blocked in a host wait (xsim_host_wait_locked). */
static struct {
  bool on;
  uint64_t lag_ns, now_ns;
  uint64_t host_waits;
} xsim_clock;

/* Stream priorities are clamped to an H100's range, as cuda.h's
   cuStreamCreateWithPriority says out-of-range values are. */
#define XSIM_PRIORITY_LEAST 0
#define XSIM_PRIORITY_GREATEST (-5)

void xsim_lock(void) { pthread_mutex_lock(&xsim_mutex); }
void xsim_unlock(void) { pthread_mutex_unlock(&xsim_mutex); }
void xsim_wait_locked(void) { pthread_cond_wait(&xsim_progress, &xsim_mutex); }
void xsim_broadcast_locked(void) { pthread_cond_broadcast(&xsim_progress); }

/* ---- fork: a child has no worker threads --------------------------------
   The lock is held across fork so the child gets it in a consistent state;
   the child forgets its parent's legacy streams (their workers do not exist
   there) and makes new ones on first use. Streams created by the parent are
   unusable in the child, as on a real GPU. The condition variable is made
   anew: the parent's waiters (its workers) are counted in it, and a
   broadcast in the child would wait for them to wake forever. */
static void xsim_fork_prepare(void) { xsim_lock(); }
static void xsim_fork_parent(void) { xsim_unlock(); }
static void xsim_fork_child(void) {
  pthread_cond_init(&xsim_progress, NULL);
  memset(xsim_legacy, 0, sizeof xsim_legacy);
  xsim_registry = NULL;
  xsim_host_queued = 0;
  xsim_host_fork_child_locked();
  xsim_unlock();
}
static pthread_once_t xsim_fork_once = PTHREAD_ONCE_INIT;
static void xsim_fork_install(void) {
  pthread_atfork(xsim_fork_prepare, xsim_fork_parent, xsim_fork_child);
}

/* ---- references and the registry --------------------------------------- */

void xsim_stream_retain_locked(struct CUstream_st *s) {
  assert(s->refs > 0 && "retain of a freed stream");
  s->refs++;
}

void xsim_stream_release_locked(struct CUstream_st *s) {
  assert(s->refs > 0 && "stream released too often");
  if (--s->refs > 0) return;
  assert(s->head == NULL && s->completed == s->submitted && "drained");
  s->magic = 0;
  free(s);
}

static void xsim_registry_insert_locked(struct CUstream_st *s) {
  s->prev = NULL;
  s->next = xsim_registry;
  if (xsim_registry) xsim_registry->prev = s;
  xsim_registry = s;
}

static void xsim_registry_remove_locked(struct CUstream_st *s) {
  if (s->prev) s->prev->next = s->next;
  else xsim_registry = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static bool xsim_stream_is_blocking(const struct CUstream_st *s) {
  return !s->legacy && !(s->flags & CU_STREAM_NON_BLOCKING);
}

struct CUstream_st *xsim_stream_first_locked(void) { return xsim_registry; }

bool xsim_stream_blocking_capture_locked(int device, bool invalidate) {
  bool found = false;
  for (struct CUstream_st *s = xsim_registry; s; s = s->next) {
    if (s->device != device || !s->capture || !xsim_stream_is_blocking(s))
      continue;
    found = true;
    if (invalidate) xsim_capture_invalidate_locked(s);
  }
  return found;
}

/* ---- running work ------------------------------------------------------ */

static void xsim_fill(void *dst, uint32_t value, size_t count, unsigned width) {
  if (width == 1) {
    memset(dst, (int)value, count);
    return;
  }
  assert(width == 4 && "memset widths are 1 and 4");
  uint32_t *p = dst;
  for (size_t i = 0; i < count; i++) p[i] = value;
}

static void xsim_work_run(const xsim_work *w) {
  assert(w->kind != XSIM_WORK_HOST && "host functions run on their thread");
  switch (w->kind) {
  case XSIM_WORK_SET:
    xsim_fill(w->u.set.dst, w->u.set.value, w->u.set.count, w->u.set.width);
    break;
  case XSIM_WORK_COPY:
    memmove(w->u.copy.dst, w->u.copy.src, w->u.copy.bytes);
    break;
  case XSIM_WORK_WAIT_IPC:   /* the event's ipc state is fixed at creation */
    xsim_ipc_event_await(w->u.wait_ipc.event->ipc, w->u.wait_ipc.gen);
    break;
  default:
    break;   /* NOP and RECORD act when retired; waits were made deps */
  }
}

void xsim_work_retain_locked(const xsim_work *w) {
  if (w->kind == XSIM_WORK_RECORD) xsim_event_retain_locked(w->u.record.event);
  if (w->kind == XSIM_WORK_WAIT_EVENT)
    xsim_event_retain_locked(w->u.wait.event);
  if (w->kind == XSIM_WORK_WAIT_IPC)
    xsim_event_retain_locked(w->u.wait_ipc.event);
}

void xsim_work_release_locked(const xsim_work *w) {
  if (w->kind == XSIM_WORK_RECORD) xsim_event_release_locked(w->u.record.event);
  if (w->kind == XSIM_WORK_WAIT_EVENT)
    xsim_event_release_locked(w->u.wait.event);
  if (w->kind == XSIM_WORK_WAIT_IPC)
    xsim_event_release_locked(w->u.wait_ipc.event);
}

/* ---- dependency lists -------------------------------------------------- */

typedef struct xsim_deps {
  size_t n, cap;
  xsim_dep *v;
} xsim_deps;

void *xsim_array_grow(void *v, size_t *cap, size_t first, size_t elem) {
  size_t n = *cap ? 2 * *cap : first;
  void *grown = realloc(v, n * elem);
  if (grown) *cap = n;
  return grown;
}

bool xsim_dep_done_locked(const xsim_dep *d) {
  return d->stream->completed >= d->seq;
}

/* Adds (s, seq) unless it is already complete; holds a reference on s. */
static CUresult xsim_deps_push_locked(xsim_deps *d, struct CUstream_st *s,
                                    uint64_t seq) {
  if (s->completed >= seq) return CUDA_SUCCESS;
  if (d->n == d->cap) {
    xsim_dep *v = xsim_array_grow(d->v, &d->cap, 4, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    d->v = v;
  }
  xsim_stream_retain_locked(s);
  d->v[d->n++] = (xsim_dep){s, seq};
  return CUDA_SUCCESS;
}

static void xsim_deps_clear_locked(xsim_deps *d) {
  for (size_t i = 0; i < d->n; i++) xsim_stream_release_locked(d->v[i].stream);
  free(d->v);
  *d = (xsim_deps){0};
}

static bool xsim_deps_done_locked(const xsim_dep *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!xsim_dep_done_locked(&v[i])) return false;
  return true;
}

static void xsim_host_wait_locked(const xsim_dep *v, size_t n);

static void xsim_deps_wait_locked(const xsim_deps *d) {
  xsim_host_wait_locked(d->v, d->n);
}

/* Everything submitted so far to the device's streams: blocking ones only,
   or all of them (cuCtxSynchronize). */
static CUresult xsim_deps_device_locked(xsim_deps *d, int device, bool all) {
  CUresult r = CUDA_SUCCESS;
  for (struct CUstream_st *s = xsim_registry; s && !r; s = s->next)
    if (s->device == device && (all || xsim_stream_is_blocking(s)))
      r = xsim_deps_push_locked(d, s, s->submitted);
  return r;
}

/* The implicit ordering of the legacy stream (see the file comment). */
static CUresult xsim_deps_implicit_locked(xsim_deps *d, struct CUstream_st *s) {
  if (s->legacy) return xsim_deps_device_locked(d, s->device, false);
  struct CUstream_st *legacy = xsim_legacy[s->device];
  if (!xsim_stream_is_blocking(s) || !legacy) return CUDA_SUCCESS;
  return xsim_deps_push_locked(d, legacy, legacy->submitted);
}

/* All work a synchronize or query of s covers: its own, and for the legacy
   stream the prior work of the blocking streams it implicitly waits for. */
static CUresult xsim_deps_barrier_locked(xsim_deps *d, struct CUstream_st *s) {
  CUresult r = xsim_deps_push_locked(d, s, s->submitted);
  if (!r && s->legacy) r = xsim_deps_device_locked(d, s->device, false);
  return r;
}

/* ---- the worker -------------------------------------------------------- */

static void xsim_op_free_locked(xsim_op *op) {
  for (size_t i = 0; i < op->ndeps; i++)
    xsim_stream_release_locked(op->deps[i].stream);
  xsim_work_release_locked(&op->work);
  free(op->deps);
  free(op);
}

static uint64_t xsim_monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeps, without the lock, until the monotonic clock reads `until`. */
static void xsim_sleep_until_locked(uint64_t until) {
  struct timespec ts = {(time_t)(until / 1000000000ull),
                        (long)(until % 1000000000ull)};
  xsim_unlock();
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    continue;
  xsim_lock();
}

/* Whether a worker may take s's head: nobody runs it, its dependencies are
   done, and it is not left to the virtual clock. */
static bool xsim_worker_may_run_locked(const struct CUstream_st *s) {
  const xsim_op *op = s->head;
  return op && !s->running && (!op->clocked || !xsim_clock.on) &&
         xsim_deps_done_locked(op->deps, op->ndeps);
}

/* ---- handing host functions over --------------------------------------
   A host function goes to the host-function thread (sim_host.c) the moment
   it becomes ready, in the thread that makes it ready: the submission of a
   host function to an idle stream, or the retirement of the work it waited
   for. So the thread's queue is in the order the functions became ready,
   whatever the scheduling of the workers (a latch taken first is run
   first). Only a modeled lag (XSIM_GPU_LAG) leaves it to the worker, which
   hands its head over once the lag has passed. */

static bool xsim_host_ready_locked(const struct CUstream_st *s) {
  const xsim_op *op = s->head;
  return op && op->work.kind == XSIM_WORK_HOST && !s->running &&
         xsim_deps_done_locked(op->deps, op->ndeps) &&
         (op->due_wall_ns == 0 || op->due_wall_ns <= xsim_monotonic_ns());
}

/* The stream stays running until the host-function thread retires its
   head. */
static void xsim_host_hand_over_locked(struct CUstream_st *s) {
  assert(xsim_host_queued > 0 && "counted when submitted");
  xsim_host_queued--;
  s->running = true;
  xsim_host_enqueue_locked(s);
}

static void xsim_host_hand_over_ready_locked(void) {
  if (xsim_host_queued == 0) return;
  for (int d = 0; d < XSIM_MAX_DEVICES; d++)
    if (xsim_legacy[d] && xsim_host_ready_locked(xsim_legacy[d]))
      xsim_host_hand_over_locked(xsim_legacy[d]);
  for (struct CUstream_st *s = xsim_registry; s; s = s->next)
    if (xsim_host_ready_locked(s)) xsim_host_hand_over_locked(s);
}

/* The next operation for the worker to run, or NULL once s is destroyed and
   drained. The head is marked running; a modeled lag (XSIM_GPU_LAG) delays
   it; a host function is handed over instead. */
static xsim_op *xsim_worker_next_locked(struct CUstream_st *s) {
  for (;;) {
    if (xsim_worker_may_run_locked(s)) {
      if (s->head->due_wall_ns <= xsim_monotonic_ns()) {
        if (s->head->work.kind == XSIM_WORK_HOST) {
          xsim_host_hand_over_locked(s);
          continue;
        }
        s->running = true;
        return s->head;
      }
      xsim_sleep_until_locked(s->head->due_wall_ns);
      continue;
    }
    if (!s->head && s->destroyed) return NULL;
    xsim_wait_locked();
  }
}

/* Completes s's head; the caller broadcasts the progress. */
static void xsim_op_retire_locked(struct CUstream_st *s, xsim_op *op) {
  assert(s->head == op && op->seq == s->completed + 1 && "in order");
  assert(s->running && "retired by the thread that ran it");
  s->running = false;
  s->head = op->next;
  if (!s->head) s->tail = NULL;
  s->completed = op->seq;
  if (op->work.kind == XSIM_WORK_RECORD)
    xsim_event_stamp_locked(op->work.u.record.event, op->work.u.record.gen);
  xsim_op_free_locked(op);
  xsim_host_hand_over_ready_locked();
}

void xsim_stream_retire_head_locked(struct CUstream_st *s) {
  xsim_op_retire_locked(s, s->head);
  xsim_broadcast_locked();
}

static void *xsim_worker_main(void *arg) {
  struct CUstream_st *s = arg;
  xsim_lock();
  for (xsim_op *op; (op = xsim_worker_next_locked(s)) != NULL;) {
    xsim_unlock();
    xsim_work_run(&op->work);
    xsim_lock();
    xsim_stream_retire_head_locked(s);
  }
  if (!s->legacy) xsim_registry_remove_locked(s);
  xsim_stream_release_locked(s);   /* the worker's reference */
  xsim_unlock();
  return NULL;
}

/* ---- the virtual clock ------------------------------------------------- */

/* Moves (d->stream)'s forced mark up to d->seq; true if it moved. */
static bool xsim_dep_force_locked(const xsim_dep *d) {
  if (d->stream->forced >= d->seq) return false;
  d->stream->forced = d->seq;
  return true;
}

/* One step of the modeled device on s, in the calling thread: runs s's head
   when it is clocked, due (or forced) and its dependencies are done. A
   forced head still waiting on other streams forces what it waits for, so
   a host wait pulls in everything it depends on. True when something moved;
   *ran counts the operations run. */
static bool xsim_clock_step_locked(struct CUstream_st *s, uint64_t *ran) {
  xsim_op *op = s->head;
  if (!op || s->running) return false;
  bool forced = op->seq <= s->forced;
  if (!xsim_deps_done_locked(op->deps, op->ndeps)) {
    bool moved = false;
    for (size_t i = 0; forced && i < op->ndeps; i++)
      moved |= xsim_dep_force_locked(&op->deps[i]);
    return moved;
  }
  if (!op->clocked || !(forced || op->due_clock_ns <= xsim_clock.now_ns))
    return false;
  s->running = true;
  xsim_unlock();
  xsim_work_run(&op->work);
  xsim_lock();
  xsim_op_retire_locked(s, op);
  ++*ran;
  return true;
}

/* Whether a thread may be waiting on clocked work that ran: a host wait, or
   a worker whose head it may take (unclocked) or whose stream is drained
   and destroyed. Workers with clocked heads or none have nothing to do. */
static bool xsim_clock_wake_needed_locked(void) {
  if (xsim_clock.host_waits > 0) return true;
  for (int d = 0; d < XSIM_MAX_DEVICES; d++)
    if (xsim_legacy[d] && xsim_legacy[d]->head &&
        !xsim_legacy[d]->head->clocked)
      return true;
  for (struct CUstream_st *s = xsim_registry; s; s = s->next)
    if (s->head ? !s->head->clocked : s->destroyed) return true;
  return false;
}

/* Runs every clocked operation that can run now. The scan starts over after
   each step: the registry may have changed while the lock was dropped. One
   broadcast at the end wakes whoever waits on what ran (workers with work
   behind it, host waits): waking every worker at each of thousands of
   small operations would cost more than the operations. */
static uint64_t xsim_clock_run_locked(void) {
  uint64_t ran = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int d = 0; d < XSIM_MAX_DEVICES && !moved; d++)
      if (xsim_legacy[d]) moved = xsim_clock_step_locked(xsim_legacy[d], &ran);
    for (struct CUstream_st *s = xsim_registry; s && !moved; s = s->next)
      moved = xsim_clock_step_locked(s, &ran);
  }
  if (ran > 0 && xsim_clock_wake_needed_locked()) xsim_broadcast_locked();
  return ran;
}

/* A host wait for every (stream, seq) of v. Under the virtual clock the
   awaited work would otherwise never run: the device catches up with it
   (and with what it depends on) at once, and the clock does not move. */
static void xsim_host_wait_locked(const xsim_dep *v, size_t n) {
  for (size_t i = 0; xsim_clock.on && i < n; i++) xsim_dep_force_locked(&v[i]);
  while (!xsim_deps_done_locked(v, n)) {
    if (xsim_clock.on && (xsim_clock_run_locked(), xsim_deps_done_locked(v, n)))
      break;
    xsim_clock.host_waits++;
    xsim_wait_locked();
    xsim_clock.host_waits--;
  }
}

void xsim_dep_wait_locked(const xsim_dep *d) { xsim_host_wait_locked(d, 1); }

/* Hands every clocked operation still queued back to the workers. */
static void xsim_clock_release_locked(void) {
  for (int d = 0; d < XSIM_MAX_DEVICES; d++)
    for (xsim_op *op = xsim_legacy[d] ? xsim_legacy[d]->head : NULL; op;
         op = op->next)
      op->clocked = false;
  for (struct CUstream_st *s = xsim_registry; s; s = s->next)
    for (xsim_op *op = s->head; op; op = op->next) op->clocked = false;
  xsim_broadcast_locked();
}

void xsim_clock_enable(uint64_t lag_ns) {
  xsim_lock();
  xsim_clock_release_locked();
  xsim_clock.on = true;
  xsim_clock.lag_ns = lag_ns;
  xsim_clock.now_ns = 0;
  xsim_unlock();
}

/* Not xsim_clock_disable itself: an exported name called from inside could
   bind to another copy of the emulator loaded into the process. */
static void xsim_clock_off(void) {
  xsim_lock();
  xsim_clock.on = false;
  xsim_clock_release_locked();
  xsim_unlock();
}

void xsim_clock_disable(void) { xsim_clock_off(); }

uint64_t xsim_clock_advance(uint64_t now_ns) {
  xsim_lock();
  uint64_t ran = 0;
  if (xsim_clock.on) {
    if (now_ns > xsim_clock.now_ns) xsim_clock.now_ns = now_ns;
    ran = xsim_clock_run_locked();
  }
  xsim_unlock();
  return ran;
}

uint64_t xsim_clock_now(void) {
  xsim_lock();
  uint64_t now = xsim_clock.on ? xsim_clock.now_ns : 0;
  xsim_unlock();
  return now;
}

void xsim_stream_clock_reset(void) { xsim_clock_off(); }

/* A thread being started, on its creator's stack until `started` is
   posted. */
typedef struct xsim_thread_start {
  void *(*fn)(void *);
  void *arg;
  sem_t started;
} xsim_thread_start;

static void *xsim_thread_trampoline(void *p) {
  xsim_thread_start *start = p;
  void *(*fn)(void *) = start->fn;
  void *arg = start->arg;
  sem_post(&start->started);      /* the creator's: not touched after */
  return fn(arg);
}

/* Returns once the new thread is past its start-up, about to call fn. A
   thread still in its start-up (the C library's and a sanitizer's, which
   allocate) when the process forks leaves the locks it holds held in the
   child, for good: under AddressSanitizer the child's first new thread
   then waited forever on the allocator's lock
   (SimStream.forked_child_runs_streams_of_its_own, about 1 run in 50, the
   parent forking just after a cuStreamCreate). Our threads take the
   emulator's lock first, which fork holds, so a fork that follows the
   start (in this thread, or in one that waited for it) lands in none. A
   fork racing another thread's start still may, as it may land in any
   thread's allocation: GCC 12's AddressSanitizer does not hold its
   allocator across fork. */
int xsim_thread_start_detached(void *(*fn)(void *), void *arg) {
  xsim_thread_start start = {.fn = fn, .arg = arg};
  if (sem_init(&start.started, 0, 0) != 0) return errno;
  pthread_attr_t attr;
  pthread_t thread;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int err = pthread_create(&thread, &attr, xsim_thread_trampoline, &start);
  pthread_attr_destroy(&attr);
  if (err == 0)
    while (sem_wait(&start.started) != 0 && errno == EINTR) {
    }
  sem_destroy(&start.started);
  return err;
}

/* A stream with its worker running; refs: one for the worker, one for the
   creator (the legacy stream's creator is the process). */
static struct CUstream_st *xsim_stream_new(int device, unsigned flags,
                                         int priority, bool legacy) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  *s = (struct CUstream_st){.magic = XSIM_STREAM_MAGIC, .device = device,
                            .flags = flags, .priority = priority,
                            .legacy = legacy, .refs = 2};
  if (xsim_thread_start_detached(xsim_worker_main, s) != 0) {
    free(s);
    return NULL;
  }
  return s;
}

static struct CUstream_st *xsim_legacy_get_locked(int device) {
  assert(device >= 0 && device < XSIM_MAX_DEVICES);
  if (!xsim_legacy[device]) {
    pthread_once(&xsim_fork_once, xsim_fork_install);
    xsim_legacy[device] = xsim_stream_new(device, CU_STREAM_DEFAULT, 0, true);
    if (xsim_legacy[device]) xsim_legacy[device]->id = xsim_next_stream_id++;
  }
  return xsim_legacy[device];
}

/* ---- handles ----------------------------------------------------------- */

static bool xsim_stream_is_legacy_handle(CUstream h) {
  return h == NULL || h == CU_STREAM_LEGACY;
}

/* What must hold before the lock is taken: initialised, and a current
   context when the handle names the legacy stream. The device is that
   context's (or -1 for an explicit stream, which carries its own). */
static CUresult xsim_stream_prepare(CUstream h, int *device) {
  *device = -1;
  if (xsim_stream_is_legacy_handle(h)) return xsim_current_device(device);
  return xsim_require_init();
}

static CUresult xsim_stream_find_locked(CUstream h, int device,
                                      struct CUstream_st **out) {
  if (xsim_stream_is_legacy_handle(h)) {
    *out = xsim_legacy_get_locked(device);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (struct CUstream_st *s = xsim_registry; s; s = s->next)
    if (s == h && !s->destroyed) {
      *out = s;
      return CUDA_SUCCESS;
    }
  /* A real driver promises nothing for a destroyed handle (an H200 crashed
     on some): XSIM_STALE_STREAMS=abort makes the emulator as unforgiving,
     for tests that prove a caller never names one again. */
  const char *stale = getenv("XSIM_STALE_STREAMS");
  if (stale != NULL && strcmp(stale, "abort") == 0) {
    fprintf(stderr, "xsim: a call named stream %p, which is destroyed or "
            "was never created (XSIM_STALE_STREAMS=abort)\n", (void *)h);
    abort();
  }
  return CUDA_ERROR_INVALID_HANDLE;
}

CUresult xsim_stream_acquire(CUstream h, struct CUstream_st **out) {
  int device;
  CUresult r = xsim_stream_prepare(h, &device);
  if (r != CUDA_SUCCESS) return r;
  xsim_lock();
  r = xsim_stream_find_locked(h, device, out);
  if (r != CUDA_SUCCESS) xsim_unlock();
  return r;
}

/* ---- submission -------------------------------------------------------- */

static void xsim_stream_enqueue_locked(struct CUstream_st *s, xsim_op *op) {
  op->seq = ++s->submitted;
  op->clocked = xsim_clock.on && op->work.kind != XSIM_WORK_HOST;
  if (op->clocked)   /* saturating: never before a clock of UINT64_MAX */
    op->due_clock_ns = xsim_clock.lag_ns > UINT64_MAX - xsim_clock.now_ns
                           ? UINT64_MAX
                           : xsim_clock.now_ns + xsim_clock.lag_ns;
  uint64_t lag = op->clocked ? 0 : xsim_knob_gpu_lag_ns();
  if (lag > 0) op->due_wall_ns = xsim_monotonic_ns() + lag;
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  if (op->work.kind == XSIM_WORK_HOST) {
    xsim_host_queued++;
    if (xsim_host_ready_locked(s)) xsim_host_hand_over_locked(s);
  }
  if (!op->clocked) xsim_broadcast_locked();   /* no worker takes it */
}

/* Dependencies of a new operation on s: implicit, extra, and for a replayed
   external event wait the event's current record. */
static CUresult xsim_op_deps_locked(xsim_deps *d, struct CUstream_st *s,
                                  const xsim_work *w, const xsim_dep *extra) {
  CUresult r = xsim_deps_implicit_locked(d, s);
  if (!r && extra) r = xsim_deps_push_locked(d, extra->stream, extra->seq);
  if (!r && w->kind == XSIM_WORK_WAIT_EVENT && w->u.wait.event->stream)
    r = xsim_deps_push_locked(d, w->u.wait.event->stream, w->u.wait.event->seq);
  return r;
}

CUresult xsim_stream_submit_locked(struct CUstream_st *s, const xsim_work *w,
                                 const xsim_dep *extra, xsim_ticket *ticket) {
  *ticket = (xsim_ticket){.captured = s->capture != NULL};
  if (s->capture) return xsim_capture_append_locked(s, w);
  if (s->legacy && xsim_stream_blocking_capture_locked(s->device, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (w->kind == XSIM_WORK_HOST) {
    CUresult r = xsim_host_start_locked();
    if (r != CUDA_SUCCESS) return r;
  }
  xsim_op *op = calloc(1, sizeof *op);
  xsim_deps d = {0};
  CUresult r = op ? xsim_op_deps_locked(&d, s, w, extra)
                  : CUDA_ERROR_OUT_OF_MEMORY;
  if (r != CUDA_SUCCESS) {
    xsim_deps_clear_locked(&d);
    free(op);
    return r;
  }
  op->work = *w;
  if (w->kind == XSIM_WORK_WAIT_EVENT) op->work.kind = XSIM_WORK_NOP;
  xsim_work_retain_locked(&op->work);
  op->deps = d.v;
  op->ndeps = d.n;
  xsim_stream_enqueue_locked(s, op);
  ticket->seq = op->seq;
  return CUDA_SUCCESS;
}

/* Submits w to the stream named by h (an *Async call). */
static CUresult xsim_stream_submit(CUstream h, const xsim_work *w) {
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(h, &s);
  if (r != CUDA_SUCCESS) return r;
  xsim_ticket ticket;
  r = xsim_stream_submit_locked(s, w, NULL, &ticket);
  xsim_unlock();
  return r;
}

/* The synchronous forms (cuMemsetD8, cuMemcpyHtoD ...): on the legacy
   stream, returning after completion; the copies are potentially unsafe
   during capture. A memset of device memory is not: the driver runs it
   asynchronously to the host (observed on H100, driver 580, a global-mode
   capture allowed one of the calls the emulator refused; of those, only the
   memset does not wait for the device). */
static CUresult xsim_legacy_run(const xsim_work *w) {
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(NULL, &s);
  if (r != CUDA_SUCCESS) return r;
  xsim_ticket ticket = {0};
  if (w->kind != XSIM_WORK_SET) r = xsim_capture_check_unsafe_locked();
  if (r == CUDA_SUCCESS) r = xsim_stream_submit_locked(s, w, NULL, &ticket);
  if (r == CUDA_SUCCESS) {
    assert(!ticket.captured && "the legacy stream never captures");
    xsim_dep_wait_locked(&(xsim_dep){s, ticket.seq});
  }
  xsim_unlock();
  return r;
}

/* ---- streams: create, destroy, properties ------------------------------ */

static CUresult xsim_stream_create(CUstream *out, unsigned flags,
                                   int priority) {
  int device;
  CUresult r = xsim_current_device(&device);
  if (r != CUDA_SUCCESS) return r;
  if (!out || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_once(&xsim_fork_once, xsim_fork_install);
  struct CUstream_st *s = xsim_stream_new(device, flags, priority, false);
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  s->ctx = xsim_ctx_current();
  xsim_lock();
  s->id = xsim_next_stream_id++;
  xsim_registry_insert_locked(s);
  xsim_unlock();
  *out = s;
  return CUDA_SUCCESS;
}

/* cuda.h: "Valid values for Flags are CU_STREAM_DEFAULT,
   CU_STREAM_NON_BLOCKING"; CUDA_ERROR_INVALID_VALUE otherwise. */
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  XSIM_ENTER("cuStreamCreate");
  return xsim_stream_create(phStream, Flags, 0);
}

/* cuda.h: a priority outside cuCtxGetStreamPriorityRange "will
   automatically be clamped to the lowest or the highest number". */
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags,
                                    int priority) {
  XSIM_ENTER("cuStreamCreateWithPriority");
  if (priority > XSIM_PRIORITY_LEAST) priority = XSIM_PRIORITY_LEAST;
  if (priority < XSIM_PRIORITY_GREATEST) priority = XSIM_PRIORITY_GREATEST;
  return xsim_stream_create(phStream, flags, priority);
}

/* cuda.h: with work still pending the call "will return immediately and the
   resources ... will be released automatically once the device has
   completed all work". The worker drains the queue, then frees. */
static CUresult xsim_stream_destroy(CUstream hStream) {
  if (xsim_stream_is_legacy_handle(hStream)) {
    CUresult r = xsim_require_init();
    return r ? r : CUDA_ERROR_INVALID_HANDLE;
  }
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  if (s->capture) xsim_capture_abandon_locked(s);
  s->destroyed = true;
  xsim_stream_release_locked(s);   /* the creator's reference */
  xsim_broadcast_locked();
  xsim_unlock();
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
  XSIM_ENTER("cuStreamDestroy");
  return xsim_stream_destroy(hStream);
}

/* The pre-3.2 entry point, same prototype. */
#undef cuStreamDestroy
CUresult CUDAAPI cuStreamDestroy(CUstream hStream);
CUresult cuStreamDestroy(CUstream hStream) {
  XSIM_ENTER("cuStreamDestroy");
  return xsim_stream_destroy(hStream);
}

/* Reads one property of a stream under the lock. */
typedef enum { XSIM_PROP_FLAGS, XSIM_PROP_PRIORITY, XSIM_PROP_ID } xsim_prop;

static CUresult xsim_stream_property(CUstream h, xsim_prop p, uint64_t *out) {
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(h, &s);
  if (r != CUDA_SUCCESS) return r;
  if (p == XSIM_PROP_FLAGS) *out = s->flags;
  else if (p == XSIM_PROP_PRIORITY) *out = (uint64_t)(int64_t)s->priority;
  else *out = s->id;
  xsim_unlock();
  return CUDA_SUCCESS;
}

/* cuda.h: "the context that was active in the calling thread when the
   stream was created"; for "any of the special handles ... the context
   current to the calling thread", CUDA_ERROR_INVALID_CONTEXT when none. */
CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  XSIM_ENTER("cuStreamGetCtx");
  if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (xsim_stream_is_legacy_handle(hStream)) {
    int device;
    CUresult r = xsim_current_device(&device);
    if (r == CUDA_SUCCESS) *pctx = xsim_ctx_current();
    return r;
  }
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  *pctx = s->ctx;
  xsim_unlock();
  return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags) {
  XSIM_ENTER("cuStreamGetFlags");
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v;
  CUresult r = xsim_stream_property(hStream, XSIM_PROP_FLAGS, &v);
  if (r == CUDA_SUCCESS) *flags = (unsigned)v;
  return r;
}

CUresult cuStreamGetPriority(CUstream hStream, int *priority) {
  XSIM_ENTER("cuStreamGetPriority");
  if (!priority) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v;
  CUresult r = xsim_stream_property(hStream, XSIM_PROP_PRIORITY, &v);
  if (r == CUDA_SUCCESS) *priority = (int)(int64_t)v;
  return r;
}

CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId) {
  XSIM_ENTER("cuStreamGetId");
  if (!streamId) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v;
  CUresult r = xsim_stream_property(hStream, XSIM_PROP_ID, &v);
  if (r == CUDA_SUCCESS) *streamId = v;
  return r;
}

/* ---- synchronize and query --------------------------------------------- */

/* What forbids waiting on s during capture: the unsafe-call rule, waiting
   on a capturing stream (illegal in every mode: its work is not running),
   and the legacy stream while a blocking stream captures. */
static CUresult xsim_stream_check_wait_locked(struct CUstream_st *s) {
  CUresult r = xsim_capture_check_unsafe_locked();
  if (r != CUDA_SUCCESS) return r;
  if (s->capture) {
    xsim_capture_invalidate_locked(s);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (s->legacy && xsim_stream_blocking_capture_locked(s->device, true))
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  return CUDA_SUCCESS;
}

/* Waits for (wait) or polls (!wait) the work submitted to hStream before
   the call: cuStreamSynchronize and cuStreamQuery differ in nothing else. */
static CUresult xsim_stream_finish(CUstream hStream, bool wait) {
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  xsim_deps d = {0};
  r = xsim_stream_check_wait_locked(s);
  if (r == CUDA_SUCCESS) r = xsim_deps_barrier_locked(&d, s);
  if (r == CUDA_SUCCESS && wait) xsim_deps_wait_locked(&d);
  else if (r == CUDA_SUCCESS && !xsim_deps_done_locked(d.v, d.n))
    r = CUDA_ERROR_NOT_READY;
  xsim_deps_clear_locked(&d);
  xsim_unlock();
  return r;
}

/* cuda.h: "Waits until the device has completed all operations in the
   stream" (work submitted before the call). */
CUresult cuStreamSynchronize(CUstream hStream) {
  XSIM_ENTER("cuStreamSynchronize");
  return xsim_stream_finish(hStream, true);
}

/* cuda.h: "Returns CUDA_SUCCESS if all operations in the stream ... have
   completed, or CUDA_ERROR_NOT_READY if not." */
CUresult cuStreamQuery(CUstream hStream) {
  XSIM_ENTER("cuStreamQuery");
  return xsim_stream_finish(hStream, false);
}

/* Waits for every stream of a device, the legacy one and destroyed ones
   still draining included. */
static CUresult xsim_device_synchronize(int device) {
  xsim_lock();
  xsim_deps d = {0};
  CUresult r = xsim_capture_check_unsafe_locked();
  if (r == CUDA_SUCCESS) r = xsim_capture_check_device_locked(device);
  struct CUstream_st *legacy = xsim_legacy[device];
  if (r == CUDA_SUCCESS && legacy)
    r = xsim_deps_push_locked(&d, legacy, legacy->submitted);
  if (r == CUDA_SUCCESS) r = xsim_deps_device_locked(&d, device, true);
  if (r == CUDA_SUCCESS) xsim_deps_wait_locked(&d);
  xsim_deps_clear_locked(&d);
  xsim_unlock();
  return r;
}

/* cuda.h: "Blocks until the device has completed all preceding requested
   tasks" of the current context. */
CUresult cuCtxSynchronize(void) {
  XSIM_ENTER("cuCtxSynchronize");
  int device;
  CUresult r = xsim_current_device(&device);
  return r ? r : xsim_device_synchronize(device);
}

/* cuda.h (CUDA 13): "If the specified context is NULL, the API will operate
   on the current context." Streams belong to devices here, so a context is
   synchronized through its device, which sim_device.c's cuCtxGetDevice_v2
   reports (that lookup is counted as one cuCtxGetDevice call). */
CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  XSIM_ENTER("cuCtxSynchronize");
  int device;
  CUresult r;
  if (ctx == NULL) {
    r = xsim_current_device(&device);
  } else {
    CUdevice dev = 0;
    r = cuCtxGetDevice_v2(&dev, ctx);
    device = (int)dev;
  }
  return r ? r : xsim_device_synchronize(device);
}

/* ---- host functions ---------------------------------------------------- */

/* cuda.h: "The function will be called after currently enqueued work and
   will block work added after it." It runs on the process's one
   host-function thread (sim_host.c), one host function at a time. */
CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
  XSIM_ENTER("cuLaunchHostFunc");
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  xsim_work w = {.kind = XSIM_WORK_HOST, .u.host = {fn, userData}};
  return xsim_stream_submit(hStream, &w);
}

/* ---- memset ------------------------------------------------------------ */

/* cuda.h: D32 requires "The dstDevice pointer must be four byte aligned". */
static CUresult xsim_set_work(xsim_work *w, CUdeviceptr dst, uint32_t value,
                            size_t count, unsigned width) {
  if ((dst == 0 && count > 0) || dst % width != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (count > SIZE_MAX / width) return CUDA_ERROR_INVALID_VALUE;
  *w = (xsim_work){.kind = XSIM_WORK_SET,
                 .u.set = {(void *)(uintptr_t)dst, value, count, width}};
  return CUDA_SUCCESS;
}

static CUresult xsim_set_async(CUdeviceptr dst, uint32_t value, size_t count,
                             unsigned width, CUstream h) {
  xsim_work w;
  CUresult r = xsim_set_work(&w, dst, value, count, width);
  return r ? r : xsim_stream_submit(h, &w);
}

static CUresult xsim_set_sync(CUdeviceptr dst, uint32_t value, size_t count,
                            unsigned width) {
  xsim_work w;
  CUresult r = xsim_set_work(&w, dst, value, count, width);
  return r ? r : xsim_legacy_run(&w);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                         CUstream hStream) {
  XSIM_ENTER("cuMemsetD8Async");
  return xsim_set_async(dstDevice, uc, N, 1, hStream);
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                          CUstream hStream) {
  XSIM_ENTER("cuMemsetD32Async");
  return xsim_set_async(dstDevice, ui, N, 4, hStream);
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  XSIM_ENTER("cuMemsetD8");
  return xsim_set_sync(dstDevice, uc, N, 1);
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  XSIM_ENTER("cuMemsetD32");
  return xsim_set_sync(dstDevice, ui, N, 4);
}

/* ---- memcpy ------------------------------------------------------------ */

/* Device pointers are host addresses here, so every direction is one copy;
   overlapping ranges are copied as memmove does. */
static CUresult xsim_copy_work(xsim_work *w, void *dst, const void *src,
                             size_t bytes) {
  if (bytes > 0 && (!dst || !src)) return CUDA_ERROR_INVALID_VALUE;
  *w = (xsim_work){.kind = XSIM_WORK_COPY, .u.copy = {dst, src, bytes}};
  return CUDA_SUCCESS;
}

static void *xsim_dptr(CUdeviceptr p) { return (void *)(uintptr_t)p; }

static CUresult xsim_copy_async(void *dst, const void *src, size_t bytes,
                              CUstream h) {
  xsim_work w;
  CUresult r = xsim_copy_work(&w, dst, src, bytes);
  return r ? r : xsim_stream_submit(h, &w);
}

static CUresult xsim_copy_sync(void *dst, const void *src, size_t bytes) {
  xsim_work w;
  CUresult r = xsim_copy_work(&w, dst, src, bytes);
  return r ? r : xsim_legacy_run(&w);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                       CUstream hStream) {
  XSIM_ENTER("cuMemcpyAsync");
  return xsim_copy_async(xsim_dptr(dst), xsim_dptr(src), ByteCount, hStream);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                              size_t ByteCount, CUstream hStream) {
  XSIM_ENTER("cuMemcpyHtoDAsync");
  return xsim_copy_async(xsim_dptr(dstDevice), srcHost, ByteCount, hStream);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice,
                              size_t ByteCount, CUstream hStream) {
  XSIM_ENTER("cuMemcpyDtoHAsync");
  return xsim_copy_async(dstHost, xsim_dptr(srcDevice), ByteCount, hStream);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                              size_t ByteCount, CUstream hStream) {
  XSIM_ENTER("cuMemcpyDtoDAsync");
  return xsim_copy_async(xsim_dptr(dstDevice), xsim_dptr(srcDevice), ByteCount,
                       hStream);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  XSIM_ENTER("cuMemcpy");
  return xsim_copy_sync(xsim_dptr(dst), xsim_dptr(src), ByteCount);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost,
                         size_t ByteCount) {
  XSIM_ENTER("cuMemcpyHtoD");
  return xsim_copy_sync(xsim_dptr(dstDevice), srcHost, ByteCount);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice,
                         size_t ByteCount) {
  XSIM_ENTER("cuMemcpyDtoH");
  return xsim_copy_sync(dstHost, xsim_dptr(srcDevice), ByteCount);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                         size_t ByteCount) {
  XSIM_ENTER("cuMemcpyDtoD");
  return xsim_copy_sync(xsim_dptr(dstDevice), xsim_dptr(srcDevice), ByteCount);
}

/* ---- live counts ------------------------------------------------------- */

/* Streams are live from cuStreamCreate to cuStreamDestroy (a destroyed
   stream still draining is not); the legacy streams are not counted. */
void xsim_stream_live(xsim_live *out) {
  xsim_lock();
  uint64_t n = 0;
  for (struct CUstream_st *s = xsim_registry; s; s = s->next)
    n += !s->destroyed;
  out->streams = n;
  out->events = xsim_event_live_locked();
  xsim_unlock();
}
