/* Tests of alloc/config.c: PYTORCH_CUDA_ALLOC_CONF keys and syntax, xseg's
   own keys, the XSEG_ALLOC_CONF fallback, and PyTorch's round_size. The
   expected values are worked out by hand from PyTorch's algorithm
   (c10/core/AllocatorConfig.cpp, CUDACachingAllocator.cpp). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/config.h"
#include "xseg_test.h"

#define MiB ((size_t)1 << 20)

/* Parsing `conf` fails with XSEG_ERR_INVALID_ARGUMENT and a message that
   names `key` and `value`. */
#define EXPECT_INVALID(conf, key, value)                                    \
  do {                                                                      \
    xs_config c_;                                                           \
    XSEG_EXPECT_STATUS(xs_config_parse(conf, &c_),                          \
                       XSEG_ERR_INVALID_ARGUMENT);                          \
    expect_message(__FILE__, __LINE__, key, value);                         \
  } while (0)

static void expect_message(const char *file, int line, const char *key,
                           const char *value) {
  const char *m = xseg_last_error();
  if (strstr(m, key) == NULL || (value && strstr(m, value) == NULL))
    xt_fail(file, line, false, "message \"%s\" lacks \"%s\" or \"%s\"", m,
            key, value ? value : "");
}

static xs_config parsed(const char *conf) {
  xs_config c;
  XSEG_EXPECT_OK(xs_config_parse(conf, &c));
  return c;
}

/* Runs body with XSEG_ALLOC_CONF set to value (NULL: unset), restoring the
   caller's environment afterwards. */
typedef struct env_saved { char buf[512]; bool had; } env_saved;
static void env_set(env_saved *s, const char *value) {
  const char *old = getenv("XSEG_ALLOC_CONF");
  s->had = old != NULL;
  if (s->had) snprintf(s->buf, sizeof s->buf, "%s", old);
  if (value) setenv("XSEG_ALLOC_CONF", value, 1);
  else unsetenv("XSEG_ALLOC_CONF");
}
static void env_restore(const env_saved *s) {
  if (s->had) setenv("XSEG_ALLOC_CONF", s->buf, 1);
  else unsetenv("XSEG_ALLOC_CONF");
}

/* ---- defaults and the environment -------------------------------------- */

XSEG_TEST(config, defaults) {
  xs_config c;
  xs_config_defaults(&c);
  XSEG_EXPECT_TRUE(c.expandable_segments);
  XSEG_EXPECT_TRUE(c.max_split_size == SIZE_MAX);
  XSEG_EXPECT_EQ(c.max_non_split_rounding, 20 * MiB);
  for (int i = 0; i < XS_ROUNDUP_INTERVALS; i++)
    XSEG_EXPECT_EQ(c.roundup_power2_divisions[i], 0);
  XSEG_EXPECT_TRUE(c.garbage_collection_threshold == 0.0);
  XSEG_EXPECT_TRUE(c.memory_fraction == 1.0);
  XSEG_EXPECT_STREQ(c.driver, "");
  XSEG_EXPECT_EQ(c.small_granule, 2 * MiB);
  XSEG_EXPECT_EQ(c.large_granule, 2 * MiB);
  XSEG_EXPECT_EQ(c.reserve_size, 0);
}

XSEG_TEST(config, null_and_empty_without_env_give_defaults) {
  env_saved s;
  env_set(&s, NULL);
  xs_config d, a, b;
  xs_config_defaults(&d);
  XSEG_EXPECT_OK(xs_config_parse(NULL, &a));
  XSEG_EXPECT_OK(xs_config_parse("", &b));
  XSEG_EXPECT_EQ(memcmp(&a, &d, sizeof d), 0);
  XSEG_EXPECT_EQ(memcmp(&b, &d, sizeof d), 0);
  env_restore(&s);
}

XSEG_TEST(config, env_fallback_is_parsed) {
  env_saved s;
  env_set(&s, "max_split_size_mb:64,xseg_driver:sim");
  xs_config a = parsed(NULL), b = parsed("");
  XSEG_EXPECT_EQ(a.max_split_size, 64 * MiB);
  XSEG_EXPECT_STREQ(a.driver, "sim");
  XSEG_EXPECT_EQ(b.max_split_size, 64 * MiB);
  /* an explicit string wins over the environment */
  xs_config e = parsed("expandable_segments:False");
  XSEG_EXPECT_TRUE(e.max_split_size == SIZE_MAX);
  XSEG_EXPECT_FALSE(e.expandable_segments);
  env_restore(&s);
}

