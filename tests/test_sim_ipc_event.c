/* Conformance of the emulator's interprocess events (sim/sim_ipc_event.c)
 * to cuda.h's cuIpcGetEventHandle and cuIpcOpenEventHandle: "After the
 * event has been opened in the importing process, cuEventRecord,
 * cuEventSynchronize, cuStreamWaitEvent and cuEventQuery may be used in
 * either process." Pending work is forced with a latch that holds a stream
 * back; the other process is a forked child that runs beside the test and
 * reports each step through a pipe.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sim_helpers.h"
#include "xseg_test.h"

#define IE_FLAGS (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)

/* A child that runs `role` (its roles are below) beside the test: this
 * program started again (fork + exec, XSEG_IE_CHILD names the role and its
 * pipes), so that it inherits no threads and no locks held by threads of
 * the test (an allocator's, a sanitizer's). Its pid, or -1. */
static pid_t ie_spawn(char role, int *to_child, int *from_child) {
  int up[2], down[2];
  if (pipe(up) != 0) return -1;
  if (pipe(down) != 0) return close(up[0]), close(up[1]), -1;
  char spec[64], self[4096];
  snprintf(spec, sizeof spec, "XSEG_IE_CHILD=%c,%d,%d", role, up[1], down[0]);
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  self[n > 0 ? n : 0] = '\0';
  size_t envc = 0;
  while (environ[envc] != NULL) envc++;
  char **envp = calloc(envc + 2, sizeof *envp);
  if (envp == NULL) return -1;
  memcpy(envp, environ, envc * sizeof *envp);
  envp[envc] = spec;
  char *argv[] = {self, NULL};
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    execve(self, argv, envp);
    _exit(127);
  }
  free(envp);
  close(up[1]);
  close(down[0]);
  *to_child = down[1];
  *from_child = up[0];
  return pid;
}

/* The child's exit status (or 128 + signal). */
static int ie_reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) continue;
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

static bool ie_send(int fd, const void *p, size_t n) {
  return write(fd, p, n) == (ssize_t)n;
}

static bool ie_recv(int fd, void *p, size_t n) {
  return read(fd, p, n) == (ssize_t)n;
}

/* cuda.h: the event "must have been created with the CU_EVENT_INTERPROCESS
   and CU_EVENT_DISABLE_TIMING flags set" (cuEventCreate refuses the first
   without the second); any other event gives no handle:
   CUDA_ERROR_INVALID_HANDLE, as an H200 with driver 580 answers. (A
   destroyed event is the caller's use after free: cuda.h promises
   nothing.) */
XSEG_TEST(SimIpcEvent, handle_needs_an_interprocess_event) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUevent plain, ipc;
  CUipcEventHandle h;
  XSEG_EXPECT_CU_ERR(cuEventCreate(&ipc, CU_EVENT_INTERPROCESS),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_ASSERT_CU(cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING));
  XSEG_ASSERT_CU(cuEventCreate(&ipc, IE_FLAGS));
  XSEG_EXPECT_CU_ERR(cuIpcGetEventHandle(&h, plain),
                     CUDA_ERROR_INVALID_HANDLE);
  XSEG_EXPECT_CU_ERR(cuIpcGetEventHandle(NULL, ipc), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuIpcGetEventHandle(&h, ipc));
  XSEG_EXPECT_CU(cuEventDestroy(ipc));
  XSEG_EXPECT_CU(cuEventDestroy(plain));
}

/* Bytes that are no handle are refused (CUDA_ERROR_MAP_FAILED); so is the
   handle of an event of this very process, live or destroyed, even once
   its descriptor number names another event: the driver opens only
   another process's events (CUDA_ERROR_INVALID_CONTEXT; both codes as an
   H200 with driver 580 answers). */
XSEG_TEST(SimIpcEvent, forged_or_own_handles_are_refused) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUipcEventHandle junk, own;
  memset(&junk, 0x5a, sizeof junk);
  CUevent e, again, out = NULL;
  XSEG_EXPECT_CU_ERR(cuIpcOpenEventHandle(&out, junk),
                     CUDA_ERROR_MAP_FAILED);
  XSEG_ASSERT_CU(cuEventCreate(&e, IE_FLAGS));
  XSEG_ASSERT_CU(cuIpcGetEventHandle(&own, e));
  XSEG_EXPECT_CU_ERR(cuIpcOpenEventHandle(NULL, own),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuIpcOpenEventHandle(&out, own),
                     CUDA_ERROR_INVALID_CONTEXT);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU_ERR(cuIpcOpenEventHandle(&out, own),
                     CUDA_ERROR_INVALID_CONTEXT);
  XSEG_ASSERT_CU(cuEventCreate(&again, IE_FLAGS));   /* likely the same fd */
  XSEG_EXPECT_CU_ERR(cuIpcOpenEventHandle(&out, own),
                     CUDA_ERROR_INVALID_CONTEXT);
  XSEG_EXPECT_TRUE(out == NULL);
  XSEG_EXPECT_CU(cuEventDestroy(again));
}

