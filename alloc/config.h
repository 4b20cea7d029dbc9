/* config.h: the allocator's settings, parsed from a PYTORCH_CUDA_ALLOC_CONF
 * style string ("key:value,key:value").
 *
 * PyTorch's keys keep PyTorch's names, syntax and meaning (see
 * c10/cuda/CUDAAllocatorConfig.cpp); xseg's own keys start with "xseg_".
 */
#ifndef XS_ALLOC_CONFIG_H
#define XS_ALLOC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "xseg.h"

/* PyTorch's rounding intervals: one per power of two from 1 MiB up
   (kRoundUpPowerOfTwoIntervals = 16, the last one open-ended). */
enum { XS_ROUNDUP_INTERVALS = 16 };

/* xseg_handle_policy: how growth cuts the fresh granules it maps into
   physical handles. Fewer handles mean fewer cuMemCreate and cuMemMap
   calls; smaller ones can be given back or moved where fewer granules are
   free (the driver unmaps whole handles only). */
typedef enum xs_handle_policy {
  XS_HANDLES_GRANULE,          /* one handle per granule */
  XS_HANDLES_SINGLE,           /* one handle per growth */
  XS_HANDLES_POW2              /* power-of-two handles, largest first */
} xs_handle_policy;

typedef struct xs_config {
  bool   expandable_segments;           /* default true */
  size_t max_split_size;                /* bytes; SIZE_MAX = no limit */
  size_t max_non_split_rounding;        /* bytes; default 20 MiB */
  /* divisions per interval, 0 or 1 = plain 512-byte rounding; interval i
     covers sizes in [2^i MiB, 2^(i+1) MiB), interval 0 also everything
     smaller and interval 15 everything larger (PyTorch's
     roundup_power2_divisions(size): index = floor(log2(size)) - 20, clamped
     to [0, 15]) */
  unsigned roundup_power2_divisions[XS_ROUNDUP_INTERVALS];
  double garbage_collection_threshold;  /* 0 = off, else in (0, 1) */
  size_t large_segment_size;            /* large_segment_size_mb (bytes):
                                           a classic segment for a request
                                           of 1 to 10 MiB; default 20 MiB */
  double memory_fraction;               /* xseg_memory_fraction, (0, 1], or
                                           per_process_memory_fraction,
                                           [0, 1] (0: nothing grows) */
  char   driver[256];                   /* xseg_driver; "" = libcuda.so.1 */
  size_t small_granule;                 /* xseg_small_granule_mb (bytes) */
  size_t large_granule;                 /* xseg_large_granule_mb (bytes) */
  size_t reserve_size;                  /* xseg_reserve_mb; 0 = 9/8 of the
                                           device's memory */
  xs_handle_policy handle_policy;       /* xseg_handle_policy */
  size_t grow_min;                      /* xseg_grow_min_mb (bytes): least
                                           fresh growth at a segment's end */
  size_t handle_max;                    /* xseg_handle_max_mb (bytes): most
                                           per fresh handle; 0 = no limit */
  size_t handle_max_part;               /* xseg_handle_max_part: a fresh
                                           handle is at most 1/N of the
                                           mapped bytes; 0 = no limit */
} xs_config;

/* Defaults for every field. */
void xs_config_defaults(xs_config *c);

/* Parses `conf` over the defaults. NULL or "" means the environment variable
   XSEG_ALLOC_CONF (then nothing). An unknown key or a bad value gives
   XSEG_ERR_INVALID_ARGUMENT and a message naming the key and the value
   (backend:cudaMallocAsync, valid but not implemented, XSEG_ERR_UNSUPPORTED);
   *c is then unspecified. */
xseg_status xs_config_parse(const char *conf, xs_config *c);

/* PyTorch's round_size (CUDACachingAllocator.cpp): sizes below 512 bytes
   become 512; a size above 512 * d, where d > 1 is the divisions of its
   interval, is rounded up to the next multiple of 2^floor(log2(size)) / d;
   every other size to a multiple of 512. Returns 0 when the rounded size
   overflows size_t (the caller reports XSEG_ERR_INVALID_ARGUMENT). */
size_t xs_config_round_size(const xs_config *c, size_t size);

#endif /* XS_ALLOC_CONFIG_H */
