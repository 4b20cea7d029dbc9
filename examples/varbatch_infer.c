/* varbatch_infer.c: a variable-batch inference loop on xseg.
 *
 * Each step takes a batch of 1..64 requests: the input is staged on a copy
 * stream, the layers run on a compute stream (here cuMemsetD8Async stands in
 * for kernels), and the output goes back on the copy stream. A block used
 * on the stream it was not allocated on is marked with xseg_record_stream,
 * so xseg reuses it only once that stream's work is done. It prints one line
 * of statistics and exits 0 when every call succeeded and every byte read
 * back was right.
 *
 * The program owns its context and streams: xseg only allocates. It runs on
 * a GPU as it is (link the real libcuda), and on xseg's emulator when linked
 * against it (lib/xseg/libcuda.so.1) with XSEG_ALLOC_CONF=xseg_driver:sim.
 */
#include <cuda.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <xseg.h>

#define CU_CHECK(call)                                                       \
  do {                                                                       \
    CUresult r_ = (call);                                                    \
    if (r_ != CUDA_SUCCESS) {                                                \
      const char *name_ = "?";                                               \
      cuGetErrorName(r_, &name_);                                            \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,   \
              name_);                                                        \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define XS_CHECK(call)                                                       \
  do {                                                                       \
    xseg_status s_ = (call);                                                 \
    if (s_ != XSEG_OK) {                                                     \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__,      \
              #call, xseg_status_name(s_), xseg_last_error());               \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

enum { STEPS = 300, LAYERS = 6, MAX_BATCH = 64 };
static const size_t ROW = 24 * 1024;   /* bytes per request per tensor */

static CUdeviceptr dev(void *p) { return (CUdeviceptr)(uintptr_t)p; }

typedef struct loop {
  xseg_allocator *a;
  CUstream copy, compute;
  CUevent staged, done;
} loop;

/* One step: stage the input, run the layers, queue the output's download
   to `host` on the copy stream (the caller synchronises and checks it). */
static void step(loop *l, int batch, unsigned char tag, unsigned char *host) {
  size_t n = (size_t)batch * ROW;
  void *input, *output;
  XS_CHECK(xseg_malloc(l->a, n, l->copy, &input));
  CU_CHECK(cuMemsetD8Async(dev(input), tag, n, l->copy));   /* the upload */
  CU_CHECK(cuEventRecord(l->staged, l->copy));
  CU_CHECK(cuStreamWaitEvent(l->compute, l->staged, 0));
  XS_CHECK(xseg_record_stream(l->a, input, l->compute));

  void *prev = input;
  for (int i = 0; i < LAYERS; i++) {
    /* Layer widths vary, as in a real model. */
    size_t width = n * (size_t)(1 + (i * 7 + batch) % 4);
    void *act;
    XS_CHECK(xseg_malloc(l->a, width, l->compute, &act));
    CU_CHECK(cuMemsetD8Async(dev(act), (unsigned char)(tag + i + 1), width,
                             l->compute));
    if (prev != input) XS_CHECK(xseg_free(l->a, prev));
    prev = act;
  }
  XS_CHECK(xseg_malloc(l->a, n, l->compute, &output));
  CU_CHECK(cuMemcpyDtoDAsync(dev(output), dev(prev), n, l->compute));
  XS_CHECK(xseg_free(l->a, prev));
  /* Freed on the copy stream's side; the compute stream's reads come
     first (recorded above). */
  XS_CHECK(xseg_free(l->a, input));

  CU_CHECK(cuEventRecord(l->done, l->compute));
  CU_CHECK(cuStreamWaitEvent(l->copy, l->done, 0));
  XS_CHECK(xseg_record_stream(l->a, output, l->copy));
  CU_CHECK(cuMemcpyDtoHAsync(host, dev(output), n, l->copy));   /* download */
  XS_CHECK(xseg_free(l->a, output));
}

int main(void) {
  CUdevice device;
  CUcontext ctx;
  CU_CHECK(cuInit(0));
  CU_CHECK(cuDeviceGet(&device, 0));
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  CU_CHECK(cuCtxSetCurrent(ctx));

  loop l;
  CU_CHECK(cuStreamCreate(&l.copy, CU_STREAM_NON_BLOCKING));
  CU_CHECK(cuStreamCreate(&l.compute, CU_STREAM_NON_BLOCKING));
  CU_CHECK(cuEventCreate(&l.staged, CU_EVENT_DISABLE_TIMING));
  CU_CHECK(cuEventCreate(&l.done, CU_EVENT_DISABLE_TIMING));
  XS_CHECK(xseg_create(0, NULL, &l.a));   /* config: XSEG_ALLOC_CONF */

  unsigned char *host = malloc((size_t)MAX_BATCH * ROW);
  if (host == NULL) return fprintf(stderr, "out of host memory\n"), 1;
  unsigned seed = 12345;
  for (int s = 0; s < STEPS; s++) {
    seed = seed * 1103515245u + 12345u;
    int batch = 1 + (int)((seed >> 16) % MAX_BATCH);
    unsigned char tag = (unsigned char)(s * 3);
    step(&l, batch, tag, host);
    CU_CHECK(cuStreamSynchronize(l.copy));
    size_t n = (size_t)batch * ROW;
    if (host[0] != (unsigned char)(tag + LAYERS) ||
        host[n - 1] != (unsigned char)(tag + LAYERS)) {
      fprintf(stderr, "step %d: wrong output byte %u\n", s, host[0]);
      return 1;
    }
  }
  free(host);

  xseg_stats st;
  XS_CHECK(xseg_get_stats(l.a, &st));
  XS_CHECK(xseg_check(l.a));
  double mib = 1024.0 * 1024.0;
  printf("varbatch_infer: %d steps, %" PRId64 " allocations, peak allocated "
         "%.1f MiB, peak reserved %.1f MiB (%.3fx), %" PRId64
         " physical allocations, %" PRId64 " OOMs\n",
         STEPS, st.allocation.allocated, st.allocated_bytes.peak / mib,
         st.reserved_bytes.peak / mib,
         (double)st.reserved_bytes.peak / (double)st.allocated_bytes.peak,
         st.num_device_alloc, st.num_ooms);

  XS_CHECK(xseg_empty_cache_blocking(l.a));
  xseg_destroy(l.a);
  CU_CHECK(cuEventDestroy(l.staged));
  CU_CHECK(cuEventDestroy(l.done));
  CU_CHECK(cuStreamDestroy(l.copy));
  CU_CHECK(cuStreamDestroy(l.compute));
  CU_CHECK(cuDevicePrimaryCtxRelease(device));
  return 0;
}
