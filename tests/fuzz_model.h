/* fuzz_model.h: test_fuzz.c's walk without its operations: the shadow
 * model (live blocks, streams, pools, the counters of every call), the
 * latches that hold streams back and the watchdog that opens them when a
 * call has blocked for long, the bytes each block must hold, and the
 * checks after every step. test_fuzz.c says what the walk does.
 */
#ifndef XSEG_TESTS_FUZZ_MODEL_H
#define XSEG_TESTS_FUZZ_MODEL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_helpers.h"
#include "fuzz_helpers.h"

enum { MAX_LIVE = 96, MAX_STREAMS = 4, MAX_POOLS = 2 };

typedef struct fz_block {
  void *p;
  size_t size;
  int stream;          /* index in fz.streams; -1: its stream was destroyed */
  unsigned char tag;   /* the byte its spans hold once queued work is done */
  bool frozen;         /* used on another stream: no more own writes */
  unsigned recorded;   /* the stream slots it was recorded on (a mask) */
} fz_block;

typedef struct fz_stream {
  CUstream s;          /* NULL for slot 0 (the legacy stream) */
  bool alive;
  xt_latch *latch;     /* held while non-NULL */
  int pool;            /* private pool it allocates to, 0 = none */
  unsigned pools_used; /* private pools it allocated to, not released
                          since (a mask) */
  unsigned char scratch[SPAN];  /* what its reads copy to (TSan builds) */
} fz_stream;

typedef struct fz {
  xseg_allocator *a;
  uint64_t rng;
  fz_block live[MAX_LIVE];
  int n_live;
  fz_stream streams[MAX_STREAMS + 1];
  CUevent written;     /* orders another stream's use after the owner's */
  int pool_state[MAX_POOLS + 1];  /* 0 none, 1 ended and not released */
  unsigned char next_tag;
  bool faults;         /* driver calls fail now and then */
  /* Streams are destroyed only after xseg_forget_stream, and the emulator
     aborts on any call that names a destroyed stream. */
  bool forgets;
  /* the model's counters */
  int64_t mallocs, frees, ooms, requested_total;
  xsim_live base;
  /* watchdog */
  pthread_t dog;
  atomic_int in_call, stop;
  atomic_uint call_seq;
  pthread_mutex_t latch_lock;
  uint64_t steps, step;
  bool failed;
} fz;

static inline uint64_t fz_rand(fz *f, uint64_t n) {
  return at_rand(&f->rng) % n;
}

static inline size_t fz_round(size_t size) {
  return size <= 512 ? 512 : (size + 511) / 512 * 512;
}

static inline void fz_fail(fz *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void fz_fail(fz *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fz_vfail(&f->failed, "", f->step, fmt, ap);
  va_end(ap);
}

/* ---- latches and the watchdog ------------------------------------------ */

static inline void fz_open_all_locked(fz *f) {
  for (int i = 1; i <= MAX_STREAMS; i++)
    if (f->streams[i].latch != NULL) xt_latch_open(f->streams[i].latch);
}

/* Opens every latch when one xseg call has been running for 50 ms: it
   waits on held work (a blocking call), which the test lets finish. */
static inline void *fz_watchdog(void *arg) {
  fz *f = arg;
  const struct timespec tick = {0, 5 * 1000 * 1000};
  unsigned seen = 0;
  int ticks = 0;
  while (!atomic_load(&f->stop)) {
    nanosleep(&tick, NULL);
    unsigned seq = atomic_load(&f->call_seq);
    if (!atomic_load(&f->in_call) || seq != seen) {
      seen = seq;
      ticks = 0;
      continue;
    }
    if (++ticks == 10) {
      pthread_mutex_lock(&f->latch_lock);
      fz_open_all_locked(f);
      pthread_mutex_unlock(&f->latch_lock);
    }
  }
  return NULL;
}

static inline void fz_call_begin(fz *f) {
  atomic_fetch_add(&f->call_seq, 1);
  atomic_store(&f->in_call, 1);
}
static inline void fz_call_end(fz *f) { atomic_store(&f->in_call, 0); }
       
static inline bool fz_any_held(const fz *f) {
  for (int i = 1; i <= MAX_STREAMS; i++)
    if (f->streams[i].latch != NULL) return true;
  return false;
}

/* Lets stream i run again and waits for it. */
static inline void fz_unhold(fz *f, int i) {
  fz_stream *st = &f->streams[i];
  pthread_mutex_lock(&f->latch_lock);
  xt_latch_open(st->latch);
  pthread_mutex_unlock(&f->latch_lock);
  /* It may wait on a held stream (another stream's use waits on its
     owner's work): the watchdog lets that one go. */
  fz_call_begin(f);
  XSEG_EXPECT_CU(cuStreamSynchronize(st->s));
  fz_call_end(f);
  pthread_mutex_lock(&f->latch_lock);
  xt_latch_free(st->latch);
  st->latch = NULL;
  pthread_mutex_unlock(&f->latch_lock);
}

static inline void fz_unhold_all(fz *f) {
  for (int i = 1; i <= MAX_STREAMS; i++)
    if (f->streams[i].latch != NULL) fz_unhold(f, i);
}

/* ---- bytes ---------------------------------------------------------------- */

/* Queues writes of `tag` to the first and last SPAN bytes of b on stream
   slot si. */
static inline void fz_write(fz *f, const fz_block *b, int si,
                            unsigned char tag) {
  CUstream s = f->streams[si].s;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)b->p;
  size_t n = b->size < SPAN ? b->size : SPAN;
  if (n == 0) return;
  XSEG_EXPECT_CU(cuMemsetD8Async(d, tag, n, s));
  if (b->size > SPAN)
    XSEG_EXPECT_CU(cuMemsetD8Async(d + b->size - n, tag, n, s));
}

