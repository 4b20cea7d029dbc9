/* Host out of memory, swept (SQLite's malloc fault test): a scenario of
 * the public API runs again and again, and run n makes the library's nth
 * allocation from the host heap fail (malloc, calloc, realloc and
 * aligned_alloc, wrapped at link time: tests/CMakeLists.txt), until a run
 * makes fewer; then again with every allocation after the nth failing too
 * (the heap stays exhausted). Every call must then succeed or return
 * XSEG_ERR_OUT_OF_MEMORY, the allocator must stay consistent (xseg_check), and
 * when the scenario ends nothing may be left: every block frees, every
 * handle, mapping and reservation goes back to the driver (the harness
 * checks), and the sanitizer builds' leak check sees no host memory lost.
 * A second sweep fails the allocations of xseg_check itself, and of the
 * debug builds' check after every operation (XSEG_DEBUG_CHECK): they must
 * say "out of host memory", never report or abort on a broken invariant.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/torch.h"
#include "alloc_helpers.h"
#include "sim_helpers.h"

/* ---- the failing heap --------------------------------------------------- */

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__real_aligned_alloc(size_t alignment, size_t size);

/* Allocations left before the one that fails; -1: none fails. Atomic: the
   emulator's threads never allocate through the wrappers (it is a shared
   library of its own), but a host callback of the library could.
   `oom_persistent`: every allocation after that one fails too (the heap
   stays exhausted), until the test pauses the countdown. */
static _Atomic long oom_countdown = -1;
static _Atomic bool oom_fired, oom_persistent;

static bool oom_now(void) {
  if (atomic_load(&oom_countdown) < 0) return false;
  if (atomic_load(&oom_fired) && atomic_load(&oom_persistent)) return true;
  if (atomic_fetch_sub(&oom_countdown, 1) != 0) return false;
  atomic_store(&oom_fired, true);
  return true;
}

void *__wrap_malloc(size_t size) {
  return oom_now() ? NULL : __real_malloc(size);
}
void *__wrap_calloc(size_t n, size_t size) {
  return oom_now() ? NULL : __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t size) {
  return oom_now() ? NULL : __real_realloc(p, size);
}
void *__wrap_aligned_alloc(size_t alignment, size_t size) {
  return oom_now() ? NULL : __real_aligned_alloc(alignment, size);
}

/* The countdown stops while the test itself checks. */
static long oom_pause(void) { return atomic_exchange(&oom_countdown, -1); }
static void oom_resume(long left) { atomic_store(&oom_countdown, left); }

/* ---- the scenario ------------------------------------------------------- */

enum { BLOCKS = 24 };

typedef struct run {
  xseg_allocator *a, *b;        /* b opens what a exports */
  CUstream side;
  void *p[BLOCKS];
} run;

/* A call's status: OK, or out of memory after the failure fired; both
   allocators consistent after it. */
static void step(run *r, xseg_status st, const char *what) {
  if (st == XSEG_OK) return;
  long left = oom_pause();
  if (!XSEG_EXPECT_EQ(st, XSEG_ERR_OUT_OF_MEMORY) ||
      !XSEG_EXPECT_TRUE(atomic_load(&oom_fired)))
    fprintf(stderr, "%s: %s\n", what, xseg_last_error());
  if (!XSEG_EXPECT_OK(xseg_check(r->a)) ||
      (r->b != NULL && !XSEG_EXPECT_OK(xseg_check(r->b))))
    fprintf(stderr, "after %s\n", what);
  oom_resume(left);
}

static size_t block_size(int i) {
  static const size_t sizes[] = {512, 3000, 64 << 10, 1 << 20, 3 << 20,
                                 (1 << 20) + 512};
  return sizes[i % 6];
}

/* The public API's ways to allocate host memory, once each or more:
   pairs of two streams, the pointer table, the pending frees' events and
   queues, a graph pool, the trace, IPC (export, a ticket, an interprocess
   event, open and close), growth, release and the stats. */
