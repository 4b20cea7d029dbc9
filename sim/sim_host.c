/* sim_host.c: the one thread that runs host functions (cuLaunchHostFunc).
 *
 * The driver runs host functions on an internal thread, not on the stream:
 * on an H100 (driver 580) a process's host functions ran one at a time.
 * While a host function blocked on a latch no second one ran, on any stream,
 * and two latches were never seen waiting at once, so a test that held two
 * streams with latches hung. The CUDA documentation allows exactly that
 * (cudaLaunchHostFunc: "Host functions without a mandated order (such as in
 * independent streams) execute in undefined order and may be serialized")
 * and puts no bound on it: it names no context. Only one context was
 * observed, so the emulator takes the stricter reading and serializes the
 * whole process: a test that passes here never needs two host functions
 * running at once, and every driver honours that.
 *
 * A stream's worker hands its head operation over once it is a ready host
 * function (the stream's earlier work and its dependencies done) and leaves
 * the stream marked running; this thread runs the handed-over functions in
 * the order they became ready, one at a time, and retires each, which lets
 * the stream go on. Order across streams is otherwise undefined (the
 * documentation above): tests must not depend on it.
 *
 * The thread starts with the first host function submitted, so that
 * cuLaunchHostFunc reports when it cannot start, and lives as long as the
 * process; a forked child has none until its own first host function.
 */
#include "sim_stream.h"

#include <assert.h>

/* Invariant: the queue holds streams whose head is a ready host function
   being handed over (running set), each once, linked through host_next. */
static struct {
  bool started;
  struct CUstream_st *head, *tail;
} xsim_host;

static struct CUstream_st *xsim_host_pop_locked(void) {
  struct CUstream_st *s = xsim_host.head;
  xsim_host.head = s->host_next;
  if (!xsim_host.head) xsim_host.tail = NULL;
  s->host_next = NULL;
  return s;
}

static void *xsim_host_main(void *arg) {
  (void)arg;
  xsim_lock();
  for (;;) {
    while (!xsim_host.head) xsim_wait_locked();
    struct CUstream_st *s = xsim_host_pop_locked();
    const xsim_op *op = s->head;
    assert(s->running && op->work.kind == XSIM_WORK_HOST && "handed over");
    xsim_unlock();
    op->work.u.host.fn(op->work.u.host.data);
    xsim_lock();
    xsim_stream_retire_head_locked(s);
  }
  return NULL;
}

CUresult xsim_host_start_locked(void) {
  if (xsim_host.started) return CUDA_SUCCESS;
  if (xsim_thread_start_detached(xsim_host_main, NULL) != 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  xsim_host.started = true;
  return CUDA_SUCCESS;
}

void xsim_host_enqueue_locked(struct CUstream_st *s) {
  assert(xsim_host.started && "started when the function was submitted");
  assert(s->running && s->head->work.kind == XSIM_WORK_HOST && !s->host_next);
  if (xsim_host.tail) xsim_host.tail->host_next = s;
  else xsim_host.head = s;
  xsim_host.tail = s;
  xsim_broadcast_locked();
}

void xsim_host_fork_child_locked(void) {
  xsim_host.started = false;
  xsim_host.head = xsim_host.tail = NULL;
}
