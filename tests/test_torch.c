/* The PyTorch entry points (alloc/torch.c): one allocator per device made on
   first use from XSEG_ALLOC_CONF (once, even when two threads race to it),
   record_stream through them with the other stream held back, graph pools,
   and failures kept for xseg_torch_last_error, never a crash. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/torch.h"
#include "alloc_helpers.h"

enum { SIZE = 3 << 20 };

/* The entry points read XSEG_ALLOC_CONF: point it at the tests' driver. */
static void torch_setup(void) {
  char conf[64];
  setenv("XSEG_ALLOC_CONF", at_conf(NULL, conf, sizeof conf), 1);
  xseg_torch_clear_error();
}

static xseg_stats torch_stats(void) {
  xseg_stats s;
  memset(&s, 0, sizeof s);
  xseg_get_stats(xseg_torch_allocator(0), &s);
  return s;
}

XSEG_TEST(torch, record_stream_defers_the_free_until_the_stream_is_done) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  XSEG_EXPECT_FALSE(xseg_torch_has_allocator(0));
  CUstream s1 = at_stream_new(), s2 = at_stream_new();
  void *p = xseg_torch_malloc(SIZE, 0, s1);
  XSEG_ASSERT_TRUE(p != NULL);
  XSEG_EXPECT_TRUE(xseg_torch_has_allocator(0));
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(s2, l));
  XSEG_ASSERT_CU(cuMemsetD8Async((CUdeviceptr)(uintptr_t)p, 1, SIZE, s2));
  xseg_torch_record_stream(p, s2);
  xseg_torch_free(p, SIZE, 0, s1);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  /* s2 is held: the block waits, and empty_cache keeps its granules. */
  XSEG_EXPECT_EQ(torch_stats().pending_free_bytes, SIZE);
  xseg_torch_empty_cache();
  XSEG_EXPECT_GE(torch_stats().reserved_bytes.current, SIZE);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s2));
  xt_latch_free(l);
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(xseg_torch_allocator(0)));
  XSEG_EXPECT_EQ(torch_stats().pending_free_bytes, 0);
  XSEG_EXPECT_EQ(torch_stats().reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  cuStreamDestroy(s1);
  cuStreamDestroy(s2);
  xs_torch_destroy_all();
}

typedef struct racer {
  pthread_barrier_t *start;
  void *ptr;
} racer;

static void *racer_run(void *arg) {
  racer *r = arg;
  pthread_barrier_wait(r->start);
  r->ptr = xseg_torch_malloc(4096, 0, NULL);
  return NULL;
}

XSEG_TEST(torch, two_threads_first_use_makes_one_allocator) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  enum { N = 4 };
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, N);
  racer r[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    r[i] = (racer){&start, NULL};
    pthread_create(&t[i], NULL, racer_run, &r[i]);
  }
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&start);
  /* One allocator holds all four blocks: it frees each of them. */
  xseg_allocator *a = xseg_torch_allocator(0);
  XSEG_EXPECT_EQ(at_stats(a).allocation.current, N);
  for (int i = 0; i < N; i++) {
    XSEG_ASSERT_TRUE(r[i].ptr != NULL);
    XSEG_EXPECT_OK(xseg_free(a, r[i].ptr));
  }
  xs_torch_destroy_all();
}

/* A 1 GiB device on the emulator; on a GPU a memory-fraction cap a MiB
   above 1 GiB stands for it (as at_create_capped sets it). */
XSEG_TEST(torch, out_of_memory_is_kept_with_the_message) {
  if (xt_have_sim()) xsim_set_device_memory(0, 1 * GiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  if (!xt_have_sim()) {
    CUdevice dev;
    size_t total = 0;
    XSEG_ASSERT_CU(cuDeviceGet(&dev, 0));
    XSEG_ASSERT_CU(cuDeviceTotalMem(&total, dev));
    char conf[64];
    snprintf(conf, sizeof conf, "xseg_memory_fraction:%.12g",
             ((double)GiB + (double)MiB) / (double)total);
    setenv("XSEG_ALLOC_CONF", conf, 1);
  }
  void *p = xseg_torch_malloc(512 * MiB, 0, NULL);
  XSEG_ASSERT_TRUE(p != NULL);
  XSEG_EXPECT_TRUE(xseg_torch_malloc(768 * MiB, 0, NULL) == NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(),
                          "xseg_torch_malloc: XSEG_ERR_OUT_OF_MEMORY") != NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(),
                          "Tried to allocate 768.00 MiB") != NULL);
  /* The live block is untouched, and a smaller request still fits. */
  void *q = xseg_torch_malloc(256 * MiB, 0, NULL);
  XSEG_EXPECT_TRUE(q != NULL);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  xseg_torch_free(q, 256 * MiB, 0, NULL);
  xseg_torch_free(p, 512 * MiB, 0, NULL);
  xs_torch_destroy_all();
}

