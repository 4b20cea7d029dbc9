/* sim_event.c: events, and cuStreamWaitEvent (which is mostly about the
 * event's state: recorded, never recorded, or recorded inside a capture).
 *
 * An event is the (stream, seq) of its last record; it is complete once that
 * stream's completed counter reaches seq. A record operation stamps the time
 * when the stream's worker retires it, which is what cuEventElapsedTime
 * subtracts. Events recorded in a capturing stream point at the capture
 * instead, and a stream that waits on one joins the capture (fork / join).
 */
#include "sim_stream.h"

#include <assert.h>
#include <stdlib.h>
#include <time.h>

#define XSIM_EVENT_DEAD 0x44454144U   /* destroyed, still referenced */

static uint64_t xsim_events_live;

uint64_t xsim_event_live_locked(void) { return xsim_events_live; }

void xsim_event_retain_locked(struct CUevent_st *e) {
  assert(e->refs > 0 && "retain of a freed event");
  e->refs++;
}

void xsim_event_release_locked(struct CUevent_st *e) {
  assert(e->refs > 0 && "event released too often");
  if (--e->refs > 0) return;
  if (e->stream) xsim_stream_release_locked(e->stream);
  xsim_ipc_event_free(e->ipc);
  e->magic = 0;
  free(e);
}

bool xsim_event_valid_locked(const struct CUevent_st *e) {
  return e && e->magic == XSIM_EVENT_MAGIC;
}

/* Last recorded inside a capture that is still going on. */
static bool xsim_event_captured_locked(const struct CUevent_st *e) {
  return e->capture_id && xsim_capture_is_active_locked(e->capture_id);
}

static struct CUstream_st *xsim_event_cap_stream_locked(
    const struct CUevent_st *e);

static bool xsim_event_done_locked(const struct CUevent_st *e) {
  return !e->stream || e->stream->completed >= e->seq;
}

static uint64_t xsim_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void xsim_event_stamp_locked(struct CUevent_st *e, uint64_t gen) {
  if (e->ipc != NULL) xsim_ipc_event_retired(e->ipc, gen);
  if (e->gen != gen) return;   /* recorded again since: not this record */
  e->time_ns = xsim_clock_ns();
  e->stamped = true;
}

static void xsim_event_point_locked(struct CUevent_st *e,
                                  struct CUstream_st *s, uint64_t seq) {
  if (s) xsim_stream_retain_locked(s);
  if (e->stream) xsim_stream_release_locked(e->stream);
  e->stream = s;
  e->seq = seq;
  e->stamped = false;
}

/* A record inside a capture: the event now names the captured node, and no
   longer any real work (cuda.h: recording "will overwrite the previously
   captured state"). */
static void xsim_event_capture_locked(struct CUevent_st *e,
                                    struct CUstream_st *s) {
  xsim_event_point_locked(e, NULL, 0);
  e->capture_id = s->capture->id;
  e->cap_stream = s;
  e->cap_pos = s->cap_tail;
}

/* An interprocess event's generations are shared by every process that
   holds it (the latest record wins, whoever made it); a record that did not
   get queued completes its generation at once, so nobody waits for it. */
CUresult xsim_event_record_locked(struct CUevent_st *e, struct CUstream_st *s) {
  uint64_t gen = e->ipc != NULL && !s->capture ? xsim_ipc_event_next_gen(e->ipc)
                                               : e->gen + 1;
  xsim_work w = {.kind = XSIM_WORK_RECORD, .u.record = {e, gen}};
  xsim_ticket ticket;
  CUresult r = xsim_stream_submit_locked(s, &w, NULL, &ticket);
  if (r != CUDA_SUCCESS && e->ipc != NULL && !s->capture)
    xsim_ipc_event_retired(e->ipc, gen);
  if (r != CUDA_SUCCESS) return r;
  if (ticket.captured) {
    xsim_event_capture_locked(e, s);
    return CUDA_SUCCESS;
  }
  e->gen = gen;
  e->capture_id = 0;
  xsim_event_point_locked(e, s, ticket.seq);
  return CUDA_SUCCESS;
}

/* ---- create and destroy ------------------------------------------------ */

/* cuda.h: flags are CU_EVENT_DEFAULT, BLOCKING_SYNC, DISABLE_TIMING and
   INTERPROCESS, which "must be specified along with
   CU_EVENT_DISABLE_TIMING". */
static bool xsim_event_flags_valid(unsigned flags) {
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                         CU_EVENT_INTERPROCESS;
  if (flags & ~known) return false;
  return !(flags & CU_EVENT_INTERPROCESS) || (flags & CU_EVENT_DISABLE_TIMING);
}

