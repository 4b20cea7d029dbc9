/* Sharing blocks between processes (alloc/ipc*.c): a producer exports a
 * block, consumers in other processes open it through a Unix socket, and
 * the producer keeps the block until the last of them closes or dies.
 *
 * Other processes are this very test binary, started again with
 * fork + exec (XSEG_IPC_CHILD names its sockets): a fresh process, so the
 * child shares no emulator threads or locks with the parent, as a real
 * consumer would (and as ThreadSanitizer needs). The child is a worker
 * that obeys one-packet commands on a SOCK_SEQPACKET control socket (open
 * a received handle, check or write bytes, close, forward, export its own
 * block, quit) and answers each with an int32 status. Bytes are written
 * and read through the driver, so the tests run on a GPU too.
 */
#define _GNU_SOURCE
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
static bool ipc_fill(void *p, size_t n, unsigned tag) {
  unsigned char *b = malloc(n);
  if (b == NULL || xt_context(0) == NULL) return free(b), false;
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131 + tag);
  bool ok = cuMemcpyHtoD((CUdeviceptr)(uintptr_t)p, b, n) == CUDA_SUCCESS;
  free(b);
  return ok;
}

static bool ipc_same(const void *p, size_t n, unsigned tag) {
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
static int produce(xseg_allocator *a, int sock) {
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
static int consume(xseg_allocator *b, int sock) {
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

static xseg_allocator *ipc_create(void) {
  const char *drv = getenv("XSEG_TEST_DRIVER");
  bool sim = drv == NULL || strcmp(drv, "system") != 0;
  xseg_allocator *a = NULL;
  return xseg_create(0, sim ? "xseg_driver:sim" : "", &a) == XSEG_OK ? a
                                                                     : NULL;
}

/* One command; the status it answers. */
static int32_t ipc_worker_do(ipc_worker *g, const ipc_cmd *c) {
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
    case 'x':                                  /* export a block of its own */
      st = xseg_malloc(g->a, c->len, NULL, &g->own);
      if (st == XSEG_OK && !ipc_fill(g->own, c->len, c->tag)) return 93;
      return st != XSEG_OK ? st : (int32_t)xseg_ipc_export(g->a, g->own,
                                                           &g->out);
    default: return 92;
  }
}

static int ipc_worker_run(int ctl, int peer) {
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
static ipc_child ipc_spawn(int peer) {
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
static int32_t ipc_ask(ipc_child c, char op, uint32_t len, unsigned tag) {
  ipc_cmd cmd = {.op = op, .tag = (uint8_t)tag, .len = len};
  int32_t st = -1;
  if (send(c.ctl, &cmd, sizeof cmd, MSG_NOSIGNAL) != (ssize_t)sizeof cmd)
    return -1;
  if (recv(c.ctl, &st, sizeof st, 0) != (ssize_t)sizeof st) return -1;
  return st;
}

/* Sends h, then has the worker receive and open it. */
static int32_t ipc_give(ipc_child c, const xseg_ipc_handle *h) {
  ipc_cmd cmd = {.op = 'r'};
  int32_t st = -1;
  if (send(c.ctl, &cmd, sizeof cmd, MSG_NOSIGNAL) != (ssize_t)sizeof cmd ||
      xseg_ipc_send(c.ctl, h) != XSEG_OK ||
      recv(c.ctl, &st, sizeof st, 0) != (ssize_t)sizeof st)
    return -1;
  return st;
}

/* Asks the worker to quit and reaps it; its exit status. */
static int ipc_finish(ipc_child c) {
  ipc_cmd cmd = {.op = 'q'};
  send(c.ctl, &cmd, sizeof cmd, MSG_NOSIGNAL);
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) continue;
  close(c.ctl);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Exports p (its handle in *h, the caller's to free) and hands it to a new
   consumer, which opens it; c.pid <= 0 (the cause reported) on failure. */
static ipc_child ipc_share(xseg_allocator *a, void *p, xseg_ipc_handle **h) {
  ipc_child c = {.pid = -1};
  if (!XT_OK(xseg_ipc_export(a, p, h))) return c;
  c = ipc_spawn(-1);
  if (c.pid > 0 && !XSEG_EXPECT_EQ(ipc_give(c, *h), 0)) {
    ipc_finish(c);
    c.pid = -1;
  }
  return c;
}

static xseg_ipc_stats ipc_stats(xseg_allocator *a) {
  xseg_ipc_stats s;
  memset(&s, 0, sizeof s);
  XT_OK(xseg_ipc_get_stats(a, &s));
  return s;
}

static int ipc_open_fds(void) {
  int n = 0;
  for (int fd = 0; fd < 4096; fd++) n += fcntl(fd, F_GETFD) >= 0;
  return n;
}

/* ---- across processes ---------------------------------------------------- */

/* Bytes the producer wrote are read by the consumer, and the consumer's
   writes are read by the producer. The block spans two granules (two
   handles), so the consumer maps both at the block's offset. */
XSEG_TEST(ipc, consumer_reads_producer_bytes_and_back) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *pad = NULL, *p = NULL;
  const size_t size = 3 * MiB;
  XT_OK(xseg_malloc(a, 1 * MiB + 512, NULL, &pad));   /* p not at offset 0 */
  XT_OK(xseg_malloc(a, size, NULL, &p));
  XSEG_EXPECT_TRUE(ipc_fill(p, size, 5));
  xseg_ipc_handle *h = NULL;
  ipc_child c = ipc_share(a, p, &h);
  XSEG_ASSERT_GT(c.pid, 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'v', size, 5), 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'o', 0, 0), 0);            /* same mapping */
  XSEG_EXPECT_EQ(ipc_ask(c, 'w', size, 9), 0);
  XSEG_EXPECT_TRUE(ipc_same(p, size, 9));
  xseg_ipc_stats s = ipc_stats(a);
  XSEG_EXPECT_EQ(s.exported_blocks, 1);
  XSEG_EXPECT_EQ(s.open_by_others, 1);
  XSEG_EXPECT_EQ(ipc_ask(c, 'c', 0, 0), 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'c', 0, 0), 0);            /* opened twice */
  XSEG_EXPECT_EQ(ipc_ask(c, 'c', 0, 0), XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 0);
  XSEG_EXPECT_EQ(ipc_finish(c), 0);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);   /* nobody held it */
  XT_OK(xseg_free(a, pad));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* While a consumer holds the block, the producer's free leaves it pending:
   its bytes are not handed out again (a new block of the same size lies
   elsewhere and the consumer still reads the old bytes) until the
   consumer closes; the next malloc then frees it. */
XSEG_TEST(ipc, held_block_is_not_reused_until_the_consumer_closes) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  const size_t size = 4 * MiB;
  void *p = NULL, *q = NULL, *r = NULL;
  XT_OK(xseg_malloc(a, size, NULL, &p));
  XSEG_EXPECT_TRUE(ipc_fill(p, size, 1));
  xseg_ipc_handle *h = NULL;
  ipc_child c = ipc_share(a, p, &h);
  XSEG_ASSERT_GT(c.pid, 0);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XSEG_EXPECT_EQ(ipc_stats(a).pending_on_others, 1);
  XT_OK(xseg_check(a));
  XT_OK(xseg_malloc(a, size, NULL, &q));
  XSEG_EXPECT_TRUE((char *)q >= (char *)p + size ||
                   (char *)q + size <= (char *)p);
  XSEG_EXPECT_TRUE(ipc_fill(q, size, 2));
  XSEG_EXPECT_EQ(ipc_ask(c, 'v', size, 1), 0);         /* untouched */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XSEG_EXPECT_EQ(ipc_ask(c, 'c', 0, 0), 0);
  XT_OK(xseg_malloc(a, size, NULL, &r));               /* reaps, then fits */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);
  XSEG_EXPECT_TRUE(r == p);                            /* free again */
  XT_OK(xseg_check(a));
  XSEG_EXPECT_EQ(ipc_finish(c), 0);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, q));
  XT_OK(xseg_free(a, r));
  xseg_destroy(a);
}

