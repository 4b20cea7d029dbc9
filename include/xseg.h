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

/* libxseg.so is built with hidden visibility: what this header declares is
   its whole exported interface. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
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
/* The message of the calling thread's last failure ("" if none): read it
   right after the call that failed. Valid until the thread's next xseg
   call: a call that succeeds may replace it with that of a failure it met
   and recovered from (a growth retried after a driver error). */
const char *xseg_last_error(void);

typedef struct xseg_allocator xseg_allocator;   /* one per device */

/* conf: PYTORCH_CUDA_ALLOC_CONF syntax ("key:value,key:value"); NULL or ""
   means the environment variable XSEG_ALLOC_CONF, then defaults. An
   unknown key or a bad value is XSEG_ERR_INVALID_ARGUMENT, naming both;
   backend:cudaMallocAsync is XSEG_ERR_UNSUPPORTED (docs/DESIGN.md, 3.1). */
xseg_status xseg_create(int device, const char *conf, xseg_allocator **out);
/* Releases every driver resource, live blocks included (they are reported
   on stderr). Work still queued on a stream before a free (of a block
   freed on that stream, or of a block whose handles were lent since) may
   still write that memory: destroy waits for it (one event per stream)
   before unmapping. NULL is ignored. */
void        xseg_destroy(xseg_allocator *a);

/* A block of at least `size` bytes for work on `stream` (NULL, a special
   handle, or a stream of the allocator's device's context), 512-byte
   aligned. size 0 gives a unique 512-byte block. */
xseg_status xseg_malloc(xseg_allocator *a, size_t size,
                        struct CUstream_st *stream, void **ptr);
/* NULL is ignored, as by free(). A block that xseg_record_stream tagged
   with other streams becomes pending (stats: pending_free_bytes) and is
   reused only after the work those streams had queued at this free.
   A stream that xseg has seen (a malloc, a record_stream or a capture on
   it) is asked again later (whether memory freed on it is unused, whether
   it captures a graph), and a destroyed stream's handle is freed memory
   in a real driver: on an H200 (driver 580) tests that destroyed such a
   stream crashed inside the driver. So call xseg_forget_stream before
   cuStreamDestroy, or keep the stream as long as the allocator (as
   PyTorch keeps its streams). The emulator answers a destroyed handle
   with CUDA_ERROR_INVALID_HANDLE; there xseg counts the stream as idle
   and moves its free memory, which its tests of destroyed streams check. */
xseg_status xseg_free(xseg_allocator *a, void *ptr);
/* Marks the live block at ptr as used by work on `stream` (PyTorch's
   recordStream); its own allocation stream is ignored. A pointer that is
   not the start of a live block gives XSEG_ERR_UNKNOWN_POINTER. A stream
   of another context (another device's) is recorded as any other, as
   PyTorch records one: the free records an event of that stream's
   context on it, making that context current for a moment (the caller's
   is current again on return; when the driver fails to make it so, the
   free says so and the allocator's next call tries again); only
   allocating on such a stream is refused (xseg_malloc, a private pool's
   xseg_begin_allocate_to_pool and xseg_malloc_from_pool). */
xseg_status xseg_record_stream(xseg_allocator *a, void *ptr,
                               struct CUstream_st *stream);
/* Before cuStreamDestroy of a stream xseg has seen: waits (on the host)
   for the work that guards the free memory of the stream's own pools and
   for the stream's work that frees recorded on it wait for (blocks of any
   stream), gives back all of the stream's free memory (as
   xseg_empty_cache_blocking does for every stream; other streams keep
   their caches, and their work is not waited for), and stops asking the
   stream anything, so that the caller may destroy it. Refused, with nothing changed, while
   blocks allocated on the stream or recorded on it are live, while a
   private pool allocates on it (xseg_release_pool first), and during a
   graph capture, or while a free recorded on it waits for a capture on
   another of its block's streams to end (XSEG_ERR_CAPTURE; the stream's
   own cache may have been given back). A stream created later at the same
   address is a new stream. NULL (the legacy stream) is never destroyed:
   XSEG_ERR_INVALID_ARGUMENT. */
xseg_status xseg_forget_stream(xseg_allocator *a, struct CUstream_st *stream);
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
/* Caps mapped memory (reserved_bytes) at fraction * device memory, as
   torch.cuda.set_per_process_memory_fraction: a cap lowered under what is
   mapped unmaps nothing and limits growth only (cached memory still
   serves; new memory fails over to the out-of-memory path). */
xseg_status xseg_set_memory_fraction(xseg_allocator *a, double fraction);
/* Every current and future mapping becomes accessible from peer_device. */
xseg_status xseg_enable_peer_access(xseg_allocator *a, int peer_device);

