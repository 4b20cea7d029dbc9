/* Stress: 10^5 random allocations with a byte pattern written into every
   live block through the driver and checked when it is freed; and 4 threads
   on 4 streams with xseg_check at the end. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "alloc_helpers.h"

/* Mostly small, some large, a few huge: log-uniform up to 2^(lo..hi). */
static size_t stress_size(uint64_t *seed) {
  uint64_t r = at_rand(seed);
  unsigned bits = (unsigned)(r % 100 < 90 ? r % 17 : 17 + r % 8);  /* 24 */
  return (size_t)(at_rand(seed) % ((uint64_t)1 << bits)) + (r % 13 == 0);
}

enum { SLOTS = 2048 };

static void stress_random(const char *conf, int ops) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(conf);
  at_live *live = calloc(SLOTS, sizeof *live);
  unsigned *tag = calloc(SLOTS, sizeof *tag);
  uint64_t seed = 1234;
  int bad = 0;
  for (int op = 0; op < ops && bad == 0; op++) {
    int i = (int)(at_rand(&seed) % SLOTS);
    if (live[i].p != NULL) {
      if (!at_verify(live[i].p, live[i].size, tag[i])) bad++;
      if (xseg_free(a, live[i].p) != XSEG_OK) bad++;
      live[i].p = NULL;
      continue;
    }
    size_t size = stress_size(&seed);
    if (xseg_malloc(a, size, NULL, &live[i].p) != XSEG_OK) {
      XSEG_FAIL("malloc(%zu): %s", size, xseg_last_error());
      bad++;
      break;
    }
    if ((uintptr_t)live[i].p % 512 != 0) bad++;
    live[i].size = size;
    tag[i] = (unsigned)op;
    if (!at_fill(live[i].p, size, tag[i])) bad++;
    if (op % 20000 == 0) {
      if (xseg_check(a) != XSEG_OK) XSEG_FAIL("%s", xseg_last_error());
      at_live *all = malloc(SLOTS * sizeof *all);
      size_t n = 0;
      for (int j = 0; j < SLOTS; j++)
        if (live[j].p != NULL) all[n++] = live[j];
      if (!at_disjoint(all, n)) bad++;
      free(all);
      if (op % 40000 == 0) xseg_empty_cache(a);
    }
  }
  XSEG_EXPECT_EQ(bad, 0);
  for (int j = 0; j < SLOTS; j++)
    if (live[j].p != NULL) {
      XSEG_EXPECT_TRUE(at_verify(live[j].p, live[j].size, tag[j]));
      XSEG_EXPECT_OK(xseg_free(a, live[j].p));
    }
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_stats s = at_stats(a);
  XSEG_EXPECT_EQ(s.allocation.current, 0);
  XSEG_EXPECT_EQ(s.requested_bytes.current, 0);
  free(live);
  free(tag);
  xseg_destroy(a);
}

XSEG_TEST(alloc_stress, random_1e5_aligned_disjoint_data_kept) {
  stress_random(NULL, 100000);
}

XSEG_TEST(alloc_stress, random_classic) {
  stress_random("expandable_segments:False", 30000);
}

XSEG_TEST(alloc_stress, random_power2_rounding_large_granules) {
  stress_random("roundup_power2_divisions:4,xseg_large_granule_mb:8", 30000);
}

typedef struct stress_thread {
  xseg_allocator *a;
  CUstream stream;
  uint64_t seed;
  int errors;
} stress_thread;

static void *stress_worker(void *arg) {
  stress_thread *t = arg;
  if (xt_context(0) == NULL) {
    t->errors++;
    return NULL;
  }
  enum { N = 64 };
  at_live live[N] = {{0}};
  for (int op = 0; op < 6000; op++) {
    int i = (int)(at_rand(&t->seed) % N);
    if (live[i].p != NULL) {
      if (!at_verify(live[i].p, live[i].size, 9)) t->errors++;
      if (xseg_free(t->a, live[i].p) != XSEG_OK) t->errors++;
      live[i].p = NULL;
    } else {
      live[i].size = stress_size(&t->seed) % (8 * MiB);
      if (xseg_malloc(t->a, live[i].size, t->stream, &live[i].p) != XSEG_OK)
        t->errors++;
      else if (!at_fill(live[i].p, live[i].size, 9))
        t->errors++;
    }
    if (op % 1500 == 0) xseg_empty_cache(t->a);
  }
  for (int i = 0; i < N; i++)
    if (live[i].p != NULL && xseg_free(t->a, live[i].p) != XSEG_OK)
      t->errors++;
  return NULL;
}

static void stress_threads(const char *conf) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(conf);
  XSEG_ASSERT_TRUE(a != NULL);
  enum { T = 4 };
  stress_thread t[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    t[i] = (stress_thread){.a = a, .seed = 99 + (uint64_t)i};
    XSEG_ASSERT_CU(cuStreamCreate(&t[i].stream, CU_STREAM_NON_BLOCKING));
  }
  for (int i = 0; i < T; i++)
    XSEG_ASSERT_EQ(pthread_create(&th[i], NULL, stress_worker, &t[i]), 0);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < T; i++) XSEG_EXPECT_EQ(t[i].errors, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_EQ(at_stats(a).allocation.current, 0);
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  xseg_destroy(a);
  for (int i = 0; i < T; i++) XSEG_EXPECT_CU(cuStreamDestroy(t[i].stream));
}

XSEG_TEST(alloc_stress, four_threads_four_streams) { stress_threads(NULL); }

XSEG_TEST(alloc_stress, four_threads_classic) {
  stress_threads("expandable_segments:False");
}

XSEG_TEST(alloc_stress, four_threads_granules) {
  stress_threads("xseg_small_granule_mb:4,xseg_large_granule_mb:8,"
                 "xseg_handle_policy:granule,xseg_grow_min_mb:16");
}
