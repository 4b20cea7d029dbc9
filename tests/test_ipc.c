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
#include "ipc_helpers.h"

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
