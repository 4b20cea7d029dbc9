/* torch_pools.c: CUDA graph pools as PyTorch announces them to a
 * pluggable allocator (beginAllocateToPool / endAllocateToPool /
 * releasePool).
 *
 * PyTorch's beginAllocateToPool(device, MempoolId_t, filter) means: until
 * endAllocateToPool, an allocation on a stream for which filter(stream) is
 * true comes from the private pool. The filter is how torch.cuda.graph
 * names the streams of its capture (cudaStreamGetCaptureInfo gives this
 * capture's id) and how a MemPool names its thread
 * (_cuda_beginAllocateCurrentThreadToPool, torch.cuda.use_mem_pool: the
 * calling thread's id, whatever the stream). So, as PyTorch's own
 * allocator does (get_pool), every allocation while a pool of the device
 * is open asks the open pools' filters, the first that claims it wins:
 * a stream may join a capture after the begin, and on one stream the
 * pool's thread allocates to the pool while other threads do not. A
 * claimed stream is announced to the core (xseg_begin_allocate_to_pool:
 * what the core routes by, and what tells it that a capture may be under
 * way), until the end; an allocation that its stream's announcement would
 * send elsewhere than the filters say names its pools itself
 * (xseg_malloc_from_pool).
 *
 * Pools are counted as PyTorch counts its private pools: every begin of a
 * pool id takes a use (graphs may share a pool), every releasePool drops
 * one, and the last drop releases the pool's memory to the core (then
 * empty_cache returns it to the driver). A pool into which nothing was
 * allocated never reached the core and releases nothing.
 *
 *   begin(id, filter) ──► open, uses+1 ──malloc on s, filter(s)──► s announced
 *                         (or, announced to another pool, this one named)
 *   end(id)           ──► closed (core: end of every announced stream)
 *   release(id)       ──► uses-1; at 0: core release (if any stream was
 *                         announced), entry forgotten
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "alloc/torch.h"
#include "vmm/array.h"

typedef struct torch_pool {
  int device;
  unsigned long long first, second;   /* PyTorch's MempoolId_t */
  xseg_pool_id id;                    /* the core's (pool_id_of) */
  int uses;                 /* begins not yet released (> 0 while kept) */
  bool open;                /* between begin and end */
  bool in_core;             /* a stream was announced: the core has it */
  /* The open pool's claim on streams; NULL claims only `streams`. */
  xseg_torch_stream_filter filter;
  void *ctx;
  void (*ctx_free)(void *ctx);
  struct CUstream_st **streams;       /* announced since the begin */
  size_t n_streams, cap_streams;
} torch_pool;

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static torch_pool *pools;
static size_t n_pools, cap_pools;
/* Open pools per device: the allocation path reads only this. */
static atomic_int pools_open[XS_TORCH_MAX_DEVICES];

/* Ids of pools whose pair is not readable (below), one each. */
static xseg_pool_id pools_serial;

/* pools_lock held: the core's id for a new pool of MempoolId_t {a, b}:
   {n, 0} for a graph's own pool (CUDAGraph), {0, n} for one from
   graph_pool_handle() or a MemPool. Such a pair stays readable, so that
   a snapshot can give PyTorch's pair back (python/xseg_torch.py,
   _pool_pair): {n, 0} is 2n + 1, {0, n} is 2n, for n below 2^61. Any
   other pair (PyTorch makes none, a caller may) gets the next serial with
   bit 62 set, one id per pool however the pairs compare; a snapshot
   finds its pair while the pool lives (xseg_torch_pool_id). Never 0, and
   below the XSEG_CAPTURE_POOL range. */
static xseg_pool_id pool_id_of(unsigned long long first,
                               unsigned long long second) {
  const unsigned long long readable = 1ull << 61;
  if (second == 0 && first != 0 && first < readable)
    return (xseg_pool_id)first << 1 | 1;
  if (first == 0 && second != 0 && second < readable)
    return (xseg_pool_id)second << 1;
  return (xseg_pool_id)1 << 62 | ++pools_serial;
}
static xseg_pool_id pool_id(const torch_pool *p) { return p->id; }

