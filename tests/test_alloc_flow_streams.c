/* Physical memory that flows between streams while the device runs,
   continued from test_alloc_flow.c: another stream takes a free handle
   behind an event (the device waits, not the host), memory does not
   ping-pong, nothing moves during a capture, and a stress of four threads
   on four lagging streams. Every race is forced by a latch. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_helpers.h"
#include "flow_helpers.h"

/* ---- across streams: the device waits, not the host ----------------------- */

/* An allocator on a device of `device_mib`, three streams, and a latch for
   each of the first two to hold them back with. The teardown lets every
   stream go, checks the allocator, and after xseg_destroy that no handle
   or mapping is left. */
typedef struct streams_fixture {
  xseg_allocator *a;
  CUstream sa, sb, sc;
  xt_latch *la, *lb;
} streams_fixture;

/* The test itself skips first (see lend_setup). */
static void streams_setup(streams_fixture *f, size_t device_mib) {
  xsim_set_device_memory(0, device_mib * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  f->a = at_create(NULL);
  f->sa = at_stream_new();
  f->sb = at_stream_new();
  f->sc = at_stream_new();
  f->la = xt_latch_new();
  f->lb = xt_latch_new();
}

static void streams_teardown(streams_fixture *f) {
  xt_latch_open(f->la);
  xt_latch_open(f->lb);
  CUstream s[3] = {f->sa, f->sb, f->sc};
  for (int i = 0; i < 3; i++) XSEG_EXPECT_CU(cuStreamSynchronize(s[i]));
  XSEG_EXPECT_OK(xseg_check(f->a));
  xseg_destroy(f->a);
  xsim_live l = live_now();
  XSEG_EXPECT_EQ(l.handles, 0);            /* every handle released */
  XSEG_EXPECT_EQ(l.mappings, 0);
  xt_latch_free(f->la);
  xt_latch_free(f->lb);
  for (int i = 0; i < 3; i++) XSEG_EXPECT_CU(cuStreamDestroy(s[i]));
}

/* Stream A frees 48 MiB its held work still writes. Stream B asks for 48
   MiB with room to grow (256 MiB device): one budget says take A's free
   memory rather than create more. B's malloc returns at once, and B's
   work does not run before A's (cuStreamWaitEvent on A's guard event). */
XSEG_TEST(alloc_flow, a_stolen_handles_stream_waits_for_the_old_streams_work) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  streams_fixture f = {0};
  streams_setup(&f, 256);
  xseg_allocator *a = f.a;
  CUstream sa = f.sa, sb = f.sb;
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_CU(xt_latch_hold(sa, f.la));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x77, 48 * MiB, sa));
  XSEG_ASSERT_OK(xseg_free(a, p));
  uint64_t waits = host_waits(), creates = xsim_call_count("cuMemCreate");
  uint64_t stream_waits = xsim_call_count("cuStreamWaitEvent");
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));
  XSEG_EXPECT_EQ(host_waits(), waits);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemCreate"), creates);   /* no growth */
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamWaitEvent"), stream_waits + 1);
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(a, &st));
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 48 * MiB);
  unsigned char v = at_byte(q, 9);
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(q), v, 48 * MiB, sb));
  usleep(20000);
  XSEG_EXPECT_EQ(cuStreamQuery(sb), CUDA_ERROR_NOT_READY);   /* behind A */
  XSEG_EXPECT_OK(xseg_check(a));
  xt_latch_open(f.la);
  XSEG_EXPECT_CU(cuStreamSynchronize(sb));
  XSEG_EXPECT_TRUE(dev_bytes_are(at_dptr(q), 48 * MiB, v));     /* no 0x77 */
  XSEG_EXPECT_OK(xseg_free(a, q));
  XSEG_EXPECT_CU(cuStreamSynchronize(sa));
  XSEG_EXPECT_OK(xseg_empty_cache(a));
  XSEG_EXPECT_EQ(live_now().mappings, 0);
  streams_teardown(&f);
}

/* A stolen handle stays mapped at the donor's old address until the
   donor's guard passes. Here the thief's work is done (it waited on the
   donor's old work, which has run) but the donor's guard cannot show it
   yet: its event in flight was recorded before the donor's free, and the
   donor is busy with new work. A release pass must not release the handle
   then: the driver would keep its memory until the alias is unmapped,
   while reserved bytes stopped counting it. Device memory held is what
   reserved_bytes says, handle for handle, before and after the alias
   goes. */
