/* Differential fuzz test of the public API.
 *
 * A seeded random walk over xseg_malloc, xseg_free, xseg_record_stream,
 * xseg_empty_cache(_blocking), xseg_set_memory_fraction, private pools
 * (begin / end / release), graph captures (announced or found by the
 * allocator) whose stream is destroyed after they end or while they run,
 * and streams created and destroyed, while streams
 * are held back by latches, so that work queued before a free really is
 * late. A shadow model keeps every live block, the byte it should hold,
 * the counters of every call and the state of every pool, and after each
 * step:
 *   - no two live blocks overlap;
 *   - the statistics equal the model's (counts, requested bytes, OOMs) or
 *     are bounded by it (rounded bytes), and agree with each other and with
 *     the emulator's physical bytes;
 *   - xseg_check is OK;
 *   - the snapshot's segments add up to reserved_bytes (PyTorch's memory
 *     viewer takes their total_size for it);
 *   - whenever no stream is held, every live block holds its bytes (written
 *     on its own stream, and on the streams it was recorded on, read back
 *     through the driver): a late write into a reused block shows here.
 * After xseg_destroy nothing the allocator created is alive in the emulator.
 * Two configurations also make driver calls of the allocator fail now and
 * then: a failure is reported, and nothing is lost or leaked. One destroys
 * streams only after xseg_forget_stream (predicted by the model), with
 * the emulator aborting on any call that names a destroyed stream.
 *
 * Blocking calls may wait on a held stream (the out-of-memory path and
 * empty_cache_blocking wait on guard events): a watchdog opens every latch
 * when a call has been blocked for a while, as a GPU would finish the work.
 *
 * CI runs a short walk per configuration with a fixed seed. A long run:
 *   XSEG_FUZZ_SEED=7 XSEG_FUZZ_STEPS=200000 ./build/tests/test_fuzz
 * (XSEG_FUZZ_SEED=0 draws a seed from the clock; it is printed.)
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_helpers.h"
#include "fuzz_helpers.h"
#include "fuzz_model.h"

/* ---- the operations ------------------------------------------------------ */

/* A live stream slot (0, the legacy stream, included). */
static int fz_pick_stream(fz *f) {
  for (;;) {
    int i = (int)fz_rand(f, MAX_STREAMS + 1);
    if (i == 0 || f->streams[i].alive) return i;
  }
}

static size_t fz_size(fz *f) {
  switch (fz_rand(f, 8)) {
    case 0: return fz_rand(f, 600);                         /* tiny, 0 too */
    case 1: case 2: case 3: return 1 + fz_rand(f, 1 << 20);  /* small pool */
    case 4: case 5: return (1 << 20) + fz_rand(f, 8 << 20);
    case 6: return fz_rand(f, 40) << 20;                     /* whole MiB */
    default: return (8 << 20) + fz_rand(f, 24 << 20);
  }
}

static void fz_malloc(fz *f) {
  if (f->n_live == MAX_LIVE) return;
  int si = fz_pick_stream(f);
  size_t size = fz_size(f);
  void *p = (void *)1;
  fz_call_begin(f);
  xseg_status st = xseg_malloc(f->a, size, f->streams[si].s, &p);
  fz_call_end(f);
  if (st == XSEG_ERR_OUT_OF_MEMORY || (st == XSEG_ERR_DRIVER && f->faults)) {
    f->ooms += st == XSEG_ERR_OUT_OF_MEMORY;
    if (p != NULL) fz_fail(f, "a failed malloc left *ptr %p", p);
    return;
  }
  if (st != XSEG_OK) {
    fz_fail(f, "malloc(%zu): %s: %s", size, xseg_status_name(st),
            xseg_last_error());
    return;
  }
  if (((uintptr_t)p & 511) != 0) fz_fail(f, "%p is not 512-byte aligned", p);
  f->mallocs++;
  f->requested_total += (int64_t)size;
  fz_block *b = &f->live[f->n_live++];
  *b = (fz_block){p, size, si, ++f->next_tag, false, 0};
  fz_write(f, b, si, b->tag);
}

static void fz_free(fz *f) {
  if (f->n_live == 0) return;
  int i = (int)fz_rand(f, (uint64_t)f->n_live);
  xseg_status st = xseg_free(f->a, f->live[i].p);
  if (st == XSEG_ERR_DRIVER && f->faults) return;     /* still live */
  if (st != XSEG_OK) {
    fz_fail(f, "free(%p): %s: %s", f->live[i].p, xseg_status_name(st),
            xseg_last_error());
    return;
  }
  f->frees++;
  f->live[i] = f->live[--f->n_live];
}