XSEG_TEST(torch, failures_are_kept_with_their_cause) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  XSEG_EXPECT_TRUE(xseg_torch_malloc(-1, 0, NULL) == NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(), "size -1") != NULL);
  XSEG_EXPECT_TRUE(xseg_torch_malloc(512, xseg_torch_device_limit(), NULL) ==
                   NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(), "device 64") != NULL);
  int x;
  xseg_torch_record_stream(&x, NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(),
                          "XSEG_ERR_UNKNOWN_POINTER") != NULL);
  xseg_torch_clear_error();
  xseg_torch_free(&x, 4, 0, NULL);     /* reported on stderr, too */
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(), "xseg_torch_free") != NULL);
  xseg_torch_set_memory_fraction(1.5, 0);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(),
                          "XSEG_ERR_INVALID_ARGUMENT") != NULL);
  xseg_torch_clear_error();
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  /* Nothing was lost on the way. */
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).allocation.current, 0);
  xs_torch_destroy_all();
}

XSEG_TEST(torch, graph_pool_keeps_its_blocks_apart) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  CUstream s = at_stream_new();
  /* A block freed on s before the capture is not reused inside it. */
  void *before = xseg_torch_malloc(SIZE, 0, s);
  XSEG_ASSERT_TRUE(before != NULL);
  xseg_torch_free(before, SIZE, 0, s);
  xseg_torch_begin_allocate_to_pool(0, 0, 7, s);
  void *in_pool = xseg_torch_malloc(SIZE, 0, s);
  xseg_torch_end_allocate_to_pool(0, 0, 7);
  XSEG_ASSERT_TRUE(in_pool != NULL);
  XSEG_EXPECT_TRUE(in_pool != before);
  xseg_torch_free(in_pool, SIZE, 0, s);
  xseg_torch_release_pool(0, 0, 7);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  char *snap = xseg_torch_snapshot_json(0);
  char *stats = xseg_torch_stats_json(0);
  XSEG_ASSERT_TRUE(snap != NULL && stats != NULL);
  XSEG_EXPECT_TRUE(strstr(snap, "\"segments\"") != NULL);
  XSEG_EXPECT_TRUE(strstr(stats, "\"allocated_bytes.all.current\": 0") !=
                   NULL);
  xseg_torch_string_free(snap);
  xseg_torch_string_free(stats);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  cuStreamDestroy(s);
  xs_torch_destroy_all();
}

/* A graph pool used out of order keeps the failure with its cause and
   leaves the pools as they were: a second begin of a pool already being
   allocated to (PyTorch refuses it too: "already recording to
   mempool_id"), a release before the end, and a begin on a stream that
   already allocates to another pool, which is undone (the pool it named
   is not left open: it can be begun again). */
XSEG_TEST(torch, graph_pool_misuse_is_kept_and_undone) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  CUstream s = at_stream_new(), s2 = at_stream_new();
  xseg_torch_begin_allocate_to_pool(0, 0, 7, s);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  xseg_torch_begin_allocate_to_pool(0, 0, 7, s2);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(),
                          "already being allocated to") != NULL);
  xseg_torch_clear_error();
  xseg_torch_release_pool(0, 0, 7);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(), "end it first") != NULL);
  xseg_torch_clear_error();
  /* s allocates to pool 7 already: pool 8's begin on s fails, undone. */
  xseg_torch_begin_allocate_to_pool(0, 0, 8, s);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(), "already allocates to "
                          "pool") != NULL);
  xseg_torch_clear_error();
  void *in_pool = xseg_torch_malloc(SIZE, 0, s);       /* still pool 7's */
  XSEG_ASSERT_TRUE(in_pool != NULL);
  xseg_torch_end_allocate_to_pool(0, 0, 7);
  xseg_torch_begin_allocate_to_pool(0, 0, 8, s2);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  void *in_8 = xseg_torch_malloc(SIZE, 0, s2);
  XSEG_ASSERT_TRUE(in_8 != NULL);
  xseg_torch_end_allocate_to_pool(0, 0, 8);
  xseg_torch_free(in_pool, SIZE, 0, s);
  xseg_torch_free(in_8, SIZE, 0, s2);
  xseg_torch_release_pool(0, 0, 7);
  xseg_torch_release_pool(0, 0, 8);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).allocation.current, 0);
  cuStreamDestroy(s);
  cuStreamDestroy(s2);
  xs_torch_destroy_all();
}