XSEG_TEST(alloc_flow, a_handle_an_alias_still_maps_is_not_released) {
  XT_REQUIRE_SIM();
  streams_fixture f = {0};
  streams_setup(&f, 256);
  xseg_allocator *a = f.a;
  CUstream sa = f.sa, sb = f.sb;
  xt_latch *old = f.la, *busy = f.lb;
  xsim_live base = live_now();
  void *p, *x, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, sa, &x));
  XSEG_ASSERT_CU(xt_latch_hold(sa, old));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x77, 48 * MiB, sa));
  XSEG_ASSERT_OK(xseg_free(a, x));
  /* A's guard event: recorded now, before p's free, and held back. */
  uint64_t records = xsim_call_count("cuEventRecord");
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  XSEG_ASSERT_EQ(xsim_call_count("cuEventRecord"), records + 1);
  XSEG_ASSERT_OK(xseg_free(a, p));
  uint64_t stream_waits = xsim_call_count("cuStreamWaitEvent");
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));         /* B steals */
  XSEG_ASSERT_EQ(xsim_call_count("cuStreamWaitEvent"), stream_waits + 1);
  XSEG_ASSERT_GT(live_now().mappings, live_now().handles);  /* an alias */
  xt_latch_open(old);
  XSEG_EXPECT_CU(cuStreamSynchronize(sb));   /* A's old work has run */
  XSEG_ASSERT_CU(xt_latch_hold(sa, busy));   /* A busy again */
  XSEG_ASSERT_OK(xseg_free(a, q));
  uint64_t releases = xsim_call_count("cuMemRelease");
  XSEG_EXPECT_OK(xseg_empty_cache(a));       /* B's guard passes, A's not */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemRelease"), releases);
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(a, &st));
  xsim_live l = live_now();
  XSEG_EXPECT_GT(l.mappings, l.handles);     /* the alias is still there */
  XSEG_EXPECT_GE(l.physical_bytes - base.physical_bytes, 48 * MiB);
  XSEG_EXPECT_EQ((int64_t)(l.physical_bytes - base.physical_bytes),
                 st.reserved_bytes.current);
  XSEG_EXPECT_EQ((int64_t)(l.handles - base.handles),
                 st.num_device_alloc - st.num_device_free);
  XSEG_EXPECT_OK(xseg_check(a));
  xt_latch_open(busy);
  XSEG_EXPECT_CU(cuStreamSynchronize(sa));
  XSEG_EXPECT_OK(xseg_empty_cache(a));       /* the alias, then the handle */
  XSEG_ASSERT_OK(xseg_get_stats(a, &st));
  l = live_now();
  XSEG_EXPECT_EQ(l.physical_bytes, base.physical_bytes);
  XSEG_EXPECT_EQ(l.mappings, base.mappings);
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 0);
  XSEG_EXPECT_EQ(st.num_device_alloc, st.num_device_free);
  streams_teardown(&f);
}

/* Bounded: a stream that has just taken memory with a wait does not give
   memory back with a wait (the steal rule's quiet period), so the next
   request of the donor grows instead of making the two streams wait on
   each other in turn. */
XSEG_TEST(alloc_flow, memory_does_not_ping_pong_between_busy_streams) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  streams_fixture f = {0};
  streams_setup(&f, 256);
  xseg_allocator *a = f.a;
  CUstream sa = f.sa, sb = f.sb;
  void *p, *q, *r;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_CU(xt_latch_hold(sa, f.la));
  XSEG_ASSERT_OK(xseg_free(a, p));
  uint64_t stream_waits = xsim_call_count("cuStreamWaitEvent");
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));         /* B takes A's */
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamWaitEvent"), stream_waits + 1);
  XSEG_ASSERT_CU(xt_latch_hold(sb, f.lb));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &r));         /* A grows */
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamWaitEvent"), stream_waits + 1);
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(a, &st));
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 96 * MiB);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_EXPECT_OK(xseg_free(a, r));
  streams_teardown(&f);
}

/* At the device limit the quiet period gives way: the out-of-memory
   path's last try before a host wait takes a busy stream's memory behind
   an event even from a stream that just took memory. No host wait, no
   failure; the taker's work runs after the donor's. */