/* pools_lock held: the open pool (first, second) of `device`, or NULL. */
static torch_pool *pool_find(int device, unsigned long long first,
                             unsigned long long second) {
  for (size_t i = 0; i < n_pools; i++)
    if (pools[i].device == device && pools[i].first == first &&
        pools[i].second == second)
      return &pools[i];
  return NULL;
}

/* pools_lock held: p's stream filter dropped (its context freed). */
static void pool_drop_filter(torch_pool *p) {
  if (p->ctx_free != NULL) p->ctx_free(p->ctx);
  p->filter = NULL, p->ctx = NULL, p->ctx_free = NULL;
}

/* pools_lock held: p's filter and streams gone, its slot given up. */
static void pool_forget(torch_pool *p) {
  pool_drop_filter(p);
  free(p->streams);
  *p = pools[--n_pools];
}

/* pools_lock held: whether `s` allocates to p. */
static bool pool_has_stream(const torch_pool *p, struct CUstream_st *s) {
  for (size_t i = 0; i < p->n_streams; i++)
    if (p->streams[i] == s) return true;
  return false;
}

/* pools_lock held: announces `stream` to the core as allocating to p. */
static bool pool_announce(torch_pool *p, xseg_allocator *a,
                          struct CUstream_st *stream, const char *fn) {
  if (!XS_ARRAY_RESERVE(p->streams, p->cap_streams, p->n_streams + 1, 4)) {
    xs_torch_error(fn, XSEG_ERR_OUT_OF_MEMORY,
                   "out of host memory for pool (%llu, %llu)", p->first,
                   p->second);
    return false;
  }
  xseg_status st = xseg_begin_allocate_to_pool(a, pool_id(p), stream);
  if (st != XSEG_OK) {
    xs_torch_error_from_xseg(fn, st);
    return false;
  }
  p->streams[p->n_streams++] = stream;
  p->in_core = true;
  return true;
}

/* pools_lock held: which open pool of `device` claims this allocation on
   `stream`, asked now: 1 found (*out), 0 none, -1 a filter failed (the
   failure kept). A pool begun on one stream, without a filter, claims
   that stream. */
static int pools_claim(int device, struct CUstream_st *stream,
                       torch_pool **out) {
  for (size_t i = 0; i < n_pools; i++) {
    torch_pool *p = &pools[i];
    if (!p->open || p->device != device) continue;
    int claim = p->filter != NULL ? p->filter(p->ctx, stream)
                                  : pool_has_stream(p, stream);
    if (claim < 0) {
      xs_torch_error("xseg_torch_malloc", XSEG_ERR_INVALID_ARGUMENT,
                     "the stream filter of pool (%llu, %llu) failed on "
                     "stream %p", p->first, p->second, (void *)stream);
      return -1;
    }
    if (claim > 0) {
      *out = p;
      return 1;
    }
  }
  return 0;
}

/* pools_lock held: the open pool of `device` that `stream` is announced
   to (what the core sends its allocations to), or NULL. */
static torch_pool *pools_announced(int device, struct CUstream_st *stream) {
  for (size_t i = 0; i < n_pools; i++)
    if (pools[i].open && pools[i].device == device &&
        pool_has_stream(&pools[i], stream))
      return &pools[i];
  return NULL;
}