XSEG_TEST(config, env_fallback_reports_errors) {
  env_saved s;
  env_set(&s, "no_such_key:1");
  EXPECT_INVALID(NULL, "no_such_key", NULL);
  env_restore(&s);
}

/* ---- PyTorch's keys ----------------------------------------------------- */

XSEG_TEST(config, expandable_segments) {
  XSEG_EXPECT_FALSE(parsed("expandable_segments:False").expandable_segments);
  XSEG_EXPECT_TRUE(parsed("expandable_segments:True").expandable_segments);
  /* toBool is case-sensitive */
  EXPECT_INVALID("expandable_segments:true", "expandable_segments", "true");
  EXPECT_INVALID("expandable_segments:1", "expandable_segments", "\"1\"");
}

XSEG_TEST(config, max_split_size_mb) {
  XSEG_EXPECT_EQ(parsed("max_split_size_mb:20").max_split_size, 20 * MiB);
  XSEG_EXPECT_EQ(parsed("max_split_size_mb:512").max_split_size, 512 * MiB);
  /* PyTorch: must be >= kLargeBuffer / kMB = 20 */
  EXPECT_INVALID("max_split_size_mb:19", "max_split_size_mb", "19");
  EXPECT_INVALID("max_split_size_mb:0", "max_split_size_mb", "\"0\"");
}

XSEG_TEST(config, max_non_split_rounding_mb) {
  xs_config c = parsed("max_non_split_rounding_mb:1024");
  XSEG_EXPECT_EQ(c.max_non_split_rounding, 1024 * MiB);
  EXPECT_INVALID("max_non_split_rounding_mb:10", "max_non_split_rounding_mb",
                 "10");
}

XSEG_TEST(config, garbage_collection_threshold) {
  xs_config c = parsed("garbage_collection_threshold:0.6");
  XSEG_EXPECT_TRUE(c.garbage_collection_threshold == 0.6);
  const char *bad[] = {"0", "1", "1.0", "1.5", "-0.5", "abc", "0.5x", "nan"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char conf[64];
    snprintf(conf, sizeof conf, "garbage_collection_threshold:%s", bad[i]);
    EXPECT_INVALID(conf, "garbage_collection_threshold", bad[i]);
  }
}

XSEG_TEST(config, roundup_power2_divisions_single_number) {
  xs_config c = parsed("roundup_power2_divisions:4");
  for (int i = 0; i < XS_ROUNDUP_INTERVALS; i++)
    XSEG_EXPECT_EQ(c.roundup_power2_divisions[i], 4);
  XSEG_EXPECT_EQ(parsed("roundup_power2_divisions:1")
                     .roundup_power2_divisions[7], 1);
}

/* [256:1,512:2,1024:4,>:8]: 256 MB is interval log2(256) = 8, and the first
   entry also fills 0..7; 512 -> 9; 1024 -> 10; '>' fills 11..15. */
XSEG_TEST(config, roundup_power2_divisions_list) {
  xs_config c = parsed("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  const unsigned want[XS_ROUNDUP_INTERVALS] = {1, 1, 1, 1, 1, 1, 1, 1, 1,
                                               2, 4, 8, 8, 8, 8, 8};
  for (int i = 0; i < XS_ROUNDUP_INTERVALS; i++)
    XSEG_EXPECT_EQ(c.roundup_power2_divisions[i], want[i]);
}

XSEG_TEST(config, roundup_power2_divisions_list_edges) {
  /* 65536 MB is log2 16, clamped to the last interval; the fill below it
     covers 0..14 */
  xs_config c = parsed("roundup_power2_divisions:[65536:4]");
  for (int i = 0; i < XS_ROUNDUP_INTERVALS; i++)
    XSEG_EXPECT_EQ(c.roundup_power2_divisions[i], 4);
  /* '>' first: last index is 0, so it fills 1..15 and leaves 0 alone */
  c = parsed("roundup_power2_divisions:[>:2]");
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[0], 0);
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[1], 2);
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[15], 2);
  /* 0 disables an interval in the list form; a trailing ',' is accepted */
  c = parsed("roundup_power2_divisions:[1:2,64:0,]");
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[0], 2);
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[6], 0);
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[7], 0);
}