/* A consumer killed by SIGKILL never closes: the producer finds it dead
   (here a zombie not yet reaped, then gone) at its next malloc and frees
   the block. */
XSEG_TEST(ipc, killed_consumer_is_reclaimed_at_the_next_malloc) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  const size_t size = 2 * MiB;
  void *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, size, NULL, &p));
  xseg_ipc_handle *h = NULL;
  ipc_child c = ipc_share(a, p, &h);
  XSEG_ASSERT_GT(c.pid, 0);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XT_OK(xseg_malloc(a, 512, NULL, &q));                /* still held */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XT_OK(xseg_free(a, q));
  XSEG_ASSERT_EQ(kill(c.pid, SIGKILL), 0);
  siginfo_t info;
  XSEG_EXPECT_EQ(waitid(P_PID, (id_t)c.pid, &info, WEXITED | WNOWAIT), 0);
  XT_OK(xseg_malloc(a, 512, NULL, &q));                /* reclaims */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  xseg_ipc_stats s = ipc_stats(a);
  XSEG_EXPECT_EQ(s.reclaimed, 1);
  XSEG_EXPECT_EQ(s.exported_blocks, 0);
  XT_OK(xseg_check(a));
  XSEG_EXPECT_EQ(ipc_finish(c), 128 + SIGKILL);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, q));
  xseg_destroy(a);
}