/* ---- across processes -------------------------------------------------- */

/* An importer's start, in a child: receives the handle the test sends,
   opens it and makes a stream of its own; exits 10-13 on a failure. */
static void ie_import(int down, CUevent *e, CUstream *s) {
  CUipcEventHandle h;
  if (!ie_recv(down, &h, sizeof h)) _exit(10);
  if (xt_context(0) == NULL) _exit(11);
  if (cuIpcOpenEventHandle(e, h) != CUDA_SUCCESS) _exit(12);
  if (cuStreamCreate(s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) _exit(13);
}

/* The importer, in a child: opens the handle the test sends, checks that
   the record is pending (query, a stream that waits on it), tells the
   test, and after the test released its stream checks that both finish.
   Then it records the event itself behind a stream of its own held by a
   latch, for the test to wait on, and releases it when told. Exits with
   the number of the step that failed. */
static void ie_importer(int up, int down) {
  CUevent e;
  CUstream s;
  char go;
  ie_import(down, &e, &s);
  if (cuEventQuery(e) != CUDA_ERROR_NOT_READY) _exit(14);
  if (cuStreamWaitEvent(s, e, 0) != CUDA_SUCCESS) _exit(15);
  if (cuStreamQuery(s) != CUDA_ERROR_NOT_READY) _exit(16);
  if (!ie_send(up, "p", 1) || !ie_recv(down, &go, 1)) _exit(17);
  if (st_stream_drain(s) != CUDA_SUCCESS) _exit(18);
  if (cuEventSynchronize(e) != CUDA_SUCCESS) _exit(19);
  xt_latch *l = xt_latch_new();
  if (xt_latch_hold(s, l) != CUDA_SUCCESS) _exit(20);
  if (cuEventRecord(e, s) != CUDA_SUCCESS) _exit(21);
  if (!ie_send(up, "r", 1) || !ie_recv(down, &go, 1)) _exit(22);
  xt_latch_open(l);
  if (cuStreamSynchronize(s) != CUDA_SUCCESS) _exit(23);
  if (!ie_send(up, "d", 1)) _exit(24);
  cuEventDestroy(e);
  cuStreamDestroy(s);
  xt_latch_free(l);
}

/* The creator and an importer in another process use one event both ways:
   each one's waits (query, synchronize, a stream's wait) see the record
   the other made, pending until it retires. */
XSEG_TEST(SimIpcEvent, records_are_seen_across_processes_both_ways) {
  XT_REQUIRE_SIM_FOR("uses the emulator in a forked child");
  CUstream held, waiter;
  CUevent e;
  XSEG_ASSERT_TRUE(st_stream_event(&held, &e, IE_FLAGS));
  XSEG_ASSERT_CU(cuStreamCreate(&waiter, CU_STREAM_NON_BLOCKING));
  CUipcEventHandle h;
  XSEG_ASSERT_CU(cuIpcGetEventHandle(&h, e));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(held, l));
  XSEG_EXPECT_CU(cuEventRecord(e, held));
  int to_child, from_child;
  pid_t pid = ie_spawn('i', &to_child, &from_child);
  XSEG_ASSERT_GT(pid, 0);
  char step = 0;
  XSEG_EXPECT_TRUE(ie_send(to_child, &h, sizeof h));
  XSEG_EXPECT_TRUE(ie_recv(from_child, &step, 1) && step == 'p');
  xt_latch_open(l);
  XSEG_EXPECT_TRUE(ie_send(to_child, "g", 1));
  XSEG_EXPECT_TRUE(ie_recv(from_child, &step, 1) && step == 'r');
  /* The child's record is the latest now: ours waits for it. */
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_CU(cuStreamWaitEvent(waiter, e, 0));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(waiter), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_TRUE(ie_send(to_child, "g", 1));
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_CU(st_stream_drain(waiter));
  XSEG_EXPECT_TRUE(ie_recv(from_child, &step, 1) && step == 'd');
  XSEG_EXPECT_EQ(ie_reap(pid), 0);
  close(to_child);
  close(from_child);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(held));
  XSEG_EXPECT_CU(cuStreamDestroy(waiter));
  xt_latch_free(l);
}

/* The creator, in a child: records behind a latch it never opens, sends
   the handle, and exits when told (its pending work dies with it). */
