/* Threads x streams: four threads on two streams (two per stream) malloc
   and free, hand blocks to the next thread to free (a free on another
   thread than the allocating one, of a block of another stream's pool
   half the time, some of them recorded on the receiver's stream first),
   while one of them grows (blocks up to 8 MiB) and another releases
   (empty_cache), and a fifth thread validates and reads the stats
   throughout. At the end every stat that does not depend on the order of
   operations (current values, totals of increases and decreases) equals a
   replay of the same mallocs and frees on one thread. Run under TSan by
   CI. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc_helpers.h"

enum { THREADS = 4, STREAMS = 2, SLOTS = 32, BOX = 64, OPS = 1500 };

/* Blocks handed to a thread for it to free. */
typedef struct thr_box {
  pthread_mutex_t mu;
  void *p[BOX];
  int n;
} thr_box;

/* One malloc, for the replay. */
typedef struct thr_op {
  size_t size;
  int stream;
} thr_op;

typedef struct thr_ctx {
  xseg_allocator *a;
  CUstream streams[STREAMS];
  thr_box box[THREADS];
  atomic_bool stop;
  int checks;                   /* rounds the checker made (its own) */
} thr_ctx;

typedef struct thr_worker {
  thr_ctx *c;
  int id;
  uint64_t seed;
  thr_op log[OPS];
  int n_log;
  int errors;
} thr_worker;

static size_t thr_size(thr_worker *w) {
  uint64_t r = at_rand(&w->seed);
  /* Thread 1 grows: a block of up to 8 MiB now and then. */
  if (w->id == 1 && r % 8 == 0) return (size_t)(r >> 8) % (8 * MiB) + 1;
  return (size_t)(r >> 8) % (64 * 1024) + 1;
}

/* Hands p to the next thread; false when its box is full. */
static bool thr_hand(thr_worker *w, void *p) {
  int to = (w->id + 1) % THREADS;
  thr_box *b = &w->c->box[to];
  /* The receiver's stream uses it before the free: a deferred free,
     found from another thread and another stream. */
  if (at_rand(&w->seed) % 4 == 0 &&
      xseg_record_stream(w->c->a, p, w->c->streams[to % STREAMS]) != XSEG_OK)
    w->errors++;
  pthread_mutex_lock(&b->mu);
  bool ok = b->n < BOX;
  if (ok) b->p[b->n++] = p;
  pthread_mutex_unlock(&b->mu);
  return ok;
}

static void thr_drain(thr_worker *w) {
  thr_box *b = &w->c->box[w->id];
  pthread_mutex_lock(&b->mu);
  for (int i = 0; i < b->n; i++)
    if (xseg_free(w->c->a, b->p[i]) != XSEG_OK) w->errors++;
  b->n = 0;
  pthread_mutex_unlock(&b->mu);
}

static void thr_step(thr_worker *w, void **slot) {
  thr_ctx *c = w->c;
  int stream = w->id % STREAMS;
  if (*slot == NULL) {
    size_t size = thr_size(w);
    if (xseg_malloc(c->a, size, c->streams[stream], slot) != XSEG_OK) {
      w->errors++;
      return;
    }
    w->log[w->n_log++] = (thr_op){size, stream};
  } else if (at_rand(&w->seed) % 2 == 0 && thr_hand(w, *slot)) {
    *slot = NULL;
  } else {
    if (xseg_free(c->a, *slot) != XSEG_OK) w->errors++;
    *slot = NULL;
  }
}

static void *thr_main(void *arg) {
  thr_worker *w = arg;
  if (xt_context(0) == NULL) {
    w->errors++;
    return NULL;
  }
  void *live[SLOTS] = {NULL};
  for (int op = 0; op < OPS; op++) {
    thr_step(w, &live[at_rand(&w->seed) % SLOTS]);
    if (op % 16 == 0) thr_drain(w);
    /* Thread 2 releases while the others free across streams. */
    if (w->id == 2 && op % 100 == 0 && xseg_empty_cache(w->c->a) != XSEG_OK)
      w->errors++;
  }
  for (int i = 0; i < SLOTS; i++)
    if (live[i] != NULL && xseg_free(w->c->a, live[i]) != XSEG_OK)
      w->errors++;
  return NULL;
}

/* Validates and reads the stats while the workers run, as a monitor
   would: with a pause between rounds. Each takes every lock, and the locks
   are not fair (as std::mutex is not): a thread that takes them again the
   moment it lets go can starve the workers for as long as it keeps on
   (seen: a worker waiting minutes under the sanitizers). */