/* A consumer passes the handle on to a third process (over a socket of
   its own); the producer still decides the block's lifetime: it stays
   pending while either holds it. */
XSEG_TEST(ipc, reshared_block_lives_until_the_third_process_closes) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  const size_t size = 1 * MiB;
  void *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, size, NULL, &p));
  XSEG_EXPECT_TRUE(ipc_fill(p, size, 3));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  int bc[2];
  XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, bc), 0);
  ipc_child b = ipc_spawn(bc[0]), c = ipc_spawn(bc[1]);
  close(bc[0]);
  close(bc[1]);
  XSEG_ASSERT_GT(b.pid, 0);
  XSEG_ASSERT_GT(c.pid, 0);
  XSEG_EXPECT_EQ(ipc_give(b, h), 0);
  XSEG_EXPECT_EQ(ipc_ask(b, 'f', 0, 0), 0);            /* b -> c */
  ipc_cmd from_peer = {.op = 'r', .from_peer = 1};
  int32_t st = -1;
  XSEG_EXPECT_EQ(send(c.ctl, &from_peer, sizeof from_peer, 0),
                 (ssize_t)sizeof from_peer);
  XSEG_EXPECT_EQ(recv(c.ctl, &st, sizeof st, 0), (ssize_t)sizeof st);
  XSEG_EXPECT_EQ(st, 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'v', size, 3), 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'w', size, 4), 0);
  XSEG_EXPECT_TRUE(ipc_same(p, size, 4));
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(ipc_ask(b, 'c', 0, 0), 0);
  XT_OK(xseg_malloc(a, 512, NULL, &q));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);  /* c */
  XSEG_EXPECT_EQ(ipc_ask(c, 'v', size, 4), 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'c', 0, 0), 0);
  XT_OK(xseg_free(a, q));
  XT_OK(xseg_malloc(a, 512, NULL, &q));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(ipc_finish(b), 0);
  XSEG_EXPECT_EQ(ipc_finish(c), 0);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, q));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A handle whose producer has exited cannot be opened (its memory would
   still be reachable through the fds, but nobody owns it any more); the
   consumer keeps nothing. */
XSEG_TEST(ipc, handle_of_a_dead_producer_is_refused) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  ipc_child c = ipc_spawn(-1);
  XSEG_ASSERT_GT(c.pid, 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'x', 1 * MiB, 7), 0);      /* it exports */
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_recv(c.ctl, &h));
  XSEG_EXPECT_EQ(ipc_finish(c), 0);
  XSEG_ASSERT_TRUE(h != NULL);
  xsim_live before = {0}, now = {0};
  if (xt_have_sim()) xsim_get_live(&before);   /* the driver's own count */
  void *p = (void *)1;
  XSEG_EXPECT_EQ(xseg_ipc_open(a, h, &p), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "has exited") != NULL);
  XSEG_EXPECT_TRUE(p == NULL);
  if (xt_have_sim()) xsim_get_live(&now);
  XSEG_EXPECT_EQ(now.handles, before.handles);
  XSEG_EXPECT_EQ(now.reservations, before.reservations);
  XSEG_EXPECT_EQ(ipc_stats(a).opened_blocks, 0);
  xseg_ipc_handle_free(h);
  xseg_destroy(a);
}

