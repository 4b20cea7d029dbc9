/* Physical memory that flows while the device runs (alloc/grow.c,
   alloc/reclaim.c, segments/release.c): a free block its stream may still
   use lends its handles (mapped again at once, the old mapping unmapped
   when the stream's guard passes), another stream takes it behind an event
   (the device waits, not the host), and growth creates memory only when no
   free memory anywhere serves. Every race is forced: a stream is held back
   by a latch, so "the old work has not run yet" is certain. In the
   emulator a device pointer is a host address, so work touching an
   unmapped range would fault the test, not pass it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_helpers.h"

/* True when every byte of [d, d+n) is v (read through the driver). */
static bool dev_bytes_are(CUdeviceptr d, size_t n, unsigned char v) {
  unsigned char *buf = malloc(n);
  bool ok = buf != NULL && cuMemcpyDtoH(buf, d, n) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < n; i++) ok = buf[i] == v;
  free(buf);
  return ok;
}

static uint64_t host_waits(void) {
  return xsim_call_count("cuStreamSynchronize") +
         xsim_call_count("cuCtxSynchronize") +
         xsim_call_count("cuEventSynchronize");
}

static xsim_live live_now(void) {
  xsim_live l;
  xsim_get_live(&l);
  return l;
}

/* ---- the driver: one handle, two mappings --------------------------------- */

/* A handle mapped at two addresses holds one set of bytes: written through
   one, read through the other; unmapping one leaves the other. */
XSEG_TEST(alloc_flow, handle_mapped_at_two_addresses_holds_the_same_bytes) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
  size_t g = 0;
  XSEG_ASSERT_CU(cuMemGetAllocationGranularity(
      &g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(cuMemCreate(&h, g, &prop, 0));
  CUdeviceptr va[2];
  CUmemAccessDesc acc = {.location = prop.location,
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  for (int i = 0; i < 2; i++) {
    XSEG_ASSERT_CU(cuMemAddressReserve(&va[i], g, 0, 0, 0));
    XSEG_ASSERT_CU(cuMemMap(va[i], g, 0, h, 0));
    XSEG_ASSERT_CU(cuMemSetAccess(va[i], g, &acc, 1));
  }
  XSEG_EXPECT_CU(cuMemsetD8(va[0], 0x5a, g));
  XSEG_EXPECT_TRUE(dev_bytes_are(va[1], g, 0x5a));
  XSEG_EXPECT_CU(cuMemsetD8(va[1] + g / 2, 0xc3, g / 2));
  XSEG_EXPECT_TRUE(dev_bytes_are(va[0] + g / 2, g / 2, 0xc3));
  XSEG_EXPECT_CU(cuMemUnmap(va[0], g));
  XSEG_EXPECT_TRUE(dev_bytes_are(va[1], g / 2, 0x5a));
  XSEG_EXPECT_CU(cuMemRelease(h));          /* still mapped at va[1] */
  XSEG_EXPECT_TRUE(dev_bytes_are(va[1] + g / 2, g / 2, 0xc3));
  XSEG_EXPECT_CU(cuMemUnmap(va[1], g));
  for (int i = 0; i < 2; i++) XSEG_EXPECT_CU(cuMemAddressFree(va[i], g));
}

/* ---- same stream: map before unmap ---------------------------------------- */

/* One stream, held back: a 40 MiB block with queued work is freed, then a
   48 MiB request that it cannot serve in place. Growth maps the freed
   handles again at once (no new memory beyond the device's 64 MiB, no host
   wait), and the old mapping stays until the held work has run. */
typedef struct lend_fixture {
  xseg_allocator *a;
  CUstream s;
  xt_latch *l;
  void *old, *pin, *fresh;
} lend_fixture;

/* The test itself skips first (XT_REQUIRE_SIM_FOR returns from the
   function it is in, and the test would go on without a fixture). */
static void lend_setup(lend_fixture *f) {
  xsim_set_device_memory(0, 64 * MiB);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  f->a = at_create(NULL);
  f->s = at_stream_new();
  f->l = xt_latch_new();
  XSEG_ASSERT_OK(xseg_malloc(f->a, 40 * MiB, f->s, &f->old));
  XSEG_ASSERT_OK(xseg_malloc(f->a, 8 * MiB, f->s, &f->pin));
  XSEG_ASSERT_CU(xt_latch_hold(f->s, f->l));
  /* The old work: writes the old block after the latch. */
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(f->old), 0x77, 40 * MiB, f->s));
  XSEG_ASSERT_OK(xseg_free(f->a, f->old));
}