/* A new byte on the block's own stream (queued behind a hold, if any). */
static void fz_rewrite(fz *f) {
  if (f->n_live == 0) return;
  fz_block *b = &f->live[fz_rand(f, (uint64_t)f->n_live)];
  if (b->frozen || b->stream < 0) return;
  b->tag = ++f->next_tag;
  fz_write(f, b, b->stream, b->tag);
}

/* Under ThreadSanitizer another stream's use is a read (a copy into that
   stream's scratch): two streams writing the same byte would be a race to
   TSan, while a read racing with a new owner's write is exactly the early
   reuse it should report. Elsewhere it writes the block's byte again, so
   an early reuse shows as a wrong byte. */
#if defined(__SANITIZE_THREAD__)
#define FZ_SHARED_READS 1
#else
#define FZ_SHARED_READS 0
#endif

/* The test's own cuEventRecord, which a fault armed for the allocator may
   hit once. */
static CUresult fz_event_record(fz *f, CUstream s) {
  CUresult r = cuEventRecord(f->written, s);
  return r == CUDA_SUCCESS || !f->faults ? r : cuEventRecord(f->written, s);
}

/* Used on another stream, after the owner's work so far: recorded, and
   read or written there (the same byte, so that the order of the streams'
   writes does not matter; no more writes of the owner follow). */
static void fz_use_elsewhere(fz *f) {
  if (f->n_live == 0) return;
  fz_block *b = &f->live[fz_rand(f, (uint64_t)f->n_live)];
  int si = fz_pick_stream(f);
  CUstream other = f->streams[si].s;
  xseg_status st = xseg_record_stream(f->a, b->p, other);
  if (st != XSEG_OK) {
    fz_fail(f, "record_stream: %s", xseg_last_error());
    return;
  }
  b->frozen = true;
  b->recorded |= 1u << si;
  if (b->stream >= 0) {
    XSEG_EXPECT_CU(fz_event_record(f, f->streams[b->stream].s));
    XSEG_EXPECT_CU(cuStreamWaitEvent(other, f->written, 0));
  }
  if (!FZ_SHARED_READS) {
    fz_write(f, b, si, b->tag);
    return;
  }
  size_t n = b->size < SPAN ? b->size : SPAN;
  if (n != 0)
    XSEG_EXPECT_CU(cuMemcpyDtoHAsync(f->streams[si].scratch,
                                     (CUdeviceptr)(uintptr_t)b->p, n, other));
}

/* One stream at a time: the driver runs host functions one at a time, so
   a second latch would not hold its stream independently of the first
   (opening it would not let that stream go while the first blocks). */
static void fz_hold(fz *f) {
  int i = 1 + (int)fz_rand(f, MAX_STREAMS);
  fz_stream *st = &f->streams[i];
  if (!st->alive || st->latch != NULL || fz_any_held(f)) return;
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(st->s, l));
  pthread_mutex_lock(&f->latch_lock);
  st->latch = l;
  pthread_mutex_unlock(&f->latch_lock);
}

static void fz_empty_cache(fz *f) {
  bool blocking = fz_rand(f, 3) == 0;
  bool capturing = false;
  for (int i = 0; i <= MAX_STREAMS; i++) capturing |= f->streams[i].pool != 0;
  fz_call_begin(f);
  xseg_status st = blocking ? xseg_empty_cache_blocking(f->a)
                            : xseg_empty_cache(f->a);
  fz_call_end(f);
  xseg_status want = blocking && capturing ? XSEG_ERR_CAPTURE : XSEG_OK;
  if (st != want && !(st == XSEG_ERR_DRIVER && f->faults))
    fz_fail(f, "empty_cache%s: %s (want %s): %s", blocking ? "_blocking" : "",
            xseg_status_name(st), xseg_status_name(want), xseg_last_error());
}

static void fz_fraction(fz *f) {
  static const double fractions[] = {0.3, 0.6, 1.0};
  double v = fractions[fz_rand(f, 3)];
  if (xseg_set_memory_fraction(f->a, v) != XSEG_OK)
    fz_fail(f, "set_memory_fraction(%g): %s", v, xseg_last_error());
}

static bool fz_pool_in_use(const fz *f, int pool) {
  for (int i = 0; i <= MAX_STREAMS; i++)
    if (f->streams[i].pool == pool) return true;
  return false;
}

