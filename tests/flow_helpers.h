/* flow_helpers.h: what the flow tests share (test_alloc_flow.c,
 * test_alloc_flow_streams.c): device bytes read back, host waits and live
 * driver objects counted by the emulator.
 */
#ifndef XSEG_TESTS_FLOW_HELPERS_H
#define XSEG_TESTS_FLOW_HELPERS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "alloc_helpers.h"

/* True when every byte of [d, d+n) is v (read through the driver). */
static inline bool dev_bytes_are(CUdeviceptr d, size_t n, unsigned char v) {
  unsigned char *buf = malloc(n);
  bool ok = buf != NULL && cuMemcpyDtoH(buf, d, n) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < n; i++) ok = buf[i] == v;
  free(buf);
  return ok;
}

static inline uint64_t host_waits(void) {
  return xsim_call_count("cuStreamSynchronize") +
         xsim_call_count("cuCtxSynchronize") +
         xsim_call_count("cuEventSynchronize");
}

static inline xsim_live live_now(void) {
  xsim_live l;
  xsim_get_live(&l);
  return l;
}

#endif /* XSEG_TESTS_FLOW_HELPERS_H */