static void lend_teardown(lend_fixture *f) {
  xt_latch_open(f->l);
  XSEG_EXPECT_CU(cuStreamSynchronize(f->s));
  if (f->fresh != NULL) XSEG_EXPECT_OK(xseg_free(f->a, f->fresh));
  XSEG_EXPECT_OK(xseg_free(f->a, f->pin));
  XSEG_EXPECT_OK(xseg_check(f->a));
  xseg_destroy(f->a);
  xt_latch_free(f->l);
  XSEG_EXPECT_CU(cuStreamDestroy(f->s));
  xsim_live l = live_now();
  XSEG_EXPECT_EQ(l.handles, 0);            /* every handle released */
  XSEG_EXPECT_EQ(l.mappings, 0);
}

XSEG_TEST(alloc_flow, same_stream_maps_a_busy_free_handle_again_at_once) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  lend_fixture f = {0};
  lend_setup(&f);
  uint64_t waits = host_waits(), creates = xsim_call_count("cuMemCreate");
  uint64_t unmaps = xsim_call_count("cuMemUnmap");
  XSEG_ASSERT_OK(xseg_malloc(f.a, 48 * MiB, f.s, &f.fresh));
  XSEG_EXPECT_EQ(host_waits(), waits);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemUnmap"), unmaps);  /* nothing yet */
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(f.a, &st));
  XSEG_EXPECT_LE(st.reserved_bytes.current, 64 * MiB);
  XSEG_EXPECT_EQ(st.num_ooms, 0);
  /* At most 8 MiB fresh (the rest was lent): 48 + 8 live on 64. */
  XSEG_EXPECT_LE(xsim_call_count("cuMemCreate") - creates, 8);
  xsim_live l = live_now();
  XSEG_EXPECT_GT(l.mappings, l.handles);   /* some handle is mapped twice */
  XSEG_EXPECT_EQ((uint64_t)st.reserved_bytes.current, l.physical_bytes);
  XSEG_EXPECT_OK(xseg_check(f.a));
  lend_teardown(&f);
}

/* The new owner's data: old work queued before the free runs first (stream
   order), so it never lands in the new block after the new owner writes,
   and reading the block after the new owner's first write shows only the
   new owner's bytes. */
XSEG_TEST(alloc_flow, old_work_never_lands_in_the_new_block) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  lend_fixture f = {0};
  lend_setup(&f);
  XSEG_ASSERT_OK(xseg_malloc(f.a, 48 * MiB, f.s, &f.fresh));
  unsigned char v = at_byte(f.fresh, 3);
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(f.fresh), v, 48 * MiB, f.s));
  unsigned char *seen = malloc(48 * MiB);
  XSEG_ASSERT_TRUE(seen != NULL);
  XSEG_ASSERT_CU(cuMemcpyDtoHAsync(seen, at_dptr(f.fresh), 48 * MiB, f.s));
  usleep(10000);
  XSEG_EXPECT_EQ(cuStreamQuery(f.s), CUDA_ERROR_NOT_READY);
  xt_latch_open(f.l);
  XSEG_EXPECT_CU(cuStreamSynchronize(f.s));
  size_t bad = 0;
  for (size_t i = 0; i < 48 * MiB; i++) bad += seen[i] != v;
  XSEG_EXPECT_EQ(bad, 0);
  XSEG_EXPECT_TRUE(dev_bytes_are(at_dptr(f.fresh), 48 * MiB, v));
  free(seen);
  lend_teardown(&f);
}

/* Nothing is unmapped while held work can touch it: release passes while
   the stream is held leave the old mapping (the held memset then writes
   through it, which would fault on an unmapped range); once the work has
   run, a pass unmaps it and the mapping count drops back. */
XSEG_TEST(alloc_flow, the_old_mapping_stays_until_its_work_is_done) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  lend_fixture f = {0};
  lend_setup(&f);
  XSEG_ASSERT_OK(xseg_malloc(f.a, 48 * MiB, f.s, &f.fresh));
  uint64_t mappings = live_now().mappings;
  uint64_t unmaps = xsim_call_count("cuMemUnmap");
  XSEG_EXPECT_OK(xseg_empty_cache(f.a));
  XSEG_EXPECT_OK(xseg_empty_cache(f.a));
  XSEG_EXPECT_EQ(xsim_call_count("cuMemUnmap"), unmaps);
  XSEG_EXPECT_EQ(live_now().mappings, mappings);
  XSEG_EXPECT_OK(xseg_check(f.a));
  xt_latch_open(f.l);
  XSEG_EXPECT_CU(cuStreamSynchronize(f.s));   /* the held work wrote fine */
  XSEG_EXPECT_OK(xseg_empty_cache(f.a));
  xsim_live l = live_now();
  XSEG_EXPECT_GT(xsim_call_count("cuMemUnmap"), unmaps);
  XSEG_EXPECT_LT(l.mappings, mappings);
  XSEG_EXPECT_EQ(l.mappings, l.handles);      /* no alias left */
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(f.a, &st));
  XSEG_EXPECT_EQ((uint64_t)st.reserved_bytes.current, l.physical_bytes);
  lend_teardown(&f);
}