XSEG_TEST(alloc_flow, at_the_limit_the_device_waits_instead_of_the_host) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  streams_fixture f = {0};
  streams_setup(&f, 64);
  xseg_allocator *a = f.a;
  CUstream sa = f.sa, sb = f.sb;
  xt_latch *la = f.la, *lb = f.lb;
  void *p, *q, *r;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_CU(xt_latch_hold(sa, la));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));         /* B takes A's */
  XSEG_ASSERT_CU(xt_latch_hold(sb, lb));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(q), 0x77, 48 * MiB, sb));
  XSEG_ASSERT_OK(xseg_free(a, q));
  uint64_t waits = host_waits();
  uint64_t stream_waits = xsim_call_count("cuStreamWaitEvent");
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &r));         /* back to A */
  XSEG_EXPECT_EQ(host_waits(), waits);
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamWaitEvent"), stream_waits + 1);
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(a, &st));
  XSEG_EXPECT_EQ(st.num_ooms, 0);
  XSEG_EXPECT_LE(st.reserved_bytes.current, 64 * MiB);
  unsigned char v = at_byte(r, 4);
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(r), v, 48 * MiB, sa));
  xt_latch_open(la);
  usleep(20000);
  XSEG_EXPECT_EQ(cuStreamQuery(sa), CUDA_ERROR_NOT_READY);   /* behind B */
  XSEG_EXPECT_OK(xseg_check(a));
  xt_latch_open(lb);
  XSEG_EXPECT_CU(cuStreamSynchronize(sa));
  XSEG_EXPECT_CU(cuStreamSynchronize(sb));
  XSEG_EXPECT_TRUE(dev_bytes_are(at_dptr(r), 48 * MiB, v));     /* no 0x77 */
  XSEG_EXPECT_OK(xseg_free(a, r));
  streams_teardown(&f);
}

/* While a capture is under way nothing moves: a request on another stream
   grows (or fails) rather than take or wait on a capturing stream's
   memory. */
XSEG_TEST(alloc_flow, nothing_is_stolen_while_a_stream_captures) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  streams_fixture f = {0};
  streams_setup(&f, 256);
  xseg_allocator *a = f.a;
  CUstream sa = f.sa, sb = f.sb, sc = f.sc;
  void *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sa, &p));
  XSEG_ASSERT_CU(xt_latch_hold(sa, f.la));
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, 1 * MiB, sc, &q));          /* sc has pools */
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_CU(cuStreamBeginCapture(sc, CU_STREAM_CAPTURE_MODE_RELAXED));
  uint64_t stream_waits = xsim_call_count("cuStreamWaitEvent");
  uint64_t unmaps = xsim_call_count("cuMemUnmap");
  XSEG_ASSERT_OK(xseg_malloc(a, 48 * MiB, sb, &q));
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamWaitEvent"), stream_waits);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemUnmap"), unmaps);
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(a, &st));
  XSEG_EXPECT_GE(st.reserved_bytes.current, 96 * MiB);
  CUgraph g = NULL;
  XSEG_EXPECT_CU(cuStreamEndCapture(sc, &g));
  if (g != NULL) XSEG_EXPECT_CU(cuGraphDestroy(g));
  XSEG_EXPECT_OK(xseg_free(a, q));
  streams_teardown(&f);
}

/* ---- stress ------------------------------------------------------------- */

/* 4 threads on 4 shared streams, each stream made to lag by host functions
   that sleep, with a device small enough that memory must move between
   streams. Each block is filled on its stream and copied back on its
   stream just before its free; the copies are checked after the stream
   drains. Memory lent or stolen too early would show another owner's
   bytes. */
enum { FLOW_THREADS = 4, FLOW_STREAMS = 4, FLOW_LIVE = 6, FLOW_ITERS = 400,
       FLOW_CHECKS = 24, FLOW_PROBE = 256 };

typedef struct flow_shared {
  xseg_allocator *a;
  CUstream s[FLOW_STREAMS];
  _Atomic int failures;
} flow_shared;

typedef struct flow_slot {
  void *p;
  size_t size;
  int stream;
  unsigned char v;
} flow_slot;

/* What a block held just before its free, read back on its stream. */
typedef struct flow_probe {
  unsigned char v;
  unsigned char bytes[2][FLOW_PROBE];   /* head and tail */
} flow_probe;

typedef struct flow_thread {
  flow_shared *sh;
  unsigned seed;
  int id;
  flow_slot slot[FLOW_LIVE];
  flow_probe check[FLOW_CHECKS];
  int n_checks;
} flow_thread;

static void CUDA_CB flow_lag(void *arg) {
  (void)arg;
  usleep(200);
}