XSEG_TEST(config, roundup_power2_divisions_invalid) {
  const char *k = "roundup_power2_divisions";
  EXPECT_INVALID("roundup_power2_divisions:3", k, "\"3\"");
  EXPECT_INVALID("roundup_power2_divisions:0", k, "\"0\"");
  EXPECT_INVALID("roundup_power2_divisions:4294967296", k, "4294967296");
  EXPECT_INVALID("roundup_power2_divisions:[256:3]", k, "\"3\"");
  EXPECT_INVALID("roundup_power2_divisions:[300:2]", k, "\"300\"");
  EXPECT_INVALID("roundup_power2_divisions:[0:2]", k, "\"0\"");
  EXPECT_INVALID("roundup_power2_divisions:[abc:2]", k, "abc");
}

XSEG_TEST(config, roundup_power2_divisions_bad_list_syntax) {
  const char *k = "roundup_power2_divisions";
  EXPECT_INVALID("roundup_power2_divisions:[256:1", k, "<end>");
  EXPECT_INVALID("roundup_power2_divisions:[256:1,512:2", k, NULL);
  EXPECT_INVALID("roundup_power2_divisions:[256]", k, "\"]\"");
  EXPECT_INVALID("roundup_power2_divisions:[256:]", k, NULL);
  EXPECT_INVALID("roundup_power2_divisions:[256:1:2]", k, NULL);
  EXPECT_INVALID("roundup_power2_divisions:[[256:1]]", k, "\"[\"");
  EXPECT_INVALID("roundup_power2_divisions:[,256:1]", k, "\",\"");
}

XSEG_TEST(config, backend) {
  xs_config c, d;
  xs_config_defaults(&d);
  XSEG_EXPECT_OK(xs_config_parse("backend:native", &c));
  XSEG_EXPECT_EQ(memcmp(&c, &d, sizeof d), 0);
  XSEG_EXPECT_STATUS(xs_config_parse("backend:cudaMallocAsync", &c),
                     XSEG_ERR_UNSUPPORTED);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cudaMallocAsync") != NULL);
  EXPECT_INVALID("backend:Native", "backend", "Native");
}

/* PyTorch keys that mean nothing to a VMM device allocator: accepted with
   PyTorch's valid values, leaving every field at its default. */
XSEG_TEST(config, ignored_pytorch_keys) {
  xs_config c, d;
  xs_config_defaults(&d);
  XSEG_EXPECT_OK(xs_config_parse(
      "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,"
      "pinned_num_register_threads:8,pinned_use_background_threads:False,"
      "pinned_reserve_segment_size_mb:64", &c));
  XSEG_EXPECT_EQ(memcmp(&c, &d, sizeof d), 0);
  EXPECT_INVALID("release_lock_on_cudamalloc:yes",
                 "release_lock_on_cudamalloc", "yes");
  EXPECT_INVALID("pinned_num_register_threads:3",
                 "pinned_num_register_threads", "\"3\"");
  EXPECT_INVALID("pinned_num_register_threads:256",
                 "pinned_num_register_threads", "256");
  EXPECT_INVALID("pinned_use_background_threads:",
                 "pinned_use_background_threads", NULL);
}

/* Keys of newer PyTorch releases (CUDAAllocatorConfig::parseArgs,
   AcceleratorAllocatorConfig's keys): a PYTORCH_CUDA_ALLOC_CONF that one
   accepts works here, with PyTorch's ranges. */