static void fz_expect(fz *f, const char *what, xseg_status got,
                      xseg_status want) {
  if (got != want)
    fz_fail(f, "%s: %s, the model says %s (%s)", what, xseg_status_name(got),
            xseg_status_name(want), xseg_last_error());
}

/* Begin, end or release a private pool, as the model predicts. */
static void fz_pool(fz *f) {
  int pool = 1 + (int)fz_rand(f, MAX_POOLS);
  switch (fz_rand(f, 3)) {
    case 0: {
      int si = fz_pick_stream(f);
      fz_stream *st = &f->streams[si];
      xseg_status want = st->pool != 0 ? XSEG_ERR_INVALID_ARGUMENT : XSEG_OK;
      fz_expect(f, "begin_allocate_to_pool",
                xseg_begin_allocate_to_pool(f->a, (xseg_pool_id)pool, st->s),
                want);
      if (want == XSEG_OK) st->pool = pool;
      /* The begin makes the pool's pools of the stream. */
      if (want == XSEG_OK) st->pools_used |= 1u << pool;
      break;
    }
    case 1: {
      bool used = fz_pool_in_use(f, pool);
      fz_expect(f, "end_allocate_to_pool",
                xseg_end_allocate_to_pool(f->a, (xseg_pool_id)pool),
                used ? XSEG_OK : XSEG_ERR_INVALID_ARGUMENT);
      for (int i = 0; i <= MAX_STREAMS; i++)
        if (f->streams[i].pool == pool) f->streams[i].pool = 0;
      if (used) f->pool_state[pool] = 1;
      break;
    }
    default: {
      xseg_status want = fz_pool_in_use(f, pool) ? XSEG_ERR_CAPTURE
                         : f->pool_state[pool] ? XSEG_OK
                                               : XSEG_ERR_INVALID_ARGUMENT;
      fz_expect(f, "release_pool",
                xseg_release_pool(f->a, (xseg_pool_id)pool), want);
      if (want == XSEG_OK) f->pool_state[pool] = 0;
      if (want == XSEG_OK)
        for (int i = 0; i <= MAX_STREAMS; i++)
          f->streams[i].pools_used &= ~(1u << pool);
    }
  }
}

/* What xseg_forget_stream of slot i answers, as the model sees it. */
static xseg_status fz_forget_want(const fz *f, int i) {
  for (int k = 0; k <= MAX_STREAMS; k++)
    if (f->streams[k].pool != 0) return XSEG_ERR_CAPTURE;
  for (int k = 0; k < f->n_live; k++)
    if (f->live[k].stream == i || (f->live[k].recorded & (1u << i)))
      return XSEG_ERR_INVALID_ARGUMENT;
  return f->streams[i].pools_used != 0 ? XSEG_ERR_INVALID_ARGUMENT : XSEG_OK;
}

/* Makes slot i forgettable, as a program about to destroy a stream would:
   frees the blocks allocated on it or recorded on it, ends every capture
   and releases the private pools it allocated to. */
static void fz_retire(fz *f, int i) {
  for (int k = 0; k < f->n_live;) {
    fz_block *b = &f->live[k];
    if (b->stream != i && !(b->recorded & (1u << i))) {
      k++;
      continue;
    }
    xseg_status st = xseg_free(f->a, b->p);
    if (st != XSEG_OK) {
      fz_fail(f, "free(%p) before a forget: %s", b->p, xseg_last_error());
      return;
    }
    f->frees++;
    *b = f->live[--f->n_live];
  }
  for (int k = 0; k <= MAX_STREAMS; k++) {
    int pool = f->streams[k].pool;
    if (pool == 0) continue;
    fz_expect(f, "end_allocate_to_pool",
              xseg_end_allocate_to_pool(f->a, (xseg_pool_id)pool), XSEG_OK);
    for (int j = 0; j <= MAX_STREAMS; j++)
      if (f->streams[j].pool == pool) f->streams[j].pool = 0;
    f->pool_state[pool] = 1;
  }
  for (int pool = 1; pool <= MAX_POOLS; pool++) {
    if (!(f->streams[i].pools_used & (1u << pool))) continue;
    fz_expect(f, "release_pool", xseg_release_pool(f->a, (xseg_pool_id)pool),
              XSEG_OK);
    f->pool_state[pool] = 0;
    for (int j = 0; j <= MAX_STREAMS; j++)
      f->streams[j].pools_used &= ~(1u << pool);
  }
}