/* Recording turned on before a device is first used reaches it too, as
   PyTorch's recordHistory reaches every device's allocator; an alloc is
   traced with the size asked for, as PyTorch's record_trace. */
XSEG_TEST(torch, history_reaches_devices_used_later) {
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  xseg_torch_record_memory_history(100);
  XSEG_EXPECT_FALSE(xseg_torch_has_allocator(1));
  XSEG_ASSERT_TRUE(xt_context(1) != NULL);
  void *p = xseg_torch_malloc(1000, 1, NULL);
  XSEG_ASSERT_TRUE(p != NULL);
  /* Recorded on a stream of its own device, with device 0's allocator
     there too, asked first: that one does not refuse the stream of a
     block it does not have. */
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  void *p0 = xseg_torch_malloc(1000, 0, NULL);
  XSEG_ASSERT_TRUE(p0 != NULL);
  XSEG_ASSERT_TRUE(xt_context(1) != NULL);
  CUstream s1;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  xseg_torch_record_stream(p, s1);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  char *snap = xseg_torch_snapshot_json(1);
  XSEG_ASSERT_TRUE(snap != NULL);
  XSEG_EXPECT_TRUE(strstr(snap, "\"action\": \"alloc\"") != NULL);
  XSEG_EXPECT_TRUE(strstr(snap, "\"size\": 1000,") != NULL);
  xseg_torch_string_free(snap);
  xseg_torch_free(p, 1000, 1, NULL);
  xseg_torch_free(p0, 1000, 0, NULL);
  xseg_torch_record_memory_history(0);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  xs_torch_destroy_all();
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_emulated_devices_end();
}

/* Tensor.record_stream with a stream of another device (PyTorch records
   it, on the stream's device): the hook finds the block's allocator, and
   the free waits for that stream's work, held back here. */
XSEG_TEST(torch, record_stream_of_another_device_waits_for_it) {
  xt_emulate_devices(2);
  XT_REQUIRE_DEVICES(2);
  CUstream s1 = xt_stream_of_device(1);
  XSEG_ASSERT_TRUE(s1 != NULL);
  torch_setup();
  void *p = xseg_torch_malloc(SIZE, 0, NULL);
  XSEG_ASSERT_TRUE(p != NULL);
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(s1, l));
  xseg_torch_record_stream(p, s1);
  xseg_torch_free(p, SIZE, 0, NULL);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  XSEG_EXPECT_EQ(torch_stats().pending_free_bytes, SIZE);
  void *q = xseg_torch_malloc(SIZE, 0, NULL);
  XSEG_EXPECT_TRUE(q != NULL && q != p);
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(s1));
  xt_latch_free(l);
  xseg_torch_free(q, SIZE, 0, NULL);
  XSEG_EXPECT_OK(xseg_empty_cache_blocking(xseg_torch_allocator(0)));
  XSEG_EXPECT_EQ(torch_stats().pending_free_bytes, 0);
  XSEG_EXPECT_EQ(torch_stats().reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  xs_torch_destroy_all();
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  xt_emulated_devices_end();
}

/* A pool whose filter claims one thread's allocations (use_mem_pool's). */
typedef struct thread_pool_ctx {
  pthread_t owner;
  atomic_int asked;             /* the owner's allocation asked the filter */
} thread_pool_ctx;

static int thread_pool_filter(void *ctx, struct CUstream_st *stream) {
  (void)stream;
  thread_pool_ctx *c = ctx;
  if (!pthread_equal(pthread_self(), c->owner)) return 0;
  atomic_store(&c->asked, 1);
  return 1;
}

typedef struct chosen_racer {
  CUstream stream;
  atomic_int go;
  void *block;
} chosen_racer;

static void *chosen_racer_run(void *arg) {
  chosen_racer *r = arg;
  while (atomic_load(&r->go) == 0) sched_yield();
  if (xt_context(0) != NULL) r->block = xseg_torch_malloc(4096, 0, r->stream);
  return NULL;
}

