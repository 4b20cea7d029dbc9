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
 *   XSIM_GPU_LAG        microseconds: modeled device lag (xsim_set_gpu_lag)
 *   XSIM_STEERING       "refuse": the calls below that steer the emulator
 *                       (capacity, faults, latency, lag) abort instead
 *   XSIM_STALE_STREAMS  "abort": a call that names a destroyed (or never
 *                       created) stream aborts, as a real driver may
 *                       crash, instead of CUDA_ERROR_INVALID_HANDLE
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

/* A busy device, modeled two ways.

   Wall-clock lag (XSIM_GPU_LAG, xsim_set_gpu_lag): a stream operation does
   not start before `us` microseconds after it was queued, as if the device
   had that much queued work ahead of it. Streams still run in parallel and
   in order, so this delays completion without limiting throughput. For
   live runs and tests; timing-dependent by nature. 0 (the default): none.
   Operations queued under the virtual clock ignore it.

   The virtual clock, for deterministic replays. xsim_clock_enable(lag_ns)
   starts a clock at 0 that only xsim_clock_advance moves. An operation
   queued while the clock reads t completes only once the clock reaches
   t + lag_ns: until then its stream is not done (cuStreamQuery), events
   recorded behind it report CUDA_ERROR_NOT_READY, and work that waits for
   it does not run. xsim_clock_advance(now_ns) moves the clock to now_ns
   (never backwards) and returns only after every operation due by then, and
   every operation that becomes runnable through those, has run; it returns
   how many ran. They run in the calling thread, so what is complete after
   it returns does not depend on thread scheduling.
   - Host waits (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize,
     the synchronous cuMemset and cuMemcpy forms) do not deadlock: the device
     catches up with the awaited work, and with the work of other streams it
     depends on, at once, in the waiting thread, without moving the clock.
     Each such call counts in xsim_call_count as usual.
   - Host functions (cuLaunchHostFunc) are not clocked: they run as soon
     as the work before them is done and no other host function runs (one
     at a time per process, as on a real driver), so a latch holds a stream
     as without the clock. Clocked work queued behind a host
     function runs at the next advance or host wait after it returned.
   - xsim_clock_enable while operations of an earlier clock are queued lets
     those run at once; xsim_clock_disable does so for all clocked work.
     xsim_reset disables the clock. xsim_clock_now reads the clock (0 when
     off). Times are nanoseconds on a clock of the caller's choosing (a
     trace's Time column). */
void xsim_set_gpu_lag(uint64_t us);
void xsim_clock_enable(uint64_t lag_ns);
void xsim_clock_disable(void);
uint64_t xsim_clock_advance(uint64_t now_ns);
uint64_t xsim_clock_now(void);

/* Calls of the named function since process start or the last reset. */
uint64_t xsim_call_count(const char *name);
void     xsim_reset_counters(void);

/* Back to the environment's settings: counters, fault injections, latencies,
   device capacities and the device lag; the virtual clock is turned off. Live
   objects are untouched (tests check them for leaks). */
void xsim_reset(void);

/* Writes one line per live handle, mapping and reservation to `out`
   (a leak report); returns how many lines it wrote. */
uint64_t xsim_report_live(FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* XSIM_H */