/* Destroys an idle stream (its work finished first) or creates one. With
   `forgets`, xseg forgets it first (half the time after fz_retire), as the
   model predicts, and it stays while xseg refuses. */
static void fz_stream_turn(fz *f) {
  int i = 1 + (int)fz_rand(f, MAX_STREAMS);
  fz_stream *st = &f->streams[i];
  if (!st->alive) {
    st->alive = cuStreamCreate(&st->s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
    XSEG_EXPECT_TRUE(st->alive);
    return;
  }
  if (st->latch != NULL || st->pool != 0) return;
  if (f->forgets) {
    if (fz_rand(f, 2)) fz_retire(f, i);
    xseg_status want = fz_forget_want(f, i);
    fz_call_begin(f);                   /* it waits for guards */
    xseg_status got = xseg_forget_stream(f->a, st->s);
    fz_call_end(f);
    if (got == XSEG_ERR_DRIVER && f->faults) return;
    fz_expect(f, "forget_stream", got, want);
    if (got != XSEG_OK) return;
    st->pools_used = 0;
  }
  fz_call_begin(f);                     /* may wait on a held stream */
  XSEG_EXPECT_CU(cuStreamSynchronize(st->s));
  fz_call_end(f);
  XSEG_EXPECT_CU(cuStreamDestroy(st->s));
  st->alive = false;
  for (int k = 0; k < f->n_live; k++)
    if (f->live[k].stream == i) f->live[k].stream = -1;
}

/* One malloc (and its free at once) on stream slot si for the model:
   counted as fz_malloc and fz_free count. */
static void fz_malloc_free(fz *f, int si, size_t size) {
  void *p = NULL;
  fz_call_begin(f);
  xseg_status st = xseg_malloc(f->a, size, f->streams[si].s, &p);
  fz_call_end(f);
  if (st == XSEG_ERR_OUT_OF_MEMORY || (st == XSEG_ERR_DRIVER && f->faults)) {
    f->ooms += st == XSEG_ERR_OUT_OF_MEMORY;
    return;
  }
  if (st != XSEG_OK) {
    fz_fail(f, "malloc(%zu) on stream slot %d: %s: %s", size, si,
            xseg_status_name(st), xseg_last_error());
    return;
  }
  f->mallocs++;
  f->requested_total += (int64_t)size;
  while ((st = xseg_free(f->a, p)) == XSEG_ERR_DRIVER && f->faults) continue;
  if (st != XSEG_OK) fz_fail(f, "free(%p): %s", p, xseg_last_error());
  f->frees++;
}

/* A graph capture on an idle stream with no private pool, announced
   (pool 3) or not (the allocator finds it on its slow path), with a few
   mallocs and frees in it; then the stream is destroyed, after the
   capture ended or while it runs (which ends it). The allocator goes on
   as after any capture: mallocs on other streams, cached or not, and
   empty_cache work, and the capture's pool is released. */
static void fz_capture(fz *f) {
  int i = 1 + (int)fz_rand(f, MAX_STREAMS);
  fz_stream *st = &f->streams[i];
  if (!st->alive || st->latch != NULL || st->pool != 0) return;
  bool announce = fz_rand(f, 2), end_first = fz_rand(f, 3) != 0;
  fz_call_begin(f);                     /* may wait on a held stream */
  XSEG_EXPECT_CU(cuStreamSynchronize(st->s));
  fz_call_end(f);
  if (announce)
    fz_expect(f, "begin_allocate_to_pool",
              xseg_begin_allocate_to_pool(f->a, 3, st->s), XSEG_OK);
  if (!XSEG_EXPECT_CU(cuStreamBeginCapture(st->s,
                                           CU_STREAM_CAPTURE_MODE_GLOBAL)))
    return;
  cuuint64_t id = 0;
  CUstreamCaptureStatus status;
  XSEG_EXPECT_CU(cuStreamGetCaptureInfo(st->s, &status, &id, NULL, NULL, NULL,
                                        NULL));
  for (int n = (int)fz_rand(f, 4); n >= 0 && !f->failed; n--)
    fz_malloc_free(f, i, fz_size(f));
  CUgraph g = NULL;
  if (end_first) XSEG_EXPECT_CU(cuStreamEndCapture(st->s, &g));
  if (g != NULL) XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_CU(cuStreamDestroy(st->s));
  st->alive = false;
  for (int k = 0; k < f->n_live; k++)
    if (f->live[k].stream == i) f->live[k].stream = -1;
  if (announce)
    fz_expect(f, "end_allocate_to_pool", xseg_end_allocate_to_pool(f->a, 3),
              XSEG_OK);
  /* The allocator hears of the end from a malloc elsewhere or a release
     pass; the pool may go only then. */
  if (fz_rand(f, 2)) {
    fz_malloc_free(f, 0, fz_size(f));
  } else {
    fz_call_begin(f);
    xseg_status e = xseg_empty_cache(f->a);
    fz_call_end(f);
    if (e != XSEG_OK && !(e == XSEG_ERR_DRIVER && f->faults))
      fz_fail(f, "empty_cache after a capture's stream went: %s",
              xseg_last_error());
  }
  xseg_pool_id pool = announce ? 3 : XSEG_CAPTURE_POOL(id);
  xseg_status r = xseg_release_pool(f->a, pool);
  /* A capture that no malloc's slow path saw made no pool; under driver
     faults the malloc that would have refreshed it may have failed. */
  if (r != XSEG_OK && !(r == XSEG_ERR_INVALID_ARGUMENT && !announce) &&
      !(r == XSEG_ERR_CAPTURE && f->faults))
    fz_fail(f, "release_pool(%llu) after its capture: %s: %s",
            (unsigned long long)pool, xseg_status_name(r), xseg_last_error());
}

/* Arms one failing call of a driver function that only the allocator
   calls (the test's own calls never fail). */
static void fz_fault(fz *f) {
  static const char *const names[] = {
      "cuMemCreate", "cuMemMap",   "cuMemSetAccess", "cuMemUnmap",
      "cuMemRelease", "cuMemAddressReserve", "cuEventRecord",
      "cuEventQuery", "cuStreamQuery"};
  const char *name = names[fz_rand(f, sizeof names / sizeof names[0])];
  CUresult err = strcmp(name, "cuMemCreate") == 0 && fz_rand(f, 2)
                     ? CUDA_ERROR_OUT_OF_MEMORY
                     : CUDA_ERROR_UNKNOWN;
  xsim_fail_call(name, 1 + fz_rand(f, 4), err);
}

static void fz_step(fz *f) {
  if (f->faults && fz_rand(f, 100) < 4) fz_fault(f);
  uint64_t r = fz_rand(f, 100);
  if (r < 32) fz_malloc(f);
  else if (r < 54) fz_free(f);
  else if (r < 62) fz_rewrite(f);
  else if (r < 67) fz_use_elsewhere(f);
  else if (r < 75) fz_hold(f);
  else if (r < 82) {
    int i = 1 + (int)fz_rand(f, MAX_STREAMS);
    if (f->streams[i].latch != NULL) fz_unhold(f, i);
  } else if (r < 87) fz_empty_cache(f);
  else if (r < 89) fz_fraction(f);
  else if (r < 96) fz_pool(f);
  else if (r < 98) {
    if (!f->forgets) fz_capture(f);     /* it destroys a capturing stream */
  } else fz_stream_turn(f);
}

/* ---- one walk -------------------------------------------------------------- */

static void fz_teardown(fz *f) {
  xsim_reset();                         /* the driver works again */
  fz_unhold_all(f);
  for (int i = 0; i < f->n_live; i++)
    XSEG_EXPECT_OK(xseg_free(f->a, f->live[i].p));
  f->frees += f->n_live;
  f->n_live = 0;
  for (int i = 0; i <= MAX_STREAMS; i++) f->streams[i].pool = 0;
  xseg_end_allocate_to_pool(f->a, 1);
  xseg_end_allocate_to_pool(f->a, 2);
  /* Every handle whose release failed goes now. */
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(f->a));
  XSEG_EXPECT_EQ(at_stats(f->a).handles_awaiting_release, 0);
  fz_check(f);
  XSEG_EXPECT_CU(cuCtxSynchronize());
  xseg_destroy(f->a);
  xsim_live now;
  xsim_get_live(&now);
  for (int i = 1; i <= MAX_STREAMS; i++)
    if (f->streams[i].alive) XSEG_EXPECT_CU(cuStreamDestroy(f->streams[i].s));
  XSEG_EXPECT_EQ(now.handles, f->base.handles);
  XSEG_EXPECT_EQ(now.mappings, f->base.mappings);
  XSEG_EXPECT_EQ(now.reservations, f->base.reservations);
  XSEG_EXPECT_EQ(now.physical_bytes, f->base.physical_bytes);
}

