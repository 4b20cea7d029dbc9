/* Per-pair locks and statistics shards (alloc/pairs.c, segments/shards.h):
 *   - threads on streams taking turns (each operation finished before the
 *     next starts, on whichever thread): every statistic, peaks included,
 *     equals a one-thread replay of the same operations, blocks freed on
 *     other threads and streams than their own;
 *   - threads running at once: the peaks stay within the bound shards.h
 *     states;
 *   - the thread-local pair of a destroyed allocator is not used by its
 *     successor;
 *   - debug builds stop a thread that takes the locks out of order.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/pairs.h"
#include "alloc/types.h"
#include "alloc_helpers.h"

enum { SH_THREADS = 3, SH_LIVE = 8, SH_TURNS = 1200 };

/* One operation of the log: a malloc on `stream`, or the free of block
   `index` of stream `stream`'s list (made by any thread). */
typedef struct sh_op {
  bool is_free;
  int stream, index;
} sh_op;

/* Blocks live per stream, in malloc order but for frees (the last one
   takes the freed one's place): the same in the run and its replay. */
typedef struct sh_lists {
  void *p[SH_THREADS][SH_LIVE];
  int n[SH_THREADS];
} sh_lists;

/* Sizes per stream: two in the small pool, one in the large, none a
   multiple of another, so that splits leave inactive pieces. */
static const size_t sh_size[SH_THREADS] = {3000, 300 * 1024 + 512,
                                           3 * MiB + 4096};

typedef struct sh_turns {
  xseg_allocator *a;
  CUstream streams[SH_THREADS];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int next;                   /* whose turn */
  int done;                   /* turns taken */
  uint64_t seed;
  sh_lists lists;
  sh_op log[SH_TURNS];
  int errors;
} sh_turns;

/* Applies op to allocator a and the lists; the same code for the run and
   the replay. */
static bool sh_apply(xseg_allocator *a, const CUstream *streams,
                     sh_lists *l, sh_op op) {
  int s = op.stream;
  if (!op.is_free) {
    void *p;
    if (xseg_malloc(a, sh_size[s], streams[s], &p) != XSEG_OK) return false;
    l->p[s][l->n[s]++] = p;
    return true;
  }
  void *p = l->p[s][op.index];
  l->p[s][op.index] = l->p[s][--l->n[s]];
  return xseg_free(a, p) == XSEG_OK;
}

/* The operation of thread `me`'s turn: first every stream fills its list
   and empties it (so that growth only ever creates memory), then a random
   malloc on its own stream or free on any stream's. */
static sh_op sh_choose(sh_turns *t, int me) {
  sh_lists *l = &t->lists;
  int phase = t->done / (SH_THREADS * SH_LIVE);
  if (phase == 0) return (sh_op){false, me, 0};
  if (phase == 1) return (sh_op){true, me, l->n[me] - 1};
  uint64_t r = at_rand(&t->seed);
  int s = (int)(r % SH_THREADS);
  if (r % 3 != 0 && l->n[s] > 0)   /* any stream's block, from this thread */
    return (sh_op){true, s, (int)((r >> 8) % (uint64_t)l->n[s])};
  if (l->n[me] < SH_LIVE) return (sh_op){false, me, 0};
  return (sh_op){true, me, (int)((r >> 8) % (uint64_t)l->n[me])};
}

static void *sh_turn_main(void *arg) {
  sh_turns *t = ((void **)arg)[0];
  int me = (int)(intptr_t)((void **)arg)[1];
  if (xt_context(0) == NULL) return NULL;
  pthread_mutex_lock(&t->mu);
  while (t->done < SH_TURNS) {
    if (t->next != me) {
      pthread_cond_wait(&t->cv, &t->mu);
      continue;
    }
    sh_op op = sh_choose(t, me);
    if (!sh_apply(t->a, t->streams, &t->lists, op)) t->errors++;
    t->log[t->done++] = op;
    /* In the fill and empty phases every thread takes its turns in a row;
       then a random thread goes next. */
    t->next = t->done < 2 * SH_THREADS * SH_LIVE
                  ? t->done % (SH_THREADS * SH_LIVE) / SH_LIVE
                  : (int)(at_rand(&t->seed) % SH_THREADS);
    pthread_cond_broadcast(&t->cv);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* Every statistic as JSON (both pools and all, peaks included). */
static char *sh_json(xseg_allocator *a) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL) return NULL;
  xseg_status st = xseg_stats_json(a, f);
  fclose(f);
  if (st != XSEG_OK) {
    free(buf);
    return NULL;
  }
  return buf;
}