/* xseg_check covers aliases: with one handle mapped at two places it
   passes, and reserved bytes count that handle once (the driver's
   physical bytes); xseg_destroy with an alias still retiring releases
   every handle and mapping. */
XSEG_TEST(alloc_flow, check_counts_an_alias_once_and_destroy_frees_it) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  lend_fixture f = {0};
  lend_setup(&f);
  XSEG_ASSERT_OK(xseg_malloc(f.a, 48 * MiB, f.s, &f.fresh));
  xsim_live l = live_now();
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(f.a, &st));
  XSEG_EXPECT_GT(l.mappings, l.handles);
  XSEG_EXPECT_EQ((uint64_t)st.reserved_bytes.current, l.physical_bytes);
  XSEG_EXPECT_EQ(st.mapped_bytes, st.reserved_bytes.current);
  XSEG_EXPECT_OK(xseg_check(f.a));
  XSEG_EXPECT_OK(xseg_free(f.a, f.fresh));
  f.fresh = NULL;
  XSEG_EXPECT_OK(xseg_check(f.a));
  lend_teardown(&f);                          /* destroys with aliases */
}

/* A growth that fails after lending: the lent handles go back to nobody,
   but the old mappings still map them, so the driver keeps their memory
   until those are unmapped. Until then their bytes stay in reserved_bytes
   (orphans) and they are not released; once the held work has run, a
   release pass unmaps the old mappings and releases them. Device memory
   held is what reserved_bytes says at every point. */
XSEG_TEST(alloc_flow, a_failed_growth_keeps_counting_what_it_had_lent) {
  lend_fixture f = {0};
  lend_setup(&f);
  xsim_fail_call("cuMemCreate", 1, CUDA_ERROR_UNKNOWN);
  uint64_t releases = xsim_call_count("cuMemRelease");
  void *big = NULL;
  XSEG_EXPECT_EQ(xseg_malloc(f.a, 56 * MiB, f.s, &big), XSEG_ERR_DRIVER);
  xsim_fail_call("cuMemCreate", 0, CUDA_SUCCESS);
  XSEG_EXPECT_EQ(xsim_call_count("cuMemRelease"), releases);
  xseg_stats st;
  XSEG_ASSERT_OK(xseg_get_stats(f.a, &st));
  xsim_live l = live_now();
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 48 * MiB);   /* 40 + the pin */
  XSEG_EXPECT_EQ((int64_t)l.physical_bytes, st.reserved_bytes.current);
  XSEG_EXPECT_EQ((int64_t)l.handles,
                 st.num_device_alloc - st.num_device_free);
  XSEG_EXPECT_OK(xseg_check(f.a));
  XSEG_EXPECT_OK(xseg_empty_cache(f.a));     /* held: nothing may go */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemRelease"), releases);
  XSEG_ASSERT_OK(xseg_get_stats(f.a, &st));
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 48 * MiB);
  xt_latch_open(f.l);
  XSEG_EXPECT_CU(cuStreamSynchronize(f.s));
  XSEG_EXPECT_OK(xseg_empty_cache(f.a));
  XSEG_EXPECT_GT(xsim_call_count("cuMemRelease"), releases);
  XSEG_ASSERT_OK(xseg_get_stats(f.a, &st));
  l = live_now();
  XSEG_EXPECT_EQ(st.reserved_bytes.current, 8 * MiB);    /* the pin */
  XSEG_EXPECT_EQ((int64_t)l.physical_bytes, st.reserved_bytes.current);
  XSEG_EXPECT_EQ((int64_t)l.handles,
                 st.num_device_alloc - st.num_device_free);
  XSEG_EXPECT_EQ(l.mappings, l.handles);
  XSEG_EXPECT_OK(xseg_check(f.a));
  lend_teardown(&f);
}

/* The snapshot shows what reserved_bytes counts: after a growth failed
   having lent a busy free block's handles, they stay mapped at their old
   address (the driver holds them) until the held work has run; each is a
   segment of its own ("retiring"), so the segments' total_size adds up to
   reserved_bytes before and after. */
