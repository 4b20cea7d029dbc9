/* xseg.h: the public API of xseg, an expandable-segments GPU memory
 * allocator on the CUDA driver's virtual memory API.
 *
 * Including it needs no CUDA header: streams are `struct CUstream_st *`, the
 * same type as CUstream and cudaStream_t (NULL is the legacy default stream).
 * Every call that can fail returns an xseg_status; on failure
 * xseg_last_error() returns a thread-local message that names the cause.
 */
#ifndef XSEG_H
#define XSEG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

typedef enum xseg_status {
  XSEG_OK = 0,
  XSEG_ERR_INVALID_ARGUMENT = 1,  /* bad size/pointer/config key or value */
  XSEG_ERR_OUT_OF_MEMORY    = 2,  /* still no memory after freeing caches */
  XSEG_ERR_UNKNOWN_POINTER  = 3,  /* not allocated here, or already freed */
  XSEG_ERR_DRIVER           = 4,  /* a driver call failed; message names it */
  XSEG_ERR_NO_DRIVER        = 5,  /* driver library could not be loaded */
  XSEG_ERR_UNSUPPORTED      = 6,  /* e.g. device lacks VMM */
  XSEG_ERR_CAPTURE          = 7   /* illegal while a graph capture is under way */
} xseg_status;

/* "XSEG_ERR_OUT_OF_MEMORY" for XSEG_ERR_OUT_OF_MEMORY; never NULL. */
const char *xseg_status_name(xseg_status s);
/* The message of the calling thread's last failure ("" if none). Valid until
   the thread's next failing xseg call. */
const char *xseg_last_error(void);

typedef struct xseg_allocator xseg_allocator;   /* one per device */

/* conf: PYTORCH_CUDA_ALLOC_CONF syntax ("key:value,key:value"); NULL or ""
   means the environment variable XSEG_ALLOC_CONF, then defaults. */
xseg_status xseg_create(int device, const char *conf, xseg_allocator **out);
/* Releases every driver resource, live blocks included (they are reported
   on stderr). NULL is ignored. */
void        xseg_destroy(xseg_allocator *a);

/* A block of at least `size` bytes for work on `stream`, 512-byte aligned.
   size 0 gives a unique 512-byte block. */
xseg_status xseg_malloc(xseg_allocator *a, size_t size,
                        struct CUstream_st *stream, void **ptr);
/* NULL is ignored, as by free(). A block that xseg_record_stream tagged
   with other streams becomes pending (stats: pending_free_bytes) and is
   reused only after the work those streams had queued at this free.
   Streams may be destroyed while xseg caches memory for them: once the
   driver says a stream's handle is gone (cuStreamQuery:
   CUDA_ERROR_INVALID_HANDLE), its free memory counts as idle and moves to
   other streams or back to the driver. So finish the work that uses memory
   freed on a stream (cuStreamSynchronize) before cuStreamDestroy, which
   CUDA lets return while that work still runs. */
xseg_status xseg_free(xseg_allocator *a, void *ptr);
/* Marks the live block at ptr as used by work on `stream` (PyTorch's
   recordStream); its own allocation stream is ignored. A pointer that is
   not the start of a live block gives XSEG_ERR_UNKNOWN_POINTER. */
xseg_status xseg_record_stream(xseg_allocator *a, void *ptr,
                               struct CUstream_st *stream);
/* Unmaps and releases every whole free granule whose recorded work is
   done, without waiting on the host: a granule whose stream may still use
   it stays mapped, and a later call (or the out-of-memory path) releases
   it. Does nothing while a graph capture is under way. */
xseg_status xseg_empty_cache(xseg_allocator *a);
/* As xseg_empty_cache, but first waits for the work that guards free
   memory (on its events alone, never on whole streams or the device), so
   that every whole free granule is released on return. Counts one
   num_sync_all_streams. Other calls on this allocator wait meanwhile.
   XSEG_ERR_CAPTURE during a graph capture. */
