/* ipc_helpers.h: what the IPC tests share (test_ipc.c, test_ipc_local.c):
 * byte patterns written and read through the driver, README's example,
 * and the child worker, a fresh process of the same test binary that obeys
 * commands on a control socket, with the parent's side of it. The worker
 * starts from a constructor when XSEG_IPC_CHILD is set (test_ipc.c's
 * comment says why a fresh process).
 */
#ifndef XSEG_TESTS_IPC_HELPERS_H
#define XSEG_TESTS_IPC_HELPERS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/ipc.h"
#include "alloc_helpers.h"

#define XT_OK(call) XSEG_EXPECT_OK(call)

/* ---- byte patterns ----------------------------------------------------- */

/* Written and read through the driver, as device memory must be on a GPU,
   with device 0's context made current in the calling thread. False when
   a driver call (or the host buffer) failed, or a byte differs. */
static inline bool ipc_fill(void *p, size_t n, unsigned tag) {
  unsigned char *b = malloc(n);
  if (b == NULL || xt_context(0) == NULL) return free(b), false;
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131 + tag);
  bool ok = cuMemcpyHtoD((CUdeviceptr)(uintptr_t)p, b, n) == CUDA_SUCCESS;
  free(b);
  return ok;
}

static inline bool ipc_same(const void *p, size_t n, unsigned tag) {
  unsigned char *b = malloc(n);
  bool ok = b != NULL && xt_context(0) != NULL &&
            cuMemcpyDtoH(b, (CUdeviceptr)(uintptr_t)p, n) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < n; i++)
    ok = b[i] == (unsigned char)(i * 131 + tag);
  free(b);
  return ok;
}

/* ---- README's example, verbatim ---------------------------------------- */

/* Producer: shares a block with whoever is at the other end of `sock`
   and frees it once the consumer has it open: the block then stays
   pending until the consumer closes it (or dies). */
static inline int produce(xseg_allocator *a, int sock) {
  void *p = NULL;
  xseg_ipc_handle *h = NULL;
  char opened;
  if (xseg_malloc(a, 4 << 20, NULL, &p) != XSEG_OK) return -1;
  xseg_status st = xseg_ipc_export(a, p, &h);
  if (st == XSEG_OK) st = xseg_ipc_send(sock, h);
  xseg_ipc_handle_free(h);        /* closes our fds; the block stays live */
  bool held = st == XSEG_OK && read(sock, &opened, 1) == 1;
  xseg_free(a, p);
  return held ? 0 : -1;
}

/* Consumer (another process, its own allocator on the same device). */
static inline int consume(xseg_allocator *b, int sock) {
  xseg_ipc_handle *h = NULL;
  void *q = NULL;
  xseg_status st = xseg_ipc_recv(sock, &h);
  if (st == XSEG_OK) st = xseg_ipc_open(b, h, &q);  /* p's bytes, mapped */
  if (write(sock, "o", 1) != 1) st = XSEG_ERR_INVALID_ARGUMENT;
  /* ... kernels on q ... */
  if (q != NULL && xseg_ipc_close(b, q) != XSEG_OK) st = XSEG_ERR_DRIVER;
  xseg_ipc_handle_free(h);
  return st == XSEG_OK ? 0 : -1;
}

/* ---- the child worker ------------------------------------------------- */

typedef struct ipc_cmd {
  char op;                 /* see ipc_worker_do */
  uint8_t tag;
  uint8_t from_peer;       /* 'r': receive on the peer socket */
  uint8_t pad;
  uint32_t len;
} ipc_cmd;

typedef struct ipc_worker {
  xseg_allocator *a;
  int ctl, peer;
  xseg_ipc_handle *h;      /* the handle received last */
  void *ptr;               /* the block it opened */
  void *own;               /* a block it exported itself */
  xseg_ipc_handle *out;    /* its handle, sent after the answer */
} ipc_worker;

