/* bench.h: xseg-bench's internals, grouped by the file that defines them.
 *
 * The benchmark replays a workload (a list of allocate/free events) through a
 * policy and reports what the policy reserved against what the workload had
 * live. A workload comes from an RMM replay-log CSV (trace_csv.c, built with
 * trace.c) or a synthetic generator (varbatch.c); a policy is exact mode on
 * vmm/ (policy_exact.c), PyTorch's caching allocator with expandable
 * segments on vmm/ (policy_pytorch.c, pytorch.h) or the allocator through
 * the public API (policy_xseg.c: xseg, and pytorch-native). Everything driver-specific goes through env.c, so one
 * binary runs on the emulator and on a real GPU.
 */
#ifndef XB_BENCH_H
#define XB_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vmm/vmm.h"
#include "xseg.h"

/* ---- common.c: errors, sizes, clocks ---------------------------------- */

/* A failure's message, "file:line: reason" for trace errors. */
typedef struct xb_error {
  char text[512];
} xb_error;

/* Formats the message into e and returns false, so that a failing path is
   one line: `return xb_fail(err, "...", ...);`. */
bool xb_fail(xb_error *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The allocator's rounding of a request (PyTorch's kMinBlockSize). */
enum { XB_ROUND = 512 };
/* The largest request: xseg refuses larger ones (XS_MAX_REQUEST,
   alloc/alloc.c), and a workload's sizes stay at most this, so that
   rounding them to XB_ROUND or to granules cannot wrap. */
#define XB_MAX_SIZE ((uint64_t)1 << 62)
static inline uint64_t xb_round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}

/* "80G", "512M", "4096": bytes with an optional K M G T suffix (powers of
   1024). False on anything else, or on overflow. */
bool xb_parse_size(const char *s, uint64_t *out);
/* "1.5 GiB" style, into buf; returns buf. */
const char *xb_format_bytes(uint64_t n, char *buf, size_t size);
uint64_t xb_now_ns(void);
/* The next of a splitmix64 sequence whose state is *s: the benches'
   reproducible random sizes and choices. */
uint64_t xb_splitmix64(uint64_t *s);

/* ---- trace.c: a workload as an event array ---------------------------- */

enum { XB_MAX_STREAMS = 64 };
enum { XB_EV_ALLOC = 0, XB_EV_FREE = 1 };

/* One replayed request. `slot` names the block densely: the loader maps the
   trace's pointers to slots 0..n_slots-1, reusing a slot once its block is
   freed, so replay indexes arrays and never hashes. A free carries the size
   its block was allocated with. */
typedef struct xb_event {
  uint64_t size;
  uint64_t time_ns;    /* the trace's Time column, in ns */
  uint32_t slot;
  uint16_t stream;     /* index into xb_trace.stream_ids */
  uint8_t action;      /* XB_EV_ALLOC or XB_EV_FREE */
} xb_event;

struct xb_live;        /* a live block while building (uthash entry) */

/* Invariants once built: every free follows the allocation of its slot and
   no slot is allocated twice without a free between; no size is above
   XB_MAX_SIZE; peak_live_bytes is the maximum over events of the sum of
   live sizes rounded to XB_ROUND, first reached just after
   events[peak_event]. */
typedef struct xb_trace {
  char name[128];                   /* file name less .csv / .csv.gz */
  xb_event *events;
  size_t n_events, cap_events;
  uint64_t n_allocs, n_frees;
  uint32_t n_slots;
  int n_streams;
  int64_t stream_ids[XB_MAX_STREAMS]; /* the trace's Stream values */
  uint64_t live_bytes, peak_live_bytes;
  size_t peak_event;
  uint64_t now_ns;                  /* time given to the next event added */
  /* Building state, released by xb_trace_done: live pointers -> slots, and
     freed entries kept for reuse with their slot. */
  struct xb_live *live, *recycled;
} xb_trace;

