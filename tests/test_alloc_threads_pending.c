/* A cross-stream free pending on another thread while other threads grow,
   release and run the cached path (alloc/pairs.c's slow flag), and
   xseg_record_stream, which needs its block's pair lock alone. A stream
   held by a latch keeps the free pending for as long as the test needs, so
   the overlap is forced, not hoped for. Meanwhile no thread may be handed
   the pending block's memory, and the statistics count it as active; once
   the latch opens, a release on yet another thread frees it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "alloc/pairs.h"
#include "alloc/types.h"
#include "alloc_helpers.h"

enum { PD_ROUNDS = 300, PD_SEEN = 4 * PD_ROUNDS };

typedef struct pd_ctx {
  xseg_allocator *a;
  CUstream own, held;          /* the block's stream; the one it is used on */
  uint64_t lo, hi;             /* the pending block's range */
  atomic_int overlaps, errors;
} pd_ctx;

static void pd_seen(pd_ctx *c, void *p, size_t size) {
  uint64_t a = (uint64_t)(uintptr_t)p;
  if (a < c->hi && a + size > c->lo) atomic_fetch_add(&c->overlaps, 1);
}

/* One block of `size` bytes on `stream`, checked against the pending one
   (pd_seen), then freed; failures are counted. */
static void pd_malloc_free(pd_ctx *c, CUstream stream, size_t size) {
  void *p;
  if (xseg_malloc(c->a, size, stream, &p) != XSEG_OK) {
    atomic_fetch_add(&c->errors, 1);
    return;
  }
  pd_seen(c, p, size);
  if (xseg_free(c->a, p) != XSEG_OK) atomic_fetch_add(&c->errors, 1);
}

/* The cached path's pairs on the block's own stream: slow while a free is
   pending (the flag), never handed the pending block. */
static void *pd_churn(void *arg) {
  pd_ctx *c = arg;
  if (xt_context(0) == NULL) return NULL;
  for (int i = 0; i < PD_ROUNDS; i++)
    pd_malloc_free(c, c->own, 512 * (1 + (size_t)i % 2048));
  return NULL;
}

/* Growth on the held stream: new memory, never the pending block's. */
static void *pd_grow(void *arg) {
  pd_ctx *c = arg;
  if (xt_context(0) == NULL) return NULL;
  for (int i = 0; i < PD_ROUNDS / 10; i++)
    pd_malloc_free(c, c->held, (size_t)(8 + i % 24) * MiB);
  return NULL;
}

/* Release passes from another thread: the pending block stays. */
static void *pd_release(void *arg) {
  pd_ctx *c = arg;
  if (xt_context(0) == NULL) return NULL;
  for (int i = 0; i < PD_ROUNDS / 10; i++)
    if (xseg_empty_cache(c->a) != XSEG_OK) atomic_fetch_add(&c->errors, 1);
  return NULL;
}

typedef struct pd_free_arg {
  xseg_allocator *a;
  void *p;
  xseg_status st;
} pd_free_arg;

static void *pd_free(void *arg) {
  pd_free_arg *f = arg;
  f->st = xt_context(0) != NULL ? xseg_free(f->a, f->p) : XSEG_ERR_DRIVER;
  return NULL;
}

static void *pd_release_blocking(void *arg) {
  pd_free_arg *f = arg;
  f->st = xt_context(0) != NULL ? xseg_empty_cache_blocking(f->a)
                                : XSEG_ERR_DRIVER;
  return NULL;
}

