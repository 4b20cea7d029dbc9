/* Stress: 4 threads, each allocating on its own stream of 4, writing every
   block's pattern on that stream, handing blocks to random other streams
   (record_stream, ordered after the owner's write by an event) that write
   the same pattern again, some of them behind delayed work (a host function
   that sleeps), and freeing them. A block reused before the work of its
   previous owner's streams finished would receive a stale pattern: every
   block is checked before it is freed. The device is small, so memory also
   moves between streams (growth at the limit) and empty_cache runs now and
   then. xseg_check at the end; no deadlock (ctest's timeout).

   Under ThreadSanitizer the other streams read the block (a copy into a
   scratch buffer of their own) instead of writing it: the emulator's device
   memory is host memory, so the same-value writes racing with the check
   would be reported, while a read racing with a new owner's write is
   exactly the early reuse that TSan should then report.

   XSEG_STRESS_OPS sets the total operation count. The default is 10^5
   (about 6 s on 2 cores); sanitizer builds default to fewer (ASan 5*10^4,
   TSan 2*10^4) to stay inside ctest's timeout. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "alloc_helpers.h"

enum { THREADS = 4, STREAMS = 4, SLOTS = 48 };

typedef struct stress_ctx {
  xseg_allocator *a;
  CUstream streams[STREAMS];
} stress_ctx;

typedef struct stress_thread {
  stress_ctx *ctx;
  int id;
  long ops;
  uint64_t seed;
  int errors;
  CUevent written;                  /* orders other streams after ours */
  void *scratch[STREAMS];           /* each written by its stream alone */
} stress_thread;

#if defined(__SANITIZE_THREAD__)
#define STRESS_SHARE_READS 1
#else
#define STRESS_SHARE_READS 0
#endif

typedef struct stress_block {
  void *p;
  size_t size;
  unsigned char tag;
} stress_block;

static void delay_host(void *arg) { usleep((useconds_t)(uintptr_t)arg); }

static size_t stress_size(uint64_t *seed) {
  uint64_t r = at_rand(seed);
  if (r % 8 == 0) return (size_t)(1 + at_rand(seed) % (6 * MiB));  /* large */
  return (size_t)(1 + at_rand(seed) % (64 * 1024));
}

/* Writes the pattern on `s` over the first and last KiB (all if small). */
static bool stress_write(stress_block *b, CUstream s) {
  size_t span = b->size < 2048 ? b->size : 1024;
  CUdeviceptr d = at_dptr(b->p);
  return cuMemsetD8Async(d, b->tag, span, s) == CUDA_SUCCESS &&
         cuMemsetD8Async(d + b->size - span, b->tag, span, s) == CUDA_SUCCESS;
}

/* Reads the pattern back once the owner's stream is done with it: what
   stress_write wrote, the first and last KiB (or the whole small block). */
static bool stress_verify(stress_block *b, CUstream own) {
  unsigned char buf[2048];
  size_t span = b->size < 2048 ? b->size : 1024;
  size_t n = b->size < 2048 ? b->size : 2048;
  if (cuStreamSynchronize(own) != CUDA_SUCCESS ||
      cuMemcpyDtoH(buf, at_dptr(b->p), span) != CUDA_SUCCESS)
    return false;
  if (n > span &&
      cuMemcpyDtoH(buf + span, at_dptr(b->p) + b->size - span, span) !=
          CUDA_SUCCESS)
    return false;
  for (size_t i = 0; i < n; i++)
    if (buf[i] != b->tag) return false;
  return true;
}

/* The use of another stream: the pattern again, or (TSan) a read. */
static bool stress_use(stress_thread *t, stress_block *b, int x) {
  CUstream other = t->ctx->streams[x];
  if (!STRESS_SHARE_READS) return stress_write(b, other);
  size_t n = b->size < 1024 ? b->size : 1024;
  return cuMemcpyDtoDAsync(at_dptr(t->scratch[x]), at_dptr(b->p), n, other) ==
         CUDA_SUCCESS;
}

