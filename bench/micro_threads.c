/* micro_threads.c: the thread scaling of `xseg-bench micro`: one thread,
 * then two on two streams, then four on four, each doing malloc+free pairs
 * of one size on its own stream from a shared start; throughput is all
 * pairs over the wall time, and glibc's malloc+free in the same loops
 * says what the machine allows.
 *
 * Where the threads ran is part of the result: two threads on the two
 * hardware threads of one core share its execution units, and their
 * scaling then says little about what the allocator shares. Each worker
 * notes its CPU at the end of its loop, the row says whether two of the
 * best run's threads were on one core (sysfs topology), and --pin puts
 * each worker on a core of its own (the lowest CPU of each core this
 * process may use), xseg's and glibc's alike.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "micro.h"

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

/* The physical core of a CPU (its package and core id, from sysfs), or
   -1 where the kernel does not say. */
static long cpu_core(int cpu) {
  long ids[2];
  static const char *const names[2] = {"physical_package_id", "core_id"};
  for (int i = 0; i < 2; i++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s",
             cpu, names[i]);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    int got = fscanf(f, "%ld", &ids[i]);
    fclose(f);
    if (got != 1 || ids[i] < 0) return -1;
  }
  return ids[0] << 20 | ids[1];
}

/* --pin's CPUs: the lowest CPU of each core this process may run on, in
   order, at most `max` (<= XB_THREADS_MAX); how many there are. */
static int pin_cpus(int *out, int max) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 0;
  long cores[XB_THREADS_MAX];              /* out[j]'s core */
  int n = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && n < max; cpu++) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    long core = cpu_core(cpu);
    bool seen = false;
    for (int j = 0; j < n && !seen; j++) seen = core >= 0 && cores[j] == core;
    if (!seen) cores[n] = core, out[n++] = cpu;
  }
  return n;
}

/* Whether two of the n (<= XB_THREADS_MAX) CPUs are one core's hardware
   threads; a CPU of -1 is unknown. */
static bool cpus_share_a_core(const int *cpus, int n) {
  long cores[XB_THREADS_MAX];
  for (int i = 0; i < n; i++) cores[i] = cpus[i] >= 0 ? cpu_core(cpus[i]) : -1;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (cores[i] >= 0 && cpus[i] != cpus[j] && cores[i] == cores[j])
        return true;
  return false;
}

typedef struct xb_worker {
  xseg_allocator *a;              /* NULL: glibc's malloc and free */
  struct CUstream_st *stream;
  struct CUstream_st *side;       /* --record: each block used here too */
  uint64_t pairs;
  xb_start *start;
  int pin;                        /* --pin: its CPU; -1 none */
  int cpu;                        /* where its loop ended */
  uint64_t t0, t1;                /* its loop's start and end (ns) */
  bool ok;
} xb_worker;

static void *worker_main(void *arg) {
  xb_worker *w = arg;
  if (w->pin >= 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(w->pin, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  }
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
  w->cpu = sched_getcpu();
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
                        const int *pins, double *rate, int *cpus) {
  xb_start start = {.n = n};
  atomic_init(&start.arrived, 0);
  xb_worker w[XB_THREADS_MAX];
  pthread_t tid[XB_THREADS_MAX];
  int started = 0;
  for (; started < n; started++) {
    w[started] = (xb_worker){a, streams[started],
                             sides != NULL ? sides[started] : NULL, pairs,
                             &start, pins != NULL ? pins[started] : -1, -1,
                             0, 0, false};
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
    cpus[i] = w[i].cpu;
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
                            struct CUstream_st **sides, const int *pins,
                            xb_threads_row *row) {
  for (int rep = 0; rep < 3; rep++)
    for (int i = 0; i < XB_THREAD_COUNTS; i++)
      for (int j = 0; j < 2; j++) {
        bool glibc = (j + rep) % 2 == 1;
        int n = xb_thread_count[i], cpus[XB_THREADS_MAX];
        double rate, *best = glibc ? &row->glibc_pairs_per_s[i]
                                   : &row->pairs_per_s[i];
        if (!threads_run(glibc ? NULL : a, streams, glibc ? NULL : sides,
                         n, m->pairs, pins, &rate, cpus))
          return false;
        if (rate <= *best) continue;
        *best = rate;
        bool *shared = glibc ? &row->glibc_shared_core[i]
                             : &row->shared_core[i];
        *shared = cpus_share_a_core(cpus, n);
        if (!glibc)
          for (int t = 0; t < n; t++) row->cpus[i][t] = cpus[t];
      }
  return true;
}

bool xb_micro_threads(xb_micro *m, xb_threads_row *row) {
  struct CUstream_st *streams[XB_THREADS_MAX] = {NULL};
  struct CUstream_st *sides[XB_THREADS_MAX] = {NULL};
  *row = (xb_threads_row){.pairs_per_thread = m->pairs,
                          .cores = (int)sysconf(_SC_NPROCESSORS_ONLN),
                          .record = m->record, .pinned = m->pin};
  int pins[XB_THREADS_MAX];
  if (m->pin) {
    /* Fewer cores than threads: the rest wrap around (the row claims no
       scaling beyond the cores anyway). */
    int n = pin_cpus(pins, XB_THREADS_MAX);
    for (int i = n; i < XB_THREADS_MAX; i++) pins[i] = n > 0 ? pins[i % n] : -1;
    row->pinned = n > 0;             /* no CPU set to read: none pinned */
  }
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
  ok = ok && threads_measure(m, a, streams, m->record ? sides : NULL,
                             m->pin ? pins : NULL, row);
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
