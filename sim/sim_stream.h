/* sim_stream.h: what sim_stream.c, sim_event.c and sim_graph.c share.
 *
 * The model. Every stream is an in-order queue of operations run by a worker
 * thread of its own. A stream counts the operations submitted to it and the
 * ones completed; an operation is identified by (stream, seq), seq counting
 * from 1, and is complete once stream->completed >= seq. An operation carries
 * a list of such (stream, seq) dependencies that its worker waits for before
 * running it: that is how the legacy stream orders with blocking streams, how
 * cuStreamWaitEvent works and how graph launches order behind each other. An
 * event is a recorded (stream, seq).
 *
 * One mutex guards all of it (queues, counters, events, captures), and one
 * condition variable is broadcast whenever an operation is submitted or
 * completes. Workers run operations (memset, memcpy) without the mutex. A
 * handful of streams is the expected load, so one lock and one broadcast
 * keep the code short at a cost nobody measures.
 *
 * The modeled device lag (xsim.h). With XSIM_GPU_LAG an operation is not
 * started before its submission time plus the lag (wall clock). Under the
 * virtual clock an operation submitted at clock time t is "clocked", due at
 * t + lag: workers leave clocked work alone, and only the threads that move
 * the clock (xsim_clock_advance) or wait on the host (synchronize) run it,
 * in their own thread, so what has completed is a function of the clock and
 * the host's calls alone. Host functions are never clocked: they run as soon
 * as the work before them is done and no other host function runs.
 *
 * Host functions do not run on the worker: it hands them to the process's
 * one host-function thread (sim_host.c), which runs them one at a time, as
 * the driver does.
 *
 * Graph capture: a capturing stream appends the work it is given to the
 * capture's graph instead of queueing it; a graph is a list of work items in
 * submission order, which is a valid topological order of what was captured,
 * and a launch submits them in that order to the launch stream.
 */
#ifndef XSIM_STREAM_H
#define XSIM_STREAM_H

#include "sim_internal.h"

#define XSIM_STREAM_MAGIC 0x5354524dU  /* "STRM" */
#define XSIM_EVENT_MAGIC  0x45564e54U  /* "EVNT" */
#define XSIM_GRAPH_MAGIC  0x47525048U  /* "GRPH" */
#define XSIM_EXEC_MAGIC   0x47455843U  /* "GEXC" */

/* ---- work: what an operation does, independent of where it runs -------- */

typedef enum xsim_work_kind {
  XSIM_WORK_NOP,          /* orders only (cuStreamWaitEvent, barriers) */
  XSIM_WORK_HOST,         /* cuLaunchHostFunc */
  XSIM_WORK_SET,          /* cuMemsetD8 / D32: count elements of width bytes */
  XSIM_WORK_COPY,         /* cuMemcpy* */
  XSIM_WORK_RECORD,       /* cuEventRecord: stamps the event's time */
  XSIM_WORK_WAIT_EVENT,   /* captured wait on an event outside the capture */
  XSIM_WORK_WAIT_IPC      /* wait for a record made in another process */
} xsim_work_kind;

typedef struct xsim_work {
  xsim_work_kind kind;
  union {
    struct { CUhostFn fn; void *data; } host;
    struct { void *dst; uint32_t value; size_t count; unsigned width; } set;
    struct { void *dst; const void *src; size_t bytes; } copy;
    struct { struct CUevent_st *event; uint64_t gen; } record;
    struct { struct CUevent_st *event; } wait;
    struct { struct CUevent_st *event; uint64_t gen; } wait_ipc;
  } u;
} xsim_work;

/* A work item that names an event holds a reference on it. */
void xsim_work_retain_locked(const xsim_work *w);
void xsim_work_release_locked(const xsim_work *w);

/* ---- streams ----------------------------------------------------------- */

typedef struct xsim_dep {
  struct CUstream_st *stream;  /* holds a reference while in a list */
  uint64_t seq;
} xsim_dep;

typedef struct xsim_op {
  struct xsim_op *next;
  uint64_t seq;
  bool clocked;                /* queued under the virtual clock */
  uint64_t due_clock_ns;       /* clocked: may run once the clock is here */
  uint64_t due_wall_ns;        /* XSIM_GPU_LAG: not before this monotonic ns */
  xsim_work work;
  size_t ndeps;
  xsim_dep *deps;
} xsim_op;

typedef struct xsim_capture xsim_capture;