CUresult xsim_event_new(unsigned flags, struct xsim_ipc_event *ipc,
                      struct CUevent_st **out) {
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  *e = (struct CUevent_st){.magic = XSIM_EVENT_MAGIC, .flags = flags,
                           .refs = 1, .ipc = ipc};
  xsim_lock();
  xsim_events_live++;
  xsim_unlock();
  *out = e;
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  XSIM_ENTER("cuEventCreate");
  int device;
  CUresult r = xsim_current_device(&device);
  if (r != CUDA_SUCCESS) return r;
  if (!phEvent || !xsim_event_flags_valid(Flags))
    return CUDA_ERROR_INVALID_VALUE;
  xsim_ipc_event *ipc = NULL;
  if ((Flags & CU_EVENT_INTERPROCESS) &&
      (r = xsim_ipc_event_create(&ipc)) != CUDA_SUCCESS)
    return r;
  r = xsim_event_new(Flags, ipc, phEvent);
  if (r != CUDA_SUCCESS) xsim_ipc_event_free(ipc);
  else (*phEvent)->device = device;
  return r;
}

/* cuda.h: an event "may be destroyed before it is complete ... the call does
   not block"; queued records and graphs keep their own references. */
static CUresult xsim_event_destroy(CUevent hEvent) {
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  xsim_lock();
  if (!xsim_event_valid_locked(hEvent)) {
    xsim_unlock();
    return CUDA_ERROR_INVALID_HANDLE;
  }
  hEvent->magic = XSIM_EVENT_DEAD;
  xsim_events_live--;
  xsim_event_release_locked(hEvent);
  xsim_unlock();
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
  XSIM_ENTER("cuEventDestroy");
  return xsim_event_destroy(hEvent);
}

#undef cuEventDestroy
CUresult CUDAAPI cuEventDestroy(CUevent hEvent);
CUresult cuEventDestroy(CUevent hEvent) {
  XSIM_ENTER("cuEventDestroy");
  return xsim_event_destroy(hEvent);
}

/* ---- record ------------------------------------------------------------ */

/* A plain record inside a capture is a dependency inside the capture only,
   and adds no node to the graph (CUDA programming guide, "Cross-stream
   dependencies and events"); with CU_EVENT_RECORD_EXTERNAL it is an event
   record node, which every launch of the graph performs (cuda.h). */
static CUresult xsim_event_record_internal_locked(struct CUevent_st *e,
                                                struct CUstream_st *s) {
  if (s->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  xsim_event_capture_locked(e, s);
  return CUDA_SUCCESS;
}

static CUresult xsim_event_record(CUevent hEvent, CUstream hStream,
                                unsigned flags) {
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!xsim_event_valid_locked(hEvent)) r = CUDA_ERROR_INVALID_HANDLE;
  /* cuda.h: "hEvent and hStream must be from the same context otherwise
     CUDA_ERROR_INVALID_HANDLE is returned" (a device's contexts are one
     here). */
  else if (hEvent->device != s->device) r = CUDA_ERROR_INVALID_HANDLE;
  else if ((flags & CU_EVENT_RECORD_EXTERNAL) && !s->capture)
    r = CUDA_ERROR_ILLEGAL_STATE;
  else if (s->capture && !(flags & CU_EVENT_RECORD_EXTERNAL))
    r = xsim_event_record_internal_locked(hEvent, s);
  else r = xsim_event_record_locked(hEvent, s);
  xsim_unlock();
  return r;
}

/* cuda.h: "Captures in hEvent the contents of hStream at the time of this
   call ... can be called multiple times on the same event and will
   overwrite the previously captured state." */
CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
  XSIM_ENTER("cuEventRecord");
  return xsim_event_record(hEvent, hStream, 0);
}

/* cuda.h: CU_EVENT_RECORD_EXTERNAL "is invalid outside of stream capture":
   CUDA_ERROR_ILLEGAL_STATE (observed on H100, driver 580). */
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream,
                                unsigned int flags) {
  XSIM_ENTER("cuEventRecordWithFlags");
  if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  return xsim_event_record(hEvent, hStream, flags);
}

/* ---- query and synchronize --------------------------------------------- */

/* Locks and checks what cuEventQuery and cuEventSynchronize share: a live
   handle, the unsafe-call rule, and cuThreadExchangeStreamCaptureMode's
   "attempting cuEventQuery on an event that was last recorded inside a
   capture sequence" (CUDA_ERROR_CAPTURED_EVENT, in every mode), which
   also invalidates that capture (observed on H100, driver 580, in relaxed
   mode). The lock is held on return whatever the result. */
