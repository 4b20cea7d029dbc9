/* micro.h: what the parts of `xseg-bench micro` share.
 *
 * micro.c runs the command; micro_cached.c the cached-path loops
 * (malloc+free pairs against glibc on the same size sequence);
 * micro_growth.c the growth path
 * (driver calls per GiB mapped); micro_threads.c the 1- vs 2-thread
 * scaling;
 * micro_deferred.c the host cost of a deferred (cross-stream) free.
 */
#ifndef XB_MICRO_H
#define XB_MICRO_H

#include "cli.h"

typedef struct xb_micro {
  xb_cli cli;
  xb_env env;
  const char *only;                 /* one benchmark, or NULL for all */
  uint64_t pairs, live_min, live_max, rounds, seed;
  uint64_t mixed_live;              /* cached-mixed's live set */
  const char *mixed_pools;          /* cached-mixed's sizes: "both" pools,
                                       "small" (under 1 MiB) or "large"
                                       (1..2 MiB) alone */
  uint64_t other_streams;           /* cached-*: pairs of other streams the
                                       allocator holds meanwhile */
  /* deferred: wait for the side stream after each deferred free (outside
     the allocator's calls), so that every malloc finds the last free's
     event fired, whenever the emulator's stream thread runs. */
  bool fired;
  /* threads: each thread records every block on a side stream of its own
     before freeing it (a cross-stream free per pair). */
  bool record;
  /* threads: each worker on a core of its own (micro_threads.c). */
  bool pin;
  bool expandable;
} xb_micro;

/* One size of cached-mixed's sequence (micro_cached.c), drawn with
   splitmix64 state *s: `pools` "both" (1 KiB .. 2 MiB - 1, one request in
   11 above 1 MiB), "small" (1 KiB .. 1 MiB - 1) or "large" (above 1 MiB,
   under 2 MiB). */
uint32_t xb_mixed_size(const char *pools, uint64_t *s);

/* Cached path: ns per malloc+free pair, median over rounds. */
typedef struct xb_cached_row {
  const char *name;                 /* "cached-repeat", "cached-layers",
                                       "cached-random", "cached-mixed" */
  uint64_t live, pairs;
  double xseg_ns, glibc_ns;
} xb_cached_row;

typedef struct xb_growth_row {
  const char *name;                 /* "growth-small", "growth-large" */
  uint64_t mallocs, reserved, vmm_calls;
  double calls_per_gib, ns_per_malloc;
} xb_growth_row;

/* Deferred frees: malloc + record_stream(side stream) + free, against the
   plain malloc + free pair, ns per iteration, median over rounds. */
typedef struct xb_deferred_row {
  uint64_t frees;                   /* deferred frees timed, all rounds */
  double plain_ns, deferred_ns;
  uint64_t events_created;          /* by the deferred loops */
  double records_per_free, queries_per_free;   /* driver calls */
} xb_deferred_row;

/* Threads: 1, 2 and 4 threads, each on its own stream. */
enum { XB_THREAD_COUNTS = 3, XB_THREADS_MAX = 4 };
static const int xb_thread_count[XB_THREAD_COUNTS] = {1, 2, 4};
typedef struct xb_threads_row {
  uint64_t pairs_per_thread;
  int cores;                          /* online CPUs: no claim beyond */
  bool record;                        /* --record: cross-stream frees */
  bool pinned;                        /* --pin */
  double pairs_per_s[XB_THREAD_COUNTS];
  double glibc_pairs_per_s[XB_THREAD_COUNTS];   /* the same loop, glibc */
  /* Of each best run: the CPUs xseg's threads ended on, and whether two
     threads (xseg's, glibc's) were on one core's hardware threads. */
  int cpus[XB_THREAD_COUNTS][XB_THREADS_MAX];
  bool shared_core[XB_THREAD_COUNTS], glibc_shared_core[XB_THREAD_COUNTS];
} xb_threads_row;

/* --pairs at most: cached-random keeps 8 bytes per pair (its victims and
   sizes), 8 GB here; beyond, the arrays' bytes would soon wrap. */
#define XB_MICRO_MAX_PAIRS 1000000000ull

/* The cached-path rows at most (repeat, layers, random at up to seven
   live-set sizes, mixed) and the other streams' pools at most. */
enum { XB_CACHED_ROWS = 10, XB_OTHER_STREAMS_MAX = 16 };

/* A fresh allocator in the micro's mode; prints why on failure. */
bool xb_micro_allocator(xb_micro *m, xseg_allocator **out);
/* The median of v[0..n) (n > 0; v is sorted in place): each micro row is
   the median of its rounds. */
double xb_micro_median(double *v, size_t n);
/* True when benchmark `name` is selected by --only. */
bool xb_micro_selected(const xb_micro *m, const char *name);

/* The selected cached-path cases, a row each appended at rows[*n]
   (micro_cached.c); false (and why, on stderr) when one fails. */
bool xb_micro_cached(xb_micro *m, xb_cached_row *rows, size_t *n);
bool xb_micro_growth(xb_micro *m, const char *name, uint64_t min_size,
                     uint64_t max_size, uint64_t total, xb_growth_row *row);
bool xb_micro_threads(xb_micro *m, xb_threads_row *row);
bool xb_micro_deferred(xb_micro *m, xb_deferred_row *row);

/* The pair loop's result must not be optimised away: glibc's malloc+free
   of an unused pointer is a pair GCC may delete. */
#define XB_ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

#endif /* XB_MICRO_H */