/* Invariants: completed <= submitted; the queue holds exactly the operations
   with seq in (completed, submitted], in order; refs > 0 while the stream is
   registered (the creator's reference until destroy, the worker's until it
   exits). Legacy streams live for the whole process. */
struct CUstream_st {
  uint32_t magic;
  int device;
  CUcontext ctx;               /* current at its creation (cuStreamGetCtx);
                                  NULL for a device's legacy stream */
  unsigned flags;              /* CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING */
  int priority;
  bool legacy;                 /* the device's NULL stream */
  bool destroyed;              /* cuStreamDestroy called; drains, then frees */
  uint64_t id;                 /* cuStreamGetId */
  uint64_t submitted, completed;
  uint64_t forced;             /* clocked work up to this seq runs now */
  bool running;                /* its head operation is being run */
  uint32_t refs;
  xsim_op *head, *tail;
  xsim_capture *capture;       /* capture this stream takes part in, or NULL */
  size_t cap_tail;             /* graph length after this stream's last node */
  bool cap_joined;             /* its tail was waited on by another stream */
  struct CUstream_st *prev, *next;   /* registry of non-legacy streams */
  struct CUstream_st *host_next;     /* queue of the host-function thread */
};

/* The one lock and its condition variable. */
void xsim_lock(void);
void xsim_unlock(void);
void xsim_wait_locked(void);
void xsim_broadcast_locked(void);

/* Finds the stream named by h and takes the lock (the caller unlocks); the
   lock is not held on failure. NULL and CU_STREAM_LEGACY name the current
   context's legacy stream (CUDA_ERROR_INVALID_CONTEXT without one); anything
   else must be a live stream, or CUDA_ERROR_INVALID_HANDLE. */
CUresult xsim_stream_acquire(CUstream h, struct CUstream_st **out);
/* The registry of non-legacy streams, destroyed ones still draining
   included; walk it with ->next. */
struct CUstream_st *xsim_stream_first_locked(void);
void xsim_stream_retain_locked(struct CUstream_st *s);
void xsim_stream_release_locked(struct CUstream_st *s);
/* True when a blocking stream of the device is capturing: the legacy stream
   is then unusable (cuda.h, cuStreamIsCapturing). With `invalidate`, those
   captures are invalidated (the legacy stream was used anyway). */
bool xsim_stream_blocking_capture_locked(int device, bool invalidate);
/* Ticket of a submission: where the work went. */
typedef struct xsim_ticket {
  bool captured;               /* appended to a capture, not queued */
  uint64_t seq;                /* queued: the operation's seq */
} xsim_ticket;
/* Queues w on s (or appends it to s's capture) after s's prior work, the
   legacy-stream ordering and `extra` (may be NULL). */
CUresult xsim_stream_submit_locked(struct CUstream_st *s, const xsim_work *w,
                                 const xsim_dep *extra, xsim_ticket *ticket);
bool xsim_dep_done_locked(const xsim_dep *d);
/* Completes s's head, which s->running marks as being run by the caller,
   and broadcasts the progress. */
void xsim_stream_retire_head_locked(struct CUstream_st *s);
/* Blocks until d is complete: a host wait. Under the virtual clock it first
   runs the awaited work and what that work depends on (xsim.h). */
void xsim_dep_wait_locked(const xsim_dep *d);
/* Doubles an array's capacity (to `first` elements when it has none) with
   realloc: the grown array, *cap updated; NULL, v and *cap untouched, when
   out of memory. Used by dependency lists and graphs alike. */
void *xsim_array_grow(void *v, size_t *cap, size_t first, size_t elem);
/* Starts fn(arg) on a detached thread (stream workers, the host-function
   thread) and returns once the thread is past its start-up (so that a
   later fork copies none of a start's locks); pthread_create's error, 0 on
   success. */
int xsim_thread_start_detached(void *(*fn)(void *), void *arg);

/* ---- the host-function thread (sim_host.c) ---------------------------- */

/* Starts the thread unless it runs: CUDA_ERROR_OUT_OF_MEMORY if it cannot. */
CUresult xsim_host_start_locked(void);
/* Hands s's head, a ready host function marked running, to the thread. */
void xsim_host_enqueue_locked(struct CUstream_st *s);
/* In a forked child: no thread, nothing queued. */
void xsim_host_fork_child_locked(void);

/* ---- events ------------------------------------------------------------ */