XSEG_TEST(config, newer_pytorch_keys) {
  XSEG_EXPECT_EQ(parsed("large_segment_size_mb:64").large_segment_size,
                 64 * MiB);
  XSEG_EXPECT_EQ(parsed("large_segment_size_mb:11").large_segment_size,
                 11 * MiB);
  EXPECT_INVALID("large_segment_size_mb:10", "large_segment_size_mb", "10");
  XSEG_EXPECT_TRUE(
      parsed("per_process_memory_fraction:0.5").memory_fraction == 0.5);
  XSEG_EXPECT_TRUE(
      parsed("per_process_memory_fraction:0").memory_fraction == 0.0);
  XSEG_EXPECT_TRUE(
      parsed("per_process_memory_fraction:1").memory_fraction == 1.0);
  EXPECT_INVALID("per_process_memory_fraction:1.5",
                 "per_process_memory_fraction", "1.5");
  EXPECT_INVALID("per_process_memory_fraction:-0.1",
                 "per_process_memory_fraction", "-0.1");
  /* Accepted and ignored (config.c says why). */
  xs_config c, d;
  xs_config_defaults(&d);
  XSEG_EXPECT_OK(xs_config_parse("graph_capture_record_stream_reuse:True", &c));
  XSEG_EXPECT_EQ(memcmp(&c, &d, sizeof d), 0);
  EXPECT_INVALID("graph_capture_record_stream_reuse:1",
                 "graph_capture_record_stream_reuse", "\"1\"");
}

/* A word too long for the lexer inside a divisions list is refused, as
   at the top level, not read cut short (300 zeros then 4 was read as 0). */
XSEG_TEST(config, long_words_in_a_divisions_list_are_refused) {
  char conf[512], zeros[301];
  memset(zeros, '0', 300);
  zeros[300] = '\0';
  snprintf(conf, sizeof conf, "roundup_power2_divisions:[256:%s4]", zeros);
  EXPECT_INVALID(conf, "roundup_power2_divisions", "shorter");
  snprintf(conf, sizeof conf, "roundup_power2_divisions:[%s256:4]", zeros);
  EXPECT_INVALID(conf, "roundup_power2_divisions", "shorter");
  snprintf(conf, sizeof conf, "roundup_power2_divisions:[256:4,>:%s8]",
           zeros);
  EXPECT_INVALID(conf, "roundup_power2_divisions", "shorter");
}

/* ---- xseg's keys -------------------------------------------------------- */

