/* sim_ipc_event.c: interprocess events (CU_EVENT_INTERPROCESS,
 * cuIpcGetEventHandle, cuIpcOpenEventHandle).
 *
 * cuda.h: an exported event "may be copied into other processes and opened
 * with cuIpcOpenEventHandle"; then "cuEventRecord, cuEventSynchronize,
 * cuStreamWaitEvent and cuEventQuery may be used in either process". So
 * the state those calls read must be visible to every process that holds
 * the event: it lives in a small memfd, mapped shared by the creator and
 * by every importer.
 *
 *     creator                                importer
 *     memfd "xsim-ipc-event" ---- /proc/<creator pid>/fd/<fd> ---> mmap
 *       recorded: generation of the latest record, and the pid of the
 *                 process that made it (one word, so both change at once)
 *       completed: a generation whose record retired while it was the
 *                  latest one
 *
 * The handle is 64 opaque bytes, as on the driver: the creator's pid, the
 * memfd's number in the creator and a random nonce the memfd also holds.
 * An importer opens the memfd through /proc (the way the kernel lets a
 * process of the same user reach another's open file), then checks the
 * nonce, so a handle whose event was destroyed and whose fd number was
 * reused names nothing. The creator must still run at the open, as a
 * real exporter must (its context holds the event).
 *
 * Waits. A process records gen = ++recorded and queues the record; when
 * the record retires, completed becomes gen unless a later record was
 * made meanwhile (then only that later one completes the event, as
 * cuEventQuery reports the latest record). A wait for the record that is
 * latest at the call (cuda.h: "the most recently captured state at the
 * time of the API call") is done once completed reaches it: at worst it
 * waits for a later record too, never for less. A stream waits through a
 * work item that polls `completed` on the stream's worker; a host wait
 * polls in the calling thread. A process that exits takes its queued work
 * with it (the driver tears its context down), so a wait also ends once
 * the process that made the awaited record has exited (or is a zombie),
 * and an importer watches the creator with a pidfd: the emulator must not
 * hang the processes that outlive another.
 */
#define _GNU_SOURCE
#include "sim_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define XSIM_IPC_EVENT_MAGIC "xsimevt"     /* 8 bytes with its NUL */

/* The shared page. Only `recorded` and `completed` change after creation. */
typedef struct xsim_ipc_event_shared {
  char magic[8];
  uint64_t nonce;
  int32_t creator_pid;
  uint32_t pad;
  _Atomic uint64_t recorded;   /* generation << XSIM_PID_BITS | recorder */
  _Atomic uint64_t completed;
} xsim_ipc_event_shared;

/* Linux pids are below PID_MAX_LIMIT (2^22). */
#define XSIM_PID_BITS 22
#define XSIM_PID_MASK ((UINT64_C(1) << XSIM_PID_BITS) - 1)

/* CUipcEventHandle's 64 bytes, as the emulator fills them. */
typedef struct xsim_ipc_event_wire {
  char magic[8];
  uint64_t nonce;
  int32_t creator_pid;
  int32_t fd;                  /* in the creator */
} xsim_ipc_event_wire;
_Static_assert(sizeof(xsim_ipc_event_wire) <= sizeof(CUipcEventHandle),
               "the handle fits CUipcEventHandle");

struct xsim_ipc_event {
  xsim_ipc_event_shared *shared;
  int fd;                      /* the memfd (creator) or the opened copy */
  int creator_pidfd;           /* importer: watches the creator; else -1 */
};

static void xsim_ipc_event_unmap(xsim_ipc_event *x) {
  if (x->shared != NULL) munmap(x->shared, sizeof *x->shared);
  if (x->fd >= 0) close(x->fd);
  if (x->creator_pidfd >= 0) close(x->creator_pidfd);
  free(x);
}

void xsim_ipc_event_free(xsim_ipc_event *x) {
  if (x != NULL) xsim_ipc_event_unmap(x);
}