static CUresult xsim_event_check_wait_locked(CUevent e) {
  if (!xsim_event_valid_locked(e)) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = xsim_capture_check_unsafe_locked();
  if (r != CUDA_SUCCESS) return r;
  if (!xsim_event_captured_locked(e)) return CUDA_SUCCESS;
  struct CUstream_st *rec = xsim_event_cap_stream_locked(e);
  if (rec) xsim_capture_invalidate_locked(rec);
  return CUDA_ERROR_CAPTURED_EVENT;
}

/* Blocks until the event's current record completes (nothing to wait for
   when it was never recorded). */
static void xsim_event_block_locked(CUevent e) {
  if (!e->stream) return;
  xsim_dep d = {e->stream, e->seq};
  xsim_stream_retain_locked(d.stream);
  xsim_dep_wait_locked(&d);
  xsim_stream_release_locked(d.stream);
}

/* The record to wait for when the latest record of an interprocess event
   was made elsewhere (then true), through the shared generations; false
   when this process's own record (or none) is the latest. */
static bool xsim_event_remote_locked(const struct CUevent_st *e,
                                   uint64_t *target) {
  if (e->ipc == NULL || e->capture_id) return false;
  *target = xsim_ipc_event_latest(e->ipc);
  return *target != 0 && *target != e->gen;
}

/* Waits for (wait) or polls (!wait) the event: cuEventSynchronize and
   cuEventQuery differ in nothing else. A wait for another process polls
   without the lock. */
static CUresult xsim_event_finish(CUevent hEvent, bool wait) {
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  xsim_lock();
  r = xsim_event_check_wait_locked(hEvent);
  uint64_t target;
  if (r == CUDA_SUCCESS && xsim_event_remote_locked(hEvent, &target)) {
    xsim_event_retain_locked(hEvent);
    xsim_unlock();
    if (wait) xsim_ipc_event_await(hEvent->ipc, target);
    else if (!xsim_ipc_event_done(hEvent->ipc, target))
      r = CUDA_ERROR_NOT_READY;
    xsim_lock();
    xsim_event_release_locked(hEvent);
    xsim_unlock();
    return r;
  }
  if (r == CUDA_SUCCESS && wait) xsim_event_block_locked(hEvent);
  else if (r == CUDA_SUCCESS && !xsim_event_done_locked(hEvent))
    r = CUDA_ERROR_NOT_READY;
  xsim_unlock();
  return r;
}

/* cuda.h: CUDA_SUCCESS once all captured work completed, else
   CUDA_ERROR_NOT_READY; a never-recorded event "represents an empty set of
   work, so ... cuEventQuery() would return CUDA_SUCCESS". */
CUresult cuEventQuery(CUevent hEvent) {
  XSIM_ENTER("cuEventQuery");
  return xsim_event_finish(hEvent, false);
}

/* cuda.h: "Waits until the completion of all work currently captured in
   hEvent": the record at the time of the call, not a later one. */
CUresult cuEventSynchronize(CUevent hEvent) {
  XSIM_ENTER("cuEventSynchronize");
  return xsim_event_finish(hEvent, true);
}

/* ---- elapsed time ------------------------------------------------------ */

/* cuda.h: INVALID_HANDLE if either event was never recorded or was created
   with CU_EVENT_DISABLE_TIMING; NOT_READY if either is incomplete. */
static CUresult xsim_event_elapsed_locked(float *ms, CUevent a, CUevent b) {
  if (!xsim_event_valid_locked(a) || !xsim_event_valid_locked(b))
    return CUDA_ERROR_INVALID_HANDLE;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
    return CUDA_ERROR_INVALID_HANDLE;
  if (!a->stream || !b->stream) return CUDA_ERROR_INVALID_HANDLE;
  if (!xsim_event_done_locked(a) || !xsim_event_done_locked(b))
    return CUDA_ERROR_NOT_READY;
  assert(a->stamped && b->stamped && "a retired record stamps its event");
  *ms = (float)(((double)b->time_ns - (double)a->time_ns) / 1e6);
  return CUDA_SUCCESS;
}

static CUresult xsim_event_elapsed(float *ms, CUevent a, CUevent b) {
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  xsim_lock();
  r = xsim_event_elapsed_locked(ms, a, b);
  xsim_unlock();
  return r;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart,
                               CUevent hEnd) {
  XSIM_ENTER("cuEventElapsedTime");
  return xsim_event_elapsed(pMilliseconds, hStart, hEnd);
}