XSEG_TEST(alloc_threads, pending_free_holds_while_threads_grow_and_release) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  pd_ctx c = {.a = at_create(NULL), .own = at_stream_new(),
              .held = at_stream_new()};
  void *x;
  XSEG_ASSERT_OK(xseg_malloc(c.a, 3 * MiB, c.own, &x));
  c.lo = (uint64_t)(uintptr_t)x;
  c.hi = c.lo + 3 * MiB;
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(c.held, l));
  XSEG_ASSERT_OK(xseg_record_stream(c.a, x, c.held));
  /* Freed on another thread: pending behind the latch. */
  pd_free_arg f = {c.a, x, XSEG_OK};
  pthread_t th[4];
  XSEG_ASSERT_EQ(pthread_create(&th[0], NULL, pd_free, &f), 0);
  pthread_join(th[0], NULL);
  XSEG_ASSERT_OK(f.st);
  xseg_stats mid = at_stats(c.a);
  XSEG_EXPECT_EQ(mid.pending_free_bytes, (int64_t)(3 * MiB));
  XSEG_EXPECT_EQ(mid.active_bytes.current - mid.allocated_bytes.current,
                 (int64_t)(3 * MiB));

  XSEG_ASSERT_EQ(pthread_create(&th[0], NULL, pd_churn, &c), 0);
  XSEG_ASSERT_EQ(pthread_create(&th[1], NULL, pd_churn, &c), 0);
  XSEG_ASSERT_EQ(pthread_create(&th[2], NULL, pd_grow, &c), 0);
  XSEG_ASSERT_EQ(pthread_create(&th[3], NULL, pd_release, &c), 0);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  XSEG_EXPECT_EQ(atomic_load(&c.errors), 0);
  XSEG_EXPECT_EQ(atomic_load(&c.overlaps), 0);
  xseg_stats held = at_stats(c.a);
  XSEG_EXPECT_EQ(held.pending_free_bytes, (int64_t)(3 * MiB));
  XSEG_EXPECT_EQ(held.allocated_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(c.a));

  /* The latch opens; a blocking release on another thread frees it. */
  xt_latch_open(l);
  XSEG_ASSERT_CU(cuStreamSynchronize(c.held));
  pd_free_arg r = {c.a, NULL, XSEG_OK};
  XSEG_ASSERT_EQ(pthread_create(&th[0], NULL, pd_release_blocking, &r), 0);
  pthread_join(th[0], NULL);
  XSEG_EXPECT_OK(r.st);
  xseg_stats end = at_stats(c.a);
  XSEG_EXPECT_EQ(end.pending_free_bytes, 0);
  XSEG_EXPECT_EQ(end.active_bytes.current, 0);
  XSEG_EXPECT_EQ(end.reserved_bytes.current, 0);
  /* Every malloc counted once, whatever thread made it. */
  XSEG_EXPECT_EQ(end.allocation.allocated, 1 + 2 * PD_ROUNDS + PD_ROUNDS / 10);
  XSEG_EXPECT_GE(end.active_bytes.peak, (int64_t)(3 * MiB + 8 * MiB));
  XSEG_EXPECT_OK(xseg_check(c.a));
  xseg_destroy(c.a);
  xt_latch_free(l);
  XSEG_EXPECT_CU(cuStreamDestroy(c.own));
  XSEG_EXPECT_CU(cuStreamDestroy(c.held));
}

/* Whether `flag` is set within `seconds` (polled every millisecond). */
static bool pd_wait_flag(atomic_bool *flag, int seconds) {
  for (int i = 0; i < seconds * 1000 && !atomic_load(flag); i++)
    nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
  return atomic_load(flag);
}

/* The end of a test on three streams with a latch: the allocator, the
   latch and the streams go. */
static void pd_three_streams_done(xseg_allocator *a, xt_latch *l,
                                  CUstream own, CUstream other,
                                  CUstream side) {
  xseg_destroy(a);
  xt_latch_free(l);
  XSEG_EXPECT_CU(cuStreamDestroy(own));
  XSEG_EXPECT_CU(cuStreamDestroy(other));
  XSEG_EXPECT_CU(cuStreamDestroy(side));
}

/* One operation on its own thread: xseg_record_stream(p, record) when
   `record` is set, else a malloc of `size` bytes on `stream` into *out
   when `out` is, else a free of p. */
typedef struct pd_op_arg {
  xseg_allocator *a;
  void *p, **out;
  size_t size;
  CUstream stream, record;
  xseg_status st;
  atomic_bool done;
} pd_op_arg;

static void *pd_op(void *arg) {
  pd_op_arg *o = arg;
  if (xt_context(0) == NULL)
    o->st = XSEG_ERR_DRIVER;
  else if (o->record != NULL)
    o->st = xseg_record_stream(o->a, o->p, o->record);
  else if (o->out == NULL)
    o->st = xseg_free(o->a, o->p);
  else
    o->st = xseg_malloc(o->a, o->size, o->stream, o->out);
  atomic_store(&o->done, true);
  return NULL;
}

/* Runs o on a thread while `busy` (another stream's pair) is locked, as
   its cached path locks it, for up to `seconds`: true when o finished
   meanwhile, i.e. it needed no lock of that pair's. */