/* Another stream uses the block after the owner's write: maybe behind a
   delay; and the allocator is told. */
static bool stress_share(stress_thread *t, stress_block *b) {
  int x = (int)(at_rand(&t->seed) % STREAMS);
  CUstream own = t->ctx->streams[t->id], other = t->ctx->streams[x];
  if (cuEventRecord(t->written, own) != CUDA_SUCCESS ||
      cuStreamWaitEvent(other, t->written, 0) != CUDA_SUCCESS)
    return false;
  if (at_rand(&t->seed) % 4 == 0 &&
      cuLaunchHostFunc(other, delay_host,
                       (void *)(uintptr_t)(50 + at_rand(&t->seed) % 300)) !=
          CUDA_SUCCESS)
    return false;
  return stress_use(t, b, x) &&
         xseg_record_stream(t->ctx->a, b->p, other) == XSEG_OK;
}

static void stress_op(stress_thread *t, stress_block *slot) {
  CUstream own = t->ctx->streams[t->id];
  xseg_allocator *a = t->ctx->a;
  if (slot->p == NULL) {
    slot->size = stress_size(&t->seed);
    slot->tag = (unsigned char)(1 + at_rand(&t->seed) % 255);
    if (xseg_malloc(a, slot->size, own, &slot->p) != XSEG_OK) {
      slot->p = NULL;        /* out of memory under pressure is allowed */
      return;
    }
    if (!stress_write(slot, own)) t->errors++;
  } else if (at_rand(&t->seed) % 3 == 0) {
    if (!stress_share(t, slot)) t->errors++;
  } else {
    if (!stress_verify(slot, own)) {
      fprintf(stderr, "thread %d: block %p (%zu B) lost its pattern\n",
              t->id, slot->p, slot->size);
      t->errors++;
    }
    if (xseg_free(a, slot->p) != XSEG_OK) t->errors++;
    slot->p = NULL;
  }
}