/* steps_default walks in CI; XSEG_FUZZ_STEPS and XSEG_FUZZ_SEED override. */
static void fz_run_as(const char *conf, uint64_t seed_salt,
                      uint64_t steps_default, uint64_t device_bytes,
                      bool faults, bool forgets) {
  XT_REQUIRE_SIM_FOR("checks xseg's stats against the emulator's objects");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xsim_set_device_memory(0, device_bytes);
  static fz f;
  memset(&f, 0, sizeof f);
  uint64_t seed = fz_env("XSEG_FUZZ_SEED", 20261123);
  if (seed == 0) seed = (uint64_t)time(NULL);
  f.rng = at_rand_state(seed ^ (seed_salt * 0x9E3779B97F4A7C15ull));
  f.steps = fz_env("XSEG_FUZZ_STEPS", steps_default);
  f.faults = faults;
  f.forgets = forgets;
  if (forgets) XSEG_ASSERT_TRUE(setenv("XSIM_STALE_STREAMS", "abort", 1) == 0);
  xsim_get_live(&f.base);
  f.a = at_create(conf);
  XSEG_ASSERT_TRUE(f.a != NULL);
  for (int i = 1; i <= MAX_STREAMS; i++)
    f.streams[i].alive =
        cuStreamCreate(&f.streams[i].s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
  f.streams[0].alive = true;
  XSEG_ASSERT_CU(cuEventCreate(&f.written, CU_EVENT_DISABLE_TIMING));
  pthread_mutex_init(&f.latch_lock, NULL);
  pthread_create(&f.dog, NULL, fz_watchdog, &f);
  for (f.step = 0; f.step < f.steps && !f.failed; f.step++) {
    fz_step(&f);
    fz_check(&f);
  }
  if (f.failed)
    fprintf(stderr, "fuzz: \"%s\" failed at step %llu; reproduce with "
            "XSEG_FUZZ_SEED=%llu XSEG_FUZZ_STEPS=%llu\n", conf,
            (unsigned long long)f.step, (unsigned long long)seed,
            (unsigned long long)f.steps);
  else if (f.steps != steps_default)
    fprintf(stderr, "fuzz: \"%s\": %llu steps, seed %llu: %lld mallocs, "
            "%lld OOMs\n", conf, (unsigned long long)f.steps,
            (unsigned long long)seed, (long long)f.mallocs,
            (long long)f.ooms);
  fz_teardown(&f);
  XSEG_EXPECT_CU(cuEventDestroy(f.written));
  atomic_store(&f.stop, 1);
  pthread_join(f.dog, NULL);
  pthread_mutex_destroy(&f.latch_lock);
  if (forgets) XSEG_EXPECT_TRUE(unsetenv("XSIM_STALE_STREAMS") == 0);
}

static void fz_run(const char *conf, uint64_t seed_salt, uint64_t steps_default,
                   uint64_t device_bytes, bool faults) {
  fz_run_as(conf, seed_salt, steps_default, device_bytes, faults, false);
}

#define DEVICE ((uint64_t)512 << 20)

XSEG_TEST(fuzz, expandable) { fz_run("", 1, STEPS, DEVICE, false); }

XSEG_TEST(fuzz, classic) {
  fz_run("expandable_segments:False", 2, STEPS, DEVICE, false);
}

XSEG_TEST(fuzz, granules_and_rounding) {
  fz_run("xseg_small_granule_mb:4,xseg_large_granule_mb:8,"
         "roundup_power2_divisions:4,max_split_size_mb:40",
         3, STEPS, DEVICE, false);
}

XSEG_TEST(fuzz, handles_and_garbage_collection) {
  fz_run("xseg_handle_policy:granule,garbage_collection_threshold:0.5,"
         "xseg_grow_min_mb:6",
         4, STEPS, DEVICE, false);
}

/* Driver calls fail now and then (growth, release, guards, deferred
   frees): failures are reported, nothing is lost or leaked. */
XSEG_TEST(fuzz, failing_driver_calls) {
  fz_run("xseg_handle_policy:granule", 5, STEPS, DEVICE, true);
}

XSEG_TEST(fuzz, failing_driver_calls_classic) {
  fz_run("expandable_segments:False", 6, STEPS, DEVICE, true);
}

/* Streams destroyed only after xseg_forget_stream, whose answer the model
   predicts, with the emulator aborting on any call that names a destroyed
   stream: xseg names none after forgetting it, whatever came before. */
XSEG_TEST(fuzz, forget_streams_before_destroying_them) {
  fz_run_as("", 7, STEPS, DEVICE, false, true);
}