static bool pd_op_beside_for(xs_pair *busy, pd_op_arg *o,
                             int seconds) {
  xs_pair_take(busy);
  pthread_t th;
  if (pthread_create(&th, NULL, pd_op, o) != 0) {
    xs_pair_drop(busy);
    return false;
  }
  bool done_while_held = pd_wait_flag(&o->done, seconds);
  xs_pair_drop(busy);
  pthread_join(th, NULL);
  return done_while_held;
}

/* The same, with time enough for any build (the operation should not
   wait at all). */
static bool pd_op_beside(xs_pair *busy, pd_op_arg *o) {
  return pd_op_beside_for(busy, o, 30);
}

/* Another stream's pair is locked (as its cached path locks it) while a
   thread records a stream on a live block of this stream: the record
   takes the block's pair lock alone, not every lock, so it finishes before
   the other pair is let go; and it counts: the free that follows waits for
   the recorded stream. A pointer the pairs do not know still gets its
   error, under every lock. */
XSEG_TEST(alloc_threads, record_stream_needs_only_its_blocks_pair) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream own = at_stream_new(), other = at_stream_new(),
           side = at_stream_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, own, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, other, &q));
  xs_pair *busy = xs_pairs_find_stream(a, other);
  XSEG_ASSERT_TRUE(busy != NULL);

  pd_op_arg r = {.a = a, .p = p, .record = side, .st = XSEG_ERR_DRIVER};
  XSEG_EXPECT_TRUE(pd_op_beside(busy, &r));
  XSEG_EXPECT_OK(r.st);
  XSEG_EXPECT_OK(xseg_free(a, q));

  /* The record took: with the side stream held, the free is pending. */
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(side, l));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)(3 * MiB));
  XSEG_EXPECT_EQ(xseg_record_stream(a, p, side), XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_EQ(xseg_record_stream(a, (char *)p + 512, side),
                 XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_OK(xseg_check(a));
  xt_latch_open(l);
  XSEG_ASSERT_CU(cuStreamSynchronize(side));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  pd_three_streams_done(a, l, own, other, side);
}

/* A block freed and parked (lazy merging) keeps its entry in its pair's
   pointer table until it settles; recording a stream on it must still be
   refused as on any freed pointer, and must not make its next free wait
   on that stream. */
XSEG_TEST(alloc_threads, record_stream_refuses_a_parked_block) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream own = at_stream_new(), side = at_stream_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, own, &p));
  XSEG_ASSERT_OK(xseg_free(a, p));           /* parked: the rest is free */
  XSEG_EXPECT_EQ(xseg_record_stream(a, p, side), XSEG_ERR_UNKNOWN_POINTER);
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, own, &q));
  XSEG_EXPECT_TRUE(q == p);
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(own));
  XSEG_EXPECT_CU(cuStreamDestroy(side));
}

/* A cross-stream free and the mallocs that poll it take the block's
   pair lock alone (its pending frees are the pair's): with another
   stream's pair locked, the free finishes, pending behind a latch; a
   malloc of the same size on the block's stream finishes too, handed
   other memory while the latch holds, and active's peak sees the pending
   block beside the live ones (the cached malloc's look at it); once the
   latch opens, the next malloc there polls the free itself. */
XSEG_TEST(alloc_threads,
          cross_stream_free_and_its_polling_need_only_its_pair) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream own = at_stream_new(), other = at_stream_new(),
           side = at_stream_new();
  enum { SIZE = 4096 };
  void *p, *q, *r = NULL, *s = NULL;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, own, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, other, &q));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, side));
  xs_pair *busy = xs_pairs_find_stream(a, other);
  XSEG_ASSERT_TRUE(busy != NULL);
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(side, l));

  pd_op_arg f = {.a = a, .p = p, .st = XSEG_ERR_DRIVER};
  XSEG_EXPECT_TRUE(pd_op_beside(busy, &f));
  XSEG_EXPECT_OK(f.st);
  pd_op_arg m = {.a = a, .out = &r, .size = SIZE, .stream = own,
                 .st = XSEG_ERR_DRIVER};
  XSEG_EXPECT_TRUE(pd_op_beside(busy, &m));
  XSEG_EXPECT_OK(m.st);
  XSEG_EXPECT_TRUE(r != NULL && r != p);        /* p waits for the latch */
  xseg_stats st = at_stats(a);
  XSEG_EXPECT_EQ(st.pending_free_bytes, SIZE);
  XSEG_EXPECT_EQ(st.allocation.peak, 2);
  XSEG_EXPECT_EQ(st.active.current, 3);         /* q, r live; p pending */
  XSEG_EXPECT_EQ(st.active.peak, 3);
  XSEG_EXPECT_EQ(st.active_bytes.peak, 3 * SIZE);
  XSEG_EXPECT_OK(xseg_check(a));

  xt_latch_open(l);
  XSEG_ASSERT_CU(cuStreamSynchronize(side));
  pd_op_arg m2 = {.a = a, .out = &s, .size = SIZE, .stream = own,
                  .st = XSEG_ERR_DRIVER};
  XSEG_EXPECT_TRUE(pd_op_beside(busy, &m2));
  XSEG_EXPECT_OK(m2.st);
  st = at_stats(a);
  XSEG_EXPECT_EQ(st.pending_free_bytes, 0);     /* completed by that malloc */
  XSEG_EXPECT_EQ(st.active.current, 3);         /* q, r, s */
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_free(a, r));
  XSEG_EXPECT_OK(xseg_free(a, s));
  XSEG_EXPECT_OK(xseg_check(a));
  pd_three_streams_done(a, l, own, other, side);
}