static xsim_ipc_event *xsim_ipc_event_new(int fd) {
  xsim_ipc_event *x = calloc(1, sizeof *x);
  if (x == NULL) return NULL;
  x->fd = fd;
  x->creator_pidfd = -1;
  x->shared = mmap(NULL, sizeof *x->shared, PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  if (x->shared == MAP_FAILED) {
    x->shared = NULL;
    xsim_ipc_event_unmap(x);
    return NULL;
  }
  return x;
}

CUresult xsim_ipc_event_create(xsim_ipc_event **out) {
  int fd = memfd_create("xsim-ipc-event", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, sizeof(xsim_ipc_event_shared)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  xsim_ipc_event *x = xsim_ipc_event_new(fd);
  if (x == NULL) return CUDA_ERROR_OUT_OF_MEMORY;   /* fd closed with it */
  uint64_t nonce = 0;
  while (nonce == 0)
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
      nonce = (uint64_t)(uintptr_t)x ^ (uint64_t)time(NULL);
  memcpy(x->shared->magic, XSIM_IPC_EVENT_MAGIC, sizeof x->shared->magic);
  x->shared->nonce = nonce;
  x->shared->creator_pid = (int32_t)getpid();
  *out = x;
  return CUDA_SUCCESS;
}

void xsim_ipc_event_handle(const xsim_ipc_event *x, CUipcEventHandle *out) {
  xsim_ipc_event_wire w = {.nonce = x->shared->nonce,
                         .creator_pid = x->shared->creator_pid,
                         .fd = x->fd};
  memcpy(w.magic, XSIM_IPC_EVENT_MAGIC, sizeof w.magic);
  memset(out, 0, sizeof *out);
  memcpy(out->reserved, &w, sizeof w);
}

static int xsim_pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

/* True once the process behind pidfd has exited (-1: cannot tell, alive). */
static bool xsim_pidfd_exited(int pidfd) {
  if (pidfd < 0) return false;
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  return poll(&p, 1, 0) == 1;
}

/* The memfd the handle names, reopened through /proc and checked: the
   creator's pidfd is taken first and must still be running after the
   nonce matched, so it is the creator's own. */
static CUresult xsim_ipc_event_reach(const xsim_ipc_event_wire *w,
                                   xsim_ipc_event **out) {
  if (memcmp(w->magic, XSIM_IPC_EVENT_MAGIC, sizeof w->magic) != 0 ||
      w->creator_pid <= 0 || w->fd < 0)
    return CUDA_ERROR_MAP_FAILED;   /* the H200's answer to junk bytes */
  if (w->creator_pid == getpid())
    return CUDA_ERROR_INVALID_CONTEXT;   /* its own event, live or not */
  int pidfd = xsim_pidfd_open(w->creator_pid);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)w->creator_pid, w->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (size_t)st.st_size != sizeof(xsim_ipc_event_shared)) {
    if (fd >= 0) close(fd);
    if (pidfd >= 0) close(pidfd);
    return CUDA_ERROR_INVALID_HANDLE;   /* no such event (any longer) */
  }
  xsim_ipc_event *x = xsim_ipc_event_new(fd);
  if (x == NULL) {
    if (pidfd >= 0) close(pidfd);
    return CUDA_ERROR_MAP_FAILED;
  }
  x->creator_pidfd = pidfd;
  if (memcmp(x->shared->magic, XSIM_IPC_EVENT_MAGIC, 8) != 0 ||
      x->shared->nonce != w->nonce ||
      x->shared->creator_pid != w->creator_pid || xsim_pidfd_exited(pidfd)) {
    xsim_ipc_event_unmap(x);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *out = x;
  return CUDA_SUCCESS;
}

uint64_t xsim_ipc_event_next_gen(xsim_ipc_event *x) {
  uint64_t old = atomic_load(&x->shared->recorded), next;
  do next = ((old >> XSIM_PID_BITS) + 1) << XSIM_PID_BITS |
            ((uint64_t)getpid() & XSIM_PID_MASK);
  while (!atomic_compare_exchange_weak(&x->shared->recorded, &old, next));
  return next >> XSIM_PID_BITS;
}

uint64_t xsim_ipc_event_latest(const xsim_ipc_event *x) {
  return atomic_load(&x->shared->recorded) >> XSIM_PID_BITS;
}

void xsim_ipc_event_retired(xsim_ipc_event *x, uint64_t gen) {
  if (xsim_ipc_event_latest(x) != gen) return;  /* a later one */
  uint64_t done = atomic_load(&x->shared->completed);
  while (done < gen &&
         !atomic_compare_exchange_weak(&x->shared->completed, &done, gen))
    continue;
}

/* True once process pid has exited or is a zombie (from /proc). */
static bool xsim_process_gone(pid_t pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');    /* "pid (comm) S ..." */
  return p != NULL && (p[2] == 'Z' || p[2] == 'X');
}

bool xsim_ipc_event_done(const xsim_ipc_event *x, uint64_t target) {
  if (atomic_load(&x->shared->completed) >= target ||
      xsim_pidfd_exited(x->creator_pidfd))
    return true;
  uint64_t latest = atomic_load(&x->shared->recorded);
  pid_t recorder = (pid_t)(latest & XSIM_PID_MASK);
  return latest >> XSIM_PID_BITS == target && recorder != getpid() &&
         xsim_process_gone(recorder);
}

/* Polls until the record `target` completed: short sleeps first (a wait
   across processes is usually short), up to a millisecond. */
void xsim_ipc_event_await(const xsim_ipc_event *x, uint64_t target) {
  long ns = 2000;
  while (!xsim_ipc_event_done(x, target)) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
    if (ns < 1000000) ns *= 2;
  }
}