#undef cuEventElapsedTime
CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart,
                                    CUevent hEnd);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart,
                            CUevent hEnd) {
  XSIM_ENTER("cuEventElapsedTime");
  return xsim_event_elapsed(pMilliseconds, hStart, hEnd);
}

/* ---- cuStreamWaitEvent ------------------------------------------------- */

/* Looks up the stream that recorded e inside its capture; NULL if it left. */
static struct CUstream_st *
xsim_event_cap_stream_locked(const struct CUevent_st *e) {
  for (struct CUstream_st *s = xsim_stream_first_locked(); s; s = s->next)
    if (s == e->cap_stream && s->capture && s->capture->id == e->capture_id)
      return s;
  return NULL;
}

/* s waits on an event recorded in an active capture: s joins that capture
   (a fork), or, already in it, joins the recording stream back if the event
   follows that stream's last node. The graph is kept in submission order,
   so the dependency itself needs no node. */
static CUresult xsim_event_wait_captured_locked(struct CUstream_st *s,
                                              struct CUevent_st *e) {
  struct CUstream_st *rec = xsim_event_cap_stream_locked(e);
  xsim_capture *c = rec ? rec->capture : NULL;
  if (!c) return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  if (s->capture && s->capture != c) return CUDA_ERROR_STREAM_CAPTURE_MERGE;
  if (s->legacy) {
    xsim_capture_invalidate_locked(rec);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (!s->capture) {
    s->capture = c;
    s->cap_tail = e->cap_pos;
    s->cap_joined = false;
  }
  if (rec != s && e->cap_pos >= rec->cap_tail) rec->cap_joined = true;
  return c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                        : CUDA_SUCCESS;
}

/* A capturing stream waits on an event outside its capture: a dependency
   across the capture boundary (CUDA_ERROR_STREAM_CAPTURE_ISOLATION) unless
   CU_EVENT_WAIT_EXTERNAL makes it a wait node, or the event names no work. */
static CUresult xsim_event_wait_outside_locked(struct CUstream_st *s,
                                             struct CUevent_st *e,
                                             unsigned flags) {
  if (flags & CU_EVENT_WAIT_EXTERNAL) {
    xsim_work w = {.kind = XSIM_WORK_WAIT_EVENT, .u.wait = {e}};
    return xsim_capture_append_locked(s, &w);
  }
  if (!e->stream || xsim_event_done_locked(e)) return CUDA_SUCCESS;
  xsim_capture_invalidate_locked(s);
  return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
}

/* s waits for a record another process made: a work item that polls the
   shared generations on s's worker. Inside a capture that is a dependency
   on work outside it. */
static CUresult xsim_event_wait_remote_locked(struct CUstream_st *s,
                                            struct CUevent_st *e,
                                            uint64_t target) {
  if (xsim_ipc_event_done(e->ipc, target)) return CUDA_SUCCESS;
  if (s->capture) {
    xsim_capture_invalidate_locked(s);
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  xsim_work w = {.kind = XSIM_WORK_WAIT_IPC, .u.wait_ipc = {e, target}};
  xsim_ticket ticket;
  return xsim_stream_submit_locked(s, &w, NULL, &ticket);
}

static CUresult xsim_event_wait_locked(struct CUstream_st *s,
                                     struct CUevent_st *e, unsigned flags) {
  uint64_t target;
  if (xsim_event_captured_locked(e))
    return xsim_event_wait_captured_locked(s, e);
  if (xsim_event_remote_locked(e, &target))
    return xsim_event_wait_remote_locked(s, e, target);
  if (s->capture) return xsim_event_wait_outside_locked(s, e, flags);
  if (flags & CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_ILLEGAL_STATE;
  if (!e->stream || xsim_event_done_locked(e)) return CUDA_SUCCESS;
  xsim_work w = {.kind = XSIM_WORK_NOP};
  xsim_dep d = {e->stream, e->seq};
  xsim_ticket ticket;
  return xsim_stream_submit_locked(s, &w, &d, &ticket);
}

/* cuda.h: "Makes all future work submitted to hStream wait for all work
   captured in hEvent", using "the most recently captured state at the time
   of the API call". CU_EVENT_WAIT_EXTERNAL "is invalid outside of stream
   capture": CUDA_ERROR_ILLEGAL_STATE (observed on H100, driver 580). */
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
                           unsigned int Flags) {
  XSIM_ENTER("cuStreamWaitEvent");
  if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  if (!xsim_event_valid_locked(hEvent)) r = CUDA_ERROR_INVALID_HANDLE;
  else r = xsim_event_wait_locked(s, hEvent, Flags);
  xsim_unlock();
  return r;
}
