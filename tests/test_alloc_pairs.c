/* Pairs that go away (alloc/pairs.c): a released private pool's pair is
 * recycled as the next pair, so a server that captures graph after graph
 * into fresh pools keeps as many pair structs as it ever had alive at
 * once; and a thread that still holds a gone pair's lock, as one that read
 * the range table just before the pair went does, is waited for before the
 * pair is reused, and sees it dead. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "alloc/enter.h"
#include "alloc/pairs.h"
#include "alloc/ranges.h"
#include "alloc/types.h"
#include "alloc_helpers.h"

enum { PR_POOLS = 40, PR_SIZE = 3 * MiB };

/* A private pool with one block malloc'd and freed on `stream`, the pool
   then ended and released; the block's address in *where. */
static bool pr_use_pool(xseg_allocator *a, xseg_pool_id pool,
                        CUstream stream, void **where) {
  void *p;
  bool ok = xseg_begin_allocate_to_pool(a, pool, stream) == XSEG_OK &&
            xseg_malloc(a, PR_SIZE, stream, &p) == XSEG_OK;
  if (ok) {
    *where = p;
    ok = xseg_free(a, p) == XSEG_OK;
  }
  ok &= xseg_end_allocate_to_pool(a, pool) == XSEG_OK;
  ok &= xseg_release_pool(a, pool) == XSEG_OK;
  return ok;
}

XSEG_TEST(alloc_pairs, released_pools_are_recycled_not_piled_up) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &p));   /* the stream's own pair */
  for (int i = 1; i <= PR_POOLS; i++) {
    void *where;
    XSEG_ASSERT_TRUE(pr_use_pool(a, (xseg_pool_id)i, s, &where));
    /* The release pass takes the pool's memory and the pair goes. */
    XSEG_ASSERT_OK(xseg_empty_cache(a));
    XSEG_ASSERT_OK(xseg_check(a));
    xs_alloc_enter(a);
    size_t structs = a->pair_structs, alive = a->n_pairs;
    xs_alloc_leave(a);
    XSEG_EXPECT_EQ(alive, 1u);
    XSEG_EXPECT_LE(structs, 2u);          /* the stream's and one spare */
  }
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

typedef struct pr_holder {
  xs_pair *pair;
  atomic_bool holding, let_go;
  bool saw_dead;
} pr_holder;

/* What a cached free does with a pair it found: takes its lock (the
   debug builds' bookkeeping included), and here holds it until told. */
static void *pr_hold(void *arg) {
  pr_holder *h = arg;
  xs_pair_take(h->pair);
  h->saw_dead = h->pair->dead;
  atomic_store(&h->holding, true);
  while (!atomic_load(&h->let_go))
    nanosleep(&(struct timespec){0, 200 * 1000}, NULL);
  h->saw_dead &= h->pair->dead;   /* nobody reset it under the lock */
  xs_pair_drop(h->pair);
  return NULL;
}

typedef struct pr_pool_arg {
  xseg_allocator *a;
  CUstream stream;
  void *where;
  bool ok;
  atomic_bool done;
} pr_pool_arg;

static void *pr_next_pool(void *arg) {
  pr_pool_arg *r = arg;
  r->ok = pr_use_pool(r->a, 2, r->stream, &r->where);
  atomic_store(&r->done, true);
  return NULL;
}

XSEG_TEST(alloc_pairs, a_gone_pair_is_reused_only_after_its_holder_lets_go) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new();
  void *where = NULL;
  XSEG_ASSERT_TRUE(pr_use_pool(a, 1, s, &where));
  /* The pool's pair, found from its block's address as a free finds it. */
  xs_alloc_enter(a);
  xs_pair *gone = xs_ranges_find(a, (uint64_t)(uintptr_t)where);
  xs_alloc_leave(a);
  XSEG_ASSERT_TRUE(gone != NULL && gone->private_id == 1);
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_ASSERT_TRUE(gone->dead);
  size_t structs = a->pair_structs;

  /* A late reader holds its lock; the next pool's pair waits for it. */
  pr_holder h = {.pair = gone};
  pthread_t holder, user;
  XSEG_ASSERT_EQ(pthread_create(&holder, NULL, pr_hold, &h), 0);
  while (!atomic_load(&h.holding))
    nanosleep(&(struct timespec){0, 200 * 1000}, NULL);
  pr_pool_arg r = {.a = a, .stream = s};
  XSEG_ASSERT_EQ(pthread_create(&user, NULL, pr_next_pool, &r), 0);
  nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  bool done_early = atomic_load(&r.done);
  atomic_store(&h.let_go, true);
  pthread_join(holder, NULL);
  pthread_join(user, NULL);
  XSEG_EXPECT_FALSE(done_early);
  XSEG_EXPECT_TRUE(h.saw_dead);
  XSEG_EXPECT_TRUE(r.ok);
  XSEG_EXPECT_EQ(a->pair_structs, structs);     /* the same memory again */
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}
