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

#ifdef __cplusplus
}
#endif
#endif /* XSEG_H */