/* A malloc on one stream completes another stream's ready free, as
   PyTorch's process_events completes every stream's frees at each malloc:
   with a try of that pair's lock (free here), or else with every lock. */
XSEG_TEST(alloc_threads, a_malloc_polls_other_pairs_pending_frees) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream own = at_stream_new(), other = at_stream_new(),
           side = at_stream_new();
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, own, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, other, &q));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_record_stream(a, p, side));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_CU(cuStreamSynchronize(side));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, other, &q));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(own));
  XSEG_EXPECT_CU(cuStreamDestroy(other));
  XSEG_EXPECT_CU(cuStreamDestroy(side));
}

/* Two streams each with a pending free whose recorded stream is done: a
   malloc on one completes both with its own pair's lock and a try of the
   other's (PyTorch's process_events, without every lock): it finishes
   while a third stream's pair is locked. With the other pair's lock held
   instead, the try fails and the malloc takes every lock, so it waits for
   that pair: it cannot complete a pair's frees without that pair's lock. */
XSEG_TEST(alloc_threads, a_malloc_polls_other_streams_pending_frees_by_try) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream own = at_stream_new(), other = at_stream_new(),
           third = at_stream_new(), side = at_stream_new();
  enum { SIZE = 4096 };
  void *p, *q, *t, *r = NULL, *r2 = NULL;
  XSEG_ASSERT_OK(xseg_malloc(a, SIZE, third, &t));
  for (int round = 0; round < 2; round++) {
    XSEG_ASSERT_OK(xseg_malloc(a, SIZE, own, &p));
    XSEG_ASSERT_OK(xseg_malloc(a, SIZE, other, &q));
    XSEG_ASSERT_OK(xseg_record_stream(a, p, side));
    XSEG_ASSERT_OK(xseg_record_stream(a, q, side));
    XSEG_ASSERT_OK(xseg_free(a, p));
    XSEG_ASSERT_OK(xseg_free(a, q));
    XSEG_ASSERT_CU(cuStreamSynchronize(side));
    XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 2 * SIZE);
    xs_pair *busy =
        xs_pairs_find_stream(a, round == 0 ? third : other);
    XSEG_ASSERT_TRUE(busy != NULL);
    pd_op_arg m = {.a = a, .out = round == 0 ? &r : &r2, .size = SIZE,
                   .stream = own, .st = XSEG_ERR_DRIVER};
    /* Round 1 must not finish: a second is ample to see it would. */
    bool beside = pd_op_beside_for(busy, &m, round == 0 ? 30 : 1);
    XSEG_EXPECT_OK(m.st);
    /* Round 0: the third pair has no pending free, so it is no bar.
       Round 1: the other pair's is, and a busy pair is never polled
       without its lock: the malloc waits for every lock. */
    XSEG_EXPECT_EQ(beside, round == 0);
    XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
    XSEG_EXPECT_OK(xseg_check(a));
  }
  XSEG_EXPECT_OK(xseg_free(a, r));
  XSEG_EXPECT_OK(xseg_free(a, r2));
  XSEG_EXPECT_OK(xseg_free(a, t));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(own));
  XSEG_EXPECT_CU(cuStreamDestroy(other));
  XSEG_EXPECT_CU(cuStreamDestroy(third));
  XSEG_EXPECT_CU(cuStreamDestroy(side));
}