/* ---- in one process (a second allocator is the consumer) --------------- */

/* An exported handle received back through a stream socket pair (the
   message may arrive in pieces there). */
static xseg_ipc_handle *ipc_roundtrip(const xseg_ipc_handle *h) {
  int sv[2];
  xseg_ipc_handle *got = NULL;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return NULL;
  if (XT_OK(xseg_ipc_send(sv[0], h))) XT_OK(xseg_ipc_recv(sv[1], &got));
  close(sv[0]);
  close(sv[1]);
  return got;
}

/* 2,000 opens and closes map and unmap the block's handles each time and
   leave no reservation, mapping or handle behind: the consumer's address
   space does not grow. */
XSEG_TEST(ipc, open_close_cycles_do_not_grow_address_space) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_TRUE(b != NULL);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 3 * MiB, NULL, &p));
  XSEG_EXPECT_TRUE(ipc_fill(p, 4096, 6));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  xseg_ipc_handle *got = ipc_roundtrip(h);
  XSEG_ASSERT_TRUE(got != NULL);
  xsim_live before, now;
  xsim_get_live(&before);
  uint64_t reserves = xsim_call_count("cuMemAddressReserve");
  int bad = 0;
  for (int i = 0; i < 2000 && bad == 0; i++) {
    void *q = NULL, *again = NULL;
    bad += xseg_ipc_open(b, got, &q) != XSEG_OK || !ipc_same(q, 4096, 6);
    bad += xseg_ipc_open(b, got, &again) != XSEG_OK || again != q;
    bad += xseg_ipc_close(b, q) != XSEG_OK;
    bad += xseg_ipc_close(b, again) != XSEG_OK;
    xsim_get_live(&now);
    bad += now.reservations != before.reservations ||
           now.mappings != before.mappings || now.handles != before.handles;
  }
  XSEG_EXPECT_EQ(bad, 0);
  /* One reservation per open that mapped, each exactly the handles. */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemAddressReserve") - reserves, 2000);
  xseg_ipc_stats s = ipc_stats(b);
  XSEG_EXPECT_EQ(s.opened_total, 2000);
  XSEG_EXPECT_EQ(s.opened_blocks, 0);
  xseg_ipc_handle_free(got);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* Sends raw bytes with `n_fds` copies of fd as if they were a handle. */
static bool ipc_send_raw(int sock, const void *bytes, size_t len, int fd,
                         int n_fds) {
  union { struct cmsghdr h; char buf[CMSG_SPACE(8 * sizeof(int))]; } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)bytes, len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  int fds[8];
  for (int i = 0; i < n_fds; i++) fds[i] = fd;
  if (n_fds > 0) {
    msg.msg_control = u.buf;
    msg.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n_fds * sizeof(int));
  }
  return sendmsg(sock, &msg, 0) == (ssize_t)len;
}

/* A message cut short, or one that is not a handle, is refused with its
   cause named, and every fd that came with it is closed. */
