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

/* ---- several allocators in one producer process -------------------------- */

/* Two allocators of one process both export (their block ids are equal:
   each table counts from the same start), and a third allocator in a
   fourth role, after the first was destroyed and a new one made. A
   consumer opening each gets each block's own bytes, and its hold is
   registered in the exporting allocator's table: that producer's free
   leaves the block pending. */
XSEG_TEST(ipc, blocks_of_two_allocators_of_one_process_are_told_apart) {
  xseg_allocator *a1 = at_create(NULL), *a2 = at_create(NULL);
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a1 != NULL && a2 != NULL && b != NULL);
  const size_t size = 1 * MiB;
  void *p1 = NULL, *p2 = NULL, *p3 = NULL, *q1 = NULL, *q2 = NULL, *q3 = NULL;
  XT_OK(xseg_malloc(a1, size, NULL, &p1));
  XT_OK(xseg_malloc(a2, size, NULL, &p2));
  XSEG_EXPECT_TRUE(ipc_fill(p1, size, 1));
  XSEG_EXPECT_TRUE(ipc_fill(p2, size, 2));
  xseg_ipc_handle *h1 = NULL, *h2 = NULL, *h3 = NULL;
  XT_OK(xseg_ipc_export(a1, p1, &h1));
  XT_OK(xseg_ipc_export(a2, p2, &h2));
  XT_OK(xseg_ipc_open(b, h1, &q1));
  XT_OK(xseg_ipc_open(b, h2, &q2));
  XSEG_EXPECT_TRUE(q2 != q1);
  XSEG_EXPECT_TRUE(ipc_same(q1, size, 1));
  XSEG_EXPECT_TRUE(ipc_same(q2, size, 2));
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 2);
  XSEG_EXPECT_EQ(ipc_stats(a1).open_by_others, 1);
  XSEG_EXPECT_EQ(ipc_stats(a2).open_by_others, 1);
  /* a2's free must wait for the consumer: its hold is in a2's table. */
  XT_OK(xseg_free(a2, p2));
  XSEG_EXPECT_EQ(at_stats(a2).pending_free_bytes, (int64_t)size);
  void *again = NULL;
  XT_OK(xseg_malloc(a2, size, NULL, &again));
  XSEG_EXPECT_TRUE(again != p2);                 /* not reused under b */
  XSEG_EXPECT_TRUE(ipc_same(q2, size, 2));
  XT_OK(xseg_free(a2, again));
  /* A new allocator after a1 is gone numbers its blocks from the start
     again: still another table. */
  XT_OK(xseg_ipc_close(b, q1));
  XT_OK(xseg_free(a1, p1));
  xseg_destroy(a1);
  xseg_allocator *a3 = at_create(NULL);
  XSEG_ASSERT_TRUE(a3 != NULL);
  XT_OK(xseg_malloc(a3, size, NULL, &p3));
  XSEG_EXPECT_TRUE(ipc_fill(p3, size, 3));
  XT_OK(xseg_ipc_export(a3, p3, &h3));
  XSEG_EXPECT_EQ(h3->wire.block_id, h1->wire.block_id);
  XT_OK(xseg_ipc_open(b, h3, &q3));
  XSEG_EXPECT_TRUE(q3 != q2);
  XSEG_EXPECT_TRUE(ipc_same(q3, size, 3));
  XSEG_EXPECT_EQ(ipc_stats(a3).open_by_others, 1);
  /* A handle whose table fd is another allocator's is refused. */
  int table = h3->table_fd;
  h3->table_fd = h2->table_fd;
  void *q = (void *)1;
  XSEG_EXPECT_EQ(xseg_ipc_close(b, q3), XSEG_OK);
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h3, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another allocator") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  h3->table_fd = table;
  XT_OK(xseg_ipc_close(b, q2));
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 0);
  XT_OK(xseg_empty_cache(a2));                     /* completes p2 */
  XSEG_EXPECT_EQ(at_stats(a2).pending_free_bytes, 0);
  XT_OK(xseg_free(a3, p3));
  XSEG_EXPECT_EQ(at_stats(a3).pending_free_bytes, 0);
  XT_OK(xseg_check(a2));
  XT_OK(xseg_check(a3));
  xseg_ipc_handle_free(h1);
  xseg_ipc_handle_free(h2);
  xseg_ipc_handle_free(h3);
  xseg_destroy(b);
  xseg_destroy(a3);
  xseg_destroy(a2);
}