XSEG_TEST(alloc_flow, snapshot_shows_what_a_failed_growth_had_lent) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  lend_fixture f = {0};
  lend_setup(&f);
  XSEG_EXPECT_EQ(at_snapshot_total(f.a),
                 at_stats(f.a).reserved_bytes.current);
  xsim_fail_call("cuMemCreate", 1, CUDA_ERROR_UNKNOWN);
  void *big = NULL;
  XSEG_EXPECT_EQ(xseg_malloc(f.a, 56 * MiB, f.s, &big), XSEG_ERR_DRIVER);
  xsim_fail_call("cuMemCreate", 0, CUDA_SUCCESS);
  XSEG_EXPECT_EQ(at_stats(f.a).reserved_bytes.current, 48 * MiB);
  XSEG_EXPECT_EQ(at_snapshot_total(f.a), 48 * MiB);
  char *json = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&json, &len);
  XSEG_EXPECT_OK(xseg_snapshot_json(f.a, out));
  fclose(out);
  XSEG_EXPECT_TRUE(strstr(json, "\"retiring\": true") != NULL);
  free(json);
  xt_latch_open(f.l);
  XSEG_EXPECT_CU(cuStreamSynchronize(f.s));
  XSEG_EXPECT_OK(xseg_empty_cache(f.a));
  XSEG_EXPECT_EQ(at_stats(f.a).reserved_bytes.current, 8 * MiB);
  XSEG_EXPECT_EQ(at_snapshot_total(f.a), 8 * MiB);
  lend_teardown(&f);
}

/* ---- destroy waits for the work that still uses its memory ------------- */

typedef struct destroy_run {
  xseg_allocator *a;
  atomic_bool done;
} destroy_run;

static void *destroy_thread(void *arg) {
  destroy_run *d = arg;
  xseg_destroy(d->a);
  atomic_store(&d->done, true);
  return NULL;
}

static uint64_t unmaps_and_releases(void) {
  return xsim_call_count("cuMemUnmap") + xsim_call_count("cuMemRelease");
}

/* Destroys a in another thread while latch l holds back work that writes
   its memory. True when destroy waited for that work: it began a host
   wait (on the guard's event) with nothing unmapped or released, and
   finished only once the latch opened. False when it returned with the
   work still held; the latch then stays closed for good, since the held
   write would land in unmapped memory (a fault in the emulator, an
   illegal address on a GPU). */
static bool destroy_waits_for(xseg_allocator *a, xt_latch *l) {
  destroy_run d = {.a = a};
  uint64_t waits = host_waits(), gone = unmaps_and_releases();
  pthread_t t;
  if (pthread_create(&t, NULL, destroy_thread, &d) != 0) return false;
  while (!atomic_load(&d.done) && host_waits() == waits) usleep(1000);
  usleep(20000);                       /* a wrong destroy would go on */
  bool waited = !atomic_load(&d.done) && unmaps_and_releases() == gone;
  if (atomic_load(&d.done)) {
    pthread_join(t, NULL);
    return false;
  }
  xt_latch_open(l);
  pthread_join(t, NULL);
  return waited;
}

/* A block freed on its own stream while that stream's work on it is
   still queued (a stream-ordered free: the block is back in the cache at
   once) is unmapped by xseg_destroy only after that work ran. */
XSEG_TEST(alloc_flow, destroy_waits_for_work_queued_before_a_free) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL);
  CUstream s = at_stream_new();
  xt_latch *l = xt_latch_new();
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 8 * MiB, s, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s, l));
  XSEG_ASSERT_CU(cuMemsetD8Async(at_dptr(p), 0x77, 8 * MiB, s));
  XSEG_ASSERT_OK(xseg_free(a, p));
  if (!XSEG_EXPECT_TRUE(destroy_waits_for(a, l))) return;
  XSEG_EXPECT_CU(cuStreamSynchronize(s));  /* the held write went fine */
  xt_latch_free(l);
  XSEG_EXPECT_CU(cuStreamDestroy(s));
  xsim_live now = live_now();
  XSEG_EXPECT_EQ(now.handles, 0);
  XSEG_EXPECT_EQ(now.mappings, 0);
}

/* The old mapping of a handle lent to a new block on the same stream
   (lend_setup) is its old work's: destroy leaves it until that work ran,
   then unmaps it and releases every handle. */
XSEG_TEST(alloc_flow, destroy_waits_for_the_old_work_of_a_lent_handle) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  lend_fixture f = {0};
  lend_setup(&f);
  XSEG_ASSERT_OK(xseg_malloc(f.a, 48 * MiB, f.s, &f.fresh));
  xsim_live l = live_now();
  XSEG_EXPECT_GT(l.mappings, l.handles);    /* the alias is there */
  XSEG_EXPECT_OK(xseg_free(f.a, f.fresh));
  XSEG_EXPECT_OK(xseg_free(f.a, f.pin));
  if (!XSEG_EXPECT_TRUE(destroy_waits_for(f.a, f.l))) return;
  XSEG_EXPECT_CU(cuStreamSynchronize(f.s));
  xt_latch_free(f.l);
  XSEG_EXPECT_CU(cuStreamDestroy(f.s));
  l = live_now();
  XSEG_EXPECT_EQ(l.handles, 0);
  XSEG_EXPECT_EQ(l.mappings, 0);
}

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