XSEG_TEST(config, xseg_driver) {
  XSEG_EXPECT_STREQ(parsed("xseg_driver:sim").driver, "sim");
  XSEG_EXPECT_STREQ(parsed("xseg_driver:/usr/lib/x86_64-linux-gnu/libcuda.so.1")
                        .driver, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  char conf[400] = "xseg_driver:/";
  memset(conf + 13, 'a', 300);
  conf[313] = '\0';
  EXPECT_INVALID(conf, "xseg_driver", "aaaa");
  /* the longest path that fits: 255 characters */
  memset(conf + 12, 'b', 255);
  conf[12 + 255] = '\0';
  XSEG_EXPECT_EQ(strlen(parsed(conf).driver), 255);
}

XSEG_TEST(config, xseg_memory_fraction) {
  XSEG_EXPECT_TRUE(parsed("xseg_memory_fraction:0.25").memory_fraction == 0.25);
  XSEG_EXPECT_TRUE(parsed("xseg_memory_fraction:1").memory_fraction == 1.0);
  EXPECT_INVALID("xseg_memory_fraction:0", "xseg_memory_fraction", "\"0\"");
  EXPECT_INVALID("xseg_memory_fraction:1.01", "xseg_memory_fraction", "1.01");
  EXPECT_INVALID("xseg_memory_fraction:-0.5", "xseg_memory_fraction", "-0.5");
}

XSEG_TEST(config, xseg_granules_and_reserve) {
  xs_config c = parsed("xseg_small_granule_mb:4,xseg_large_granule_mb:32,"
                       "xseg_reserve_mb:1024");
  XSEG_EXPECT_EQ(c.small_granule, 4 * MiB);
  XSEG_EXPECT_EQ(c.large_granule, 32 * MiB);
  XSEG_EXPECT_EQ(c.reserve_size, 1024 * MiB);
  XSEG_EXPECT_EQ(parsed("xseg_reserve_mb:0").reserve_size, 0);
  EXPECT_INVALID("xseg_small_granule_mb:0", "xseg_small_granule_mb", "\"0\"");
  EXPECT_INVALID("xseg_large_granule_mb:0", "xseg_large_granule_mb", "\"0\"");
  EXPECT_INVALID("xseg_reserve_mb:x", "xseg_reserve_mb", "\"x\"");
}

/* ---- syntax and number errors ------------------------------------------ */

XSEG_TEST(config, xseg_handles_and_growth) {
  xs_config d = parsed("");
  XSEG_EXPECT_EQ(d.handle_policy, XS_HANDLES_SINGLE);
  XSEG_EXPECT_EQ(d.handle_max, 8 * MiB);
  XSEG_EXPECT_EQ(d.handle_max_part, 32);
  XSEG_EXPECT_EQ(d.grow_min, 0);
  xs_config c = parsed("xseg_handle_policy:pow2,xseg_handle_max_mb:0,"
                       "xseg_handle_max_part:0,xseg_grow_min_mb:20");
  XSEG_EXPECT_EQ(c.handle_policy, XS_HANDLES_POW2);
  XSEG_EXPECT_EQ(c.handle_max, 0);
  XSEG_EXPECT_EQ(c.handle_max_part, 0);
  XSEG_EXPECT_EQ(c.grow_min, 20 * MiB);
  XSEG_EXPECT_EQ(parsed("xseg_handle_policy:granule").handle_policy,
                 XS_HANDLES_GRANULE);
  EXPECT_INVALID("xseg_handle_policy:big", "xseg_handle_policy", "\"big\"");
  EXPECT_INVALID("xseg_handle_max_part:-1", "xseg_handle_max_part", "-1");
  EXPECT_INVALID("xseg_grow_min_mb:x", "xseg_grow_min_mb", "\"x\"");
}

XSEG_TEST(config, unknown_key) {
  EXPECT_INVALID("max_split_size_mb:64,no_such_key:1", "no_such_key", NULL);
}

XSEG_TEST(config, missing_colon) {
  EXPECT_INVALID("max_split_size_mb", "max_split_size_mb", "':'");
  EXPECT_INVALID("expandable_segments,max_split_size_mb:64",
                 "expandable_segments", "':'");
  /* '=' is no separator: the whole word is an unknown key */
  EXPECT_INVALID("max_split_size_mb=64", "max_split_size_mb=64", NULL);
}

XSEG_TEST(config, empty_value) {
  EXPECT_INVALID("max_split_size_mb:", "max_split_size_mb", "missing value");
  EXPECT_INVALID("max_split_size_mb:,expandable_segments:True",
                 "max_split_size_mb", "missing value");
  EXPECT_INVALID("xseg_driver:", "xseg_driver", "missing value");
}

XSEG_TEST(config, negative_and_non_numbers) {
  /* PyTorch's stoull would take "-1" as 2^64-1 and "64abc" as 64 */
  EXPECT_INVALID("max_split_size_mb:-1", "max_split_size_mb", "\"-1\"");
  EXPECT_INVALID("max_split_size_mb:abc", "max_split_size_mb",
                 "invalid value \"abc\" for max_split_size_mb: expected a "
                 "positive integer in MB");
  EXPECT_INVALID("max_split_size_mb:64abc", "max_split_size_mb", "64abc");
  EXPECT_INVALID("max_split_size_mb:1e3", "max_split_size_mb", "1e3");
  EXPECT_INVALID("xseg_reserve_mb:-5", "xseg_reserve_mb", "-5");
}

XSEG_TEST(config, mb_overflow_is_an_error) {
  /* fits in 64 bits, but times 2^20 does not */
  EXPECT_INVALID("max_split_size_mb:17592186044416", "max_split_size_mb",
                 "17592186044416");
  /* bytes that fit, but wrap when rounded to a granule */
  EXPECT_INVALID("max_split_size_mb:17592186044415", "max_split_size_mb",
                 "too large, must be <= 67108864");
  /* the largest value: 64 TiB */
  XSEG_EXPECT_EQ(parsed("max_split_size_mb:67108864").max_split_size,
                 (size_t)67108864u * MiB);
  EXPECT_INVALID("xseg_grow_min_mb:67108865", "xseg_grow_min_mb",
                 "67108865");
  /* does not fit in 64 bits at all */
  EXPECT_INVALID("xseg_reserve_mb:99999999999999999999999", "xseg_reserve_mb",
                 "99999999999999999999999");
}

XSEG_TEST(config, whitespace_and_separators) {
  /* ConfigTokenizer drops whitespace anywhere, even inside a word */
  xs_config c = parsed("  max_split_size_mb : 5 12 ,\texpandable_segments:"
                       "Fal se , roundup_power2_divisions: [ 256 : 2 , >:4 ] ");
  XSEG_EXPECT_EQ(c.max_split_size, 512 * MiB);
  XSEG_EXPECT_FALSE(c.expandable_segments);
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[8], 2);
  XSEG_EXPECT_EQ(c.roundup_power2_divisions[9], 4);
  /* a trailing ',' is accepted, as PyTorch does; a later key wins */
  c = parsed("max_split_size_mb:64,max_split_size_mb:128,");
  XSEG_EXPECT_EQ(c.max_split_size, 128 * MiB);
  XSEG_EXPECT_EQ(parsed("   ").max_split_size, SIZE_MAX);
  EXPECT_INVALID(",max_split_size_mb:64", "key", "\",\"");
  EXPECT_INVALID("max_split_size_mb:64,,expandable_segments:True", "key",
                 "\",\"");
  EXPECT_INVALID("max_split_size_mb:64:128", "after the value of "
                 "max_split_size_mb", "\":\"");
}

