/* xseg_snapshot_json: torch.cuda.memory._snapshot()'s schema (docs/DESIGN.md
   section 6), valid JSON, block states including active_pending_free, and
   device_traces from the bounded ring of recorded events. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "alloc_helpers.h"

/* ---- a strict little JSON reader, enough to say "valid" ------------------ */

static const char *json_value(const char *s);

static const char *json_ws(const char *s) {
  while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
  return s;
}

static const char *json_string(const char *s) {
  if (*s++ != '"') return NULL;
  while (*s != '"') {
    if (*s == '\0' || (unsigned char)*s < 0x20) return NULL;
    if (*s == '\\') s++;
    s++;
  }
  return s + 1;
}

static const char *json_number(const char *s) {
  const char *start = s;
  if (*s == '-') s++;
  while (isdigit((unsigned char)*s) || *s == '.' || *s == 'e' || *s == 'E' ||
         *s == '+' || *s == '-')
    s++;
  return s > start ? s : NULL;
}

/* A list of items between open and close, each read by `item`. */
static const char *json_list(const char *s, char open, char close,
                             const char *(*item)(const char *)) {
  if (*s++ != open) return NULL;
  s = json_ws(s);
  if (*s == close) return s + 1;
  for (;;) {
    if ((s = item(json_ws(s))) == NULL) return NULL;
    s = json_ws(s);
    if (*s == close) return s + 1;
    if (*s++ != ',') return NULL;
  }
}

static const char *json_member(const char *s) {
  if ((s = json_string(s)) == NULL) return NULL;
  s = json_ws(s);
  if (*s++ != ':') return NULL;
  return json_value(json_ws(s));
}

static const char *json_value(const char *s) {
  s = json_ws(s);
  if (*s == '{') return json_list(s, '{', '}', json_member);
  if (*s == '[') return json_list(s, '[', ']', json_value);
  if (*s == '"') return json_string(s);
  if (!strncmp(s, "true", 4)) return s + 4;
  if (!strncmp(s, "false", 5)) return s + 5;
  if (!strncmp(s, "null", 4)) return s + 4;
  return json_number(s);
}

static bool json_valid(const char *s) {
  const char *end = json_value(s);
  return end != NULL && *json_ws(end) == '\0';
}

/* ---- helpers ---------------------------------------------------------------- */

static char *snapshot(xseg_allocator *a) {
  char *buf = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&buf, &size);
  xseg_status st = xseg_snapshot_json(a, f);
  fclose(f);
  if (st != XSEG_OK) XSEG_FAIL("snapshot: %s", xseg_last_error());
  return buf;
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

/* The time_us values of the traces never go back. */
static bool times_ordered(const char *json) {
  unsigned long long last = 0, t;
  for (const char *p = json; (p = strstr(p, "\"time_us\": ")) != NULL; p++) {
    if (sscanf(p, "\"time_us\": %llu", &t) != 1 || t < last) return false;
    last = t;
  }
  return true;
}

XSEG_TEST(snapshot, empty_allocator) {
  xseg_allocator *a = at_create(NULL);
  char *json = snapshot(a);
  XSEG_EXPECT_TRUE(json_valid(json));
  XSEG_EXPECT_STREQ(json, "{\"segments\": [\n],\n\"device_traces\": [[\n]]}\n");
  free(json);
  XSEG_EXPECT_STATUS(xseg_snapshot_json(a, NULL), XSEG_ERR_INVALID_ARGUMENT);
  xseg_destroy(a);
}