/* Lets the streams drain, then checks every probe queued so far. */
static void flow_drain(flow_thread *t) {
  for (int i = 0; i < FLOW_STREAMS; i++)
    if (cuStreamSynchronize(t->sh->s[i]) != CUDA_SUCCESS) t->sh->failures++;
  for (int c = 0; c < t->n_checks; c++)
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < FLOW_PROBE; i++)
        if (t->check[c].bytes[k][i] != t->check[c].v) {
          t->sh->failures++;
          k = 2;
          break;
        }
  t->n_checks = 0;
}

/* Queues the read-back of sl's head and tail on its stream, then frees it
   (the free follows the read in stream order). */
static void flow_retire(flow_thread *t, flow_slot *sl) {
  if (t->n_checks == FLOW_CHECKS) flow_drain(t);
  flow_probe *pr = &t->check[t->n_checks++];
  pr->v = sl->v;
  CUstream s = t->sh->s[sl->stream];
  CUdeviceptr d = at_dptr(sl->p);
  if (cuMemcpyDtoHAsync(pr->bytes[0], d, FLOW_PROBE, s) != CUDA_SUCCESS ||
      cuMemcpyDtoHAsync(pr->bytes[1], d + sl->size - FLOW_PROBE, FLOW_PROBE,
                        s) != CUDA_SUCCESS ||
      xseg_free(t->sh->a, sl->p) != XSEG_OK)
    t->sh->failures++;
  sl->p = NULL;
}

static void *flow_worker(void *arg) {
  flow_thread *t = arg;
  xt_context(0);
  for (int it = 0; it < FLOW_ITERS; it++) {
    flow_slot *sl = &t->slot[rand_r(&t->seed) % FLOW_LIVE];
    if (sl->p != NULL) flow_retire(t, sl);
    sl->stream = (t->id + it) % FLOW_STREAMS;
    CUstream s = t->sh->s[sl->stream];
    sl->size = ((size_t)(rand_r(&t->seed) % 48) + 1) * 128 * 1024;
    if (xseg_malloc(t->sh->a, sl->size, s, &sl->p) != XSEG_OK) {
      t->sh->failures++;
      sl->p = NULL;
      continue;
    }
    sl->v = (unsigned char)(rand_r(&t->seed) | 1);
    if (cuLaunchHostFunc(s, flow_lag, NULL) != CUDA_SUCCESS ||
        cuMemsetD8Async(at_dptr(sl->p), sl->v, sl->size, s) != CUDA_SUCCESS)
      t->sh->failures++;
  }
  for (int i = 0; i < FLOW_LIVE; i++)
    if (t->slot[i].p != NULL) flow_retire(t, &t->slot[i]);
  flow_drain(t);
  return NULL;
}

/* A 160 MiB device on the emulator; on a GPU a 160 MiB memory-fraction
   cap stands for it. */
XSEG_TEST(alloc_flow, stress_four_threads_four_lagging_streams) {
  if (xt_have_sim()) xsim_set_device_memory(0, 160 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  static flow_shared sh;
  memset(&sh, 0, sizeof sh);
  sh.a = xt_have_sim() ? at_create(NULL) : at_create_capped(NULL, 160 * MiB);
  XSEG_ASSERT_TRUE(sh.a != NULL);
  for (int i = 0; i < FLOW_STREAMS; i++) XSEG_ASSERT_TRUE((sh.s[i] = at_stream_new()) != NULL);
  static flow_thread t[FLOW_THREADS];
  pthread_t th[FLOW_THREADS];
  for (int i = 0; i < FLOW_THREADS; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i] = (flow_thread){.sh = &sh, .seed = 1234u + (unsigned)i, .id = i};
    XSEG_ASSERT_EQ(pthread_create(&th[i], NULL, flow_worker, &t[i]), 0);
  }
  for (int i = 0; i < FLOW_THREADS; i++) pthread_join(th[i], NULL);
  XSEG_EXPECT_EQ(sh.failures, 0);
  XSEG_EXPECT_OK(xseg_check(sh.a));
  XSEG_EXPECT_OK(xseg_empty_cache(sh.a));
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(sh.a, &st));
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 0);
  XSEG_EXPECT_EQ(st.num_ooms, 0);
  XSEG_EXPECT_EQ(st.mapped_bytes, 0);
  if (xt_have_sim()) XSEG_EXPECT_EQ(live_now().mappings, 0);
  xseg_destroy(sh.a);
  for (int i = 0; i < FLOW_STREAMS; i++) XSEG_EXPECT_CU(cuStreamDestroy(sh.s[i]));
}
