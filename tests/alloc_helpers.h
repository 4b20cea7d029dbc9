/* alloc_helpers.h: what the allocator tests (tests/test_alloc*.c) share:
 * an allocator on the emulator, byte patterns written and checked through
 * the driver, and a check that every live block is disjoint from the rest.
 */
#ifndef XSEG_ALLOC_HELPERS_H
#define XSEG_ALLOC_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xseg.h"
#include "xseg_test.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* A new non-blocking stream; NULL, the failure reported, if the driver
   refused (a test then fails instead of using the legacy stream). */
static inline CUstream at_stream_new(void) {
  CUstream s = NULL;
  if (!XSEG_EXPECT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING))) return NULL;
  return s;
}

static inline CUdeviceptr at_dptr(void *p) {
  return (CUdeviceptr)(uintptr_t)p;
}

/* True when every byte of [p, p+n) is v (read through the driver). */
static inline bool at_bytes_are(void *p, size_t n, unsigned char v) {
  unsigned char *buf = malloc(n);
  bool ok = buf != NULL && cuMemcpyDtoH(buf, at_dptr(p), n) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < n; i++) ok = buf[i] == v;
  free(buf);
  return ok;
}

/* Why a test that destroys a stream xseg still knows (memory freed or
   recorded on it) runs on the emulator alone: the emulator answers the
   dead handle with CUDA_ERROR_INVALID_HANDLE, while on an H200 (driver
   580) such tests crashed inside the driver: a destroyed stream's handle
   is freed memory there (include/xseg.h, xseg_free). */
#define AT_DESTROYS_A_KNOWN_STREAM \
  "destroys a stream xseg still knows (a real driver crashed on it)"

/* The config of an allocator on the driver the tests link ("sim" unless
   the tests run on a real GPU), with `extra` (or NULL) appended. */
static inline const char *at_conf(const char *extra, char *conf,
                                  size_t size) {
  const char *drv = getenv("XSEG_TEST_DRIVER");
  bool sim = drv == NULL || strcmp(drv, "system") != 0;
  snprintf(conf, size, "%s%s%s", sim ? "xseg_driver:sim" : "",
           sim && extra && extra[0] ? "," : "", extra ? extra : "");
  return conf;
}

/* An allocator on device 0 with at_conf(extra). */
static inline xseg_allocator *at_create(const char *extra) {
  char conf[512];
  at_conf(extra, conf, sizeof conf);
  xseg_allocator *a = NULL;
  xseg_status st = xseg_create(0, conf, &a);
  if (st != XSEG_OK)
    XSEG_FAIL("xseg_create(\"%s\"): %s: %s", conf, xseg_status_name(st),
              xseg_last_error());
  return a;
}

/* An allocator whose memory-fraction cap is `cap` bytes of device 0, for
   tests of the device limit that must run on a GPU too (where the device's
   real capacity cannot be set). The fraction is taken a MiB above `cap`,
   so that rounding it to a double cannot lose a granule. */
static inline xseg_allocator *at_create_capped(const char *extra,
                                               size_t cap) {
  CUdevice dev;
  size_t total = 0;
  if (!XSEG_EXPECT_CU(cuInit(0)) || !XSEG_EXPECT_CU(cuDeviceGet(&dev, 0)) ||
      !XSEG_EXPECT_CU(cuDeviceTotalMem(&total, dev)) ||
      !XSEG_EXPECT_GT(total, cap + MiB))
    return NULL;
  char conf[256];
  snprintf(conf, sizeof conf, "xseg_memory_fraction:%.12g%s%s",
           ((double)cap + (double)MiB) / (double)total,
           extra && extra[0] ? "," : "", extra ? extra : "");
  return at_create(conf);
}

/* The byte a block is filled with: from its address and a tag. */
static inline unsigned char at_byte(const void *p, unsigned tag) {
  uintptr_t v = (uintptr_t)p >> 9;
  return (unsigned char)(v * 131u + tag * 7u + 1u);
}

/* Fills the first and the last `span` bytes of [p, p+size) through the
   driver (the whole block when it is small). The caller's context must be
   current (xt_context). */
static inline bool at_fill(void *p, size_t size, unsigned tag) {
  const size_t span = 1024;
  if (size == 0) return true;
  unsigned char v = at_byte(p, tag);
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
  if (size <= 2 * span) return cuMemsetD8(d, v, size) == CUDA_SUCCESS;
  return cuMemsetD8(d, v, span) == CUDA_SUCCESS &&
         cuMemsetD8(d + size - span, v, span) == CUDA_SUCCESS;
}