static void scenario(run *r) {
  CUstream streams[2] = {NULL, r->side};
  for (int i = 0; i < BLOCKS; i++)
    step(r, xseg_malloc(r->a, block_size(i), streams[i % 2], &r->p[i]),
         "xseg_malloc");
  for (int i = 0; i < BLOCKS; i += 3)
    if (r->p[i] != NULL)
      step(r, xseg_record_stream(r->a, r->p[i], streams[(i + 1) % 2]),
           "xseg_record_stream");
  for (int i = 0; i < BLOCKS; i += 2)
    if (r->p[i] != NULL) {
      xseg_status st = xseg_free(r->a, r->p[i]);
      step(r, st, "xseg_free");
      if (st == XSEG_OK) r->p[i] = NULL;
    }
  /* A graph pool: begun, a block in it, ended, released (each step only
     if the one it needs went through). */
  xseg_status begun = xseg_begin_allocate_to_pool(r->a, 5, r->side);
  step(r, begun, "xseg_begin_allocate_to_pool");
  void *in_pool = NULL;
  if (begun == XSEG_OK) {
    step(r, xseg_malloc(r->a, 4096, r->side, &in_pool), "malloc in the pool");
    step(r, xseg_end_allocate_to_pool(r->a, 5), "xseg_end_allocate_to_pool");
  }
  if (in_pool != NULL) {
    xseg_status st = xseg_free(r->a, in_pool);
    step(r, st, "free in the pool");
    if (st != XSEG_OK) {                /* still live: it frees later */
      long left = oom_pause();
      XSEG_EXPECT_OK(xseg_free(r->a, in_pool));
      oom_resume(left);
    }
    step(r, xseg_release_pool(r->a, 5), "xseg_release_pool");
  }
  step(r, xseg_record_memory_history(r->a, 64),
       "xseg_record_memory_history");
  for (int i = 0; i < BLOCKS; i += 2)
    if (r->p[i] == NULL)                /* its free went through */
      step(r, xseg_malloc(r->a, block_size(i + 1), NULL, &r->p[i]),
           "xseg_malloc again");
  /* A block shared with a second allocator of this process: export,
     open, close (the tables, the mapping's handles). */
  if (r->b != NULL && r->p[1] != NULL) {
    xseg_ipc_handle *h = NULL;
    xseg_status st = xseg_ipc_export(r->a, r->p[1], &h);
    step(r, st, "xseg_ipc_export");
    /* A ticket keeps the block for the consumer; an event orders the
       consumer's stream after the producer's. */
    uint64_t ticket = 0;
    xseg_status took = XSEG_ERR_INVALID_ARGUMENT;
    if (st == XSEG_OK) {
      took = xseg_ipc_ticket_take(r->a, r->p[1], &ticket);
      step(r, took, "xseg_ipc_ticket_take");
    }
    unsigned char ev[XSEG_IPC_EVENT_BYTES];
    xseg_status recorded = xseg_ipc_record(r->a, r->side, ev);
    step(r, recorded, "xseg_ipc_record");
    void *q = NULL;
    if (st == XSEG_OK) {
      st = xseg_ipc_open(r->b, h, &q);
      step(r, st, "xseg_ipc_open");
    }
    if (recorded == XSEG_OK)
      step(r, xseg_ipc_wait(r->b, ev, r->side), "xseg_ipc_wait");
    if (took == XSEG_OK) {
      /* The consumer's, once it opened; else the producer's own. */
      xseg_status given = q != NULL
                              ? xseg_ipc_ticket_give(r->b, q, ticket)
                              : xseg_ipc_ticket_give(r->a, r->p[1], ticket);
      step(r, given, "xseg_ipc_ticket_give");
      if (given != XSEG_OK) {           /* given back once the heap works */
        long left = oom_pause();
        XSEG_EXPECT_OK(q != NULL ? xseg_ipc_ticket_give(r->b, q, ticket)
                                 : xseg_ipc_ticket_give(r->a, r->p[1],
                                                        ticket));
        oom_resume(left);
      }
    }
    if (q != NULL) step(r, xseg_ipc_close(r->b, q), "xseg_ipc_close");
    xseg_ipc_handle_free(h);
  }
  step(r, xseg_empty_cache(r->a), "xseg_empty_cache");
  xseg_stats s;
  step(r, xseg_get_stats(r->a, &s), "xseg_get_stats");
  step(r, xseg_set_memory_fraction(r->a, 0.5), "xseg_set_memory_fraction");
}

/* Run n: the nth allocation fails. True when it did fail (there may be
   more to sweep). */