void xb_trace_init(xb_trace *t, const char *name);
/* Appends an allocation of `size` bytes at pointer `key` on `stream`. False
   (with the reason) when key is already live, size is above XB_MAX_SIZE or
   on host out-of-memory. */
bool xb_trace_alloc(xb_trace *t, uint64_t key, uint64_t size, int64_t stream,
                    xb_error *err);
/* Appends the free of the live block at `key`. `size` must match the
   allocation's, unless it is UINT64_MAX (not known). False (with the reason)
   for an unknown pointer or a size mismatch. */
bool xb_trace_free(xb_trace *t, uint64_t key, uint64_t size, int64_t stream,
                   xb_error *err);
/* Events appended from now on carry `time_ns` (the builder's clock; times
   may repeat but a caller should not go back). */
static inline void xb_trace_at(xb_trace *t, uint64_t time_ns) {
  t->now_ns = time_ns;
}
/* Ends building: releases the pointer table (events stay). */
void xb_trace_done(xb_trace *t);
void xb_trace_release(xb_trace *t);

/* ---- trace_csv.c: RMM replay-log CSV, plain or gzip ------------------- */

/* Loads Thread,Time,Action,Pointer,Size,Stream rows from `path` (gzip or
   plain, zlib tells them apart). On a malformed line returns false with
   "path:line: reason". Rows whose action is "allocate failure" (an
   allocation that failed in the recorded run) are skipped. */
bool xb_trace_load(const char *path, xb_trace *t, xb_error *err);
/* Writes t as such a CSV, gzip-compressed when path ends in ".gz": Time from
   each event's time_ns, Stream from t->stream_ids, and Pointer a made-up
   address per slot (a slot is reused only after its block's free, as the
   format allows). False with the reason on an I/O error. */
bool xb_trace_write(const char *path, const xb_trace *t, xb_error *err);

/* ---- env.c: the driver, its counters and the emulator's knobs ---------- */

/* The driver the bench runs on, loaded like the allocator loads it. The
   emulator's control functions are found with dlsym on the driver library:
   on a real driver they are NULL and the counts come from vmm's table. */
typedef struct xb_env {
  char driver[256];                 /* "sim", "cuda" or a library path */
  xs_vmm vmm;
  uint64_t (*sim_call_count)(const char *name);
  void (*sim_reset_counters)(void);
  void (*sim_set_device_memory)(int device, uint64_t bytes);
  void (*sim_clock_enable)(uint64_t lag_ns);
  void (*sim_clock_disable)(void);
  uint64_t (*sim_clock_advance)(uint64_t now_ns);
  /* cuMemsetD8Async, the "kernel" that uses a replayed block under lag. */
  CUresult (*memset_async)(CUdeviceptr dst, unsigned char v, size_t n,
                           CUstream s);
  /* The device lag of the replay being run, in trace microseconds (0:
     none); set by xb_replay for the policy it opens. */
  uint64_t gpu_lag_us;
} xb_env;

xseg_status xb_env_open(xb_env *env, const char *driver);
void xb_env_close(xb_env *env);
bool xb_env_is_sim(const xb_env *env);
/* The path xs_driver_load and the xseg_driver key take for env->driver. */
const char *xb_env_driver_path(const xb_env *env);
void xb_env_reset_counts(xb_env *env);
uint64_t xb_env_call_count(xb_env *env, xs_driver_fn fn);
/* The emulator's capacity; false on a real driver. */
bool xb_env_set_device_memory(xb_env *env, uint64_t bytes);
/* Starts the emulator's virtual clock with a lag (xsim.h); false on a
   driver without one. */
bool xb_env_clock_start(xb_env *env, uint64_t lag_ns);
void xb_env_clock_stop(xb_env *env);
void xb_env_clock_advance(xb_env *env, uint64_t now_ns);
/* Host waits so far: cuStreamSynchronize + cuCtxSynchronize +
   cuEventSynchronize calls. */