static inline xseg_allocator *ipc_create(void) {
  char conf[64];
  xseg_allocator *a = NULL;
  return xseg_create(0, at_conf(NULL, conf, sizeof conf), &a) == XSEG_OK
             ? a
             : NULL;
}

/* One command; the status it answers. */
static inline int32_t ipc_worker_do(ipc_worker *g, const ipc_cmd *c) {
  void *again = NULL;
  int32_t st = 0;
  switch (c->op) {
    case 'r':                                  /* receive and open */
      xseg_ipc_handle_free(g->h);
      g->h = NULL;
      st = xseg_ipc_recv(c->from_peer ? g->peer : g->ctl, &g->h);
      return st != XSEG_OK ? st : (int32_t)xseg_ipc_open(g->a, g->h, &g->ptr);
    case 'o':                                  /* open again: same pointer */
      st = xseg_ipc_open(g->a, g->h, &again);
      return st != XSEG_OK ? st : again == g->ptr ? 0 : 90;
    case 'v': return ipc_same(g->ptr, c->len, c->tag) ? 0 : 91;
    case 'w': return ipc_fill(g->ptr, c->len, c->tag) ? 0 : 93;
    case 'c': return xseg_ipc_close(g->a, g->ptr);
    case 'f': return xseg_ipc_send(g->peer, g->h);
    case 'u': return consume(g->a, g->peer);   /* README's consumer */
    case 'l':                          /* open and close until killed */
      st = 0;
      if (send(g->ctl, &st, sizeof st, MSG_NOSIGNAL) != (ssize_t)sizeof st)
        return 94;
      for (;;) {
        if (xseg_ipc_open(g->a, g->h, &again) != XSEG_OK) return 95;
        if (xseg_ipc_close(g->a, again) != XSEG_OK) return 96;
      }
    case 'x':                                  /* export a block of its own */
      st = xseg_malloc(g->a, c->len, NULL, &g->own);
      if (st == XSEG_OK && !ipc_fill(g->own, c->len, c->tag)) return 93;
      return st != XSEG_OK ? st : (int32_t)xseg_ipc_export(g->a, g->own,
                                                           &g->out);
    default: return 92;
  }
}

static inline int ipc_worker_run(int ctl, int peer) {
  ipc_worker g = {.a = ipc_create(), .ctl = ctl, .peer = peer};
  if (g.a == NULL) return 3;
  ipc_cmd c;
  while (recv(ctl, &c, sizeof c, 0) == (ssize_t)sizeof c && c.op != 'q') {
    int32_t st = ipc_worker_do(&g, &c);
    if (send(ctl, &st, sizeof st, MSG_NOSIGNAL) != (ssize_t)sizeof st) break;
    if (g.out != NULL && xseg_ipc_send(ctl, g.out) != XSEG_OK) break;
    xseg_ipc_handle_free(g.out);
    g.out = NULL;
  }
  xseg_ipc_handle_free(g.out);
  xseg_ipc_handle_free(g.h);
  if (g.own != NULL) xseg_free(g.a, g.own);
  xseg_destroy(g.a);       /* closes what is still open */
  return 0;
}

/* The child's entry: before main, when started as a worker. */
__attribute__((constructor)) static void ipc_worker_main(void) {
  const char *spec = getenv("XSEG_IPC_CHILD");
  int ctl, peer;
  if (spec == NULL || sscanf(spec, "%d,%d", &ctl, &peer) != 2) return;
  exit(ipc_worker_run(ctl, peer));
}

/* ---- the parent's side of a worker ------------------------------------- */

typedef struct ipc_child {
  pid_t pid;
  int ctl;                 /* parent's end of the control socket */
} ipc_child;