xseg_status xseg_empty_cache_blocking(xseg_allocator *a);
xseg_status xseg_set_memory_fraction(xseg_allocator *a, double fraction);
/* Every current and future mapping becomes accessible from peer_device. */
xseg_status xseg_enable_peer_access(xseg_allocator *a, int peer_device);

typedef struct xseg_stat { int64_t current, peak, allocated, freed; } xseg_stat;
typedef struct xseg_stats {
  xseg_stat allocation, segment, active, inactive_split;            /* counts */
  xseg_stat allocated_bytes, reserved_bytes, active_bytes,
            inactive_split_bytes, requested_bytes;                  /* bytes  */
  int64_t   num_alloc_retries, num_ooms, num_sync_all_streams,
            num_device_alloc, num_device_free;
  int64_t   mapped_bytes;      /* physical bytes mapped now (== reserved_bytes) */
  int64_t   pending_free_bytes;/* freed but waiting on recorded stream work */
  /* Physical handles already unmapped whose cuMemRelease failed: kept and
     tried again by every later release pass and by xseg_destroy. */
  int64_t   handles_awaiting_release;
} xseg_stats;
xseg_status xseg_get_stats(xseg_allocator *a, xseg_stats *out);
xseg_status xseg_reset_peak_stats(xseg_allocator *a);

/* JSON in the schema of torch.cuda.memory._snapshot(): {"segments":[...],
   "device_traces":[[...]]} (DESIGN.md section 6). Each mapped run of a
   reserved range is a segment; blocks are active_allocated,
   active_pending_free or inactive; device_traces holds what
   xseg_record_memory_history recorded (empty when it is off). */
xseg_status xseg_snapshot_json(xseg_allocator *a, FILE *out);

/* Walks every structure and checks every invariant; XSEG_OK or a message. */
xseg_status xseg_check(xseg_allocator *a);

/* PyTorch's memory_stats() as JSON, with its key names. */
xseg_status xseg_stats_json(xseg_allocator *a, FILE *out);

/* Private pools (CUDA graph capture), as PyTorch's beginAllocateToPool /
   endAllocateToPool / releasePool. Between begin and end, allocations on
   `stream` come from private pool `pool` (not 0), which no other allocation
   uses and no release takes from until xseg_release_pool (after which its
   free memory goes back with the next empty_cache or growth at the device
   limit). While any stream allocates to a pool, xseg queries no event,
   synchronises nothing and unmaps nothing, as a global-mode capture
   requires. A capture that was not announced is detected when the
   allocation cannot be served from the cache (cuStreamGetCaptureInfo) and
   gets pool XSEG_CAPTURE_POOL(capture id); announce captures so that cached
   blocks are kept out of them too.
   Several streams may allocate to one pool at once; the pool then keeps
   its blocks per stream, as PyTorch's private pools do: a block that one
   stream frees is reused by that stream alone (stream order makes that
   safe), never by another stream, whose allocation would not wait for the
   work the first one queued before the free. xseg_release_pool releases
   the blocks of every stream. */
typedef uint64_t xseg_pool_id;
#define XSEG_CAPTURE_POOL(capture_id)                                        \
  ((xseg_pool_id)1 << 63 | (xseg_pool_id)(capture_id))
xseg_status xseg_begin_allocate_to_pool(xseg_allocator *a, xseg_pool_id pool,
                                        struct CUstream_st *stream);
xseg_status xseg_end_allocate_to_pool(xseg_allocator *a, xseg_pool_id pool);
xseg_status xseg_release_pool(xseg_allocator *a, xseg_pool_id pool);

/* Records the last `max_entries` allocator events (alloc, free_requested,
   free_completed, segment_map, segment_unmap, oom) for the snapshot's
   device_traces, as torch.cuda.memory._record_memory_history; 0 stops and
   forgets. Off by default: the cached path then pays one branch. */
xseg_status xseg_record_memory_history(xseg_allocator *a, size_t max_entries);

#ifdef __cplusplus
}
#endif
#endif /* XSEG_H */