uint64_t xb_env_host_waits(xb_env *env);
/* One created stream, and its destruction (NULL is ignored). */
xseg_status xb_env_stream_create(xb_env *env, struct CUstream_st **out);
void xb_env_stream_destroy(xb_env *env, struct CUstream_st *s);
/* Waits for everything queued on s (cuStreamSynchronize). */
xseg_status xb_env_stream_sync(xb_env *env, struct CUstream_st *s);
/* Streams for a workload's stream ids: each id, 0 included, gets a stream
   created with CU_STREAM_NON_BLOCKING, so that no two trace streams order
   behind each other through the legacy stream. */
xseg_status xb_env_streams_create(xb_env *env, const xb_trace *t,
                                  struct CUstream_st **out);
void xb_env_streams_destroy(xb_env *env, const xb_trace *t,
                            struct CUstream_st **streams);

/* ---- policy_*.c: what a replay allocates through ---------------------- */

/* Reserved (mapped physical) bytes now and the most since the last call. */
typedef struct xb_usage {
  uint64_t reserved, reserved_peak;
} xb_usage;

typedef struct xb_policy {
  const char *name;                 /* one of xb_modes */
  /* Opens a fresh instance for a workload of n_slots slots (and
     env->gpu_lag_us: under lag, blocks are used by stream work). */
  xseg_status (*open)(xb_env *env, const char *conf, uint32_t n_slots,
                      void **self);
  xseg_status (*malloc)(void *self, uint32_t slot, size_t size,
                        struct CUstream_st *stream, void **ptr);
  xseg_status (*free)(void *self, uint32_t slot, void *ptr);
  /* Fills u and starts a new window for u->reserved_peak. */
  void (*usage)(void *self, xb_usage *u);
  /* The allocator's snapshot JSON (docs/DESIGN.md section 6) to `out`, or NULL
     where the policy has none. */
  xseg_status (*snapshot)(void *self, FILE *out);
  /* Checks the policy's structures; false with the broken invariant in
     err. NULL where the policy has no checker. */
  bool (*check)(void *self, xb_error *err);
  void (*close)(void *self);
} xb_policy;

extern const xb_policy xb_policy_exact, xb_policy_pytorch_expandable;
/* The policy called `name` (a mode or an alias of one), or NULL. */
const xb_policy *xb_policy_find(const char *name);
/* Modes in report order: xseg, pytorch-expandable, pytorch-native, exact. */
enum { XB_N_MODES = 4 };
extern const char *const xb_modes[XB_N_MODES];
/* An allocator on env's driver, expandable or classic, then `conf`. */
xseg_status xb_xseg_create(xb_env *env, const char *conf, bool expandable,
                           xseg_allocator **out);

/* ---- replay.c: a workload through a policy ---------------------------- */

typedef struct xb_latency {
  uint64_t median, p99, mean;       /* host ns per call */
} xb_latency;

/* Sampled allocated and reserved bytes over a replay, for the chart. */
typedef struct xb_point {
  uint32_t event;
  uint64_t allocated, reserved;
} xb_point;

typedef struct xb_result {
  char trace[128];
  char mode[24];
  char driver[256];
  uint64_t events, allocs, frees;
  uint64_t peak_allocated, peak_reserved;
  uint64_t allocated_end, reserved_end;
  double fragmentation;             /* peak_reserved / peak_allocated */
  uint64_t ooms;
  uint64_t gpu_lag_us;              /* --gpu-lag of the run */
  uint64_t host_waits;              /* synchronize calls during the replay */
  uint64_t calls[XS_DRIVER_FN_COUNT];
  uint64_t vmm_calls;               /* the VMM functions only */
  xb_latency malloc_ns, free_ns;
  uint64_t ns_per_op;               /* median over mallocs and frees */
  double wall_s;
  xb_point *timeline;
  size_t n_points;
  char *snapshot;                   /* JSON at the allocated peak, or NULL */
} xb_result;

