/* The bench's pytorch-expandable policy (bench/policy_pytorch.c): PyTorch's
   caching allocator with expandable_segments:True, checked against what
   PyTorch does step by step (pages, driver calls, best fit's walk, the
   out-of-memory path) and against its fragmentation on an H100. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "xseg_test.h"

#define MIB (1024ull * 1024ull)

static const char *test_driver(void) {
  const char *d = getenv("XSEG_TEST_DRIVER");
  return d != NULL && strcmp(d, "system") == 0 ? "cuda" : "sim";
}

/* A policy instance on env with its own counters from here on. */
typedef struct pt_fixture {
  xb_env env;
  const xb_policy *p;
  void *self;
  CUstream s1, s2;
} pt_fixture;

static bool fixture_open(pt_fixture *f, uint64_t device_memory) {
  memset(f, 0, sizeof *f);
  if (xb_env_open(&f->env, test_driver()) != XSEG_OK) return false;
  if (device_memory > 0) xb_env_set_device_memory(&f->env, device_memory);
  f->p = xb_policy_find("pytorch-expandable");
  if (f->p == NULL || xb_env_stream_create(&f->env, &f->s1) != XSEG_OK ||
      xb_env_stream_create(&f->env, &f->s2) != XSEG_OK)
    return false;
  xb_env_reset_counts(&f->env);
  return f->p->open(&f->env, NULL, 16, &f->self) == XSEG_OK;
}

static void fixture_close(pt_fixture *f) {
  if (f->self != NULL) f->p->close(f->self);
  xb_env_stream_destroy(&f->env, f->s1);
  xb_env_stream_destroy(&f->env, f->s2);
  if (xt_have_sim()) xb_env_set_device_memory(&f->env, 80ull << 30);
  xb_env_close(&f->env);
}

static uint64_t calls(pt_fixture *f, xs_driver_fn fn) {
  return xb_env_call_count(&f->env, fn);
}

static uint64_t reserved(pt_fixture *f) {
  xb_usage u;
  f->p->usage(f->self, &u);
  return u.reserved;
}

/* Allocates and checks the policy's structures; the address, or 0. */
static uint64_t pt_malloc(pt_fixture *f, uint32_t slot, uint64_t size,
                          CUstream s) {
  void *ptr = NULL;
  xseg_status st = f->p->malloc(f->self, slot, size, s, &ptr);
  if (st != XSEG_OK) XSEG_FAIL("malloc %llu: %s", (unsigned long long)size,
                               xseg_last_error());
  xb_error err;
  if (!f->p->check(f->self, &err)) XSEG_FAIL("after malloc: %s", err.text);
  return (uint64_t)(uintptr_t)ptr;
}

static void pt_free(pt_fixture *f, uint32_t slot) {
  XSEG_EXPECT_OK(f->p->free(f->self, slot, NULL));
  xb_error err;
  if (!f->p->check(f->self, &err)) XSEG_FAIL("after free: %s", err.text);
}

/* Small requests map 2 MiB pages, large ones 20 MiB pages, each page its
   own cuMemCreate and cuMemMap, one cuMemSetAccess per map, one reserved
   range per pool; a large request that does not fit grows the free block
   at the mapped end by whole pages. */
XSEG_TEST(bench_pytorch, pages_and_driver_calls_follow_pytorch) {
  pt_fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f, 0));
  uint64_t zero = pt_malloc(&f, 0, 0, f.s1);
  XSEG_EXPECT_EQ(zero, 0);          /* raw_alloc(0) maps nothing */
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemAddressReserve), 0);
  uint64_t small = pt_malloc(&f, 1, 1 * MIB, f.s1);
  XSEG_EXPECT_NE(small, 0);
  XSEG_EXPECT_EQ(reserved(&f), 2 * MIB);
  uint64_t a = pt_malloc(&f, 2, 3 * MIB, f.s1);
  XSEG_EXPECT_EQ(reserved(&f), 22 * MIB);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemAddressReserve), 2);
  /* 17 MiB free at the end of the page, 13 more mapped: one page. */
  uint64_t b = pt_malloc(&f, 3, 30 * MIB, f.s1);
  XSEG_EXPECT_EQ(b, a + 3 * MIB);
  XSEG_EXPECT_EQ(reserved(&f), 42 * MIB);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemCreate), 3);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemMap), 3);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemSetAccess), 3);
  /* Another stream has pools of its own. */
  pt_malloc(&f, 4, 4096, f.s2);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemAddressReserve), 3);
  XSEG_EXPECT_EQ(reserved(&f), 44 * MIB);
  /* Frees unmap nothing. */
  for (uint32_t s = 1; s <= 4; s++) pt_free(&f, s);
  XSEG_EXPECT_EQ(reserved(&f), 44 * MIB);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemUnmap), 0);
  fixture_close(&f);
}

/* --conf's roundup_power2_divisions round as PyTorch's round_size (with
   2 divisions, 1 MiB + 1 KiB takes 1.5 MiB); what the policy does not
   model is refused by name, not ignored. */
