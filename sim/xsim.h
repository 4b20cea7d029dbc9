/* xsim.h: the emulator's control surface.
 *
 * The emulator (sim/) is a software CUDA driver built as libcuda.so.1. Tests
 * and benchmarks steer it through these functions, which the emulator library
 * exports beside the cu* API. Nothing here exists in a real libcuda: code that
 * must also run on a GPU declares them weak and checks for NULL (see
 * tests/harness/xseg_test.h).
 *
 * Environment, read at the first cuInit and again by xsim_reset():
 *   XSIM_DEVICE_COUNT   devices (default 1)
 *   XSIM_DEVICE_MEMORY  bytes per device, suffixes K M G T (default 80G);
 *                       pages are only committed when touched
 *   XSIM_GRANULARITY    allocation granularity (default 2M, a power of two)
 *   XSIM_FAIL           name:nth[:CUDA_ERROR_NAME],... (see xsim_fail_call)
 *   XSIM_FAIL_RATE      name:probability:seed[:CUDA_ERROR_NAME],...
 *   XSIM_LATENCY        name:nanoseconds,... modeled host latency of a call
 */
#ifndef XSIM_H
#define XSIM_H

#include <stdint.h>
#include <stdio.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What is alive now, over every device. */
typedef struct xsim_live {
  uint64_t handles, mappings, reservations, streams, events;
  uint64_t physical_bytes;               /* bytes held by live handles */
} xsim_live;
void xsim_get_live(xsim_live *out);

/* Capacity of a device; cuMemCreate beyond it fails with
   CUDA_ERROR_OUT_OF_MEMORY. Lowering it below what is in use is allowed:
   existing handles stay, new ones fail. */
void xsim_set_device_memory(int device, uint64_t bytes);

/* Fault injection (SQLite's faultsim). The nth next call (1 = the very next)
   of the named function ("cuMemCreate", "cuMemMap", ... the unversioned name)
   returns err and does nothing. The failing call still counts in
   xsim_call_count. A new injection for a name replaces the old one; nth 0
   (or repeat 0, or p <= 0 below) disarms it. In XSIM_FAIL and XSIM_FAIL_RATE
   an entry without an error name fails cuMemCreate with
   CUDA_ERROR_OUT_OF_MEMORY and any other function with CUDA_ERROR_UNKNOWN;
   malformed entries are reported on stderr and skipped. */
void xsim_fail_call(const char *name, uint64_t nth, CUresult err);
/* As xsim_fail_call, then every call after it fails too, `repeat` calls in
   all (UINT64_MAX: until xsim_reset). */
void xsim_fail_calls(const char *name, uint64_t nth, uint64_t repeat,
                     CUresult err);
/* Each call of the named function fails with probability p, drawn from a
   generator seeded with seed (reproducible for one sequence of calls). */
void xsim_fail_random(const char *name, double p, uint64_t seed, CUresult err);

/* Modeled host-side latency of a call, in nanoseconds (0: none, the default).
   A latency profile is an assumption, never a measurement. */
void xsim_set_latency(const char *name, uint64_t ns);

/* Calls of the named function since process start or the last reset. */
uint64_t xsim_call_count(const char *name);
void     xsim_reset_counters(void);

/* Back to the environment's settings: counters, fault injections, latencies
   and device capacities. Live objects are untouched (tests check them for
   leaks). */
void xsim_reset(void);

/* Writes one line per live handle, mapping and reservation to `out`
   (a leak report); returns how many lines it wrote. */
uint64_t xsim_report_live(FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* XSIM_H */