static void ie_dying_creator(int up, int down) {
  CUstream s;
  CUevent e;
  CUipcEventHandle h;
  char go;
  if (xt_context(0) == NULL ||
      cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      cuEventCreate(&e, IE_FLAGS) != CUDA_SUCCESS)
    _exit(10);
  xt_latch *l = xt_latch_new();
  if (xt_latch_hold(s, l) != CUDA_SUCCESS) _exit(11);
  if (cuEventRecord(e, s) != CUDA_SUCCESS) _exit(12);
  if (cuIpcGetEventHandle(&h, e) != CUDA_SUCCESS) _exit(13);
  if (!ie_send(up, &h, sizeof h) || !ie_recv(down, &go, 1)) _exit(14);
  _exit(0);
}

/* An importer, in a child: records the event behind a latch it never
   opens, says so, and exits when told. */
static void ie_dying_recorder(int up, int down) {
  CUevent e;
  CUstream s;
  char go;
  ie_import(down, &e, &s);
  xt_latch *l = xt_latch_new();
  if (xt_latch_hold(s, l) != CUDA_SUCCESS) _exit(14);
  if (cuEventRecord(e, s) != CUDA_SUCCESS) _exit(15);
  if (!ie_send(up, "r", 1) || !ie_recv(down, &go, 1)) _exit(16);
  _exit(0);
}

/* The child's entry, before main, when started as one. */
__attribute__((constructor)) static void ie_child_main(void) {
  const char *spec = getenv("XSEG_IE_CHILD");
  char role;
  int up, down;
  if (spec == NULL || sscanf(spec, "%c,%d,%d", &role, &up, &down) != 3)
    return;
  if (role == 'i') ie_importer(up, down);
  if (role == 'd') ie_dying_creator(up, down);
  if (role == 'r') ie_dying_recorder(up, down);
  _exit(0);
}

/* A stream waiting for a record of a process that exits before the record
   retires is released: the emulator does not hang an importer forever.
   The handle then names no event. */
XSEG_TEST(SimIpcEvent, wait_ends_when_the_creator_exits) {
  XT_REQUIRE_SIM_FOR("uses the emulator in a forked child");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  int to_child, from_child;
  pid_t pid = ie_spawn('d', &to_child, &from_child);
  XSEG_ASSERT_GT(pid, 0);
  CUipcEventHandle h;
  XSEG_ASSERT_TRUE(ie_recv(from_child, &h, sizeof h));
  CUevent e;
  CUstream s;
  XSEG_ASSERT_CU(cuIpcOpenEventHandle(&e, h));
  XSEG_ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  XSEG_EXPECT_CU(cuStreamWaitEvent(s, e, 0));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_TRUE(ie_send(to_child, "x", 1));
  XSEG_EXPECT_EQ(ie_reap(pid), 0);
  XSEG_EXPECT_CU(st_stream_drain(s));
  XSEG_EXPECT_CU(cuEventQuery(e));
  CUevent again = NULL;
  XSEG_EXPECT_CU_ERR(cuIpcOpenEventHandle(&again, h),
                     CUDA_ERROR_INVALID_HANDLE);
  close(to_child);
  close(from_child);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

/* The creator's waits for a record an importer made end once that
   importer has exited, reaped or not: its work went with it. */
XSEG_TEST(SimIpcEvent, wait_ends_when_the_recorder_exits) {
  XT_REQUIRE_SIM_FOR("uses the emulator in another process");
  CUstream waiter;
  CUevent e;
  XSEG_ASSERT_TRUE(st_stream_event(&waiter, &e, IE_FLAGS));
  CUipcEventHandle h;
  XSEG_ASSERT_CU(cuIpcGetEventHandle(&h, e));
  int to_child, from_child;
  pid_t pid = ie_spawn('r', &to_child, &from_child);
  XSEG_ASSERT_GT(pid, 0);
  char step = 0;
  XSEG_EXPECT_TRUE(ie_send(to_child, &h, sizeof h));
  XSEG_EXPECT_TRUE(ie_recv(from_child, &step, 1) && step == 'r');
  XSEG_EXPECT_CU_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_CU(cuStreamWaitEvent(waiter, e, 0));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(waiter), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_TRUE(ie_send(to_child, "x", 1));
  XSEG_EXPECT_CU(st_stream_drain(waiter));      /* a zombie, not reaped */
  XSEG_EXPECT_CU(cuEventSynchronize(e));
  XSEG_EXPECT_EQ(ie_reap(pid), 0);
  close(to_child);
  close(from_child);
  XSEG_EXPECT_CU(cuEventDestroy(e));
  XSEG_EXPECT_CU(cuStreamDestroy(waiter));
}
