/* vmm.h: one device's virtual memory, in the terms the segments need.
 *
 * An xs_vmm holds a loaded driver, the device's primary context and the
 * access list (the owner first, then every peer that xs_vmm_add_peer added).
 * Addresses and physical handles cross this interface as uint64_t, so the
 * layers above know no CUDA type.
 *
 * Every function below except xs_vmm_open/close expects the device's context
 * to be current: bracket a batch of calls with xs_vmm_ctx_enter/leave, once
 * per public operation rather than once per driver call.
 */
#ifndef XS_VMM_H
#define XS_VMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vmm/driver.h"

enum { XS_VMM_MAX_ACCESS = 16 };   /* the owner and up to 15 peers */

typedef struct xs_vmm {
  xs_driver *drv;
  int device;                      /* ordinal */
  CUcontext ctx;                   /* primary context, retained */
  size_t granularity;              /* minimum mapping granularity */
  size_t total_memory;             /* cuDeviceTotalMem */
  int n_access;                    /* entries of access[] in use, >= 1 */
  bool shareable;                  /* handles are created exportable as
                                      POSIX fds (IPC); cleared if the
                                      driver refuses that */
  CUmemAccessDesc access[XS_VMM_MAX_ACCESS];
  /* Handles already unmapped whose cuMemRelease failed (unreleased.c):
     [0, n_unreleased) of an array of cap_unreleased. */
  uint64_t *unreleased;
  size_t n_unreleased, cap_unreleased;
  /* Address ranges no longer used whose cuMemAddressFree failed, kept
     the same way (unreleased.c): [0, n_unfreed) of cap_unfreed. */
  struct xs_vmm_range *unfreed;
  size_t n_unfreed, cap_unfreed;
  /* Old mappings of lent handles, still mapped (aliases.c): [0, n_aliases)
     of an array of cap_aliases. */
  struct xs_vmm_alias *aliases;
  size_t n_aliases, cap_aliases;
  size_t orphan_bytes;             /* held by orphans only (aliases.c) */
  uint64_t reserves;               /* successful xs_vmm_reserve calls: a
                                      range table built at one count is
                                      still whole while it stays */
} xs_vmm;

/* Loads the driver (see xs_driver_load for `driver_path`), checks that the
   device supports virtual memory management (else XSEG_ERR_UNSUPPORTED),
   retains its primary context and reads its granularity and memory size. */
xseg_status xs_vmm_open(xs_vmm *v, const char *driver_path, int device);
/* Releases the primary context. Everything mapped must be gone. */
void xs_vmm_close(xs_vmm *v);

/* The context of `stream` in *ctx: v's own for NULL and the special
   handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the current context's
   stream, and xseg uses them in v's), and for a stream the driver no longer
   knows (destroyed: what uses it reports that); any other failure of
   cuStreamGetCtx is returned, naming it. */
xseg_status xs_vmm_stream_ctx(xs_vmm *v, struct CUstream_st *stream,
                              CUcontext *ctx);
/* XSEG_OK when `stream` is of v's context (xs_vmm_stream_ctx), else the
   refusal (XSEG_ERR_INVALID_ARGUMENT, the message naming `what` asked, the
   stream and why) or the driver's failure. Only such a stream allocates:
   its pools' growth and unmap guards record v's events on it, and cuda.h's
   cuEventRecord wants one context. */
xseg_status xs_vmm_stream_allocates(xs_vmm *v, const char *what,
                                    struct CUstream_st *stream);

/* Makes v's context current, returning the caller's in *saved. The
   leave makes the caller's current again; it has no status, so a failure
   there is tried once more at once, and otherwise leaves the thread in
   v's context (vmm.c says why no later call can mend it). */
xseg_status xs_vmm_ctx_enter(xs_vmm *v, CUcontext *saved);
void        xs_vmm_ctx_leave(xs_vmm *v, CUcontext saved);
/* The same for context `ctx` (another device's, say): current until
   xs_vmm_ctx_return(v, ctx, saved) makes the caller's current again (a
   failed switch tried once more at once), or says that it could not (the
   thread is left in ctx: xs_vmm_ctx_mend makes v's current again where
   v's is needed, and the thread's next xs_vmm_ctx_leave tries once more,
   whatever its saved context). */