/* Invariants: `stream` is NULL until the first record outside a capture and
   then holds a reference; gen counts records, so a record operation stamps
   the time only if no later record moved the event. */
struct CUevent_st {
  uint32_t magic;
  unsigned flags;
  uint32_t refs;               /* the creator's, plus work items naming it */
  struct CUstream_st *stream;  /* last record: (stream, seq) */
  uint64_t seq;
  uint64_t gen;
  bool stamped;                /* time_ns holds the current record's time */
  uint64_t time_ns;
  uint64_t capture_id;         /* last recorded in this capture (0: none) */
  struct CUstream_st *cap_stream;
  size_t cap_pos;              /* graph length after the recorded node */
  struct xsim_ipc_event *ipc;    /* CU_EVENT_INTERPROCESS: the shared state */
  int device;                  /* its context's: cuEventRecord refuses a
                                  stream of another */
};

/* A new event (refs 1) with flags already checked; takes `ipc` over. */
CUresult xsim_event_new(unsigned flags, struct xsim_ipc_event *ipc,
                      struct CUevent_st **out);
bool xsim_event_valid_locked(const struct CUevent_st *e);

/* Events created and not yet destroyed (xsim_get_live). */
uint64_t xsim_event_live_locked(void);
void xsim_event_retain_locked(struct CUevent_st *e);
void xsim_event_release_locked(struct CUevent_st *e);
/* Moves e to (s's next operation); used by cuEventRecord and graph launch. */
CUresult xsim_event_record_locked(struct CUevent_st *e, struct CUstream_st *s);
/* Called by the worker when a record operation completes. */
void xsim_event_stamp_locked(struct CUevent_st *e, uint64_t gen);

/* ---- interprocess events (sim_ipc_event.c) ----------------------------- */

/* The state of an interprocess event, shared with other processes. An
   event whose local record is not the latest one (another process recorded
   it since, or only another process ever did) is waited for here, through
   the shared generations; see sim_ipc_event.c. */
typedef struct xsim_ipc_event xsim_ipc_event;
CUresult xsim_ipc_event_create(xsim_ipc_event **out);
void     xsim_ipc_event_free(xsim_ipc_event *x);
void     xsim_ipc_event_handle(const xsim_ipc_event *x, CUipcEventHandle *out);
/* The generation of a new record, made the latest. */
uint64_t xsim_ipc_event_next_gen(xsim_ipc_event *x);
uint64_t xsim_ipc_event_latest(const xsim_ipc_event *x);
/* The record `gen` retired (or was never queued). */
void     xsim_ipc_event_retired(xsim_ipc_event *x, uint64_t gen);
bool     xsim_ipc_event_done(const xsim_ipc_event *x, uint64_t target);
/* Blocks the calling thread (no lock held) until done. */
void     xsim_ipc_event_await(const xsim_ipc_event *x, uint64_t target);

/* ---- capture and graphs ------------------------------------------------ */

struct xsim_capture {
  uint64_t id;
  CUstreamCaptureMode mode;
  pthread_t owner;             /* the thread that began it */
  bool invalidated;
  struct CUstream_st *origin;
  struct CUgraph_st *graph;    /* being built */
  xsim_capture *next;            /* list of active captures */
};

struct CUgraph_st {
  uint32_t magic;
  size_t count, cap;
  xsim_work *nodes;              /* in submission order; each holds its refs */
};

/* Appends w to s's capture; CUDA_ERROR_STREAM_CAPTURE_INVALIDATED if an
   earlier error invalidated it. */
CUresult xsim_capture_append_locked(struct CUstream_st *s, const xsim_work *w);
/* The check for "potentially unsafe" calls (cuda.h,
   cuThreadExchangeStreamCaptureMode): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
   invalidating the captures that forbid the call, or CUDA_SUCCESS. */
CUresult xsim_capture_check_unsafe_locked(void);
/* Synchronizing a device (context) while one of its streams captures
   conflicts with capture in every mode: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
   invalidating those captures, or CUDA_SUCCESS. */
CUresult xsim_capture_check_device_locked(int device);
/* Invalidates the capture of a stream misused by a call that conflicts with
   capture in every mode. */
void xsim_capture_invalidate_locked(struct CUstream_st *s);
bool xsim_capture_is_active_locked(uint64_t id);
/* cuStreamDestroy of a stream that takes part in a capture. */
void xsim_capture_abandon_locked(struct CUstream_st *s);

#endif /* XSIM_STREAM_H */
