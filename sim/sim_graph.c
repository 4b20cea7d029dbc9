/* sim_graph.c: stream capture, graphs and graph launch.
 *
 * A capture sequence begins on one stream (its origin) and may spread to
 * others that wait on events recorded in it (fork); every stream in it must
 * be joined back before cuStreamEndCapture. Captured work is appended to the
 * capture's graph in submission order. Since an operation is always
 * submitted after everything it depends on, that order is a valid
 * topological order of the captured dependency graph, so a graph is a plain
 * list and a launch submits the list, in order, to the launch stream: more
 * serial than a GPU would run it, never less ordered.
 *
 * "Potentially unsafe" calls during capture follow cuda.h's comment on
 * cuThreadExchangeStreamCaptureMode; see xsim_capture_check_unsafe_locked.
 * Graphs built with cuGraphCreate / cuGraphAdd*Node are not emulated; only
 * captured graphs exist.
 */
#include "sim_stream.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

static xsim_capture *xsim_captures;          /* active capture sequences */
static uint64_t xsim_next_capture_id = 1;  /* ids are unique per process */
static _Thread_local CUstreamCaptureMode xsim_thread_mode =
    CU_STREAM_CAPTURE_MODE_GLOBAL;

/* ---- graphs: lists of work --------------------------------------------- */

static struct CUgraph_st *xsim_graph_new(void) {
  struct CUgraph_st *g = calloc(1, sizeof *g);
  if (g) g->magic = XSIM_GRAPH_MAGIC;
  return g;
}

static CUresult xsim_graph_push_locked(struct CUgraph_st *g,
                                       const xsim_work *w) {
  if (g->count == g->cap) {
    xsim_work *nodes = xsim_array_grow(g->nodes, &g->cap, 8, sizeof *nodes);
    if (!nodes) return CUDA_ERROR_OUT_OF_MEMORY;
    g->nodes = nodes;
  }
  xsim_work_retain_locked(w);
  g->nodes[g->count++] = *w;
  return CUDA_SUCCESS;
}

static void xsim_graph_clear_locked(struct CUgraph_st *g) {
  for (size_t i = 0; i < g->count; i++) xsim_work_release_locked(&g->nodes[i]);
  free(g->nodes);
  g->nodes = NULL;
  g->count = g->cap = 0;
}

static void xsim_graph_free_locked(struct CUgraph_st *g) {
  xsim_graph_clear_locked(g);
  g->magic = 0;
  free(g);
}

static CUresult xsim_graph_copy_locked(struct CUgraph_st *dst,
                                     const struct CUgraph_st *src) {
  CUresult r = CUDA_SUCCESS;
  for (size_t i = 0; i < src->count && !r; i++)
    r = xsim_graph_push_locked(dst, &src->nodes[i]);
  if (r != CUDA_SUCCESS) xsim_graph_clear_locked(dst);
  return r;
}

/* An executable graph: its own copy of the nodes, and the end of its last
   launch, which the next launch orders behind (cuda.h, cuGraphLaunch). */
struct CUgraphExec_st {
  uint32_t magic;
  struct CUgraph_st body;
  xsim_dep last;                 /* stream NULL: never launched */
};

/* ---- the capture list -------------------------------------------------- */

bool xsim_capture_is_active_locked(uint64_t id) {
  for (xsim_capture *c = xsim_captures; c; c = c->next)
    if (c->id == id) return true;
  return false;
}

static bool xsim_capture_graph_busy_locked(const struct CUgraph_st *g) {
  for (xsim_capture *c = xsim_captures; c; c = c->next)
    if (c->graph == g) return true;
  return false;
}

static void xsim_capture_unlink_locked(xsim_capture *gone) {
  for (xsim_capture **p = &xsim_captures; *p; p = &(*p)->next)
    if (*p == gone) {
      *p = gone->next;
      return;
    }
  assert(0 && "capture not in the active list");
}

void xsim_capture_invalidate_locked(struct CUstream_st *s) {
  if (s->capture) s->capture->invalidated = true;
}