XSEG_TEST(alloc_threads, turns_on_threads_keep_every_stat_and_peak_exact) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  sh_turns *t = calloc(1, sizeof *t);
  t->a = at_create(NULL);
  for (int s = 0; s < SH_THREADS; s++) t->streams[s] = at_stream_new();
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  t->seed = 12345;
  pthread_t th[SH_THREADS];
  void *args[SH_THREADS][2];
  for (int i = 0; i < SH_THREADS; i++) {
    args[i][0] = t;
    args[i][1] = (void *)(intptr_t)i;
    XSEG_ASSERT_EQ(pthread_create(&th[i], NULL, sh_turn_main, args[i]), 0);
  }
  for (int i = 0; i < SH_THREADS; i++) pthread_join(th[i], NULL);
  XSEG_EXPECT_EQ(t->errors, 0);
  XSEG_EXPECT_EQ(t->done, SH_TURNS);
  XSEG_EXPECT_OK(xseg_check(t->a));
  char *got = sh_json(t->a);
  xseg_stats got_stats = at_stats(t->a);

  /* The same operations on this thread alone. */
  xseg_allocator *r = at_create(NULL);
  sh_lists *l = calloc(1, sizeof *l);
  for (int i = 0; i < t->done; i++)
    XSEG_EXPECT_TRUE(sh_apply(r, t->streams, l, t->log[i]));
  char *want = sh_json(r);
  xseg_stats want_stats = at_stats(r);
  XSEG_ASSERT_TRUE(got != NULL && want != NULL);
  XSEG_EXPECT_STREQ(got, want);
  XSEG_EXPECT_EQ(got_stats.allocated_bytes.peak,
                 want_stats.allocated_bytes.peak);
  XSEG_EXPECT_EQ(got_stats.inactive_split_bytes.peak,
                 want_stats.inactive_split_bytes.peak);
  /* Not trivially equal: blocks of every stream were live at once. */
  XSEG_EXPECT_GT(got_stats.allocated_bytes.peak,
                 (int64_t)(SH_LIVE * sh_size[SH_THREADS - 1]));

  for (int s = 0; s < SH_THREADS; s++)
    for (int i = 0; i < l->n[s]; i++) {
      XSEG_EXPECT_OK(xseg_free(r, l->p[s][i]));
      XSEG_EXPECT_OK(xseg_free(t->a, t->lists.p[s][i]));
    }
  free(got);
  free(want);
  free(l);
  xseg_destroy(r);
  xseg_destroy(t->a);
  for (int s = 0; s < SH_THREADS; s++)
    XSEG_EXPECT_CU(cuStreamDestroy(t->streams[s]));
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

/* ---- threads at once: the peak's bound -------------------------------- */

enum { SH_FREE_OPS = 4000 };

typedef struct sh_free_run {
  xseg_allocator *a;
  CUstream stream;
  atomic_int_fast64_t *live;  /* bytes live, all threads (test's count) */
  atomic_int_fast64_t *seen;  /* its largest value */
  int64_t own_max;            /* this thread's largest live bytes */
  uint64_t seed;
  int errors;
} sh_free_run;

static void sh_seen_max(atomic_int_fast64_t *seen, int64_t v) {
  int64_t old = atomic_load(seen);
  while (v > old && !atomic_compare_exchange_weak(seen, &old, v)) {
  }
}

static void *sh_free_main(void *arg) {
  sh_free_run *w = arg;
  if (xt_context(0) == NULL) return NULL;
  void *p[SH_LIVE] = {NULL};
  size_t size[SH_LIVE] = {0};
  int64_t own = 0;
  for (int op = 0; op < SH_FREE_OPS; op++) {
    int i = (int)(at_rand(&w->seed) % SH_LIVE);
    if (p[i] == NULL) {
      size[i] = 512 * (1 + at_rand(&w->seed) % 64);
      if (xseg_malloc(w->a, size[i], w->stream, &p[i]) != XSEG_OK) {
        w->errors++;
        continue;
      }
      own += (int64_t)size[i];
      if (own > w->own_max) w->own_max = own;
      /* Counted after the malloc: at most what the allocator had. */
      sh_seen_max(w->seen, atomic_fetch_add(w->live, (int64_t)size[i]) +
                               (int64_t)size[i]);
    } else {
      /* Uncounted before the free: never above what it had. */
      atomic_fetch_sub(w->live, (int64_t)size[i]);
      if (xseg_free(w->a, p[i]) != XSEG_OK) w->errors++;
      own -= (int64_t)size[i];
      p[i] = NULL;
    }
  }
  for (int i = 0; i < SH_LIVE; i++)
    if (p[i] != NULL && xseg_free(w->a, p[i]) != XSEG_OK) w->errors++;
  return NULL;
}

/* shards.h's bound, in what a test can see: the recorded peak is at least
   what any one shard reached (each threshold is at most the peak), never
   above the sum of what each reached, and at least what the test itself
   saw live at once less what the other threads could add unseen while a
   crossing ran (their whole live sets, if the crossing thread was
   preempted then). */