/* ---- round_size --------------------------------------------------------- */

XSEG_TEST(config, round_size_plain_512) {
  xs_config c;
  xs_config_defaults(&c);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 0), 512);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 1), 512);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 512), 512);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 513), 1024);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 1000000), 1000448);  /* 1954*512 */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, MiB + 1), MiB + 512);
  XSEG_EXPECT_TRUE(xs_config_round_size(&c, SIZE_MAX - 511) == SIZE_MAX - 511);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, SIZE_MAX - 510), 0);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, SIZE_MAX), 0);
}

XSEG_TEST(config, round_size_divisions) {
  xs_config c = parsed("roundup_power2_divisions:4");
  /* 1200 <= 512 * 4: plain rounding, not PyTorch's 1280 example */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 1200), 1536);
  /* 1 MiB + 1: floor 2^20, step 2^20 / 4 = 256 KiB */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, MiB + 1), MiB + 256 * 1024);
  /* 5 MiB lies on a step of [4, 8) MiB; 5 MiB + 1 goes to 6 MiB */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 5 * MiB), 5 * MiB);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 5 * MiB + 1), 6 * MiB);
  /* powers of two stay */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 1024 * MiB), 1024 * MiB);
  /* divisions 1 means plain rounding */
  c = parsed("roundup_power2_divisions:1");
  XSEG_EXPECT_EQ(xs_config_round_size(&c, MiB + 1), MiB + 512);
}

XSEG_TEST(config, round_size_list_intervals) {
  xs_config c = parsed("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  /* 300 MiB + 1: interval 8, 1 division: plain 512 rounding */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 300 * MiB + 1), 300 * MiB + 512);
  /* 600 MiB + 1: interval 9, 2 divisions of [512, 1024) MiB: 768 MiB */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 600 * MiB + 1), 768 * MiB);
  /* 1500 MiB: interval 10, steps of 256 MiB: 1536 MiB */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 1500 * MiB), 1536 * MiB);
  /* 3000 MiB: interval 11, 8 divisions of [2, 4) GiB, steps of 256 MiB */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 3000 * MiB), 3072 * MiB);
  /* 100 GiB + 1: clamped to interval 15 (8), floor 64 GiB, step 8 GiB */
  XSEG_EXPECT_EQ(xs_config_round_size(&c, 100 * 1024 * MiB + 1),
                 104 * 1024 * MiB);
}

XSEG_TEST(config, round_size_overflow_gives_zero) {
  xs_config c = parsed("roundup_power2_divisions:2");
  const size_t top = (size_t)1 << (sizeof(size_t) * 8 - 1);
  /* 2 divisions of [2^63, 2^64): the step past 2^63 + 2^62 overflows */
  XSEG_EXPECT_TRUE(xs_config_round_size(&c, top + 1) == top + top / 2);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, top + top / 2 + 1), 0);
  XSEG_EXPECT_EQ(xs_config_round_size(&c, SIZE_MAX), 0);
}
