/* Differential fuzz test of sharing blocks, one process (test_fuzz.c is
 * the walk over the rest of the API).
 *
 * A seeded walk over xseg_ipc_export, _open, _close and xseg_free across
 * FI_PRODUCERS allocators of this one process (each numbers its blocks
 * from the same start) and one consumer allocator, with producers
 * destroyed and made again. The model knows each exported block's
 * producer, bytes and opens. After every step:
 *   - every block the consumer has open holds its producer's bytes (the
 *     mapping of another producer's block, or a block its producer reused
 *     while the consumer held it, shows here);
 *   - each producer's open_by_others and pending_on_others, and the
 *     consumer's opened_blocks, are the model's;
 *   - xseg_check passes on every allocator.
 * Opening an open block again gives the same pointer; opening a block
 * that is gone (freed with no holder, or its producer destroyed) fails.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc_helpers.h"
#include "fuzz_helpers.h"

enum { FI_PRODUCERS = 3, FI_BLOCKS = 24 };

typedef struct fi_block {
  int prod;              /* its producer */
  void *p;               /* the producer's pointer; NULL once freed */
  xseg_ipc_handle *h;
  void *q;               /* the consumer's, while open */
  int opens;
  size_t size;
  unsigned char tag;
} fi_block;

typedef struct fi {
  xseg_allocator *prod[FI_PRODUCERS], *cons;
  fi_block b[FI_BLOCKS];
  int n;
  /* Blocks of each producer freed while held whose last holder closed
     since that producer last completed its frees (a malloc or
     empty_cache): held still, or given back already. */
  int64_t uncompleted[FI_PRODUCERS];
  uint64_t rng, step;
  unsigned char next_tag;
  bool failed;
} fi;