static void *thr_checker(void *arg) {
  thr_ctx *c = arg;
  int bad = 0;
  const struct timespec pause = {0, 200 * 1000};
  do {                          /* at least one round, however quick the
                                   workers were */
    c->checks++;
    if (xseg_check(c->a) != XSEG_OK) {
      fprintf(stderr, "xseg_check: %s\n", xseg_last_error());
      bad++;
    }
    xseg_stats s;
    if (xseg_get_stats(c->a, &s) != XSEG_OK ||
        s.active.current < s.allocation.current ||
        s.allocated_bytes.peak < s.allocated_bytes.current)
      bad++;
  } while (!atomic_load(&c->stop) && bad == 0 && !nanosleep(&pause, NULL));
  return (void *)(intptr_t)bad;
}

/* The stats that the order of operations does not change. */
static void thr_expect_same(const xseg_stats *got, const xseg_stats *want) {
#define THR_SAME_(g)                                                         \
  XSEG_EXPECT_EQ(got->g.current, want->g.current);                           \
  XSEG_EXPECT_EQ(got->g.allocated, want->g.allocated);                       \
  XSEG_EXPECT_EQ(got->g.freed, want->g.freed);
  THR_SAME_(allocation)
  THR_SAME_(allocated_bytes)
  THR_SAME_(requested_bytes)
  THR_SAME_(active)
  THR_SAME_(active_bytes)
#undef THR_SAME_
  XSEG_EXPECT_EQ(got->num_ooms, want->num_ooms);
  XSEG_EXPECT_EQ(got->pending_free_bytes, want->pending_free_bytes);
}

/* Every logged malloc again, on one thread, then every free. */
static void thr_replay(thr_ctx *c, thr_worker *w, xseg_stats *out) {
  xseg_allocator *a = at_create(NULL);
  size_t n = 0;
  for (int t = 0; t < THREADS; t++) n += (size_t)w[t].n_log;
  void **p = calloc(n, sizeof *p);
  size_t k = 0;
  for (int t = 0; t < THREADS; t++)
    for (int i = 0; i < w[t].n_log; i++, k++)
      XSEG_EXPECT_OK(xseg_malloc(a, w[t].log[i].size,
                                 c->streams[w[t].log[i].stream], &p[k]));
  for (k = 0; k < n; k++) XSEG_EXPECT_OK(xseg_free(a, p[k]));
  free(p);
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(a));
  *out = at_stats(a);
  xseg_destroy(a);
}

XSEG_TEST(alloc_threads, threads_on_streams_match_a_one_thread_replay) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  thr_ctx *c = calloc(1, sizeof *c);
  thr_worker *w = calloc(THREADS, sizeof *w);
  c->a = at_create(NULL);
  for (int s = 0; s < STREAMS; s++)
    XSEG_ASSERT_CU(cuStreamCreate(&c->streams[s], CU_STREAM_NON_BLOCKING));
  for (int t = 0; t < THREADS; t++)
    pthread_mutex_init(&c->box[t].mu, NULL);
  pthread_t th[THREADS], checker;
  for (int t = 0; t < THREADS; t++) {
    w[t] = (thr_worker){.c = c, .id = t, .seed = 7 + (uint64_t)t};
    XSEG_ASSERT_EQ(pthread_create(&th[t], NULL, thr_main, &w[t]), 0);
  }
  XSEG_ASSERT_EQ(pthread_create(&checker, NULL, thr_checker, c), 0);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  atomic_store(&c->stop, true);
  void *bad;
  pthread_join(checker, &bad);
  XSEG_EXPECT_EQ((intptr_t)bad, 0);
  XSEG_EXPECT_GE(c->checks, 1);
  /* What is still in the boxes is freed here, on yet another thread. */
  for (int t = 0; t < THREADS; t++) {
    XSEG_EXPECT_EQ(w[t].errors, 0);
    for (int i = 0; i < c->box[t].n; i++)
      XSEG_EXPECT_OK(xseg_free(c->a, c->box[t].p[i]));
    pthread_mutex_destroy(&c->box[t].mu);
  }
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(c->a));
  XSEG_EXPECT_OK(xseg_check(c->a));
  xseg_stats got = at_stats(c->a), want;
  thr_replay(c, w, &want);
  thr_expect_same(&got, &want);
  XSEG_EXPECT_EQ(got.allocation.current, 0);
  XSEG_EXPECT_EQ(got.reserved_bytes.current, 0);
  XSEG_EXPECT_GT(got.allocation.allocated, THREADS * OPS / 4);
  xseg_destroy(c->a);
  for (int s = 0; s < STREAMS; s++)
    XSEG_EXPECT_CU(cuStreamDestroy(c->streams[s]));
  free(w);
  free(c);
}