xs_torch_route xs_torch_pools_route(xseg_allocator *a, int device,
                                    size_t size, struct CUstream_st *stream,
                                    void **ptr) {
  if (atomic_load_explicit(&pools_open[device], memory_order_acquire) == 0)
    return XS_TORCH_BY_STREAM;
  pthread_mutex_lock(&pools_lock);
  torch_pool *claimed = NULL;
  xs_torch_route route = XS_TORCH_BY_STREAM;
  if (pools_claim(device, stream, &claimed) < 0) {
    route = XS_TORCH_ROUTE_FAILED;
  } else {
    torch_pool *announced = pools_announced(device, stream);
    if (claimed != NULL && announced == NULL) {
      if (!pool_announce(claimed, a, stream, "xseg_torch_malloc"))
        route = XS_TORCH_ROUTE_FAILED;
    } else if (claimed != announced) {
      /* Not where the core would send it: another pool's thread on the
         same stream, or no pool's. Allocated here, before another thread
         can end and release the pool chosen (the release would find no
         pair of it yet, and this allocation would make one that nothing
         ever releases), as PyTorch chooses and allocates under one
         mutex. */
      route = XS_TORCH_CHOSEN;
      if (claimed != NULL) claimed->in_core = true;
      xseg_status st = xseg_malloc_from_pool(
          a, size, stream, claimed != NULL ? pool_id(claimed) : 0, ptr);
      if (st != XSEG_OK) {
        xs_torch_error_from_xseg("xseg_torch_malloc", st);
        route = XS_TORCH_ROUTE_FAILED;
      }
    }
  }
  pthread_mutex_unlock(&pools_lock);
  return route;
}

bool xs_torch_pools_unseen(int device) {
  if (atomic_load_explicit(&pools_open[device], memory_order_acquire) == 0)
    return false;
  pthread_mutex_lock(&pools_lock);
  bool seen = false;
  for (size_t i = 0; i < n_pools && !seen; i++)
    seen = pools[i].open && pools[i].device == device &&
           pools[i].n_streams > 0;
  pthread_mutex_unlock(&pools_lock);
  return !seen;
}

xseg_pool_id xseg_torch_pool_id(int device, unsigned long long first,
                                unsigned long long second) {
  pthread_mutex_lock(&pools_lock);
  torch_pool *p = pool_find(device, first, second);
  xseg_pool_id id = p != NULL ? pool_id(p) : 0;
  pthread_mutex_unlock(&pools_lock);
  return id;
}

/* pools_lock held: a pool opened for `device`, its use taken; NULL with
   the failure kept. */
static torch_pool *pool_open(const char *fn, int device,
                             unsigned long long first,
                             unsigned long long second) {
  torch_pool *p = pool_find(device, first, second);
  if (p != NULL && p->open) {
    xs_torch_error(fn, XSEG_ERR_INVALID_ARGUMENT, "pool (%llu, %llu) of "
                   "device %d is already being allocated to", first, second,
                   device);
    return NULL;
  }
  if (p == NULL) {
    if (!XS_ARRAY_RESERVE(pools, cap_pools, n_pools + 1, 4)) {
      xs_torch_error(fn, XSEG_ERR_OUT_OF_MEMORY, "out of host memory for "
                     "pool (%llu, %llu)", first, second);
      return NULL;
    }
    p = &pools[n_pools++];
    *p = (torch_pool){.device = device, .first = first, .second = second,
                      .id = pool_id_of(first, second)};
  }
  p->open = true;
  p->uses++;
  atomic_fetch_add_explicit(&pools_open[device], 1, memory_order_release);
  return p;
}

void xseg_torch_begin_allocate_to_pool_if(int device, unsigned long long first,
                                          unsigned long long second,
                                          xseg_torch_stream_filter filter,
                                          void *ctx,
                                          void (*ctx_free)(void *ctx)) {
  const char *fn = "xseg_torch_begin_allocate_to_pool_if";
  torch_pool *p = NULL;
  if (xs_torch_allocator(fn, device) != NULL) {
    pthread_mutex_lock(&pools_lock);
    p = pool_open(fn, device, first, second);
    if (p != NULL) p->filter = filter, p->ctx = ctx, p->ctx_free = ctx_free;
    pthread_mutex_unlock(&pools_lock);
  }
  /* The context is the pool's from here; on failure nothing holds it. */
  if (p == NULL && ctx_free != NULL) ctx_free(ctx);
}

