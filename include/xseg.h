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
/* NULL is ignored, as by free(). */
xseg_status xseg_free(xseg_allocator *a, void *ptr);
xseg_status xseg_empty_cache(xseg_allocator *a);
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
} xseg_stats;
xseg_status xseg_get_stats(xseg_allocator *a, xseg_stats *out);
xseg_status xseg_reset_peak_stats(xseg_allocator *a);

/* Walks every structure and checks every invariant; XSEG_OK or a message. */
xseg_status xseg_check(xseg_allocator *a);

/* PyTorch's memory_stats() as JSON, with its key names. */
xseg_status xseg_stats_json(xseg_allocator *a, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* XSEG_H */
