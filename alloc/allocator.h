/* allocator.h: the device allocator behind xseg_allocator (internal).
 *
 * One per device. Everything below the public entry points runs with `lock`
 * held (functions named *_locked assert it in debug builds) and reaches the
 * driver only through vmm/. Pools come per (stream, size class); the
 * pointer table maps the address of every live block to its block.
 */
#ifndef XS_ALLOC_ALLOCATOR_H
#define XS_ALLOC_ALLOCATOR_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "alloc/config.h"
#include "segments/block.h"
#include "segments/pool.h"
#include "segments/stats.h"
#include "vmm/vmm.h"
#include "xseg.h"

/* PyTorch's kSmallSize: requests up to 1 MiB go to the small pool. */
#define XS_SMALL_SIZE ((size_t)1 << 20)
/* PyTorch's kMinBlockSize: the rounding unit and the smallest remainder
   worth splitting off in expandable mode. */
#define XS_MIN_BLOCK ((size_t)512)

/* The two pools of one stream. */
typedef struct xs_stream_pools {
  struct CUstream_st *stream;
  xs_pool pool[2];                    /* indexed by xs_pool_kind */
  struct xs_stream_pools *next;
} xs_stream_pools;

struct xseg_allocator {
  pthread_mutex_t lock;
  xs_vmm vmm;
  xs_config cfg;
  xs_stats stats;
  xs_blocks blocks;                   /* block struct cache */
  xs_block *live;                     /* pointer table (uthash on addr) */
  xs_block anchor;                    /* keeps the table allocated (alloc.c) */
  xs_stream_pools *streams;           /* most recently used first */
  size_t granule[2];                  /* expandable mapping unit per pool */
  size_t reserve[2];                  /* bytes per reservation per pool */
  size_t cap;                         /* memory_fraction * device memory */
#ifndef NDEBUG
  pthread_t owner;                    /* holder of lock, for asserts */
  bool owned;
#endif
};

void xs_alloc_lock(xseg_allocator *a);
void xs_alloc_unlock(xseg_allocator *a);
#ifndef NDEBUG
#define XS_ASSERT_LOCKED(a)                                                  \
  assert((a)->owned && pthread_equal((a)->owner, pthread_self()) &&          \
         "caller must hold the allocator's mutex")
#else
#define XS_ASSERT_LOCKED(a) ((void)0)
#endif

/* The pools of `stream`, created on first use (round.c has the policy). */
xseg_status xs_stream_pools_get_locked(xseg_allocator *a,
                                       struct CUstream_st *stream,
                                       xs_stream_pools **out);

/* Policy (policy.c): PyTorch's pool choice, fit and split rules. */
xs_pool_kind xs_alloc_kind(size_t rounded);
xs_block *xs_alloc_find_free(const xseg_allocator *a, xs_pool *p,
                             size_t rounded);
bool xs_alloc_should_split(const xseg_allocator *a, const xs_pool *p,
                           const xs_block *b, size_t rounded);
size_t xs_alloc_classic_size(const xseg_allocator *a, size_t rounded);

/* Growth and the out-of-memory path (grow.c): makes a free mapped block of
   at least `rounded` bytes in p. Enters the device's context itself. */
xseg_status xs_alloc_grow_locked(xseg_allocator *a, xs_pool *p,
                                 size_t rounded, size_t requested,
                                 xs_block **out);
/* Releases whole free granules of every pool until `goal` bytes are gone
   (SIZE_MAX: all). The context must be current. */
xseg_status xs_alloc_release_locked(xseg_allocator *a, size_t goal);

/* Formats bytes as PyTorch does ("20.00 MiB") into buf. */
const char *xs_format_bytes(size_t bytes, char *buf, size_t size);

#endif /* XS_ALLOC_ALLOCATOR_H */