xseg_status xs_vmm_ctx_switch(xs_vmm *v, CUcontext ctx, CUcontext *saved);
xseg_status xs_vmm_ctx_return(xs_vmm *v, CUcontext ctx, CUcontext saved);
/* Between an enter and its leave: when a xs_vmm_ctx_return of this thread
   failed since, so that another context may be current where v's is
   expected, makes v's current again (or fails, naming the call); XSEG_OK
   at once otherwise. For what must happen in v's context whatever the
   error paths before it left current: an event of v's own is created in
   the current context (streams/event_pool.c). */
xseg_status xs_vmm_ctx_mend(xs_vmm *v);

/* Adds read-write access for `peer` to what xs_vmm_set_access grants from
   now on (existing mappings are the caller's to update). Idempotent. */
xseg_status xs_vmm_add_peer(xs_vmm *v, int peer);

/* Reserves `size` bytes (a multiple of the granularity) of address space. */
xseg_status xs_vmm_reserve(xs_vmm *v, size_t size, uint64_t *addr);
xseg_status xs_vmm_unreserve(xs_vmm *v, uint64_t addr, size_t size);
/* Frees a range nothing uses any more (nothing mapped, no table names
   it). When cuMemAddressFree fails, the range is kept for
   xs_vmm_unreleased_retry instead of being lost, and the failure is
   returned with a message that says so (unreleased.c). */
xseg_status xs_vmm_unreserve_or_keep(xs_vmm *v, uint64_t addr, size_t size);
/* The same, leaving the message alone (an undo; xs_vmm_unmap_quietly),
   after unmapping the range's first `mapped` bytes (0: none): a range
   whose unmap fails twice is kept with them, and the retry unmaps them
   before it frees the range (cuMemAddressFree refuses a range with
   mappings). */
void xs_vmm_unreserve_quietly(xs_vmm *v, uint64_t addr, size_t size,
                              size_t mapped);

/* One physical allocation of `size` bytes (a multiple of the granularity).
   `exportable` (or v->shareable) asks for POSIX file descriptor export
   (IPC); a driver that does not support it (CUDA_ERROR_NOT_SUPPORTED) gets
   a plain handle, and v->shareable is cleared. */
xseg_status xs_vmm_handle_create(xs_vmm *v, size_t size, bool exportable,
                                 uint64_t *handle);
xseg_status xs_vmm_handle_release(xs_vmm *v, uint64_t handle);

/* Releases a handle that is no longer mapped anywhere. When cuMemRelease
   fails, the handle is kept for xs_vmm_unreleased_retry instead of being
   lost, and the failure is returned with a message that says so. */
xseg_status xs_vmm_handle_release_or_keep(xs_vmm *v, uint64_t handle);
/* The same, leaving the message alone (for a caller whose own failure is
   the message: a growth undoing itself); with no host memory to keep the
   handle, one more release is tried. False when the handle is lost. */
bool xs_vmm_handle_release_quietly(xs_vmm *v, uint64_t handle);
/* Keeps a handle whose release failed, leaving the message alone; false
   when host memory ran out. */
bool xs_vmm_unreleased_keep(xs_vmm *v, uint64_t handle);
/* Tries every kept handle and range again; the first failure is
   returned (those that fail again stay kept). */
xseg_status xs_vmm_unreleased_retry(xs_vmm *v);
/* Retries one last time, then forgets the list (xseg_destroy). */
void xs_vmm_unreleased_destroy(xs_vmm *v);

/* Aliases (aliases.c): a lent handle stays mapped at its old address (the
   alias) after it was mapped again elsewhere, until the alias is unmapped.
   The driver frees a handle's memory only when it is released and its last
   mapping is gone, so releasing a handle that an alias still maps frees
   nothing yet: the layers above ask xs_vmm_alias_maps first, and a handle
   that must go while aliases map it (a growth that failed after taking
   it) becomes an orphan, released when its last alias is unmapped. */