/* ---- consumers killed inside xseg_ipc_open ------------------------------- */

/* A producer a with an exported block p (handle h), a consumer b, and
   a's table mapped here to look at its holder slots. */
typedef struct ipc_slots {
  xseg_allocator *a, *b;
  void *p;
  xseg_ipc_handle *h;
  xs_ipc_table *t;
} ipc_slots;

static bool ipc_slots_setup(ipc_slots *f) {
  f->a = at_create(NULL);
  f->b = at_create(NULL);
  if (f->a == NULL || f->b == NULL) return false;
  if (!XT_OK(xseg_malloc(f->a, 1 * MiB, NULL, &f->p)) ||
      !XT_OK(xseg_ipc_export(f->a, f->p, &f->h)))
    return false;
  return XT_OK(xs_ipc_table_map(f->h->table_fd, &f->h->wire, &f->t,
                                 NULL));
}

/* Frees p (unless the test did), checks a, and destroys both. */
static void ipc_slots_teardown(ipc_slots *f) {
  xs_ipc_table_unmap(f->t);
  xseg_ipc_handle_free(f->h);
  if (f->p != NULL) XT_OK(xseg_free(f->a, f->p));
  XSEG_EXPECT_EQ(at_stats(f->a).pending_free_bytes, 0);
  XT_OK(xseg_check(f->a));
  xseg_destroy(f->b);
  xseg_destroy(f->a);
}

/* Holder slots in use (not FREE) in t. */
static size_t ipc_slots_in_use(xs_ipc_table *t) {
  size_t n = 0, used = atomic_load(&t->holders_used);
  for (size_t i = 0; i < used && i < XS_IPC_HOLDERS; i++)
    n += atomic_load(&t->holders[i].word) != XS_IPC_HOLDER_FREE;
  return n;
}

/* Consumers that open and close one block in a loop are SIGKILLed at
   random moments, some of them between claiming a holder slot and
   publishing it (about one kill in three lands there), others while they
   hold it. Once the producer has reaped (the block freed, another
   consumer holding it), the one live holder's slot is the only one in
   use: no claim of a dead consumer is left behind. */
XSEG_TEST(ipc, slots_of_consumers_killed_inside_open_are_reclaimed) {
  ipc_slots f = {0};
  XSEG_ASSERT_TRUE(ipc_slots_setup(&f));
  void *q = NULL;
  uint64_t rng = 0x5eed;
  enum { KILLS = 40 };
  for (int k = 0; k < KILLS; k++) {
    ipc_child c = ipc_spawn(-1);
    XSEG_ASSERT_GT(c.pid, 0);
    XSEG_ASSERT_EQ(ipc_give(c, f.h), 0);
    XSEG_ASSERT_EQ(ipc_ask(c, 'c', 0, 0), 0);
    XSEG_ASSERT_EQ(ipc_ask(c, 'l', 0, 0), 0);    /* looping now */
    usleep((useconds_t)(at_rand(&rng) % 3000));
    kill(c.pid, SIGKILL);
    XSEG_EXPECT_EQ(ipc_finish(c), 128 + SIGKILL);
  }
  XT_OK(xseg_ipc_open(f.b, f.h, &q));
  XT_OK(xseg_free(f.a, f.p));                       /* b holds it */
  f.p = NULL;
  XT_OK(xseg_empty_cache(f.a));                     /* reaps the dead */
  XSEG_EXPECT_EQ(ipc_slots_in_use(f.t), 1);
  XT_OK(xseg_ipc_close(f.b, q));
  XT_OK(xseg_empty_cache(f.a));
  XSEG_EXPECT_EQ(ipc_slots_in_use(f.t), 0);
  ipc_slots_teardown(&f);
}

/* Deterministically: every slot of a table claimed by a consumer that
   died before publishing any (its pid and start time in the claim). The
   table is not full for the next consumer: it takes a dead claimant's
   slot. */