/* PyTorch's memory_stats() gauges. inactive_split(_bytes) counts free
   pieces of classic segments (expandable_segments:False) alone, as PyTorch
   does: 0 with expandable segments, whose free granules can always be
   unmapped. */
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
   "device_traces":[[...]]} (docs/DESIGN.md section 6). Each mapped run of a
   reserved range is a segment; blocks are active_allocated,
   active_pending_free or inactive; a handle still mapped only where old
   work may use it (a growth failed after taking it) is a segment of one
   inactive block marked "retiring": the segments' total_size adds up to
   reserved_bytes. device_traces holds what xseg_record_memory_history
   recorded (empty when it is off). */
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
   blocks are kept out of them too. Such a capture ends when xseg next
   finds its stream out of it, or destroyed (which ends a capture too).
   Several streams may allocate to one pool at once; the pool then keeps
   its blocks per stream, as PyTorch's private pools do: a block that one
   stream frees is reused by that stream alone (stream order makes that
   safe), never by another stream, whose allocation would not wait for the
   work the first one queued before the free. xseg_release_pool releases
   the blocks of every stream. A replay of the pool's graph may still be
   queued then, on any stream (PyTorch replays on the current stream and
   releases the pool at the graph's reset without waiting): so the first
   release (empty_cache, forget_stream, or a growth's out-of-memory retry)
   that may take a released pool's memory waits for the whole device once
   (cuCtxSynchronize), as PyTorch's cudaFree of that memory does; until
   then, garbage collection and a growth's use of other streams' free
   memory leave it alone. CUDA forbids that wait during any capture, in
   any capture mode: a capture on the device that xseg was not told of
   (announce captures: PyTorch's are, at their pool's first allocation,
   and xseg_torch_empty_cache_device refuses before it) is invalidated by
   it, the wait fails, naming cuCtxSynchronize, and the memory waits for a
   later release. */
typedef uint64_t xseg_pool_id;
#define XSEG_CAPTURE_POOL(capture_id)                                        \
  ((xseg_pool_id)1 << 63 | (xseg_pool_id)(capture_id))
xseg_status xseg_begin_allocate_to_pool(xseg_allocator *a, xseg_pool_id pool,
                                        struct CUstream_st *stream);
xseg_status xseg_end_allocate_to_pool(xseg_allocator *a, xseg_pool_id pool);
xseg_status xseg_release_pool(xseg_allocator *a, xseg_pool_id pool);
/* xseg_malloc from the pools the caller names, whatever `stream` is
   announced to: private pool `pool`'s blocks for `stream` (its pools made
   if need be; xseg_release_pool releases them as any), or with `pool` 0
   the stream's own pools. For a caller that chooses the pool at every
   allocation, as PyTorch's allocator asks each open pool's filter at
   every one (a MemPool of one thread, on a stream that other threads use
   too). No capture is detected here: the caller decides. Every lock, as
   xseg_malloc's slow path. */
xseg_status xseg_malloc_from_pool(xseg_allocator *a, size_t size,
                                  struct CUstream_st *stream,
                                  xseg_pool_id pool, void **ptr);

/* Records the last `max_entries` allocator events (alloc, free_requested,
   free_completed, segment_map, segment_unmap, oom; segment_alloc and
   segment_free for classic segments) for the snapshot's
   device_traces, as torch.cuda.memory._record_memory_history: an alloc or
   free with the size the caller asked for (PyTorch's), a segment's with
   its mapped bytes. Called again with another count, it keeps the newest
   entries that fit; 0 stops and forgets. Off by default: the cached path
   then pays one branch. */
xseg_status xseg_record_memory_history(xseg_allocator *a, size_t max_entries);

/* ---- PyTorch: torch.cuda.memory.CUDAPluggableAllocator ------------------
   One process-wide allocator per device, created on first use from
   XSEG_ALLOC_CONF and kept until the process ends; cudaStream_t is
   struct CUstream_st *. These are C and cannot throw: a failure is kept as
   the calling thread's xseg_torch_last_error() / xseg_torch_last_status()
   (malloc then returns NULL). PyTorch checks nothing they return, so
   python/xseg_torch.py hands PyTorch libxseg_torch.so's C++ wrappers
   instead (torch_adapter/xseg_torch.h): the same calls in the signatures
   of PyTorch's setters, which throw at the failing call. */
void *xseg_torch_malloc(ssize_t size, int device, struct CUstream_st *stream);
void  xseg_torch_free(void *ptr, ssize_t size, int device,
                      struct CUstream_st *stream);
void  xseg_torch_record_stream(void *ptr, struct CUstream_st *stream);
void  xseg_torch_empty_cache(void);                   /* every device */
/* One device's (none made yet: XSEG_OK): xseg_empty_cache, or with `wait`
   xseg_empty_cache_blocking, falling back to xseg_empty_cache during a
   capture the allocator knows of. XSEG_ERR_CAPTURE, nothing released,
   while a graph pool of the device is begun and none of its begun pools
   has allocated yet: a capture may be under way that the allocator cannot
   see, and the device-wide wait before released pools' memory is taken
   would end it (PyTorch's own allocator refuses emptyCache during any
   capture). */
xseg_status xseg_torch_empty_cache_device(int device, int wait);
void  xseg_torch_set_memory_fraction(double fraction, int device);
/* PyTorch's init(device_count): devices from device_count on are refused
   from then on (at most xseg_torch_device_limit()). */
void  xseg_torch_init(int device_count);
/* The count xseg_torch_init was given (0 before it): torch's devices, one
   list of memory_snapshot()'s device_traces each. */
int   xseg_torch_device_count(void);
/* Graph pools, named by PyTorch's MempoolId_t {first, second}. From the
   begin to the end, an allocation of `device` on a stream for which
   filter(ctx, stream) returns 1 comes from the pool (0: not this stream;
   -1: the filter failed, and so does the allocation). As PyTorch's own
   allocator, every allocation while a pool of the device is open asks the
   open pools' filters, and the first that claims it wins: a stream may
   join a capture later, and a filter may claim a thread rather than a
   stream (torch.cuda.use_mem_pool's). ctx_free(ctx), if not NULL,
   runs at the end (or at once if the begin fails). Each begin of an id
   takes a use of the pool, each release drops one; the last returns the
   pool's free memory to the cache (empty_cache then unmaps it). */
typedef int (*xseg_torch_stream_filter)(void *ctx, struct CUstream_st *stream);
void  xseg_torch_begin_allocate_to_pool_if(int device,
                                           unsigned long long id_first,
                                           unsigned long long id_second,
                                           xseg_torch_stream_filter filter,
                                           void *ctx,
                                           void (*ctx_free)(void *ctx));
/* The same with the one stream `stream` claimed at once. */
void  xseg_torch_begin_allocate_to_pool(int device, unsigned long long id_first,
                                        unsigned long long id_second,
                                        struct CUstream_st *stream);
void  xseg_torch_end_allocate_to_pool(int device, unsigned long long id_first,
                                      unsigned long long id_second);
void  xseg_torch_release_pool(int device, unsigned long long id_first,
                              unsigned long long id_second);
/* xseg_record_memory_history for every device, those whose allocator is
   made later included, as PyTorch's recordHistory (0: stop and forget). */
void  xseg_torch_record_memory_history(size_t max_entries);
/* The xseg_pool_id a snapshot names pool {id_first, id_second} of
   `device` by while it lives (begun and not yet released for the last
   time), 0 if none. */
xseg_pool_id xseg_torch_pool_id(int device, unsigned long long id_first,
                                unsigned long long id_second);
/* "" or "<entry point>: <XSEG_ERR_...>: <xseg_last_error()>". */
const char *xseg_torch_last_error(void);
xseg_status xseg_torch_last_status(void);   /* XSEG_OK when none */
void  xseg_torch_clear_error(void);
/* The allocator of `device` (created if need be), for the xseg_* calls;
   NULL with xseg_torch_last_error() set if it cannot be created. */
xseg_allocator *xseg_torch_allocator(int device);
int   xseg_torch_has_allocator(int device);  /* created already? never creates */
int   xseg_torch_device_limit(void);         /* devices are 0 .. limit-1 */
/* xseg_stats_json / xseg_snapshot_json of `device` as a malloc'd string
   (free it with xseg_torch_string_free); NULL on failure. */
char *xseg_torch_stats_json(int device);
char *xseg_torch_snapshot_json(int device);
void  xseg_torch_string_free(char *s);

/* Sharing a live block with other processes (torch.multiprocessing's
   case), through file descriptors on a Unix socket (SCM_RIGHTS): no
   pidfd_getfd, no ptrace. The producer exports a block; the handle holds
   one fd per physical handle the block touches and one of the producer's
   reference table. A consumer opens it: it maps just those handles (its
   address space grows by their size, not by a device-sized reservation)
   and registers by pid and start time in the table. A block is named by
   its producer's table (a random id), so the blocks of several allocators
   of one process, or of a new allocator after xseg_destroy, are never
   confused. Both processes must share a PID namespace. While any process
   holds the block,
   the producer's xseg_free leaves it pending (pending_free_bytes) instead
   of reusing it; the producer reclaims the holds of processes that died
   (even by SIGKILL, even inside xseg_ipc_open) whenever it completes pending
   frees, e.g. at its next xseg_malloc. A consumer may pass a handle it
   received on; the producer still decides the block's lifetime. */
typedef struct xseg_ipc_handle xseg_ipc_handle;            /* opaque */
/* A handle for the live block at ptr; free it with xseg_ipc_handle_free
   (which does not affect the block). Exporting the same block again gives
   a handle to the same block. */
xseg_status xseg_ipc_export(xseg_allocator *a, void *ptr, xseg_ipc_handle **out);
/* One message with the handle's fds (the caller keeps the handle). */
xseg_status xseg_ipc_send(int unix_socket, const xseg_ipc_handle *h);
/* A handle from one message; a truncated or malformed message is
   XSEG_ERR_INVALID_ARGUMENT, with every fd that came with it closed. */
xseg_status xseg_ipc_recv(int unix_socket, xseg_ipc_handle **out);
void        xseg_ipc_handle_free(xseg_ipc_handle *h);      /* closes its fds */
/* Maps the block of h read-write (the same pointer, reference-counted,
   when this allocator has it open already). Fails with a message naming
   the cause when the producer has exited or runs in another PID
   namespace, the block is no longer exported, h's table fd is not the
   table its message names, h is for another device or an fd is not driver
   memory; then nothing was kept. */
xseg_status xseg_ipc_open(xseg_allocator *a, const xseg_ipc_handle *h, void **ptr);
/* Drops one open of ptr; the last unmaps it and releases the hold. */
xseg_status xseg_ipc_close(xseg_allocator *a, void *ptr);

/* A hold on the exported block at ptr for a consumer that has not opened
   it yet (a handle waiting in a queue): until the ticket is given back,
   the producer's xseg_free leaves the block pending as it does while a
   consumer has it open. A ticket never given back keeps its block until
   the producer exits or destroys its allocator. XSEG_ERR_UNKNOWN_POINTER
   unless ptr is a live block exported with xseg_ipc_export. */
xseg_status xseg_ipc_ticket_take(xseg_allocator *a, void *ptr,
                                 uint64_t *ticket);
/* Gives a ticket back: the consumer, once xseg_ipc_open gave it the block
   at ptr (its own hold keeps the block now), or the producer, for a
   handle it never sent (ptr: the block it exported, even freed since). A
   ticket given back already, or of another block, is
   XSEG_ERR_INVALID_ARGUMENT and frees nothing; a ptr that is no block
   exported or opened here (or no longer is: exported, freed, and given
   back by every holder) is XSEG_ERR_UNKNOWN_POINTER. */
xseg_status xseg_ipc_ticket_give(xseg_allocator *a, void *ptr,
                                 uint64_t ticket);
/* Gives a ticket back for handle h, whose block was not opened here (its
   xseg_ipc_open failed, or the consumer chose not to open it): through
   the producer's table that h carries, with no allocator. Otherwise the
   ticket, never given back, would keep the block until the producer
   exits. The same refusals as xseg_ipc_ticket_give's (ticket 0, which
   xseg_ipc_ticket_take never gives, is none); a table that cannot be
   mapped fails, naming why. Once the producer has exited its holds mean
   nothing, and a give changes nothing that matters. */
xseg_status xseg_ipc_ticket_give_unopened(const xseg_ipc_handle *h,
                                          uint64_t ticket);

/* Ordering the consumer after the producer's work on a block, without the
   producer's host waiting: the producer records, on the stream that wrote
   the block, an interprocess event (cuEventCreate with INTERPROCESS |
   DISABLE_TIMING; one per stream, kept until xseg_destroy, as the driver
   requires an exported event to outlive its imports) and sends its
   XSEG_IPC_EVENT_BYTES-byte handle along; the consumer's xseg_ipc_wait
   makes its stream wait for that work on the device. A late consumer
   waits for the stream's latest record, which follows the one it was
   sent with: perhaps longer than needed, never too short. */
enum { XSEG_IPC_EVENT_BYTES = 64 };
xseg_status xseg_ipc_record(xseg_allocator *a, struct CUstream_st *stream,
                            void *event_handle);
/* Fails, with the driver's error named, when the producer has exited or
   the bytes are no event handle. */
xseg_status xseg_ipc_wait(xseg_allocator *a, const void *event_handle,
                          struct CUstream_st *stream);

typedef struct xseg_ipc_stats {
  int64_t exported_blocks;   /* blocks of this allocator with an export now
                                (live, or freed and held by others) */
  int64_t exported_total;    /* blocks ever exported */
  int64_t open_by_others;    /* of exported_blocks, held by a process now */
  int64_t pending_on_others; /* freed here, waiting for holders to close */
  int64_t reclaimed;         /* holds of dead processes taken back */
  int64_t opened_blocks;     /* other processes' blocks open here now */
  int64_t opened_total;      /* blocks ever mapped by xseg_ipc_open */
} xseg_ipc_stats;
xseg_status xseg_ipc_get_stats(xseg_allocator *a, xseg_ipc_stats *out);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* XSEG_H */
