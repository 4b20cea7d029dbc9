/* A consumer keeps a producer's reference table mapped between opens
 * (alloc/ipc_open.c): the next open of that producer's blocks maps no
 * table again; at most XS_IPC_IDLE_PEERS tables of producers with nothing
 * open stay, the least recently used going first; an exited producer's
 * goes at the next new producer; and a handle whose table fd is not the
 * table mapped for it is refused, whether its producer has a block open
 * here or none. Tables are counted in /proc/self/maps (the memfd's name),
 * so these run on a GPU as well.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* b opens block i, checks its bytes and closes it. */
static bool open_close(xseg_allocator *b, producers *s, int i) {
  void *q = NULL;
  return XT_OK(xseg_ipc_open(b, s->h[i], &q)) &&
         XSEG_EXPECT_TRUE(ipc_same(q, 1 * MiB, (unsigned)i + 1)) &&
         XT_OK(xseg_ipc_close(b, q));
}

/* Opening a producer's blocks again maps its table once; ten producers
   leave the eight used last mapped; destroy unmaps them all. */
XSEG_TEST(ipc_peers, a_producers_table_stays_mapped_between_opens) {
  producers s;
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(b != NULL && producers_make(&s));
  int own = tables_mapped();                 /* the producers' own */
  XSEG_EXPECT_EQ(own, PRODUCERS);
  XSEG_EXPECT_TRUE(open_close(b, &s, 0));
  XSEG_EXPECT_EQ(tables_mapped(), own + 1);  /* kept, idle */
  XSEG_EXPECT_TRUE(open_close(b, &s, 0));
  XSEG_EXPECT_EQ(tables_mapped(), own + 1);  /* not mapped again */
  for (int i = 1; i < PRODUCERS; i++) XSEG_EXPECT_TRUE(open_close(b, &s, i));
  XSEG_EXPECT_EQ(tables_mapped(), own + XS_IPC_IDLE_PEERS);
  /* The least recently used went: 0 and 1. Block 9's table is kept (no
     new mapping), block 0's is mapped again and pushes out 2's. */
  XSEG_EXPECT_TRUE(open_close(b, &s, PRODUCERS - 1));
  XSEG_EXPECT_EQ(tables_mapped(), own + XS_IPC_IDLE_PEERS);
  XSEG_EXPECT_TRUE(open_close(b, &s, 0));
  XSEG_EXPECT_EQ(tables_mapped(), own + XS_IPC_IDLE_PEERS);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 0);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_total, PRODUCERS + 3);
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
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "another allocator") != NULL);
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