/* cuThreadExchangeStreamCaptureMode: in GLOBAL mode a thread is prohibited
   from unsafe calls if it has a capture not begun RELAXED, "or if any other
   thread has a concurrent capture sequence initiated with
   CU_STREAM_CAPTURE_MODE_GLOBAL"; in THREAD_LOCAL mode only its own count;
   in RELAXED mode none do. A mode value the driver does not name (it
   accepts any, see cuThreadExchangeStreamCaptureMode) acts as GLOBAL. */
static bool xsim_capture_forbids(const xsim_capture *c, pthread_t self) {
  if (pthread_equal(c->owner, self))
    return c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  return xsim_thread_mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
         c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

CUresult xsim_capture_check_unsafe_locked(void) {
  if (xsim_thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  pthread_t self = pthread_self();
  bool forbidden = false;
  for (xsim_capture *c = xsim_captures; c; c = c->next)
    if (xsim_capture_forbids(c, self)) {
      c->invalidated = true;   /* the capture no longer describes the work */
      forbidden = true;
    }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* CUDA programming guide, "Prohibited and Unhandled Operations": it is
   invalid to "synchronize a broader handle which encompasses an active
   stream capture, such as a device or context handle", in every mode.
   Observed on H100, driver 580: a relaxed-mode capture refused one of the
   calls the emulator allowed, and invalidated the capture; of those, only
   cuCtxSynchronize waits on the capturing stream. */
CUresult xsim_capture_check_device_locked(int device) {
  bool forbidden = false;
  for (xsim_capture *c = xsim_captures; c; c = c->next)
    if (c->origin->device == device) {
      c->invalidated = true;
      forbidden = true;
    }
  return forbidden ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult xsim_capture_append_locked(struct CUstream_st *s, const xsim_work *w) {
  xsim_capture *c = s->capture;
  assert(c && "appending to a stream that does not capture");
  if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  CUresult r = xsim_graph_push_locked(c->graph, w);
  if (r != CUDA_SUCCESS) {
    c->invalidated = true;
    return r;
  }
  s->cap_tail = c->graph->count;
  if (s != c->origin) s->cap_joined = false;
  return CUDA_SUCCESS;
}

/* Every stream but the origin must have been joined back. */
static bool xsim_capture_unjoined_locked(const xsim_capture *c) {
  for (struct CUstream_st *s = xsim_stream_first_locked(); s; s = s->next)
    if (s->capture == c && s != c->origin && !s->cap_joined) return true;
  return false;
}

/* Ends c: every stream leaves it, and it leaves the active list. Returns
   the graph (the caller owns it). */
static struct CUgraph_st *xsim_capture_end_locked(xsim_capture *c) {
  for (struct CUstream_st *s = xsim_stream_first_locked(); s; s = s->next)
    if (s->capture == c) s->capture = NULL;
  c->origin->capture = NULL;
  xsim_capture_unlink_locked(c);
  struct CUgraph_st *g = c->graph;
  free(c);
  return g;
}

void xsim_capture_abandon_locked(struct CUstream_st *s) {
  xsim_capture *c = s->capture;
  if (c->origin != s) {
    s->capture = NULL;
    return;
  }
  xsim_graph_free_locked(xsim_capture_end_locked(c));
}

/* ---- begin and end ----------------------------------------------------- */

static bool xsim_mode_valid(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
         mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

static CUresult xsim_capture_begin_locked(struct CUstream_st *s,
                                        CUstreamCaptureMode mode) {
  xsim_capture *c = calloc(1, sizeof *c);
  struct CUgraph_st *g = c ? xsim_graph_new() : NULL;
  if (!g) {
    free(c);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *c = (xsim_capture){.id = xsim_next_capture_id++, .mode = mode,
                    .owner = pthread_self(), .origin = s, .graph = g,
                    .next = xsim_captures};
  xsim_captures = c;
  s->capture = c;
  s->cap_tail = 0;
  s->cap_joined = true;   /* the origin is where everything joins */
  return CUDA_SUCCESS;
}

/* cuda.h: "Capture may not be initiated if stream is CU_STREAM_LEGACY" (the
   driver answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), and "may only be
   initiated if the stream is not already in capture mode" (the driver
   answers CUDA_ERROR_ILLEGAL_STATE). */
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  XSIM_ENTER("cuStreamBeginCapture");
  if (!xsim_mode_valid(mode)) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  if (s->legacy) r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  else if (s->capture) r = CUDA_ERROR_ILLEGAL_STATE;
  else r = xsim_capture_begin_locked(s, mode);
  xsim_unlock();
  return r;
}

/* The CUDA 10.0 entry point, which had no mode: global, the default. */
#undef cuStreamBeginCapture
CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture(CUstream hStream) {
  return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

/* Why s's capture cannot end here and now, or CUDA_SUCCESS. */
static CUresult xsim_capture_end_check_locked(const struct CUstream_st *s) {
  const xsim_capture *c = s->capture;
  if (!c) return CUDA_ERROR_ILLEGAL_STATE;   /* the driver's answer */
  if (c->origin != s) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      !pthread_equal(c->owner, pthread_self()))
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  return CUDA_SUCCESS;
}

/* cuda.h: "If capture was invalidated, due to a violation of the rules of
   stream capture, then a NULL graph will be returned" (with
   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED); a fork not joined back is
   CUDA_ERROR_STREAM_CAPTURE_UNJOINED. Either way the capture is over. So it
   is after an end from the wrong thread
   (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD): observed on H100, driver 580,
   the beginning thread's own end then gets CUDA_ERROR_ILLEGAL_STATE, the
   answer for a stream that is not capturing. */
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  XSIM_ENTER("cuStreamEndCapture");
  if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  r = xsim_capture_end_check_locked(s);
  if (r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    xsim_graph_free_locked(xsim_capture_end_locked(s->capture));
  if (r == CUDA_SUCCESS) {
    xsim_capture *c = s->capture;
    if (c->invalidated) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (xsim_capture_unjoined_locked(c))
      r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    struct CUgraph_st *g = xsim_capture_end_locked(c);
    if (r != CUDA_SUCCESS) xsim_graph_free_locked(g);
    *phGraph = r == CUDA_SUCCESS ? g : NULL;
  }
  xsim_unlock();
  return r;
}

/* ---- queries ----------------------------------------------------------- */

static CUstreamCaptureStatus xsim_capture_status(const struct CUstream_st *s) {
  if (!s->capture) return CU_STREAM_CAPTURE_STATUS_NONE;
  return s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                 : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

/* Locks and checks s for a capture query: cuda.h, cuStreamIsCapturing: on
   the legacy stream while a blocking stream captures the answer is
   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and "The blocking stream capture is not
   invalidated". On success the lock is held. */
static CUresult xsim_capture_query_acquire(CUstream h, struct CUstream_st **s) {
  CUresult r = xsim_stream_acquire(h, s);
  if (r != CUDA_SUCCESS) return r;
  if ((*s)->legacy &&
      xsim_stream_blocking_capture_locked((*s)->device, false)) {
    xsim_unlock();
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream,
                             CUstreamCaptureStatus *captureStatus) {
  XSIM_ENTER("cuStreamIsCapturing");
  if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s;
  CUresult r = xsim_capture_query_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  *captureStatus = xsim_capture_status(s);
  xsim_unlock();
  return CUDA_SUCCESS;
}

/* The status and id are exact. The graph is the one being built; the
   dependency set is reported empty, since the emulator's graphs have no node
   handles (their order is the list's order). */
static void xsim_capture_info_locked(const struct CUstream_st *s,
                                   CUstreamCaptureStatus *status,
                                   cuuint64_t *id, CUgraph *graph,
                                   const CUgraphNode **deps,
                                   const CUgraphEdgeData **edges,
                                   size_t *ndeps) {
  *status = xsim_capture_status(s);
  if (id) *id = s->capture ? s->capture->id : 0;
  if (graph) *graph = s->capture ? s->capture->graph : NULL;
  if (deps) *deps = NULL;
  if (edges) *edges = NULL;
  if (ndeps) *ndeps = 0;
}

/* cuda.h: captureStatus_out is required; "If edgeData_out is non-NULL then
   dependencies_out must be as well"; IMPLICIT on the legacy stream while a
   blocking stream captures. */
CUresult cuStreamGetCaptureInfo_v3(CUstream hStream,
                                   CUstreamCaptureStatus *captureStatus_out,
                                   cuuint64_t *id_out, CUgraph *graph_out,
                                   const CUgraphNode **dependencies_out,
                                   const CUgraphEdgeData **edgeData_out,
                                   size_t *numDependencies_out) {
  XSIM_ENTER("cuStreamGetCaptureInfo");
  if (!captureStatus_out || (edgeData_out && !dependencies_out))
    return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s;
  CUresult r = xsim_capture_query_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  xsim_capture_info_locked(s, captureStatus_out, id_out, graph_out,
                         dependencies_out, edgeData_out, numDependencies_out);
  xsim_unlock();
  return CUDA_SUCCESS;
}

/* The older signatures (CUDA 10.1 and 11.3). */
CUresult CUDAAPI cuStreamGetCaptureInfo_v2(
    CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
    cuuint64_t *id_out, CUgraph *graph_out,
    const CUgraphNode **dependencies_out, size_t *numDependencies_out);
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream,
                                   CUstreamCaptureStatus *captureStatus_out,
                                   cuuint64_t *id_out, CUgraph *graph_out,
                                   const CUgraphNode **dependencies_out,
                                   size_t *numDependencies_out) {
  return cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out,
                                   graph_out, dependencies_out, NULL,
                                   numDependencies_out);
}

#undef cuStreamGetCaptureInfo
CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream,
                                        CUstreamCaptureStatus *status_out,
                                        cuuint64_t *id_out);
CUresult cuStreamGetCaptureInfo(CUstream hStream,
                                CUstreamCaptureStatus *status_out,
                                cuuint64_t *id_out) {
  return cuStreamGetCaptureInfo_v3(hStream, status_out, id_out, NULL, NULL,
                                   NULL, NULL);
}

/* cuda.h: "Sets the calling thread's stream capture interaction mode to the
   value contained in *mode, and overwrites *mode with the previous mode".
   Any value is taken (observed on H100, driver 580: 7 gets CUDA_SUCCESS);
   xsim_capture_forbids treats one cuda.h does not name as GLOBAL. */
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  XSIM_ENTER("cuThreadExchangeStreamCaptureMode");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode previous = xsim_thread_mode;
  xsim_thread_mode = *mode;
  *mode = previous;
  return CUDA_SUCCESS;
}

/* ---- instantiate, launch, destroy -------------------------------------- */

static bool xsim_graph_valid(const struct CUgraph_st *g) {
  return g && g->magic == XSIM_GRAPH_MAGIC;
}

static bool xsim_exec_valid(const struct CUgraphExec_st *x) {
  return x && x->magic == XSIM_EXEC_MAGIC;
}

static CUresult xsim_graph_instantiate(CUgraphExec *out, CUgraph g) {
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  struct CUgraphExec_st *x = calloc(1, sizeof *x);
  if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
  x->magic = XSIM_EXEC_MAGIC;
  xsim_lock();
  r = xsim_graph_valid(g) ? xsim_graph_copy_locked(&x->body, g)
                        : CUDA_ERROR_INVALID_VALUE;
  xsim_unlock();
  if (r != CUDA_SUCCESS) free(x);
  else *out = x;
  return r;
}

/* cuda.h: flags are CUgraphInstantiate_flags; none changes what a captured
   graph of memsets, copies, host functions and event records does. */
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags) {
  XSIM_ENTER("cuGraphInstantiate");
  const unsigned long long known =
      CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
      CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
      CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
      CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (flags & ~known) return CUDA_ERROR_INVALID_VALUE;
  return xsim_graph_instantiate(phGraphExec, hGraph);
}

/* The CUDA 10-11 signature, with an error node and a log buffer; the error
   node is cleared even when the call is failed by an injected fault. */
static CUresult xsim_graph_instantiate_logged(CUgraphExec *out, CUgraph g,
                                            CUgraphNode *errnode, char *log,
                                            size_t size) {
  if (errnode) *errnode = NULL;
  XSIM_ENTER("cuGraphInstantiate");
  if (log && size > 0) log[0] = '\0';
  return xsim_graph_instantiate(out, g);
}

#undef cuGraphInstantiate
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                    CUgraphNode *phErrorNode, char *logBuffer,
                                    size_t bufferSize);
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                            CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize) {
  return xsim_graph_instantiate_logged(phGraphExec, hGraph, phErrorNode,
                                     logBuffer, bufferSize);
}

CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec,
                                       CUgraph hGraph,
                                       CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                               CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize) {
  return xsim_graph_instantiate_logged(phGraphExec, hGraph, phErrorNode,
                                     logBuffer, bufferSize);
}

/* One node, submitted as the call that captured it would have been. */
static CUresult xsim_node_submit_locked(struct CUstream_st *s,
                                        const xsim_work *w) {
  if (w->kind == XSIM_WORK_RECORD)
    return xsim_event_record_locked(w->u.record.event, s);
  xsim_ticket ticket;
  return xsim_stream_submit_locked(s, w, NULL, &ticket);
}

/* Orders this launch behind the previous one (which may have been on
   another stream), then submits the nodes in order. */
static CUresult xsim_exec_launch_locked(struct CUgraphExec_st *x,
                                      struct CUstream_st *s) {
  CUresult r = CUDA_SUCCESS;
  if (x->last.stream && !s->capture && !xsim_dep_done_locked(&x->last)) {
    xsim_work nop = {.kind = XSIM_WORK_NOP};
    xsim_ticket ticket;
    r = xsim_stream_submit_locked(s, &nop, &x->last, &ticket);
  }
  for (size_t i = 0; i < x->body.count && !r; i++)
    r = xsim_node_submit_locked(s, &x->body.nodes[i]);
  if (r != CUDA_SUCCESS || s->capture) return r;
  xsim_stream_retain_locked(s);
  if (x->last.stream) xsim_stream_release_locked(x->last.stream);
  x->last = (xsim_dep){s, s->submitted};
  return CUDA_SUCCESS;
}