typedef struct xs_vmm_alias {
  uint64_t addr;                   /* the alias mapping's first byte */
  uint64_t handle;
  size_t size;                     /* the handle's bytes */
  int tag;                         /* the caller's: whom its bytes count for
                                      (an orphan's: all its aliases') */
  bool orphan;                     /* owned nowhere: released with its last
                                      alias */
} xs_vmm_alias;
/* Room for n more aliases; false when host memory ran out (then nothing
   may be lent). */
bool xs_vmm_alias_reserve(xs_vmm *v, size_t n);
/* Records that `handle` (`size` bytes) stays mapped at `addr`;
   xs_vmm_alias_reserve made room first. */
void xs_vmm_alias_add(xs_vmm *v, uint64_t addr, uint64_t handle, size_t size,
                      int tag);
/* Whether an alias still maps `handle`. */
bool xs_vmm_alias_maps(const xs_vmm *v, uint64_t handle);
/* Makes `handle`, which its owner gives up, an orphan of the aliases that
   map it, if any: then *out gets its size and tag (its bytes are still
   held on the device, in v->orphan_bytes) and true is returned. */
bool xs_vmm_alias_orphan(xs_vmm *v, uint64_t handle, xs_vmm_alias *out);
/* Takes out one orphan whose last aliases lie in [addr, addr + size) (just
   unmapped), with all its aliases: its release is now due. False: none. */
bool xs_vmm_alias_take_orphan(xs_vmm *v, uint64_t addr, size_t size,
                              xs_vmm_alias *out);
/* Forgets the aliases mapped in [addr, addr + size) (just unmapped). */
void xs_vmm_alias_drop(xs_vmm *v, uint64_t addr, size_t size);
/* Releases the orphans left (their aliases could not be unmapped) and
   forgets every alias (xseg_destroy, after the pools' unmaps). */
void xs_vmm_alias_destroy(xs_vmm *v);

/* Maps a whole handle of `size` bytes at addr (no access yet). */
xseg_status xs_vmm_map(xs_vmm *v, uint64_t addr, size_t size,
                       uint64_t handle);
/* Unmaps [addr, addr+size): whole mappings only, possibly several. */
xseg_status xs_vmm_unmap(xs_vmm *v, uint64_t addr, size_t size);
/* Undo of a map or grant that failed: unmaps [addr, addr+size), leaving
   the message alone (the failure that made the caller undo is the
   message). Tried twice: a range left mapped is one the layers above
   believe unmapped, which nothing would unmap again. False when both
   tries failed. */
bool xs_vmm_unmap_quietly(xs_vmm *v, uint64_t addr, size_t size);
/* Read-write access for the owner and every peer, in one call. */
xseg_status xs_vmm_set_access(xs_vmm *v, uint64_t addr, size_t size);

/* Maps `n` fresh handles of `chunk` bytes each at addr, addr+chunk, ... and
   grants access to the whole run with one cuMemSetAccess. On any failure
   everything this call created or mapped is undone and the error returned:
   the range is left unmapped and no handle survives. */
xseg_status xs_vmm_map_run(xs_vmm *v, uint64_t addr, size_t chunk, size_t n,
                           uint64_t *handles_out);
/* Unmaps [addr, addr + n*chunk) with one cuMemUnmap and releases the n
   handles mapped there. If the unmap fails nothing is released (the caller
   still owns the handles); a failed release does not stop the others and the
   first failure is returned. */
xseg_status xs_vmm_unmap_run(xs_vmm *v, uint64_t addr, size_t chunk, size_t n,
                             const uint64_t *handles);

/* Maps existing handles at addr, addr+chunk, ...: handles[i] is the handle
   of granule i (`chunk` bytes), and a run of k equal values is one handle
   of k*chunk bytes, mapped with one cuMemMap (the allocator reuses handles
   it unmapped elsewhere, and creates multi-granule ones). Grants access to
   the whole range with one cuMemSetAccess. On failure whatever this call
   mapped is unmapped again; the handles stay the caller's either way. */
xseg_status xs_vmm_map_handles(xs_vmm *v, uint64_t addr, size_t chunk,
                               size_t n, const uint64_t *handles);

/* cuMemGetInfo for the device. */
xseg_status xs_vmm_mem_info(xs_vmm *v, size_t *free_bytes,
                            size_t *total_bytes);

#endif /* XS_VMM_H */