static void fi_fail(fi *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fi_fail(fi *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fz_vfail(&f->failed, "ipc ", f->step, fmt, ap);
  va_end(ap);
}

static uint64_t fi_rand(fi *f, uint64_t n) { return at_rand(&f->rng) % n; }

/* A block that is gone for good (freed, nobody holds it) leaves the model. */
static void fi_forget_if_gone(fi *f, int i) {
  if (f->b[i].p != NULL || f->b[i].opens > 0) return;
  xseg_ipc_handle_free(f->b[i].h);
  f->b[i] = f->b[--f->n];
}

static void fi_export(fi *f) {
  if (f->n == FI_BLOCKS) return;
  int j = (int)fi_rand(f, FI_PRODUCERS);
  size_t size = 512 + fi_rand(f, 6 << 20);
  void *p = NULL;
  xseg_status st = xseg_malloc(f->prod[j], size, NULL, &p);
  f->uncompleted[j] = 0;                /* a malloc completes held frees */
  if (st != XSEG_OK) {
    fi_fail(f, "producer %d: malloc(%zu): %s", j, size, xseg_last_error());
    return;
  }
  unsigned char tag = ++f->next_tag;
  XSEG_EXPECT_CU(cuMemsetD8(at_dptr(p), tag, size));
  xseg_ipc_handle *h = NULL;
  if ((st = xseg_ipc_export(f->prod[j], p, &h)) != XSEG_OK) {
    fi_fail(f, "producer %d: export: %s", j, xseg_last_error());
    xseg_free(f->prod[j], p);
    return;
  }
  f->b[f->n++] = (fi_block){.prod = j, .p = p, .h = h, .size = size,
                            .tag = tag};
}

/* Open: the same mapping again while open; a fresh one while the block
   is exported (live, or freed while held); refused once it is gone. */
static void fi_open(fi *f) {
  if (f->n == 0) return;
  fi_block *b = &f->b[fi_rand(f, (uint64_t)f->n)];
  void *q = NULL;
  xseg_status st = xseg_ipc_open(f->cons, b->h, &q);
  bool openable = b->opens > 0 || b->p != NULL;
  if (!openable) {
    if (st == XSEG_OK) fi_fail(f, "a block that is gone opened at %p", q);
    return;
  }
  if (st != XSEG_OK) {
    fi_fail(f, "open of producer %d's block: %s", b->prod, xseg_last_error());
    return;
  }
  if (b->opens > 0 && q != b->q)
    fi_fail(f, "opened again at %p, open at %p", q, b->q);
  b->q = q;
  b->opens++;
}

static void fi_close(fi *f) {
  if (f->n == 0) return;
  int i = (int)fi_rand(f, (uint64_t)f->n);
  fi_block *b = &f->b[i];
  if (b->opens == 0) return;
  if (xseg_ipc_close(f->cons, b->q) != XSEG_OK)
    fi_fail(f, "close(%p): %s", b->q, xseg_last_error());
  if (--b->opens == 0) b->q = NULL;
  if (b->opens == 0 && b->p == NULL && b->prod >= 0) {
    if (fi_rand(f, 2)) {
      XSEG_EXPECT_OK(xseg_empty_cache(f->prod[b->prod]));
      f->uncompleted[b->prod] = 0;
    } else {
      f->uncompleted[b->prod]++;
    }
  }
  fi_forget_if_gone(f, i);
}

static void fi_free(fi *f) {
  if (f->n == 0) return;
  int i = (int)fi_rand(f, (uint64_t)f->n);
  fi_block *b = &f->b[i];
  if (b->p == NULL) return;
  if (xseg_free(f->prod[b->prod], b->p) != XSEG_OK)
    fi_fail(f, "producer %d: free(%p): %s", b->prod, b->p, xseg_last_error());
  b->p = NULL;
  fi_forget_if_gone(f, i);
}

/* Producer j frees its blocks and is destroyed; a new allocator takes its
   place (its block ids start again where the old one's did). What the
   consumer has open stays readable. */
static void fi_renew(fi *f) {
  int j = (int)fi_rand(f, FI_PRODUCERS);
  for (int i = f->n - 1; i >= 0; i--) {
    fi_block *b = &f->b[i];
    if (b->prod != j) continue;
    if (b->p != NULL && xseg_free(f->prod[j], b->p) != XSEG_OK)
      fi_fail(f, "producer %d: free: %s", j, xseg_last_error());
    b->p = NULL;
    b->prod = -1;                 /* its producer is gone */
    fi_forget_if_gone(f, i);
  }
  xseg_destroy(f->prod[j]);
  f->uncompleted[j] = 0;
  f->prod[j] = at_create(NULL);
  if (f->prod[j] == NULL) fi_fail(f, "producer %d not made again", j);
}

static void fi_check(fi *f) {
  int64_t open_by[FI_PRODUCERS] = {0}, pending[FI_PRODUCERS] = {0};
  int64_t opened = 0;
  for (int i = 0; i < f->n; i++) {
    const fi_block *b = &f->b[i];
    if (b->opens == 0) continue;
    opened++;
    if (b->prod >= 0) {
      open_by[b->prod]++;
      pending[b->prod] += b->p == NULL;
    }
    CUdeviceptr d = at_dptr(b->q);
    size_t n = b->size < SPAN ? b->size : SPAN;
    if (!fz_span_is(d, n, b->tag) || !fz_span_is(d + b->size - n, n, b->tag))
      fi_fail(f, "the consumer's %p (producer %d's %p, %zu bytes) does not "
              "hold its bytes 0x%02x", b->q, b->prod, b->p, b->size, b->tag);
  }
  for (int j = 0; j < FI_PRODUCERS; j++) {
    xseg_ipc_stats s;
    xseg_ipc_get_stats(f->prod[j], &s);
    if (s.open_by_others != open_by[j] || s.pending_on_others < pending[j] ||
        s.pending_on_others > pending[j] + f->uncompleted[j])
      fi_fail(f, "producer %d: %lld open by others, %lld pending; the model "
              "says %lld, %lld (+%lld not completed yet)", j,
              (long long)s.open_by_others, (long long)s.pending_on_others,
              (long long)open_by[j], (long long)pending[j],
              (long long)f->uncompleted[j]);
    if (xseg_check(f->prod[j]) != XSEG_OK)
      fi_fail(f, "producer %d: xseg_check: %s", j, xseg_last_error());
  }
  xseg_ipc_stats c;
  xseg_ipc_get_stats(f->cons, &c);
  if (c.opened_blocks != opened)
    fi_fail(f, "the consumer has %lld blocks open, the model says %lld",
            (long long)c.opened_blocks, (long long)opened);
  if (xseg_check(f->cons) != XSEG_OK)
    fi_fail(f, "consumer: xseg_check: %s", xseg_last_error());
}

static void fi_step(fi *f) {
  uint64_t r = fi_rand(f, 100);
  if (r < 30) fi_export(f);
  else if (r < 60) fi_open(f);
  else if (r < 78) fi_close(f);
  else if (r < 96) fi_free(f);
  else fi_renew(f);
}

XSEG_TEST(fuzz, ipc_several_producers_one_consumer) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  static fi f;
  memset(&f, 0, sizeof f);
  uint64_t seed = fz_env("XSEG_FUZZ_SEED", 20261126);
  if (seed == 0) seed = (uint64_t)time(NULL);
  f.rng = at_rand_state(seed);
  uint64_t steps = fz_env("XSEG_FUZZ_STEPS", STEPS / 3);
  for (int j = 0; j < FI_PRODUCERS; j++) f.prod[j] = at_create(NULL);
  f.cons = at_create(NULL);
  for (f.step = 0; f.step < steps && !f.failed; f.step++) {
    fi_step(&f);
    fi_check(&f);
  }
  if (f.failed)
    fprintf(stderr, "fuzz: ipc failed at step %llu; reproduce with "
            "XSEG_FUZZ_SEED=%llu XSEG_FUZZ_STEPS=%llu\n",
            (unsigned long long)f.step, (unsigned long long)seed,
            (unsigned long long)steps);
  for (int i = 0; i < f.n; i++) {
    fi_block *b = &f.b[i];
    while (b->opens > 0 && xseg_ipc_close(f.cons, b->q) == XSEG_OK)
      b->opens--;
    if (b->p != NULL) XSEG_EXPECT_OK(xseg_free(f.prod[b->prod], b->p));
    xseg_ipc_handle_free(b->h);
  }
  for (int j = 0; j < FI_PRODUCERS; j++) {
    XSEG_EXPECT_OK(xseg_empty_cache(f.prod[j]));     /* completes the held */
    XSEG_EXPECT_EQ(at_stats(f.prod[j]).pending_free_bytes, 0);
    xseg_destroy(f.prod[j]);
  }
  xseg_destroy(f.cons);
}