XSEG_TEST(alloc_threads, peaks_of_threads_at_once_stay_within_the_bound) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  atomic_int_fast64_t live = 0, seen = 0;
  sh_free_run w[SH_THREADS];
  pthread_t th[SH_THREADS];
  for (int i = 0; i < SH_THREADS; i++) {
    w[i] = (sh_free_run){.a = a, .stream = at_stream_new(), .live = &live,
                         .seen = &seen, .seed = 99 + (uint64_t)i};
    XSEG_ASSERT_EQ(pthread_create(&th[i], NULL, sh_free_main, &w[i]), 0);
  }
  int64_t own_sum = 0, own_top = 0;
  for (int i = 0; i < SH_THREADS; i++) {
    pthread_join(th[i], NULL);
    XSEG_EXPECT_EQ(w[i].errors, 0);
    own_sum += w[i].own_max;
    if (w[i].own_max > own_top) own_top = w[i].own_max;
  }
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_GE(s.allocated_bytes.peak, own_top);
  XSEG_EXPECT_LE(s.allocated_bytes.peak, own_sum);
  XSEG_EXPECT_GE(s.allocated_bytes.peak + (own_sum - own_top),
                 (int64_t)atomic_load(&seen));
  XSEG_EXPECT_EQ(s.allocated_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  for (int i = 0; i < SH_THREADS; i++)
    XSEG_EXPECT_CU(cuStreamDestroy(w[i].stream));
}

/* The interleaving that runs at once on two pairs, taken apart on one
   thread: a malloc on pair A reads that nothing is held, pair B defers a
   free (allocation falls, what is held rises: active stays), then A's
   malloc moves its stats without active's look. active_bytes is then 14
   where its recorded peaks say 10 (the bound of segments/shards.h); the read
   reports 14, never a peak below the current. With the look
   (xs_stats_pending_peak, what A does when it sees the hold) the peak is
   recorded and stays when active falls. */
XSEG_TEST(alloc_threads, active_peak_read_is_never_below_its_current) {
  xs_stats_group g;
  xs_stats_group_init(&g);
  xs_stats *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  xs_stats_group_add(&g, a);
  xs_stats_group_add(&g, b);
  const xs_pool_kind k = XS_POOL_SMALL;
  xs_stats_inc(b, XS_GAUGE_allocated_bytes, k, 10);   /* B's malloc */
  xs_stats_dec(b, XS_GAUGE_allocated_bytes, k, 10);   /* B's deferral */
  xs_stats_pending_move(b, XS_GAUGE_active_bytes, k, -10, 0);
  xs_stats_inc(a, XS_GAUGE_allocated_bytes, k, 4);    /* A's malloc */
  xs_stats sum;
  xs_stats_sum(&g, &sum);
  XSEG_EXPECT_EQ(g.peak[XS_STAT_ALL][XS_GAUGE_allocated_bytes], 10);
  XSEG_EXPECT_EQ(g.peak[XS_STAT_ALL][XS_GAUGE_active_bytes], 0);
  for (int scope = 0; scope < 2; scope++) {   /* all, and the small pool */
    xseg_stat act = xs_stats_get(&sum, XS_GAUGE_active_bytes, scope);
    XSEG_EXPECT_EQ(act.current, 14);
    XSEG_EXPECT_EQ(act.peak, 14);
  }
  /* The look records it; A's free lowers active, not its peak. */
  xs_stats_pending_peak(a, k);
  xs_stats_dec(a, XS_GAUGE_allocated_bytes, k, 4);
  xs_stats_sum(&g, &sum);
  xseg_stat act = xs_stats_get(&sum, XS_GAUGE_active_bytes, XS_STAT_ALL);
  XSEG_EXPECT_EQ(act.current, 10);
  XSEG_EXPECT_EQ(act.peak, 14);
  free(a);
  free(b);
}

/* The calling thread keeps its last pair: an allocator made where a
   destroyed one was must not be handed the old one's. */
XSEG_TEST(alloc_threads, a_new_allocator_never_gets_the_old_ones_pair) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream s = at_stream_new();
  for (int round = 0; round < 3; round++) {
    xseg_allocator *a = at_create(NULL);
    void *p, *q;
    XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &p));
    XSEG_ASSERT_OK(xseg_free(a, p));
    XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &q));   /* the cached path */
    XSEG_EXPECT_TRUE(q == p);
    XSEG_EXPECT_OK(xseg_check(a));
    XSEG_EXPECT_OK(xseg_free(a, q));
    xseg_destroy(a);
  }
  XSEG_EXPECT_CU(cuStreamDestroy(s));
}

#ifndef NDEBUG
/* In a child: holds a pair's lock as the cached path does, then asks for
   every lock (the stats), which must abort on the order's assert. */
static void sh_out_of_order(xseg_allocator *a, CUstream s) {
  xs_pair *pair = xs_pairs_of_stream(a, s);
  if (pair == NULL) _exit(2);
  xs_pair_take(pair);
  xseg_stats st;
  xseg_get_stats(a, &st);
  _exit(0);                       /* survived: the order was not checked */
}
#endif

XSEG_TEST(alloc_threads, debug_builds_stop_locks_taken_out_of_order) {
#ifdef NDEBUG
  xt_skip(__FILE__, __LINE__, "release build: no lock-order asserts");
#else
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, s, &p));    /* makes the pair */
  fflush(NULL);
  pid_t child = fork();
  XSEG_ASSERT_TRUE(child >= 0);
  if (child == 0) sh_out_of_order(a, s);
  int status = 0;
  XSEG_ASSERT_EQ(waitpid(child, &status, 0), child);
  XSEG_EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  XSEG_EXPECT_OK(xseg_free(a, p));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
#endif
}
