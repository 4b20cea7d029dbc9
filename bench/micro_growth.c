/* micro_growth.c: the growth path and thread scaling of `xseg-bench micro`.
 *
 * Growth: a fresh allocator takes blocks of random sizes in [min, max] until
 * `total` bytes are live, so every byte it maps is new; the VMM calls that
 * cost (the emulator's counters, or vmm's on a GPU) are divided by the GiB
 * it reserved. Thread scaling: one thread, then two on two streams, then
 * four on four, each doing malloc+free pairs of one size on its own stream
 * from a shared start; throughput is all pairs over the wall time.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "micro.h"

static uint64_t growth_rng(uint64_t *s) {   /* xorshift64 */
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static uint64_t growth_vmm_calls(xb_env *env) {
  uint64_t n = 0;
  for (int f = 0; f < XS_DRIVER_FN_COUNT; f++)
    if (xb_fn_is_vmm((xs_driver_fn)f))
      n += xb_env_call_count(env, (xs_driver_fn)f);
  return n;
}

/* Allocates until `total` bytes are live; the pointers go to *ptrs. */
static bool growth_fill(xseg_allocator *a, uint64_t min, uint64_t max,
                        uint64_t total, void ***ptrs, uint64_t *n,
                        uint64_t *ns) {
  uint64_t cap = 1024, seed = 0x2545f4914f6cdd1dull, live = 0;
  *ptrs = malloc(cap * sizeof **ptrs);
  *n = *ns = 0;
  while (*ptrs != NULL && live < total) {
    if (*n == cap) {
      void **p = realloc(*ptrs, (cap *= 2) * sizeof *p);
      if (p == NULL) return false;
      *ptrs = p;
    }
    uint64_t size = min + growth_rng(&seed) % (max - min + 1);
    uint64_t t0 = xb_now_ns();
    if (xseg_malloc(a, size, NULL, &(*ptrs)[*n]) != XSEG_OK) return false;
    *ns += xb_now_ns() - t0;
    (*n)++;
    live += size;
  }
  return *ptrs != NULL;
}

bool xb_micro_growth(xb_micro *m, const char *name, uint64_t min_size,
                     uint64_t max_size, uint64_t total, xb_growth_row *row) {
  xseg_allocator *a;
  xb_env_reset_counts(&m->env);
  if (!xb_micro_allocator(m, &a)) return false;
  void **ptrs = NULL;
  uint64_t n = 0, ns = 0;
  bool ok = growth_fill(a, min_size, max_size, total, &ptrs, &n, &ns);
  xseg_stats s;
  ok = ok && xseg_get_stats(a, &s) == XSEG_OK;
  if (ok) {
    uint64_t calls = growth_vmm_calls(&m->env);
    double gib = (double)s.reserved_bytes.peak / (double)(1ull << 30);
    *row = (xb_growth_row){name, n, (uint64_t)s.reserved_bytes.peak, calls,
                           gib > 0 ? (double)calls / gib : 0.0,
                           n ? (double)ns / (double)n : 0.0};
  } else {
    fprintf(stderr, "xseg-bench micro: %s failed after %llu mallocs: %s\n",
            name, (unsigned long long)n, xseg_last_error());
  }
  for (uint64_t i = 0; ptrs != NULL && i < n; i++) xseg_free(a, ptrs[i]);
  free(ptrs);
  xseg_destroy(a);
  return ok;
}

/* The workers' start: each spins, yielding its core, until every one has
   arrived, and only then reads its clock. With a blocking barrier the
   clock started while a thread could still be waking (on a virtual
   machine an idle virtual CPU takes a while to run again), and that wait
   counted against whichever loop ran first after an idle core: xseg's
   two threads came right after glibc's one. */
typedef struct xb_start {
  atomic_int arrived;
  int n;
} xb_start;

static void start_wait(xb_start *s) {
  atomic_fetch_add(&s->arrived, 1);
  while (atomic_load(&s->arrived) < s->n) sched_yield();
}

typedef struct xb_worker {
  xseg_allocator *a;              /* NULL: glibc's malloc and free */
  struct CUstream_st *stream;
  struct CUstream_st *side;       /* --record: each block used here too */
  uint64_t pairs;
  xb_start *start;
  uint64_t t0, t1;                /* its loop's start and end (ns) */
  bool ok;
} xb_worker;