typedef struct xb_replay_opts {
  const char *conf;                 /* extra allocator conf, or NULL */
  size_t max_points;                /* timeline samples; 0 = none */
  bool snapshot;                    /* take one at the allocated peak */
  uint64_t gpu_lag_us;              /* device lag in trace time; 0: none */
} xb_replay_opts;

/* Replays t through policy p on env's driver. Out-of-memory is counted and
   the block's free skipped; any other failure stops the replay with the
   policy's message.

   With o->gpu_lag_us > 0 the device runs that far behind in trace time: the
   emulator's virtual clock follows the events' times, each block gets a
   one-byte memset on its stream when allocated and just before its free (a
   kernel's first and last use), and work queued at time t completes at
   t + lag. Needs the emulator (false otherwise). */
bool xb_replay(xb_env *env, const xb_trace *t, const xb_policy *p,
               const xb_replay_opts *o, xb_result *r, xb_error *err);
void xb_result_release(xb_result *r);
/* True for the functions the "VMM calls" column adds up. */
bool xb_fn_is_vmm(xs_driver_fn fn);

/* ---- report.c: table and JSON ----------------------------------------- */

void xb_report_table_header(FILE *out);
/* What the table's columns and modes mean, for after it. */
void xb_report_legend(FILE *out);
void xb_report_table_row(FILE *out, const xb_result *r);
/* "xseg, lag 5000 us": what a chart calls a result, into buf. */
const char *xb_result_label(const xb_result *r, char *buf, size_t size);
/* {"runs": [...]}: one JSON object per result, whatever n. */
void xb_report_json(FILE *out, const xb_result *r, size_t n);
void xb_json_string(FILE *out, const char *s);

/* ---- snapshot_read.c: the allocator's snapshot JSON, read back -------- */

/* A block's state in the snapshot (docs/DESIGN.md section 6). */
enum { XB_BLOCK_ALLOCATED, XB_BLOCK_PENDING, XB_BLOCK_INACTIVE,
       XB_BLOCK_STATES };

typedef struct xb_snap_block {
  uint64_t address, size, requested;
  int state;                        /* XB_BLOCK_* */
} xb_snap_block;

/* One mapped run (alloc/snapshot.c writes each maximal run of mapped blocks
   of a reserved range as one segment). Its blocks tile
   [address, address + total_size) in address order. */
typedef struct xb_snap_segment {
  uint64_t address, total_size, stream;
  bool large, expandable;           /* segment_type, is_expandable */
  xb_snap_block *blocks;
  size_t n_blocks, cap_blocks;
} xb_snap_segment;

typedef struct xb_snapshot {
  xb_snap_segment *segments;
  size_t n_segments, cap_segments;
} xb_snapshot;

/* Parses `json` into snap (released on failure); false with the reason and
   the byte offset on malformed text or an unknown block state. */
bool xb_snapshot_read(const char *json, xb_snapshot *snap, xb_error *err);
void xb_snapshot_release(xb_snapshot *snap);

/* ---- svg.c: the chart ------------------------------------------------- */

/* Allocated and reserved bytes over each replay, one chart per trace (the
   results of one trace are adjacent in r), and the segment map at the peak
   for results that carry a snapshot. */
bool xb_svg_write(const char *path, const xb_result *r, size_t n,
                  xb_error *err);
/* s with & < > escaped, as SVG text. */
void xb_svg_text(FILE *f, const char *s);
/* A round axis step of at least `raw` bytes (1, 2 or 5 times a power of ten
   MiB, or KiB for small workloads). */
uint64_t xb_svg_tick_step(uint64_t raw);

/* ---- svg_segments.c: the segment map at the peak ---------------------- */

/* The height the map of r[0, n) (one trace's results) takes: 0 when none
   carries a snapshot. */
double xb_segmap_height(const xb_result *r, size_t n);
/* Draws that map with its top at y: a row per reservation and state, for
   each result with a snapshot, on one scale, with a legend. */
void xb_segmap_write(FILE *f, const xb_result *r, size_t n, double y);

#endif /* XB_BENCH_H */
