/* fuzz_helpers.h: what the fuzz walks share (test_fuzz.c,
 * test_fuzz_ipc.c): a failure report that names the step, device bytes
 * compared through the driver, the walk's settings from the environment
 * and the steps CI runs.
 */
#ifndef XSEG_TESTS_FUZZ_HELPERS_H
#define XSEG_TESTS_FUZZ_HELPERS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc_helpers.h"

/* Bytes a walk writes and reads back at a time. */
enum { SPAN = 512 };

/* Steps per configuration in CI: fewer under the sanitizers, whose
   slowdown (TSan's above all) would otherwise take minutes. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
enum { STEPS = 300 };
#else
enum { STEPS = 1500 };
#endif

/* Records a failure with the step it happened at; the walk stops there. */
static inline void fz_vfail(bool *failed, const char *walk, uint64_t step,
                            const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  XSEG_FAIL("%sstep %llu: %s", walk, (unsigned long long)step, msg);
  *failed = true;
}

static inline bool fz_span_is(CUdeviceptr d, size_t n, unsigned char v) {
  unsigned char buf[SPAN];
  if (cuMemcpyDtoH(buf, d, n) != CUDA_SUCCESS) return false;
  for (size_t i = 0; i < n; i++)
    if (buf[i] != v) return false;
  return true;
}

static inline uint64_t fz_env(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? strtoull(v, NULL, 10) : dflt;
}

#endif /* XSEG_TESTS_FUZZ_HELPERS_H */