static void *worker_main(void *arg) {
  xb_worker *w = arg;
  start_wait(w->start);
  /* Locals: the workers' structs share a cache line, and a store to it
     on every pair would make the threads contend in the benchmark
     itself. */
  xseg_allocator *a = w->a;
  struct CUstream_st *stream = w->stream, *side = w->side;
  uint64_t pairs = w->pairs;
  bool ok = true;
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < pairs && a == NULL; i++) {
    void *p = malloc(4096);
    XB_ESCAPE(p);
    free(p);
  }
  for (uint64_t i = 0; i < pairs && a != NULL && ok; i++) {
    void *p;
    ok = xseg_malloc(a, 4096, stream, &p) == XSEG_OK &&
         (side == NULL || xseg_record_stream(a, p, side) == XSEG_OK) &&
         xseg_free(a, p) == XSEG_OK;
  }
  w->t1 = xb_now_ns();
  w->t0 = t0;
  w->ok = ok;
  return NULL;
}

/* Pairs per second of n threads started together, one stream each (and
   one side stream each that every block is recorded on, when `sides`);
   `a` NULL: glibc's malloc and free, each thread its own loop. The time
   runs from the first thread's start to the last one's end. */
static bool threads_run(xseg_allocator *a, struct CUstream_st **streams,
                        struct CUstream_st **sides, int n, uint64_t pairs,
                        double *rate) {
  xb_start start = {.n = n};
  atomic_init(&start.arrived, 0);
  xb_worker w[XB_THREADS_MAX];
  pthread_t tid[XB_THREADS_MAX];
  int started = 0;
  for (; started < n; started++) {
    w[started] = (xb_worker){a, streams[started],
                             sides != NULL ? sides[started] : NULL, pairs,
                             &start, 0, 0, false};
    if (pthread_create(&tid[started], NULL, worker_main, &w[started])) break;
  }
  bool ok = started == n;
  if (!ok) {
    fprintf(stderr, "xseg-bench micro: cannot start a thread\n");
    /* The threads that did start must not wait for the others. */
    atomic_fetch_add(&start.arrived, n - started);
  }
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (int i = 0; i < started; i++) {
    if (w[i].t0 < t0) t0 = w[i].t0;
    if (w[i].t1 > t1) t1 = w[i].t1;
  }
  *rate = ok ? (double)n * (double)pairs / ((double)(t1 - t0) * 1e-9) : 0;
  for (int i = 0; ok && i < n; i++) ok = w[i].ok;
  return ok;
}

/* Best of three for each thread count: on a shared machine the best run is
   the one least disturbed. glibc's loop runs beside each, so that its
   scaling, measured in the same moments, says what the machine allows;
   which of the two goes first alternates, so that neither always follows
   the other's idle cores. */
static bool threads_measure(xb_micro *m, xseg_allocator *a,
                            struct CUstream_st **streams,
                            struct CUstream_st **sides, xb_threads_row *row) {
  for (int rep = 0; rep < 3; rep++)
    for (int i = 0; i < XB_THREAD_COUNTS; i++)
      for (int j = 0; j < 2; j++) {
        bool glibc = (j + rep) % 2 == 1;
        double rate, *best = glibc ? &row->glibc_pairs_per_s[i]
                                   : &row->pairs_per_s[i];
        if (!threads_run(glibc ? NULL : a, streams, glibc ? NULL : sides,
                         xb_thread_count[i], m->pairs, &rate))
          return false;
        if (rate > *best) *best = rate;
      }
  return true;
}

bool xb_micro_threads(xb_micro *m, xb_threads_row *row) {
  struct CUstream_st *streams[XB_THREADS_MAX] = {NULL};
  struct CUstream_st *sides[XB_THREADS_MAX] = {NULL};
  *row = (xb_threads_row){.pairs_per_thread = m->pairs,
                          .cores = (int)sysconf(_SC_NPROCESSORS_ONLN),
                          .record = m->record};
  xseg_allocator *a = NULL;
  bool ok = true;
  for (int i = 0; ok && i < XB_THREADS_MAX; i++)
    ok = xb_env_stream_create(&m->env, &streams[i]) == XSEG_OK &&
         (!m->record || xb_env_stream_create(&m->env, &sides[i]) == XSEG_OK);
  ok = ok && xb_micro_allocator(m, &a);
  /* Every stream's pair made before any run: the first one-thread run
     would otherwise be the only one with a single pair in the allocator,
     whose cached path does less (no stats to publish to other pairs'
     crossings: bench/README.md), and the best of three would compare
     that with two threads beside other pairs. */
  for (int i = 0; ok && i < XB_THREADS_MAX; i++) {
    void *p;
    ok = xseg_malloc(a, 4096, streams[i], &p) == XSEG_OK &&
         xseg_free(a, p) == XSEG_OK;
  }
  ok = ok && threads_measure(m, a, streams, m->record ? sides : NULL, row);
  if (!ok)
    fprintf(stderr, "xseg-bench micro: threads failed: %s\n",
            xseg_last_error());
  xseg_destroy(a);
  for (int i = 0; i < XB_THREADS_MAX; i++) {
    xb_env_stream_destroy(&m->env, streams[i]);
    xb_env_stream_destroy(&m->env, sides[i]);
  }
  return ok;
}