void xseg_torch_begin_allocate_to_pool(int device, unsigned long long first,
                                       unsigned long long second,
                                       struct CUstream_st *stream) {
  const char *fn = "xseg_torch_begin_allocate_to_pool";
  xseg_allocator *a = xs_torch_allocator(fn, device);
  if (a == NULL) return;
  pthread_mutex_lock(&pools_lock);
  torch_pool *p = pool_open(fn, device, first, second);
  if (p != NULL && !pool_announce(p, a, stream, fn)) {
    /* Undone, so that the failed begin leaves no open pool behind. */
    p->open = false;
    atomic_fetch_sub_explicit(&pools_open[device], 1, memory_order_release);
    if (--p->uses == 0 && !p->in_core) pool_forget(p);
  }
  pthread_mutex_unlock(&pools_lock);
}

/* A pool as the caller named it, found or not (p NULL). */
typedef struct pool_ref {
  torch_pool *p;
  int device;
  unsigned long long first, second;
  const char *fn;
} pool_ref;

/* pools_lock held: ends the pool, as PyTorch's endAllocateToPool. */
static void pool_end(pool_ref r) {
  torch_pool *p = r.p;
  int device = r.device;
  const char *fn = r.fn;
  if (p == NULL || !p->open) {
    xs_torch_error(fn, XSEG_ERR_INVALID_ARGUMENT, "pool (%llu, %llu) of "
                   "device %d is not being allocated to", r.first, r.second,
                   device);
    return;
  }
  xseg_status st = XSEG_OK;
  if (p->n_streams > 0)
    st = xseg_end_allocate_to_pool(xs_torch_existing(device), pool_id(p));
  if (st != XSEG_OK) xs_torch_error_from_xseg(fn, st);
  p->open = false;
  p->n_streams = 0;
  pool_drop_filter(p);
  atomic_fetch_sub_explicit(&pools_open[device], 1, memory_order_release);
}

/* pools_lock held: drops a use of p, as PyTorch's releasePool; a pool
   never begun here (or released already) has nothing to release. */
static void pool_release(pool_ref r) {
  torch_pool *p = r.p;
  int device = r.device;
  const char *fn = r.fn;
  if (p == NULL) return;
  if (p->open) {
    xs_torch_error(fn, XSEG_ERR_CAPTURE, "pool (%llu, %llu) of device %d is "
                   "still being allocated to (end it first)", p->first,
                   p->second, device);
    return;
  }
  if (--p->uses > 0) return;
  xseg_status st = XSEG_OK;
  if (p->in_core) st = xseg_release_pool(xs_torch_existing(device), pool_id(p));
  if (st != XSEG_OK) xs_torch_error_from_xseg(fn, st);
  pool_forget(p);
}

static void pools_apply(const char *fn, int device, unsigned long long first,
                        unsigned long long second,
                        void (*op)(pool_ref)) {
  pthread_mutex_lock(&pools_lock);
  op((pool_ref){pool_find(device, first, second), device, first, second, fn});
  pthread_mutex_unlock(&pools_lock);
}

void xseg_torch_end_allocate_to_pool(int device, unsigned long long first,
                                     unsigned long long second) {
  pools_apply("xseg_torch_end_allocate_to_pool", device, first, second,
              pool_end);
}

void xseg_torch_release_pool(int device, unsigned long long first,
                             unsigned long long second) {
  pools_apply("xseg_torch_release_pool", device, first, second,
              pool_release);
}

void xs_torch_pools_forget_all(void) {
  pthread_mutex_lock(&pools_lock);
  while (n_pools > 0) pool_forget(&pools[n_pools - 1]);
  free(pools);
  pools = NULL, cap_pools = 0;
  for (int d = 0; d < XS_TORCH_MAX_DEVICES; d++) atomic_store(&pools_open[d], 0);
  pthread_mutex_unlock(&pools_lock);
}