/* An allocation that names its pool (its stream announced to another pool)
   is made under the pools' lock, as PyTorch chooses and allocates under
   one mutex: an end or release of that pool on another thread waits for
   it, and so finds the pool's blocks to release. (Made after the lock
   dropped, the allocation could follow the release and make a pool that
   nothing released.) Forced: the emulator holds the new pool's address
   reservation back 50 ms, and a call that takes the pools' lock, made
   meanwhile, returns only after the allocation has mapped its memory. */
XSEG_TEST(torch, a_chosen_allocation_holds_the_pools_lock) {
  XT_REQUIRE_SIM_FOR("holds a driver call back");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  chosen_racer r = {.stream = at_stream_new()};
  thread_pool_ctx mine = {.owner = pthread_self()};
  xseg_torch_begin_allocate_to_pool_if(0, 0, 1, thread_pool_filter, &mine,
                                       NULL);
  void *x = xseg_torch_malloc(4096, 0, r.stream);   /* announced to 1 */
  XSEG_ASSERT_TRUE(x != NULL);
  pthread_t t;
  XSEG_ASSERT_EQ(pthread_create(&t, NULL, chosen_racer_run, &r), 0);
  thread_pool_ctx theirs = {.owner = t};
  xseg_torch_begin_allocate_to_pool_if(0, 0, 2, thread_pool_filter, &theirs,
                                       NULL);
  uint64_t maps = xsim_call_count("cuMemMap");
  xsim_set_latency("cuMemAddressReserve", 50 * 1000 * 1000);
  atomic_store(&r.go, 1);
  while (atomic_load(&theirs.asked) == 0) sched_yield();
  usleep(5000);                   /* the other thread is in the 50 ms */
  (void)xseg_torch_pool_id(0, 0, 2);              /* the pools' lock */
  uint64_t maps_then = xsim_call_count("cuMemMap");
  pthread_join(t, NULL);
  xsim_set_latency("cuMemAddressReserve", 0);
  XSEG_EXPECT_GT(maps_then, maps);
  XSEG_ASSERT_TRUE(r.block != NULL);
  xseg_torch_end_allocate_to_pool(0, 0, 2);
  xseg_torch_free(r.block, 4096, 0, r.stream);
  xseg_torch_release_pool(0, 0, 2);
  xseg_torch_free(x, 4096, 0, r.stream);
  xseg_torch_end_allocate_to_pool(0, 0, 1);
  xseg_torch_release_pool(0, 0, 1);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  xseg_torch_empty_cache();
  xseg_allocator *a = xseg_torch_allocator(0);
  XSEG_EXPECT_EQ(at_stats(a).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(a));
  cuStreamDestroy(r.stream);
  xs_torch_destroy_all();
}

/* Pools of pairs PyTorch does not make get one id each: two that a hash
   of the pair had folded to one id stay apart (ending one does not end
   the other's stream, whose freed block it takes back). */
XSEG_TEST(torch, pools_of_any_two_pairs_stay_apart) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  CUstream s1 = at_stream_new(), s2 = at_stream_new();
  const unsigned long long a1 = 1, a2 = 0x10, b1 = 2, b2 = 0xa2598acb81de842full;
  xseg_torch_begin_allocate_to_pool(0, a1, a2, s1);
  xseg_torch_begin_allocate_to_pool(0, b1, b2, s2);
  xseg_pool_id ia = xseg_torch_pool_id(0, a1, a2);
  xseg_pool_id ib = xseg_torch_pool_id(0, b1, b2);
  XSEG_EXPECT_TRUE(ia != 0 && ib != 0 && ia != ib);
  void *pa = xseg_torch_malloc(4096, 0, s1);
  void *pb = xseg_torch_malloc(4096, 0, s2);
  XSEG_ASSERT_TRUE(pa != NULL && pb != NULL);
  xseg_torch_free(pb, 4096, 0, s2);
  xseg_torch_end_allocate_to_pool(0, a1, a2);
  xseg_torch_free(pa, 4096, 0, s1);
  xseg_torch_release_pool(0, a1, a2);
  void *again = xseg_torch_malloc(4096, 0, s2);    /* still pool b's */
  XSEG_EXPECT_TRUE(again == pb);
  xseg_torch_free(again, 4096, 0, s2);
  xseg_torch_end_allocate_to_pool(0, b1, b2);
  xseg_torch_release_pool(0, b1, b2);
  XSEG_EXPECT_EQ(xseg_torch_pool_id(0, b1, b2), 0);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  xseg_torch_empty_cache();
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).reserved_bytes.current, 0);
  cuStreamDestroy(s1);
  cuStreamDestroy(s2);
  xs_torch_destroy_all();
}