/* Reads back what at_fill wrote; false on the first wrong byte. */
static inline bool at_verify(void *p, size_t size, unsigned tag) {
  enum { SPAN = 1024 };
  unsigned char buf[2 * SPAN];
  if (size == 0) return true;
  unsigned char v = at_byte(p, tag);
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
  size_t n = size <= 2 * SPAN ? size : 2 * SPAN;
  bool ok;
  if (size <= 2 * SPAN) {
    ok = cuMemcpyDtoH(buf, d, size) == CUDA_SUCCESS;
  } else {
    ok = cuMemcpyDtoH(buf, d, SPAN) == CUDA_SUCCESS &&
         cuMemcpyDtoH(buf + SPAN, d + size - SPAN, SPAN) == CUDA_SUCCESS;
  }
  for (size_t i = 0; ok && i < n; i++) ok = buf[i] == v;
  return ok;
}

typedef struct at_live {
  void *p;
  size_t size;
} at_live;

static int at_live_cmp(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)((const at_live *)x)->p;
  uintptr_t b = (uintptr_t)((const at_live *)y)->p;
  return a < b ? -1 : a > b;
}

/* True when no two of the n live blocks overlap (sorts a copy). */
static inline bool at_disjoint(const at_live *live, size_t n) {
  at_live *s = malloc(n * sizeof *s + 1);
  memcpy(s, live, n * sizeof *s);
  qsort(s, n, sizeof *s, at_live_cmp);
  bool ok = true;
  for (size_t i = 1; i < n && ok; i++) {
    size_t prev = s[i - 1].size ? s[i - 1].size : 1;
    ok = (uintptr_t)s[i - 1].p + prev <= (uintptr_t)s[i].p;
  }
  free(s);
  return ok;
}

/* A small deterministic generator (xorshift64*). */
static inline uint64_t at_rand(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

/* at_rand's state for a seed: every seed its own sequence (splitmix64's
   finaliser, a bijection), never the state 0 at which xorshift stays. A
   seed forced odd instead (seed | 1) gave seeds 2k and 2k + 1 one walk. */
static inline uint64_t at_rand_state(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z != 0 ? z : 1;
}

static inline xseg_stats at_stats(xseg_allocator *a) {
  xseg_stats s;
  xseg_get_stats(a, &s);
  return s;
}

/* The sum of the segments' total_size in xseg_snapshot_json (only
   segments carry that key); -1 when the snapshot could not be written.
   PyTorch's memory viewer takes it for the reserved bytes. */
/* a's snapshot as a string to free, or NULL if it fails. */
static inline char *at_snapshot_text(xseg_allocator *a) {
  char *json = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&json, &len);
  if (f == NULL) return NULL;
  xseg_status st = xseg_snapshot_json(a, f);
  fclose(f);
  if (st == XSEG_OK) return json;
  free(json);
  return NULL;
}

static inline int64_t at_snapshot_total(xseg_allocator *a) {
  char *json = at_snapshot_text(a);
  if (json == NULL) return -1;
  int64_t total = 0;
  static const char key[] = "\"total_size\": ";
  for (const char *k = json; (k = strstr(k, key)) != NULL; k += sizeof key - 1)
    total += strtoll(k + sizeof key - 1, NULL, 10);
  free(json);
  return total;
}

/* What a's recorded trace says was mapped since recording began: every
   segment_map and segment_alloc less every segment_unmap and segment_free,
   as PyTorch's viewer replays it; -1 if the snapshot fails. */
static inline int64_t at_trace_mapped(xseg_allocator *a) {
  char *json = at_snapshot_text(a);
  if (json == NULL) return -1;
  int64_t mapped = 0;
  static const struct { const char *action; int sign; } kinds[] = {
      {"segment_map", 1}, {"segment_alloc", 1},
      {"segment_unmap", -1}, {"segment_free", -1}};
  for (size_t i = 0; i < 4; i++) {
    char key[64];
    snprintf(key, sizeof key, "{\"action\": \"%s\", \"addr\": ",
             kinds[i].action);
    for (const char *k = json; (k = strstr(k, key)) != NULL; k++) {
      const char *size = strstr(k, "\"size\": ");
      if (size != NULL)
        mapped += kinds[i].sign * strtoll(size + 8, NULL, 10);
    }
  }
  free(json);
  return mapped;
}

#endif /* XSEG_ALLOC_HELPERS_H */