XSEG_TEST(ipc, truncated_or_forged_messages_are_refused) {
  int sv[2];
  XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  int fds_before = ipc_open_fds();
  xs_ipc_wire w;
  memset(&w, 0, sizeof w);
  memcpy(w.magic, XS_IPC_MAGIC, sizeof w.magic);
  w.version = XS_IPC_VERSION;
  w.n_handles = 1;
  w.producer_pid = getpid();
  w.block_size = 512;
  w.handle_size[0] = 2 * MiB;
  struct {
    const char *why;
    size_t len;
    int n_fds;
    void (*forge)(xs_ipc_wire *);
  } cases[] = {
      {"truncated message", 40, 2, NULL},
      {"the peer closed", 0, 0, NULL},
      {"the number of fds", sizeof w, 1, NULL},
      {"bad magic", sizeof w, 2, NULL},
      {"the block does not lie", sizeof w, 2, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    xs_ipc_wire f = w;
    if (i == 3) f.magic[0] = 'Y';
    if (i == 4) f.offset = 2 * MiB;
    int spare = memfd_create("not-a-handle", MFD_CLOEXEC);
    XSEG_ASSERT_TRUE(spare >= 0);
    XSEG_EXPECT_TRUE(ipc_send_raw(sv[0], &f, cases[i].len, spare,
                                  cases[i].n_fds));
    close(spare);
    xseg_ipc_handle *h = (xseg_ipc_handle *)1;
    XSEG_EXPECT_EQ(xseg_ipc_recv(sv[1], &h), XSEG_ERR_INVALID_ARGUMENT);
    XSEG_EXPECT_TRUE(h == NULL);
    if (!XSEG_EXPECT_TRUE(strstr(xseg_last_error(), cases[i].why) != NULL))
      fprintf(stderr, "case %zu: %s\n", i, xseg_last_error());
    XSEG_EXPECT_EQ(ipc_open_fds(), fds_before);
  }
  close(sv[0]);
  close(sv[1]);
}

/* Handles that parse but lie: an fd that is not driver memory, another
   device, a block the producer never exported or freed already, a table
   that is not the producer's. Each fails with its cause, and nothing is
   left mapped, imported, reserved or held. */
XSEG_TEST(ipc, forged_handles_fail_and_leave_nothing) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_TRUE(b != NULL);
  void *p = NULL, *p2 = NULL;
  XT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
  XT_OK(xseg_malloc(a, 512, NULL, &p2));
  xseg_ipc_handle *h = NULL, *h2 = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_export(a, p2, &h2));
  XSEG_ASSERT_TRUE(h != NULL);
  XSEG_ASSERT_GE(h->wire.n_handles, 2);
  xsim_live before = {0}, now = {0};
  if (xt_have_sim()) xsim_get_live(&before);   /* the driver's own count */
  void *q = (void *)1;

  /* The second handle's fd replaced by memory the driver never made. */
  int real = h->fd[1];
  h->fd[1] = memfd_create("not-driver-memory", MFD_CLOEXEC);
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_UNSUPPORTED);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(),
                          "cuMemImportFromShareableHandle") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  close(h->fd[1]);
  h->fd[1] = real;

  h->wire.device = 1;
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "device 1") != NULL);
  h->wire.device = 0;

  uint64_t id = h->wire.block_id;
  h->wire.block_id = id + 1;
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "no longer exported") != NULL);
  h->wire.block_id = id;

  int table = h->table_fd;
  h->table_fd = memfd_create("not-a-table", MFD_CLOEXEC);
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "reference table") != NULL);
  close(h->table_fd);
  h->table_fd = table;

  XT_OK(xseg_free(a, p2));               /* nobody held it: gone */
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h2, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "no longer exported") != NULL);

  if (xt_have_sim()) xsim_get_live(&now);
  XSEG_EXPECT_EQ(now.handles, before.handles);
  XSEG_EXPECT_EQ(now.mappings, before.mappings);
  XSEG_EXPECT_EQ(now.reservations, before.reservations);
  xseg_ipc_stats s = ipc_stats(a);
  XSEG_EXPECT_EQ(s.open_by_others, 0);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 0);

  /* The untouched handle still opens. */
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_EXPECT_EQ(xseg_ipc_close(b, (char *)q + 512), XSEG_ERR_UNKNOWN_POINTER);
  XT_OK(xseg_ipc_close(b, q));
  xseg_ipc_handle_free(h2);
  XSEG_EXPECT_EQ(xseg_ipc_export(a, p2, &h2), XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_TRUE(h2 == NULL);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* The snapshot marks exported blocks ("ipc": "exported" or
   "open_by_others") and the stats JSON carries the ipc counts. */
XSEG_TEST(ipc, snapshot_and_stats_json_show_shared_blocks) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_TRUE(b != NULL);
  void *p = NULL, *p2 = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 1 * MiB, NULL, &p));
  XT_OK(xseg_malloc(a, 1 * MiB, NULL, &p2));
  xseg_ipc_handle *h = NULL, *h2 = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_export(a, p2, &h2));
  XT_OK(xseg_ipc_open(b, h, &q));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  XT_OK(xseg_snapshot_json(a, f));
  fclose(f);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc\": \"open_by_others\"") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc\": \"exported\"") != NULL);
  free(buf);
  f = open_memstream(&buf, &len);
  XT_OK(xseg_stats_json(a, f));
  fclose(f);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc.exported_blocks\": 2,") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc.open_by_others\": 1,") != NULL);
  free(buf);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(ipc_stats(a).pending_on_others, 1);
  XT_OK(xseg_ipc_close(b, q));
  XT_OK(xseg_empty_cache(a));                          /* completes it */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 1);
  xseg_ipc_handle_free(h);
  xseg_ipc_handle_free(h2);
  XT_OK(xseg_free(a, p2));
  XT_OK(xseg_check(a));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* A block both recorded on another stream and held by another process
   waits for both: once the holder closes, it still waits for the held
   stream's work queued before the free. */