XSEG_TEST(snapshot, segments_blocks_states_and_traces) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create_capped(NULL, 819 * MiB);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s1;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  xt_latch *held = xt_latch_new();
  XSEG_ASSERT_OK(xseg_record_memory_history(a, 1000));
  void *big, *small, *other;
  XSEG_ASSERT_OK(xseg_malloc(a, 5 * MiB, NULL, &big));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, NULL, &small));
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, NULL, &other));
  XSEG_ASSERT_CU(xt_latch_hold(s1, held));
  XSEG_ASSERT_OK(xseg_record_stream(a, small, s1));
  XSEG_ASSERT_OK(xseg_free(a, small));
  char *json = snapshot(a);
  XSEG_EXPECT_TRUE(json_valid(json));
  XSEG_EXPECT_EQ(count(json, "\"state\": \"active_pending_free\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"state\": \"active_allocated\""), 2);
  XSEG_EXPECT_GE(count(json, "\"state\": \"inactive\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"segment_type\": \"small\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"segment_type\": \"large\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"is_expandable\": true"), 2);
  char want[128];
  snprintf(want, sizeof want, "{\"address\": %llu, \"size\": 4096, "
           "\"requested_size\": 4096, \"state\": \"active_pending_free\"",
           (unsigned long long)(uintptr_t)small);
  XSEG_EXPECT_TRUE(strstr(json, want) != NULL);
  /* The small segment: 2 MiB mapped, 8 KiB active, 4 KiB allocated. */
  XSEG_EXPECT_TRUE(strstr(json, "\"total_size\": 2097152, "
                                "\"allocated_size\": 4096, \"active_size\": "
                                "8192, \"requested_size\": 8192") != NULL);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"free_requested\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"free_completed\""), 0);
  free(json);

  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  void *again;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, NULL, &again));   /* settles it */
  XSEG_ASSERT_OK(xseg_free(a, again));
  XSEG_ASSERT_OK(xseg_free(a, other));
  XSEG_ASSERT_OK(xseg_free(a, big));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  void *huge;
  XSEG_EXPECT_STATUS(xseg_malloc(a, 900 * MiB, NULL, &huge),
                     XSEG_ERR_OUT_OF_MEMORY);
  json = snapshot(a);
  XSEG_EXPECT_TRUE(json_valid(json));
  XSEG_EXPECT_EQ(count(json, "\"action\": \"alloc\""), 4);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"free_requested\""), 4);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"free_completed\""), 4);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_map\""), 2);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_unmap\""), 2);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"oom\""), 1);
  XSEG_EXPECT_TRUE(times_ordered(json));
  XSEG_EXPECT_EQ(count(json, "\"blocks\""), 0);     /* all unmapped */
  free(json);
  xseg_destroy(a);
  xt_latch_free(held);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* The ring keeps the newest entries only; 0 turns it off. */
XSEG_TEST(snapshot, trace_ring_is_bounded) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_OK(xseg_record_memory_history(a, 5));
  for (int i = 0; i < 100; i++) {
    void *p;
    XSEG_ASSERT_OK(xseg_malloc(a, 512, NULL, &p));
    XSEG_ASSERT_OK(xseg_free(a, p));
  }
  char *json = snapshot(a);
  XSEG_EXPECT_TRUE(json_valid(json));
  XSEG_EXPECT_EQ(count(json, "\"action\""), 5);
  XSEG_EXPECT_TRUE(times_ordered(json));
  /* Newest last: the loop ended with a free. */
  const char *last = json;
  for (const char *p; (p = strstr(last + 1, "\"action\"")) != NULL;) last = p;
  XSEG_EXPECT_TRUE(strncmp(last, "\"action\": \"free_completed\"", 26) == 0);
  free(json);
  /* Another length keeps the newest entries that fit: recording again is
     no reset (PyTorch clears only when it stops, or is asked to). */
  XSEG_ASSERT_OK(xseg_record_memory_history(a, 3));
  json = snapshot(a);
  XSEG_EXPECT_EQ(count(json, "\"action\""), 3);
  free(json);
  XSEG_ASSERT_OK(xseg_record_memory_history(a, 50));
  void *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 700, NULL, &q));
  json = snapshot(a);
  XSEG_EXPECT_EQ(count(json, "\"action\""), 4);
  XSEG_EXPECT_TRUE(times_ordered(json));
  /* An alloc is traced with the size asked for, as PyTorch's. */
  XSEG_EXPECT_EQ(count(json, "\"size\": 700,"), 1);
  free(json);
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_record_memory_history(a, 0));
  json = snapshot(a);
  XSEG_EXPECT_EQ(count(json, "\"action\""), 0);
  free(json);
  xseg_destroy(a);
}

