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
#include "flow_helpers.h"

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
  XT_REQUIRE_SIM_FOR("injects driver faults");
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
  /* The trace too, as PyTorch's viewer replays it: what it maps and
     unmaps from here follows reserved_bytes (48 MiB mapped before). */
  XSEG_ASSERT_OK(xseg_record_memory_history(f.a, 1000));
  xsim_fail_call("cuMemCreate", 1, CUDA_ERROR_UNKNOWN);
  void *big = NULL;
  XSEG_EXPECT_EQ(xseg_malloc(f.a, 56 * MiB, f.s, &big), XSEG_ERR_DRIVER);
  xsim_fail_call("cuMemCreate", 0, CUDA_SUCCESS);
  XSEG_EXPECT_EQ(at_stats(f.a).reserved_bytes.current, 48 * MiB);
  XSEG_EXPECT_EQ(at_snapshot_total(f.a), 48 * MiB);
  XSEG_EXPECT_EQ(48 * MiB + at_trace_mapped(f.a), 48 * MiB);
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
  XSEG_EXPECT_EQ(48 * MiB + at_trace_mapped(f.a), 8 * MiB);
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