/* Starts a worker; `peer` (or -1) is a socket it inherits as its peer. */
static inline ipc_child ipc_spawn(int peer) {
  ipc_child c = {-1, -1};
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return c;
  /* Everything exec needs is built before fork: the child only calls
     async-signal-safe functions until it is a new program. */
  int child_ctl = fcntl(sv[1], F_DUPFD, 100);   /* without CLOEXEC */
  char spec[64], self[4096];
  snprintf(spec, sizeof spec, "XSEG_IPC_CHILD=%d,%d", child_ctl, peer);
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  self[n > 0 ? n : 0] = '\0';
  size_t envc = 0;
  while (environ[envc] != NULL) envc++;
  char **envp = calloc(envc + 2, sizeof *envp);
  memcpy(envp, environ, envc * sizeof *envp);
  envp[envc] = spec;
  char *argv[] = {self, NULL};
  fflush(NULL);
  c.pid = fork();
  if (c.pid == 0) {
    execve(self, argv, envp);
    _exit(127);
  }
  free(envp);
  close(child_ctl);
  close(sv[1]);
  c.ctl = sv[0];
  return c;
}

/* Sends a command and returns the worker's status (-1: no answer). */
static inline int32_t ipc_ask(ipc_child c, char op, uint32_t len,
                              unsigned tag) {
  ipc_cmd cmd = {.op = op, .tag = (uint8_t)tag, .len = len};
  int32_t st = -1;
  if (send(c.ctl, &cmd, sizeof cmd, MSG_NOSIGNAL) != (ssize_t)sizeof cmd)
    return -1;
  if (recv(c.ctl, &st, sizeof st, 0) != (ssize_t)sizeof st) return -1;
  return st;
}

/* Sends h, then has the worker receive and open it. */
static inline int32_t ipc_give(ipc_child c, const xseg_ipc_handle *h) {
  ipc_cmd cmd = {.op = 'r'};
  int32_t st = -1;
  if (send(c.ctl, &cmd, sizeof cmd, MSG_NOSIGNAL) != (ssize_t)sizeof cmd ||
      xseg_ipc_send(c.ctl, h) != XSEG_OK ||
      recv(c.ctl, &st, sizeof st, 0) != (ssize_t)sizeof st)
    return -1;
  return st;
}

/* Asks the worker to quit and reaps it; its exit status. */
static inline int ipc_finish(ipc_child c) {
  ipc_cmd cmd = {.op = 'q'};
  send(c.ctl, &cmd, sizeof cmd, MSG_NOSIGNAL);
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) continue;
  close(c.ctl);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Exports p (its handle in *h, the caller's to free) and hands it to a new
   consumer, which opens it; c.pid <= 0 (the cause reported) on failure. */
static inline ipc_child ipc_share(xseg_allocator *a, void *p,
                                  xseg_ipc_handle **h) {
  ipc_child c = {.pid = -1};
  if (!XT_OK(xseg_ipc_export(a, p, h))) return c;
  c = ipc_spawn(-1);
  if (c.pid > 0 && !XSEG_EXPECT_EQ(ipc_give(c, *h), 0)) {
    ipc_finish(c);
    c.pid = -1;
  }
  return c;
}

static inline xseg_ipc_stats ipc_stats(xseg_allocator *a) {
  xseg_ipc_stats s;
  memset(&s, 0, sizeof s);
  XT_OK(xseg_ipc_get_stats(a, &s));
  return s;
}

static inline int ipc_open_fds(void) {
  int n = 0;
  for (int fd = 0; fd < 4096; fd++) n += fcntl(fd, F_GETFD) >= 0;
  return n;
}

/* An exported handle received back through a stream socket pair (the
   message may arrive in pieces there). */
static inline xseg_ipc_handle *ipc_roundtrip(const xseg_ipc_handle *h) {
  int sv[2];
  xseg_ipc_handle *got = NULL;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return NULL;
  if (XT_OK(xseg_ipc_send(sv[0], h))) XT_OK(xseg_ipc_recv(sv[1], &got));
  close(sv[0]);
  close(sv[1]);
  return got;
}

#endif /* XSEG_TESTS_IPC_HELPERS_H */
