/* A consumer keeps a producer's reference table mapped between opens
 * (alloc/ipc_open.c): the next open of that producer's blocks maps no
 * table again; at most XS_IPC_IDLE_PEERS tables of producers with nothing
 * open stay, the least recently used going first; an exited producer's
 * goes at the next new producer; and a handle whose table fd is not the
 * table mapped for it is refused, whether its producer has a block open
 * here or none. Tables are counted in /proc/self/maps (the memfd's name),
 * so these run on a GPU as well. Last, a peer device (not process):
 * xseg_enable_peer_access reaches the blocks opened here before it.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc/ipc.h"
#include "alloc_helpers.h"
#include "ipc_helpers.h"

/* Mappings of xseg reference tables in this process: each producer's
   own, and each table a consumer keeps. */
static int tables_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL) return -1;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f) != NULL)
    n += strstr(line, "memfd:xseg-ipc-table") != NULL;
  fclose(f);
  return n;
}

enum { PRODUCERS = XS_IPC_IDLE_PEERS + 2 };

/* Producers a[i] in this process, each with a live 1 MiB block p[i]
   exported as h[i]. */
typedef struct producers {
  xseg_allocator *a[PRODUCERS];
  void *p[PRODUCERS];
  xseg_ipc_handle *h[PRODUCERS];
} producers;

static bool producers_make(producers *s) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < PRODUCERS; i++) {
    s->a[i] = at_create(NULL);
    if (s->a[i] == NULL || !XT_OK(xseg_malloc(s->a[i], 1 * MiB, NULL,
                                              &s->p[i])) ||
        !ipc_fill(s->p[i], 1 * MiB, (unsigned)i + 1) ||
        !XT_OK(xseg_ipc_export(s->a[i], s->p[i], &s->h[i])))
      return false;
  }
  return true;
}

static void producers_end(producers *s) {
  for (int i = 0; i < PRODUCERS; i++) {
    xseg_ipc_handle_free(s->h[i]);
    if (s->p[i] != NULL) XT_OK(xseg_free(s->a[i], s->p[i]));
    if (s->a[i] != NULL) {
      XT_OK(xseg_check(s->a[i]));
      XSEG_EXPECT_EQ(at_stats(s->a[i]).pending_free_bytes, 0);
      xseg_destroy(s->a[i]);
    }
  }
}

/* b opens block i and, while it is open, counts the tables mapped in
   this process; then closes it. -1 on a failure. */
static int open_count_close(xseg_allocator *b, producers *s, int i) {
  void *q = NULL;
  if (!XT_OK(xseg_ipc_open(b, s->h[i], &q))) return -1;
  int n = tables_mapped();
  if (!XSEG_EXPECT_TRUE(ipc_same(q, 1 * MiB, (unsigned)i + 1)) ||
      !XT_OK(xseg_ipc_close(b, q)))
    return -1;
  return n;
}

/* b opens block i, checks its bytes and closes it. */
static bool open_close(xseg_allocator *b, producers *s, int i) {
  return open_count_close(b, s, i) >= 0;
}


/* Opening a producer's blocks again maps its table once; of ten
   producers, the eight whose blocks closed last stay mapped, the least
   recently used going first; destroy unmaps them all. */
XSEG_TEST(ipc_peers, a_producers_table_stays_mapped_between_opens) {
  producers s;
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(b != NULL && producers_make(&s));
  int own = tables_mapped();                 /* the producers' own */
  XSEG_EXPECT_EQ(own, PRODUCERS);
  XSEG_EXPECT_EQ(open_count_close(b, &s, 0), own + 1);
  XSEG_EXPECT_EQ(tables_mapped(), own + 1);  /* kept, idle */
  XSEG_EXPECT_EQ(open_count_close(b, &s, 0), own + 1);   /* not mapped again */
  for (int i = 1; i < PRODUCERS; i++) {
    int idle = i < XS_IPC_IDLE_PEERS ? i : XS_IPC_IDLE_PEERS;
    XSEG_EXPECT_EQ(open_count_close(b, &s, i), own + idle + 1);
  }
  /* Closed last to first: 9 8 7 6 5 4 3 2 (0 and 1 went). */
  XSEG_EXPECT_EQ(tables_mapped(), own + XS_IPC_IDLE_PEERS);
  XSEG_EXPECT_EQ(open_count_close(b, &s, 9), own + XS_IPC_IDLE_PEERS);
  /* 0 is mapped again; its close pushes out the least recently used: 2. */
  XSEG_EXPECT_EQ(open_count_close(b, &s, 0), own + XS_IPC_IDLE_PEERS + 1);
  XSEG_EXPECT_EQ(tables_mapped(), own + XS_IPC_IDLE_PEERS);
  XSEG_EXPECT_EQ(open_count_close(b, &s, 2), own + XS_IPC_IDLE_PEERS + 1);
  /* Now 2 0 9 8 7 6 5 4 (3 went): 4, the oldest, is still mapped. */
  XSEG_EXPECT_EQ(open_count_close(b, &s, 4), own + XS_IPC_IDLE_PEERS);
  XSEG_EXPECT_EQ(open_count_close(b, &s, 3), own + XS_IPC_IDLE_PEERS + 1);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 0);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_total, PRODUCERS + 6);
  for (int i = 0; i < PRODUCERS; i++)
    XSEG_EXPECT_EQ(ipc_stats(s.a[i]).open_by_others, 0);
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  XSEG_EXPECT_EQ(tables_mapped(), own);
  producers_end(&s);
}

/* A handle of producer 0 whose table fd is producer 1's is refused while
   producer 0 has another block open here and once it has none, nothing
   imported either time; with its own fd it opens. */