/* What a call writes on stderr (a lost free's report). */
static void torch_stderr_of(void (*call)(void *), void *arg, char *out,
                            size_t size) {
  FILE *f = tmpfile();
  int saved = dup(2);
  XSEG_ASSERT_TRUE(f != NULL && saved >= 0);
  fflush(stderr);
  dup2(fileno(f), 2);
  call(arg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(f);
  size_t n = fread(out, 1, size - 1, f);
  out[n] = '\0';
  fclose(f);
}

static void torch_free_on_device_minus_one(void *p) {
  xseg_torch_free(p, SIZE, -1, NULL);
}

/* A free naming a device out of range loses the block (the caller named
   the wrong one): it is said on stderr, as every lost free is, and kept
   as the error (before, it went unseen). */
XSEG_TEST(torch, a_free_naming_no_device_is_reported) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  void *p = xseg_torch_malloc(SIZE, 0, NULL);
  XSEG_ASSERT_TRUE(p != NULL);
  char said[512];
  torch_stderr_of(torch_free_on_device_minus_one, p, said, sizeof said);
  XSEG_EXPECT_TRUE(strstr(said, "xseg: xseg_torch_free") != NULL);
  XSEG_EXPECT_TRUE(strstr(said, "device -1") != NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(), "device -1") != NULL);
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).allocation.current, 1);
  xseg_torch_free(p, SIZE, 0, NULL);
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).allocation.current, 0);
  xs_torch_destroy_all();
}

static int torch_claims_stream(void *ctx, struct CUstream_st *stream) {
  return stream == (struct CUstream_st *)ctx;
}

/* empty_cache after a graph's pool is begun and its capture started, and
   before its first allocation (when torch.cuda.graph's pool reaches the
   core): the capture is one the core cannot see yet, so nothing is
   released and the call says why, and the capture goes on (before, the
   device-wide wait that a released graph pool's memory owes ended it).
   Once the capture ended, empty_cache works again. */
XSEG_TEST(torch, empty_cache_before_a_captures_first_allocation_spares_it) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  torch_setup();
  CUstream s = at_stream_new(), s2 = at_stream_new();
  /* A released graph pool: taking its memory waits for the device. */
  xseg_torch_begin_allocate_to_pool(0, 0, 7, s);
  void *p = xseg_torch_malloc(SIZE, 0, s);
  xseg_torch_end_allocate_to_pool(0, 0, 7);
  XSEG_ASSERT_TRUE(p != NULL);
  xseg_torch_free(p, SIZE, 0, s);
  xseg_torch_release_pool(0, 0, 7);
  /* The next graph: pool begun, capture begun, nothing allocated yet. */
  xseg_torch_begin_allocate_to_pool_if(0, 0, 8, torch_claims_stream, s2,
                                       NULL);
  XSEG_ASSERT_CU(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
  XSEG_EXPECT_STATUS(xseg_torch_empty_cache_device(0, 1), XSEG_ERR_CAPTURE);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "has not allocated yet") !=
                   NULL);
  xseg_torch_empty_cache();
  XSEG_EXPECT_TRUE(strstr(xseg_torch_last_error(), "XSEG_ERR_CAPTURE") !=
                   NULL);
  xseg_torch_clear_error();
  void *q = xseg_torch_malloc(SIZE, 0, s2);
  XSEG_ASSERT_TRUE(q != NULL);
  CUgraph g = NULL;
  XSEG_EXPECT_CU(cuStreamEndCapture(s2, &g));       /* it survived */
  if (g != NULL) XSEG_EXPECT_CU(cuGraphDestroy(g));
  xseg_torch_end_allocate_to_pool(0, 0, 8);
  xseg_torch_free(q, SIZE, 0, s2);
  xseg_torch_release_pool(0, 0, 8);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  XSEG_EXPECT_OK(xseg_torch_empty_cache_device(0, 1));
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  cuStreamDestroy(s);
  cuStreamDestroy(s2);
  xs_torch_destroy_all();
}

/* A test's opening with two devices (it skips where fewer exist): their
   contexts `mine` (device 0's, made current) and `theirs`, and the entry
   points set up. */
#define TORCH_TWO_DEVICES_OPEN(mine, theirs)                                \
  xt_emulate_devices(2);                                                    \
  XT_REQUIRE_DEVICES(2);                                                    \
  CUcontext mine = xt_context(0), theirs = xt_context(1);                   \
  XSEG_ASSERT_TRUE(mine != NULL && theirs != NULL);                         \
  torch_setup();                                                            \
  XSEG_ASSERT_CU(cuCtxSetCurrent(mine))