XSEG_TEST(ipc, held_block_with_recorded_stream_waits_for_both) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  CUstream s1 = NULL;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  xt_latch *held = xt_latch_new();
  const size_t size = 64 * 1024;
  void *p = NULL, *q = NULL, *r = NULL;
  XT_OK(xseg_malloc(a, size, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_ASSERT_CU(xt_latch_hold(s1, held));
  XT_OK(xseg_record_stream(a, p, s1));
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XT_OK(xseg_check(a));
  XT_OK(xseg_ipc_close(b, q));
  XT_OK(xseg_malloc(a, size, NULL, &r));       /* holder gone, s1 not done */
  XSEG_EXPECT_TRUE(r != p);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);
  XT_OK(xseg_check(a));
  XT_OK(xseg_free(a, r));
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XT_OK(xseg_malloc(a, size, NULL, &r));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_TRUE(r == p);
  XT_OK(xseg_free(a, r));
  XT_OK(xseg_check(a));
  xseg_ipc_handle_free(h);
  xseg_destroy(b);
  xseg_destroy(a);
  xt_latch_free(held);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* A driver that cannot create fd-exportable handles
   (CUDA_ERROR_NOT_SUPPORTED) gets plain ones: allocation goes on, and an
   export then fails saying why. */
XSEG_TEST(ipc, driver_without_fd_export_still_allocates) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  xsim_fail_call("cuMemCreate", 1, CUDA_ERROR_NOT_SUPPORTED);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 1 * MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XSEG_EXPECT_EQ(xseg_ipc_export(a, p, &h), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "refused exportable") != NULL);
  XSEG_EXPECT_TRUE(h == NULL);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);   /* nothing kept */
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* Classic segments (one handle per segment) share the same way. */
XSEG_TEST(ipc, classic_segments_are_shared_too) {
  xseg_allocator *a = at_create("expandable_segments:False");
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  void *pad = NULL, *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 3 * MiB, NULL, &pad));
  XT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
  XSEG_EXPECT_TRUE(ipc_fill(p, 5 * MiB, 8));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  xseg_ipc_handle *got = ipc_roundtrip(h);
  XSEG_ASSERT_TRUE(got != NULL);
  XT_OK(xseg_ipc_open(b, got, &q));
  XSEG_EXPECT_TRUE(ipc_same(q, 5 * MiB, 8));
  XT_OK(xseg_ipc_close(b, q));
  xseg_ipc_handle_free(got);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_free(a, pad));
  XT_OK(xseg_check(a));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* README's example as written: produce() here, consume() in another
   process, over a stream socket; afterwards the block is free. */
XSEG_TEST(ipc, readme_example) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  int sv[2];
  XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ipc_child c = ipc_spawn(sv[1]);
  close(sv[1]);
  XSEG_ASSERT_GT(c.pid, 0);
  ipc_cmd use = {.op = 'u'};
  XSEG_EXPECT_EQ(send(c.ctl, &use, sizeof use, 0), (ssize_t)sizeof use);
  XSEG_EXPECT_EQ(produce(a, sv[0]), 0);
  int32_t st = -1;
  XSEG_EXPECT_EQ(recv(c.ctl, &st, sizeof st, 0), (ssize_t)sizeof st);
  XSEG_EXPECT_EQ(st, 0);                       /* consume() returned 0 */
  XSEG_EXPECT_EQ(ipc_finish(c), 0);
  close(sv[0]);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 512, NULL, &p));        /* completes the hold */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_total, 1);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A consumer destroyed with blocks still open lets go of them (its
   mappings unmapped, its holds released): the producer's free is then
   immediate. */
XSEG_TEST(ipc, consumer_destroy_releases_what_it_holds) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  void *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 2 * MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 1);
  xseg_destroy(b);                        /* reports the open block */
  XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 0);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}