XSEG_TEST(ipc_peers, a_table_fd_that_is_not_the_mapped_table_is_refused) {
  producers s;
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(b != NULL && producers_make(&s));
  void *other = NULL, *q = NULL;
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_malloc(s.a[0], 1 * MiB, NULL, &other));
  XT_OK(xseg_ipc_export(s.a[0], other, &h));
  void *held = NULL;
  XT_OK(xseg_ipc_open(b, h, &held));          /* producer 0's table mapped */
  int table = s.h[0]->table_fd;
  s.h[0]->table_fd = s.h[1]->table_fd;
  for (int round = 0; round < 2; round++) {
    if (round == 1) XT_OK(xseg_ipc_close(b, held));   /* now idle */
    xsim_live before = {0}, now = {0};
    if (xt_have_sim()) xsim_get_live(&before);
    q = (void *)1;
    XSEG_EXPECT_EQ(xseg_ipc_open(b, s.h[0], &q), XSEG_ERR_INVALID_ARGUMENT);
    /* The inode's refusal (the table's own says "another allocator's"). */
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another file") != NULL);
    XSEG_EXPECT_TRUE(q == NULL);
    if (xt_have_sim()) xsim_get_live(&now);
    XSEG_EXPECT_EQ(now.handles, before.handles);
    XSEG_EXPECT_EQ(now.reservations, before.reservations);
  }
  XSEG_EXPECT_EQ(ipc_stats(s.a[0]).open_by_others, 0);
  s.h[0]->table_fd = table;
  XSEG_EXPECT_TRUE(open_close(b, &s, 0));
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(s.a[0], other));
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  producers_end(&s);
}

/* A producer in another process exits: its table, kept here, goes when
   the next new producer's table is mapped. */
XSEG_TEST(ipc_peers, an_exited_producers_table_goes_at_the_next_producer) {
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(b != NULL);
  int before = tables_mapped();
  ipc_child c = ipc_spawn(-1);
  XSEG_ASSERT_GT(c.pid, 0);
  XSEG_EXPECT_EQ(ipc_ask(c, 'x', 1 * MiB, 7), 0);        /* it exports */
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_recv(c.ctl, &h));
  XSEG_ASSERT_TRUE(h != NULL);
  void *q = NULL;
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_EXPECT_TRUE(ipc_same(q, 1 * MiB, 7));
  XT_OK(xseg_ipc_close(b, q));
  XSEG_EXPECT_EQ(tables_mapped(), before + 1);           /* kept, idle */
  XSEG_EXPECT_EQ(ipc_finish(c), 0);                      /* it exits */
  xseg_ipc_handle_free(h);
  XSEG_EXPECT_EQ(tables_mapped(), before + 1);
  /* A producer here: its own table, and b maps it, pruning the dead. */
  producers s;
  XSEG_ASSERT_TRUE(producers_make(&s));
  XSEG_EXPECT_TRUE(open_close(b, &s, 0));
  XSEG_EXPECT_EQ(tables_mapped(), before + PRODUCERS + 1);
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  producers_end(&s);
  XSEG_EXPECT_EQ(tables_mapped(), before);
}

/* A table that only claims to be producer 0's (its header copied into
   another memfd, no block exported in it) fails its open and is not
   kept, so producer 0's own handles still open. */
XSEG_TEST(ipc_peers, a_table_no_hold_was_published_in_is_not_kept) {
  producers s;
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(b != NULL && producers_make(&s));
  int fake = memfd_create("copied-table", MFD_CLOEXEC);
  XSEG_ASSERT_TRUE(fake >= 0);
  XSEG_ASSERT_EQ(ftruncate(fake, sizeof(xs_ipc_table)), 0);
  xs_ipc_table *real = mmap(NULL, sizeof *real, PROT_READ, MAP_SHARED,
                            s.h[0]->table_fd, 0);
  xs_ipc_table *copy = mmap(NULL, sizeof *copy, PROT_READ | PROT_WRITE,
                            MAP_SHARED, fake, 0);
  XSEG_ASSERT_TRUE(real != MAP_FAILED && copy != MAP_FAILED);
  memcpy(copy, real, offsetof(xs_ipc_table, exports));   /* header only */
  int table = s.h[0]->table_fd;
  s.h[0]->table_fd = fake;
  void *q = (void *)1;
  XSEG_EXPECT_NE(xseg_ipc_open(b, s.h[0], &q), XSEG_OK);
  XSEG_EXPECT_TRUE(q == NULL);
  s.h[0]->table_fd = table;
  XSEG_EXPECT_TRUE(open_close(b, &s, 0));
  XSEG_EXPECT_EQ(ipc_stats(s.a[0]).open_by_others, 0);
  munmap(real, sizeof *real);
  munmap(copy, sizeof *copy);
  close(fake);
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  producers_end(&s);
}

/* xseg_enable_peer_access: "every current and future mapping" includes the
   blocks of other processes opened here before it (their access was the
   list of their open). */
XSEG_TEST(ipc, peer_access_reaches_a_block_opened_before) {
  XT_REQUIRE_SIM_FOR("emulates a second device");
  xt_emulate_devices(2);
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  void *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 4 * MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  xseg_ipc_handle *got = ipc_roundtrip(h);
  XSEG_ASSERT_TRUE(got != NULL);
  XT_OK(xseg_ipc_open(b, got, &q));
  XT_OK(xseg_enable_peer_access(b, 1));
  CUmemLocation peer = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  unsigned long long flags = 0;
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  XSEG_EXPECT_CU(cuMemGetAccess(&flags, &peer, (CUdeviceptr)(uintptr_t)q));
  XSEG_EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  XT_OK(xseg_ipc_close(b, q));
  xseg_ipc_handle_free(got);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  xseg_destroy(b);
  xseg_destroy(a);
  xt_emulated_devices_end();
}