/* cuda.h: "Each launch is ordered behind both any previous work in hStream
   and any previous launches of hGraphExec." Into a capturing stream, the
   graph's nodes are captured. */
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  XSIM_ENTER("cuGraphLaunch");
  struct CUstream_st *s;
  CUresult r = xsim_stream_acquire(hStream, &s);
  if (r != CUDA_SUCCESS) return r;
  r = xsim_exec_valid(hGraphExec) ? xsim_exec_launch_locked(hGraphExec, s)
                                : CUDA_ERROR_INVALID_VALUE;
  xsim_unlock();
  return r;
}

/* cuda.h: "If the executable graph is in-flight, it will not be terminated,
   but rather freed asynchronously on completion": queued operations own
   copies of their work, so the executable graph can go now. */
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  XSIM_ENTER("cuGraphExecDestroy");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  xsim_lock();
  if (xsim_exec_valid(hGraphExec)) {
    xsim_graph_clear_locked(&hGraphExec->body);
    if (hGraphExec->last.stream)
      xsim_stream_release_locked(hGraphExec->last.stream);
    hGraphExec->magic = 0;
    free(hGraphExec);
  } else {
    r = CUDA_ERROR_INVALID_VALUE;
  }
  xsim_unlock();
  return r;
}

/* cuda.h (cuStreamGetCaptureInfo): the graph of an ongoing capture permits
   all operations "other than destroy". */
CUresult cuGraphDestroy(CUgraph hGraph) {
  XSIM_ENTER("cuGraphDestroy");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  xsim_lock();
  if (xsim_graph_valid(hGraph) && !xsim_capture_graph_busy_locked(hGraph))
    xsim_graph_free_locked(hGraph);
  else
    r = CUDA_ERROR_INVALID_VALUE;
  xsim_unlock();
  return r;
}