XSEG_TEST(bench_pytorch, conf_rounds_by_divisions_and_refuses_the_rest) {
  pt_fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f, 0));
  f.p->close(f.self);
  f.self = NULL;
  XSEG_ASSERT_OK(f.p->open(&f.env, "roundup_power2_divisions:2", 16,
                           &f.self));
  uint64_t a = pt_malloc(&f, 0, MIB + 1024, f.s1);
  uint64_t b = pt_malloc(&f, 1, MIB + 1024, f.s1);
  XSEG_EXPECT_EQ(b - a, 3 * MIB / 2);
  pt_free(&f, 0);
  pt_free(&f, 1);
  f.p->close(f.self);
  f.self = NULL;
  const char *unmodelled[] = {"max_split_size_mb:20",
                              "garbage_collection_threshold:0.5",
                              "expandable_segments:False", "no_such_key:1",
                              "per_process_memory_fraction:0.5",
                              "xseg_memory_fraction:0.5"};
  for (size_t i = 0; i < sizeof unmodelled / sizeof *unmodelled; i++) {
    void *self = NULL;
    XSEG_EXPECT_EQ(f.p->open(&f.env, unmodelled[i], 16, &self),
                   XSEG_ERR_INVALID_ARGUMENT);
    XSEG_EXPECT_TRUE(self == NULL);
    char key[64];
    snprintf(key, sizeof key, "%s", unmodelled[i]);
    *strchr(key, ':') = '\0';
    if (strstr(xseg_last_error(), key) == NULL)
      XSEG_FAIL("%s: the message does not name it: %s", unmodelled[i],
                xseg_last_error());
  }
  fixture_close(&f);
}

/* get_free_block's expandable_size walk: the smallest fitting block sits
   at the mapped end of the segment, so it could grow over the whole
   unmapped rest; best fit moves on to a larger block inside. */
XSEG_TEST(bench_pytorch, best_fit_prefers_a_block_inside_the_segment) {
  pt_fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f, 0));
  uint64_t a = pt_malloc(&f, 0, 4 * MIB, f.s1);
  uint64_t b = pt_malloc(&f, 1, 10 * MIB, f.s1);
  pt_malloc(&f, 2, 4 * MIB, f.s1);  /* 2 MiB stay free at the end */
  XSEG_EXPECT_EQ(b, a + 4 * MIB);
  pt_free(&f, 1);
  uint64_t c = pt_malloc(&f, 1, 3 * MIB / 2, f.s1);
  XSEG_EXPECT_EQ(c, b);
  /* Split: 512 B or more left over stays free beside it. */
  uint64_t d = pt_malloc(&f, 3, 3 * MIB / 2, f.s1);
  XSEG_EXPECT_EQ(d, b + 3 * MIB / 2);
  XSEG_EXPECT_EQ(reserved(&f), 20 * MIB);
  fixture_close(&f);
}

/* Out of memory: release_cached_blocks unmaps every free page (one stream
   synchronize per unmapped run, a host wait), frees the segment it
   emptied, and the allocation is tried once more. */
XSEG_TEST(bench_pytorch, out_of_memory_unmaps_free_pages_and_retries) {
  XT_REQUIRE_SIM_FOR("sets the device's memory size");
  pt_fixture f;
  XSEG_ASSERT_TRUE(fixture_open(&f, 64 * MIB));
  pt_malloc(&f, 0, 40 * MIB, f.s1);
  pt_free(&f, 0);
  XSEG_EXPECT_EQ(reserved(&f), 40 * MIB);
  /* Stream 2's second page does not fit beside stream 1's two. */
  uint64_t p = pt_malloc(&f, 1, 40 * MIB, f.s2);
  XSEG_EXPECT_NE(p, 0);
  XSEG_EXPECT_EQ(reserved(&f), 40 * MIB);
  XSEG_EXPECT_EQ(xb_env_host_waits(&f.env), 1);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuStreamSynchronize), 1);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemUnmap), 2);
  /* Two created, one failed, one released again; two made after. */
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemCreate), 6);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemRelease), 3);
  XSEG_EXPECT_EQ(calls(&f, XS_DRIVER_FN_cuMemAddressFree), 1);
  /* More than the device has: out of memory, nothing lost. */
  void *q = NULL;
  XSEG_EXPECT_STATUS(f.p->malloc(f.self, 2, 100 * MIB, f.s2, &q),
                     XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(q == NULL);
  xb_error err;
  if (!f.p->check(f.self, &err)) XSEG_FAIL("%s", err.text);
  XSEG_EXPECT_EQ(reserved(&f), 40 * MIB);
  pt_free(&f, 1);
  fixture_close(&f);
}

/* Peak reserved over peak allocated of PyTorch 2.11 on an H100, replaying
   each bundled trace with torch.cuda.caching_allocator_alloc/delete under
   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. */
static const struct {
  const char *trace;
  double fragmentation;
} h100[] = {
    {"bert_infer_varbatch", 1.180},
    {"cnn_infer_varbatch", 1.223},
    {"gpt_infer_varbatch", 1.064},
    {"gpt_train_varbatch", 1.056},
};

XSEG_TEST(bench_pytorch, replays_match_pytorch_on_an_h100) {
  xb_env env;
  XSEG_ASSERT_OK(xb_env_open(&env, test_driver()));
  for (size_t i = 0; i < sizeof h100 / sizeof h100[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.csv.gz", XB_TEST_TRACE_DIR,
             h100[i].trace);
    xb_trace t;
    xb_error err;
    xb_result r;
    xb_replay_opts o = {.max_points = 0};
    if (!xb_trace_load(path, &t, &err)) {
      XSEG_FAIL("%s", err.text);
      continue;
    }
    if (!xb_replay(&env, &t, xb_policy_find("pytorch-expandable"), &o, &r,
                   &err)) {
      XSEG_FAIL("%s", err.text);
    } else {
      if (fabs(r.fragmentation - h100[i].fragmentation) > 0.005)
        XSEG_FAIL("%s: %.3f, PyTorch %.3f", h100[i].trace, r.fragmentation,
                  h100[i].fragmentation);
      XSEG_EXPECT_EQ(r.host_waits, 0);
      XSEG_EXPECT_EQ(r.ooms, 0);
      xb_result_release(&r);
    }
    xb_trace_release(&t);
  }
  xb_env_close(&env);
}