static bool sweep_once(long n, CUstream side) {
  run r = {.side = side};
  atomic_store(&oom_fired, false);
  oom_resume(n);
  char conf[64];
  at_conf(NULL, conf, sizeof conf);
  xseg_status st = xseg_create(0, conf, &r.a);
  if (st == XSEG_OK) {
    st = xseg_create(0, conf, &r.b);
    if (st != XSEG_OK) {
      XSEG_EXPECT_EQ(st, XSEG_ERR_OUT_OF_MEMORY);
      XSEG_EXPECT_TRUE(r.b == NULL);
    }
    scenario(&r);
  } else {
    XSEG_EXPECT_EQ(st, XSEG_ERR_OUT_OF_MEMORY);
    XSEG_EXPECT_TRUE(r.a == NULL);
  }
  oom_pause();
  bool fired = atomic_load(&oom_fired);
  if (r.a != NULL) {
    /* Everything still live frees, and the allocator lets go of it all. */
    for (int i = 0; i < BLOCKS; i++)
      if (r.p[i] != NULL) XSEG_EXPECT_OK(xseg_free(r.a, r.p[i]));
    XSEG_EXPECT_OK(xseg_empty_cache_blocking(r.a));
    XSEG_EXPECT_OK(xseg_check(r.a));
    xseg_stats s;
    XSEG_EXPECT_OK(xseg_get_stats(r.a, &s));
    if (!XSEG_EXPECT_EQ(s.allocation.current, 0) ||
        !XSEG_EXPECT_EQ(s.reserved_bytes.current, 0))
      fprintf(stderr, "run %ld\n", n), xseg_snapshot_json(r.a, stderr);
    if (r.b != NULL) {
      XSEG_EXPECT_OK(xseg_check(r.b));
      xseg_destroy(r.b);
    }
    xseg_destroy(r.a);
  }
  return fired;
}

/* Once each allocation (`persistent` false), or each and every one after
   it. */
static void sweep(bool persistent) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream side = at_stream_new();
  XSEG_ASSERT_TRUE(side != NULL);
  xsim_live before, after;
  if (xt_have_sim()) xsim_get_live(&before);
  atomic_store(&oom_persistent, persistent);
  long n = 0;
  while (n < 100000 && sweep_once(n, side)) n++;
  atomic_store(&oom_persistent, false);
  XSEG_EXPECT_GE(n, 20);          /* the scenario allocates that much */
  XSEG_EXPECT_LT(n, 100000);      /* and ends */
  fprintf(stderr, "host_oom: %ld allocations, each failed in turn%s\n", n,
          persistent ? " and every one after it" : "");
  if (xt_have_sim()) {
    xsim_get_live(&after);
    XSEG_EXPECT_EQ(after.handles, before.handles);
    XSEG_EXPECT_EQ(after.mappings, before.mappings);
    XSEG_EXPECT_EQ(after.reservations, before.reservations);
  }
  XSEG_EXPECT_CU(cuStreamDestroy(side));
}

XSEG_TEST(host_oom, every_host_allocation_may_fail) { sweep(false); }

XSEG_TEST(host_oom, the_heap_may_stay_exhausted) { sweep(true); }

/* xseg_check out of host memory says so (XSEG_ERR_OUT_OF_MEMORY), not
   that an invariant broke; and a debug build's check after an operation
   skips, where it used to abort. */
XSEG_TEST(host_oom, checks_out_of_memory_say_so) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream side = at_stream_new();
  XSEG_ASSERT_TRUE(side != NULL);
  /* Created with the debug builds' check after every operation. */
  const char *was = getenv("XSEG_DEBUG_CHECK");
  char *saved = was != NULL ? strdup(was) : NULL;
  setenv("XSEG_DEBUG_CHECK", "1", 1);
  xseg_allocator *a = at_create(NULL);
  if (saved != NULL) setenv("XSEG_DEBUG_CHECK", saved, 1);
  else unsetenv("XSEG_DEBUG_CHECK");
  free(saved);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p[4] = {NULL};
  for (int i = 0; i < 4; i++)
    XSEG_EXPECT_OK(xseg_malloc(a, block_size(i + 2), i % 2 ? side : NULL,
                               &p[i]));
  long n = 0, refused = 0;
  for (;; n++) {
    atomic_store(&oom_fired, false);
    oom_resume(n);
    xseg_status st = xseg_check(a);
    oom_pause();
    if (!atomic_load(&oom_fired)) {
      XSEG_EXPECT_OK(st);
      break;
    }
    /* OK when the allocation that failed was the debug check's after
       xseg_check (debug builds), which skips. */
    if (st == XSEG_OK) continue;
    refused++;
    XSEG_EXPECT_EQ(st, XSEG_ERR_OUT_OF_MEMORY);
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "out of host memory") != NULL);
  }
  XSEG_EXPECT_GE(refused, 2);  /* its context, then its arrays and sums */
  /* A malloc and free whose checks run out of host memory in turn. */
  for (n = 0;; n++) {
    atomic_store(&oom_fired, false);
    oom_resume(n);
    void *q = NULL;
    xseg_status st = xseg_malloc(a, 3000, side, &q);
    if (st == XSEG_OK) st = xseg_free(a, q);
    oom_pause();
    if (st != XSEG_OK) {
      XSEG_EXPECT_EQ(st, XSEG_ERR_OUT_OF_MEMORY);
      if (q != NULL) XSEG_EXPECT_OK(xseg_free(a, q));
    }
    if (!atomic_load(&oom_fired)) break;
  }
  for (int i = 0; i < 4; i++) XSEG_EXPECT_OK(xseg_free(a, p[i]));
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(side));
}