/* ---- the driver's entry points ----------------------------------------- */

/* cuda.h: the event "must have been created with the CU_EVENT_INTERPROCESS
   and CU_EVENT_DISABLE_TIMING flags set": another event, like a destroyed
   or unknown one, is CUDA_ERROR_INVALID_HANDLE (what an H200 with driver
   580 answers; cuda.h lists only the argument error). */
CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event) {
  XSIM_ENTER("cuIpcGetEventHandle");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (pHandle == NULL) return CUDA_ERROR_INVALID_VALUE;
  xsim_lock();
  if (!xsim_event_valid_locked(event)) r = CUDA_ERROR_INVALID_HANDLE;
  else if (event->ipc == NULL) r = CUDA_ERROR_INVALID_HANDLE;
  else xsim_ipc_event_handle(event->ipc, pHandle);
  xsim_unlock();
  return r;
}

/* cuda.h: "returns a CUevent that behaves like a locally created event with
   the CU_EVENT_DISABLE_TIMING flag specified. This event must be freed
   with cuEventDestroy." Needs a current context. As an H200 (driver 580)
   answers: the process that exported the event cannot open its handle
   (CUDA_ERROR_INVALID_CONTEXT, whether the event still lives or not), and
   bytes that are no handle at all are CUDA_ERROR_MAP_FAILED. A handle of
   another process that names no live event (its creator exited, or
   destroyed it) is CUDA_ERROR_INVALID_HANDLE. */
CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle) {
  XSIM_ENTER("cuIpcOpenEventHandle");
  int device;
  CUresult r = xsim_current_device(&device);
  if (r != CUDA_SUCCESS) return r;
  if (phEvent == NULL) return CUDA_ERROR_INVALID_VALUE;
  xsim_ipc_event_wire w;
  memcpy(&w, handle.reserved, sizeof w);
  xsim_ipc_event *x;
  if ((r = xsim_ipc_event_reach(&w, &x)) != CUDA_SUCCESS) return r;
  r = xsim_event_new(CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS, x,
                   phEvent);
  if (r != CUDA_SUCCESS) xsim_ipc_event_free(x);
  else (*phEvent)->device = device;
  return r;
}