/* p.record_stream(torch.cuda.current_stream(1)) for a block of device 0,
   device 1 current and on its default stream: PyTorch hands the hook
   NULL, device 1's legacy stream, which device 0's allocator would read
   as its own (and record nothing: p was allocated on it). The free waits
   for device 1's default stream's work (held back here), as PyTorch's own
   allocator waits on the stream's device; before, p was handed out again
   at once. */
XSEG_TEST(torch, another_devices_default_stream_is_waited_for) {
  TORCH_TWO_DEVICES_OPEN(mine, theirs);
  void *p = xseg_torch_malloc(SIZE, 0, NULL);
  XSEG_ASSERT_TRUE(p != NULL);
  XSEG_ASSERT_CU(cuCtxSetCurrent(theirs));
  xt_latch *held = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(NULL, held));    /* device 1's default */
  xseg_torch_record_stream(p, NULL);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  xseg_torch_free(p, SIZE, 0, NULL);
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).pending_free_bytes, SIZE);
  XSEG_ASSERT_CU(cuCtxSetCurrent(mine));
  void *q = xseg_torch_malloc(SIZE, 0, NULL);
  XSEG_EXPECT_TRUE(q != NULL && q != p);        /* device 1 still uses p */
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuCtxSetCurrent(theirs));
  XSEG_ASSERT_CU(cuCtxSynchronize());
  XSEG_ASSERT_CU(cuCtxSetCurrent(mine));
  xseg_torch_free(q, SIZE, 0, NULL);
  XSEG_EXPECT_OK(xseg_torch_empty_cache_device(0, 1));
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).pending_free_bytes, 0);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  xt_latch_free(held);
  xs_torch_destroy_all();
  xt_emulated_devices_end();
}

/* p.record_stream(torch.cuda.default_stream(0)) for a block of device 0
   allocated on another stream, with device 1 current: the hook gets NULL
   here too, and cannot tell it from device 1's default stream, so the free
   waits for both (device 0's, held back here). A block of device 1
   recorded on NULL while device 1 is current needs no stand-in: no stream
   is made for it (nor for device 0's allocator, which does not own it). */
XSEG_TEST(torch, a_default_stream_of_either_device_is_waited_for) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  TORCH_TWO_DEVICES_OPEN(mine, theirs);
  CUstream s0 = at_stream_new();
  void *p = xseg_torch_malloc(SIZE, 0, s0);
  XSEG_ASSERT_TRUE(p != NULL);
  xt_latch *held = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(NULL, held));    /* device 0's default */
  XSEG_ASSERT_CU(cuCtxSetCurrent(theirs));
  xseg_torch_record_stream(p, NULL);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  xseg_torch_free(p, SIZE, 0, s0);
  /* Device 1's work is all done: only device 0's default stream, held,
     keeps p. */
  XSEG_ASSERT_CU(cuCtxSynchronize());
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).pending_free_bytes, SIZE);
  XSEG_EXPECT_OK(xseg_torch_empty_cache_device(0, 0));
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).pending_free_bytes, SIZE);
  XSEG_EXPECT_GE(at_stats(xseg_torch_allocator(0)).reserved_bytes.current,
                 SIZE);
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuCtxSetCurrent(mine));
  XSEG_ASSERT_CU(cuCtxSynchronize());
  XSEG_EXPECT_OK(xseg_torch_empty_cache_device(0, 1));
  XSEG_EXPECT_EQ(at_stats(xseg_torch_allocator(0)).pending_free_bytes, 0);
  /* Device 1's own block on its own default stream. */
  XSEG_ASSERT_CU(cuCtxSetCurrent(theirs));
  void *p1 = xseg_torch_malloc(SIZE, 1, NULL);
  XSEG_ASSERT_TRUE(p1 != NULL);
  uint64_t made = xsim_call_count("cuStreamCreate");
  xseg_torch_record_stream(p1, NULL);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  XSEG_EXPECT_EQ(xsim_call_count("cuStreamCreate"), made);
  xseg_torch_free(p1, SIZE, 1, NULL);
  XSEG_ASSERT_CU(cuCtxSetCurrent(mine));
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(1)));
  xt_latch_free(held);
  xs_torch_destroy_all();
  XSEG_EXPECT_CU(cuStreamDestroy(s0));
  xt_emulated_devices_end();
}