/* Every live block holds its tag (no stream held, all work done). */
static inline void fz_verify_bytes(fz *f) {
  XSEG_EXPECT_CU(cuCtxSynchronize());
  for (int i = 0; i < f->n_live; i++) {
    const fz_block *b = &f->live[i];
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)b->p;
    size_t n = b->size < SPAN ? b->size : SPAN;
    if (n == 0) continue;
    if (!fz_span_is(d, n, b->tag) || !fz_span_is(d + b->size - n, n, b->tag))
      fz_fail(f, "block %p (%zu bytes) lost its bytes (0x%02x)", b->p,
              b->size, b->tag);
  }
}

/* ---- the checks after every step ---------------------------------------- */

static inline void fz_check_stats(fz *f) {
  xseg_stats s = at_stats(f->a);
  int64_t requested = 0, rounded = 0;
  for (int i = 0; i < f->n_live; i++) {
    requested += (int64_t)f->live[i].size;
    rounded += (int64_t)fz_round(f->live[i].size);
  }
  struct { const char *what; int64_t got, want; } eq[] = {
      {"allocation.current", s.allocation.current, f->n_live},
      {"allocation.allocated", s.allocation.allocated, f->mallocs},
      {"allocation.freed", s.allocation.freed, f->frees},
      {"requested_bytes.current", s.requested_bytes.current, requested},
      {"requested_bytes.allocated", s.requested_bytes.allocated,
       f->requested_total},
      {"num_ooms", s.num_ooms, f->ooms},
      {"mapped_bytes", s.mapped_bytes, s.reserved_bytes.current},
      {"pending_free_bytes", s.pending_free_bytes,
       s.active_bytes.current - s.allocated_bytes.current},
  };
  for (size_t i = 0; i < sizeof eq / sizeof eq[0]; i++)
    if (eq[i].got != eq[i].want)
      fz_fail(f, "%s is %lld, the model says %lld", eq[i].what,
              (long long)eq[i].got, (long long)eq[i].want);
  if (s.allocated_bytes.current < rounded ||
      s.active_bytes.current < s.allocated_bytes.current ||
      s.active.current < s.allocation.current ||
      s.reserved_bytes.current < s.active_bytes.current ||
      s.reserved_bytes.peak < s.reserved_bytes.current ||
      s.allocated_bytes.peak < s.allocated_bytes.current)
    fz_fail(f, "stats out of order: allocated %lld (>= %lld), active %lld, "
            "reserved %lld", (long long)s.allocated_bytes.current,
            (long long)rounded, (long long)s.active_bytes.current,
            (long long)s.reserved_bytes.current);
  if (s.handles_awaiting_release != 0 && !f->faults)
    fz_fail(f, "%lld handles wait for a release, and no call failed",
            (long long)s.handles_awaiting_release);
  /* The emulator's view: what xseg holds is what it says it holds (and the
     handles whose release failed, which no stat sizes). */
  xsim_live now;
  xsim_get_live(&now);
  int64_t physical = (int64_t)(now.physical_bytes - f->base.physical_bytes);
  if (s.handles_awaiting_release != 0 && physical > s.reserved_bytes.current)
    physical = s.reserved_bytes.current;
  struct { const char *what; int64_t emulator, xseg; } em[] = {
      {"physical bytes", physical, s.reserved_bytes.current},
      {"handles", (int64_t)(now.handles - f->base.handles),
       s.num_device_alloc - s.num_device_free + s.handles_awaiting_release},
      {"reservations", (int64_t)(now.reservations - f->base.reservations),
       s.segment.current},
  };
  for (size_t i = 0; i < sizeof em / sizeof em[0]; i++)
    if (em[i].emulator != em[i].xseg)
      fz_fail(f, "the emulator holds %lld %s, xseg's stats say %lld",
              (long long)em[i].emulator, em[i].what, (long long)em[i].xseg);
  int64_t shown = at_snapshot_total(f->a);
  if (shown != s.reserved_bytes.current)
    fz_fail(f, "the snapshot's segments total %lld bytes, reserved_bytes "
            "is %lld", (long long)shown, (long long)s.reserved_bytes.current);
}

static inline void fz_check(fz *f) {
  at_live live[MAX_LIVE];
  for (int i = 0; i < f->n_live; i++)
    live[i] = (at_live){f->live[i].p, f->live[i].size};
  if (!at_disjoint(live, (size_t)f->n_live)) fz_fail(f, "live blocks overlap");
  if (xseg_check(f->a) != XSEG_OK)
    fz_fail(f, "xseg_check: %s", xseg_last_error());
  fz_check_stats(f);
  if (!fz_any_held(f)) fz_verify_bytes(f);
}

#endif /* XSEG_TESTS_FUZZ_MODEL_H */