/* The thread's event and scratch buffers (one per stream, on it). */
static bool stress_thread_setup(stress_thread *t) {
  if (xt_context(0) == NULL ||
      cuEventCreate(&t->written, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
    return false;
  for (int x = 0; x < STREAMS; x++)
    if (xseg_malloc(t->ctx->a, 1024, t->ctx->streams[x], &t->scratch[x]) !=
        XSEG_OK)
      return false;
  return true;
}

static void stress_thread_teardown(stress_thread *t) {
  for (int x = 0; x < STREAMS; x++) {
    if (t->scratch[x] == NULL) continue;
    /* Its stream's copies may still be writing into it. */
    if (cuStreamSynchronize(t->ctx->streams[x]) != CUDA_SUCCESS ||
        xseg_free(t->ctx->a, t->scratch[x]) != XSEG_OK)
      t->errors++;
  }
  if (t->written != NULL) cuEventDestroy(t->written);
}

static void *stress_worker(void *arg) {
  stress_thread *t = arg;
  if (!stress_thread_setup(t)) {
    t->errors++;
    stress_thread_teardown(t);
    return NULL;
  }
  stress_block slot[SLOTS];
  memset(slot, 0, sizeof slot);
  for (long op = 0; op < t->ops && t->errors == 0; op++) {
    stress_op(t, &slot[at_rand(&t->seed) % SLOTS]);
    if (op % 2000 == 1999) xseg_empty_cache(t->ctx->a);
  }
  for (int i = 0; i < SLOTS; i++)
    if (slot[i].p != NULL) {
      if (!stress_verify(&slot[i], t->ctx->streams[t->id])) t->errors++;
      if (xseg_free(t->ctx->a, slot[i].p) != XSEG_OK) t->errors++;
    }
  stress_thread_teardown(t);
  return NULL;
}

#if defined(__SANITIZE_THREAD__)
#define STRESS_DEFAULT_OPS 20000
#elif defined(__SANITIZE_ADDRESS__)
#define STRESS_DEFAULT_OPS 50000
#else
#define STRESS_DEFAULT_OPS 100000
#endif

static long stress_ops(void) {
  const char *env = getenv("XSEG_STRESS_OPS");
  long n = env != NULL ? atol(env) : STRESS_DEFAULT_OPS;
  return n > 0 ? n : STRESS_DEFAULT_OPS;
}

/* The whole stress on an allocator configured by `conf`, `ops` in all: on
   a 96 MiB device on the emulator; on a GPU a 96 MiB memory-fraction cap
   stands for it. */
static void stress_streams(const char *conf, long ops) {
  if (xt_have_sim()) xsim_set_device_memory(0, 96 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  stress_ctx ctx = {.a = xt_have_sim() ? at_create(conf)
                                       : at_create_capped(conf, 96 * MiB)};
  XSEG_ASSERT_TRUE(ctx.a != NULL);
  for (int i = 0; i < STREAMS; i++)
    XSEG_ASSERT_CU(cuStreamCreate(&ctx.streams[i], CU_STREAM_NON_BLOCKING));
  stress_thread t[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++)
    t[i] = (stress_thread){.ctx = &ctx, .id = i, .ops = ops / THREADS,
                           .seed = 0x5eed + 7919 * (uint64_t)i};
  for (int i = 0; i < THREADS; i++)
    XSEG_ASSERT_EQ(pthread_create(&th[i], NULL, stress_worker, &t[i]), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < THREADS; i++) XSEG_EXPECT_EQ(t[i].errors, 0);
  xseg_stats peak = at_stats(ctx.a);
  printf("%ld operations: %llu events created, reserved peak %lld MiB, "
         "%lld physical allocations, %lld releases, %lld ooms\n", ops,
         xt_have_sim() ? (unsigned long long)xsim_call_count("cuEventCreate")
                       : 0ull,
         (long long)(peak.reserved_bytes.peak >> 20),
         (long long)peak.num_device_alloc, (long long)peak.num_device_free,
         (long long)peak.num_ooms);
  /* The device (emulator) or the memory-fraction cap, a MiB above it. */
  XSEG_EXPECT_LE(peak.reserved_bytes.peak,
                 (int64_t)((xt_have_sim() ? 96 : 97) * MiB));
  XSEG_EXPECT_OK(xseg_check(ctx.a));
  xseg_stats s = at_stats(ctx.a);
  XSEG_EXPECT_EQ(s.allocation.current, 0);
  /* At the device limit some mallocs fail (allowed) after the out-of-memory
     path's last resort, a wait on the guard and pending events, which
     num_sync_all_streams counts: it is not 0 here by design. */
  for (int i = 0; i < STREAMS; i++)
    XSEG_EXPECT_CU(cuStreamSynchronize(ctx.streams[i]));
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(ctx.a));
  s = at_stats(ctx.a);
  XSEG_EXPECT_EQ(s.active.current, 0);
  XSEG_EXPECT_EQ(s.pending_free_bytes, 0);
  XSEG_EXPECT_EQ(s.reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(ctx.a));
  xseg_destroy(ctx.a);
  for (int i = 0; i < STREAMS; i++)
    XSEG_EXPECT_CU(cuStreamDestroy(ctx.streams[i]));
}

XSEG_TEST(streams_stress, four_threads_four_streams_record_stream) {
  stress_streams(NULL, stress_ops());
}

/* The classic policy and non-default granules, with a quarter of the
   operations each to keep CI's time. */
XSEG_TEST(streams_stress, classic_record_stream) {
  stress_streams("expandable_segments:False", stress_ops() / 4);
}

XSEG_TEST(streams_stress, granules_record_stream) {
  stress_streams("xseg_small_granule_mb:4,xseg_large_granule_mb:8,"
                 "xseg_handle_policy:granule,roundup_power2_divisions:4",
                 stress_ops() / 4);
}