XSEG_TEST(ipc, a_table_full_of_dead_claims_still_opens) {
  ipc_slots f = {0};
  XSEG_ASSERT_TRUE(ipc_slots_setup(&f));
  void *q = NULL;
  int fds[2];
  XSEG_ASSERT_EQ(pipe(fds), 0);
  pid_t dead = fork();
  if (dead == 0) {                   /* tells its start time, then dies */
    uint64_t start = xs_ipc_self_start();
    _exit(write(fds[1], &start, sizeof start) == (ssize_t)sizeof start ? 0
                                                                       : 1);
  }
  XSEG_ASSERT_GT(dead, 0);
  uint64_t start = 0;
  XSEG_EXPECT_EQ(read(fds[0], &start, sizeof start), (ssize_t)sizeof start);
  int status = 0;
  XSEG_EXPECT_EQ(waitpid(dead, &status, 0), dead);
  close(fds[0]);
  close(fds[1]);
  uint64_t claim =
      xs_ipc_holder_word(XS_IPC_HOLDER_CLAIMING, dead, start);
  for (size_t i = 0; i < XS_IPC_HOLDERS; i++)
    atomic_store(&f.t->holders[i].word, claim);
  atomic_store(&f.t->holders_used, XS_IPC_HOLDERS);
  XT_OK(xseg_ipc_open(f.b, f.h, &q));
  XSEG_EXPECT_TRUE(q != NULL);
  XSEG_EXPECT_EQ(ipc_stats(f.a).open_by_others, 1);
  /* A live claimant's slot is not taken: this process's own claims. */
  uint64_t mine = xs_ipc_holder_word(XS_IPC_HOLDER_CLAIMING,
                                     xs_ipc_self_pid(), xs_ipc_self_start());
  XT_OK(xseg_ipc_close(f.b, q));
  for (size_t i = 0; i < XS_IPC_HOLDERS; i++)
    atomic_store(&f.t->holders[i].word, mine);
  q = (void *)1;
  XSEG_EXPECT_EQ(xseg_ipc_open(f.b, f.h, &q), XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "is full") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  for (size_t i = 0; i < XS_IPC_HOLDERS; i++)
    atomic_store(&f.t->holders[i].word, XS_IPC_HOLDER_FREE);
  ipc_slots_teardown(&f);
}

/* A producer in another PID namespace: its pid means nothing here, so
   the open is refused, saying so (not that the producer exited). */
XSEG_TEST(ipc, producer_in_another_pid_namespace_is_refused_naming_it) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  void *p = NULL, *q = (void *)1;
  XT_OK(xseg_malloc(a, 4096, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XSEG_EXPECT_EQ(h->wire.pid_ns, xs_ipc_self_pid_ns());
  h->wire.pid_ns ^= 0x10000;              /* as another namespace's */
  h->wire.producer_pid = 1;               /* its init, say */
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_UNSUPPORTED);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another PID namespace") !=
                   NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "has exited") == NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 0);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* One message carries at most XS_IPC_MAX_HANDLES fds: a block made of one
   more physical handle than that (one handle per granule) is refused,
   saying why, and nothing is exported; a block of exactly that many
   exports. */
XSEG_TEST(ipc, a_block_of_too_many_handles_is_refused_naming_the_limit) {
  xseg_allocator *a = at_create("xseg_handle_policy:granule");
  XSEG_ASSERT_TRUE(a != NULL);
  void *big = NULL, *fits = NULL;
  XT_OK(xseg_malloc(a, (XS_IPC_MAX_HANDLES + 1) * 2 * MiB, NULL, &big));
  XT_OK(xseg_malloc(a, XS_IPC_MAX_HANDLES * 2 * MiB, NULL, &fits));
  xseg_ipc_handle *h = (xseg_ipc_handle *)1;
  XSEG_EXPECT_EQ(xseg_ipc_export(a, big, &h), XSEG_ERR_UNSUPPORTED);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "more than 252 physical "
                          "handles") != NULL);
  XSEG_EXPECT_TRUE(h == NULL);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);
  XT_OK(xseg_ipc_export(a, fits, &h));
  XSEG_ASSERT_TRUE(h != NULL);
  XSEG_EXPECT_EQ(h->wire.n_handles, XS_IPC_MAX_HANDLES);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, big));
  XT_OK(xseg_free(a, fits));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}