/* PyTorch's entry points, swept the same way: the allocator made on first
   use, a malloc, record_stream, a graph pool, empty_cache, the JSON
   strings. A NULL from xseg_torch_malloc (or a failed void entry point)
   keeps an out-of-memory failure for xseg_torch_last_error, PyTorch's
   OutOfMemoryError; nothing crashes, and once the heap works again the
   allocator is consistent and every block frees. */
/* After one entry point: its kept failure, if any, is the injected out of
   memory (PyTorch's glue raises it after the call). True when it kept one;
   the failure is cleared for the next. */
static bool torch_kept(long run_n, long *kept, const char *what) {
  xseg_status st = xseg_torch_last_status();
  if (st == XSEG_OK) return false;
  (*kept)++;
  long left = oom_pause();
  if (!XSEG_EXPECT_EQ(st, XSEG_ERR_OUT_OF_MEMORY) ||
      !XSEG_EXPECT_TRUE(atomic_load(&oom_fired)))
    fprintf(stderr, "run %ld, %s: %s\n", run_n, what, xseg_torch_last_error());
  xseg_torch_clear_error();
  oom_resume(left);
  return true;
}

XSEG_TEST(host_oom, torch_entry_points_keep_the_failure) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  char conf[64];
  setenv("XSEG_ALLOC_CONF", at_conf(NULL, conf, sizeof conf), 1);
  CUstream side = at_stream_new();
  XSEG_ASSERT_TRUE(side != NULL);
  long n = 0, kept = 0;
  for (;; n++) {
    xseg_torch_clear_error();
    atomic_store(&oom_fired, false);
    oom_resume(n);
    void *p = xseg_torch_malloc(3 << 20, 0, side);
    torch_kept(n, &kept, "malloc");
    void *q = xseg_torch_malloc(4096, 0, NULL);
    torch_kept(n, &kept, "malloc on the legacy stream");
    if (p != NULL) {
      xseg_torch_record_stream(p, NULL);
      torch_kept(n, &kept, "record_stream");
    }
    void *in_pool = NULL;
    xseg_torch_begin_allocate_to_pool(0, 1, 9, side);
    bool begun = !torch_kept(n, &kept, "begin_allocate_to_pool");
    if (begun) {
      in_pool = xseg_torch_malloc(512, 0, side);
      torch_kept(n, &kept, "malloc in the pool");
      xseg_torch_end_allocate_to_pool(0, 1, 9);
      torch_kept(n, &kept, "end_allocate_to_pool");
    }
    char *snap = xseg_torch_snapshot_json(0);
    torch_kept(n, &kept, "snapshot_json");
    char *stats = xseg_torch_stats_json(0);
    torch_kept(n, &kept, "stats_json");
    oom_pause();
    bool fired = atomic_load(&oom_fired);
    if (!fired) {
      XSEG_EXPECT_TRUE(p != NULL && q != NULL && in_pool != NULL);
      XSEG_EXPECT_TRUE(snap != NULL && stats != NULL);
    }
    xseg_torch_string_free(snap);
    xseg_torch_string_free(stats);
    if (in_pool != NULL) xseg_torch_free(in_pool, 512, 0, side);
    if (begun) xseg_torch_release_pool(0, 1, 9);
    if (q != NULL) xseg_torch_free(q, 4096, 0, NULL);
    if (p != NULL) xseg_torch_free(p, 3 << 20, 0, side);
    XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
    XSEG_EXPECT_CU(cuCtxSynchronize());
    xseg_torch_empty_cache();
    if (xseg_torch_has_allocator(0)) {
      xseg_allocator *a = xseg_torch_allocator(0);
      XSEG_EXPECT_OK(xseg_check(a));
      xseg_stats st;
      XSEG_EXPECT_OK(xseg_get_stats(a, &st));
      XSEG_EXPECT_EQ(st.allocation.current, 0);
    }
    xs_torch_destroy_all();
    if (!fired) break;
  }
  XSEG_EXPECT_GE(kept, 3);
  fprintf(stderr, "host_oom: the torch entry points made %ld allocations, "
          "%ld failures kept\n", n, kept);
  XSEG_EXPECT_CU(cuStreamDestroy(side));
}