/* A classic segment is one mapped run, not expandable. */
XSEG_TEST(snapshot, classic_segments) {
  xseg_allocator *a = at_create("expandable_segments:False");
  XSEG_ASSERT_OK(xseg_record_memory_history(a, 100));
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 3 * MiB, NULL, &p));
  char *json = snapshot(a);
  XSEG_EXPECT_TRUE(json_valid(json));
  XSEG_EXPECT_EQ(count(json, "\"is_expandable\": false"), 1);
  XSEG_EXPECT_TRUE(strstr(json, "\"total_size\": 20971520") != NULL);
  free(json);
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  /* A classic segment is PyTorch's cudaMalloc and cudaFree:
     segment_alloc and segment_free, as _memory_viz and the viewer read
     them (segment_map and segment_unmap are expandable segments'). */
  json = snapshot(a);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_alloc\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_free\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_map\""), 0);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_unmap\""), 0);
  free(json);
  xseg_destroy(a);
}

/* Memory lent to another stream leaves the freeing stream's segment, and
   the snapshot, at the lend: its segment_unmap is traced then, before the
   borrower's segment_map, and not again when the old mapping goes (a
   viewer replaying the trace back from the snapshot's segments found a
   mapped range that no segment held, and later two mappings of the same
   memory, over the cap). */
XSEG_TEST(snapshot, lent_memory_is_unmapped_in_the_trace_when_lent) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create_capped(NULL, 64 * MiB);
  XSEG_ASSERT_TRUE(a != NULL);
  CUstream s1, s2;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  XSEG_ASSERT_CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  xt_latch *held = xt_latch_new();
  XSEG_ASSERT_OK(xseg_record_memory_history(a, 1000));
  void *keep, *p, *q;
  XSEG_ASSERT_OK(xseg_malloc(a, 2 * MiB, s1, &keep));
  XSEG_ASSERT_OK(xseg_malloc(a, 40 * MiB, s1, &p));
  XSEG_ASSERT_CU(xt_latch_hold(s1, held));   /* s1's work is not done */
  XSEG_ASSERT_OK(xseg_free(a, p));
  XSEG_ASSERT_OK(xseg_malloc(a, 40 * MiB, s2, &q));   /* p's memory, lent */
  char want[160];
  snprintf(want, sizeof want,
           "\"action\": \"segment_unmap\", \"addr\": %llu, \"size\": %llu",
           (unsigned long long)(uintptr_t)p,
           (unsigned long long)(40 * MiB));
  char *json = snapshot(a);
  XSEG_EXPECT_TRUE(json_valid(json));
  XSEG_EXPECT_EQ(count(json, want), 1);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_unmap\""), 1);
  XSEG_EXPECT_EQ(count(json, "\"action\": \"segment_map\""), 3);
  /* No segment holds p's range: the trace and the segments agree. */
  snprintf(want, sizeof want, "\"address\": %llu, \"total_size\"",
           (unsigned long long)(uintptr_t)p);
  XSEG_EXPECT_TRUE(strstr(json, want) == NULL);
  free(json);
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  void *r;
  XSEG_ASSERT_OK(xseg_malloc(a, 4 * MiB, s1, &r));   /* the alias goes */
  XSEG_ASSERT_OK(xseg_free(a, r));
  XSEG_ASSERT_OK(xseg_empty_cache(a));
  json = snapshot(a);
  XSEG_EXPECT_EQ(count(json, want), 0);
  snprintf(want, sizeof want,
           "\"action\": \"segment_unmap\", \"addr\": %llu, \"size\": %llu",
           (unsigned long long)(uintptr_t)p,
           (unsigned long long)(40 * MiB));
  XSEG_EXPECT_EQ(count(json, want), 1);      /* not again at the retire */
  free(json);
  XSEG_EXPECT_OK(xseg_check(a));
  XSEG_ASSERT_OK(xseg_free(a, q));
  XSEG_ASSERT_OK(xseg_free(a, keep));
  xseg_destroy(a);
  xt_latch_free(held);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
  XSEG_EXPECT_CU(cuStreamDestroy(s2));
}
