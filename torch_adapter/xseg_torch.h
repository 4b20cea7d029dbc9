/* xseg_torch.h: libxseg_torch.so, xseg's entry points in the C++
 * signatures that PyTorch's CUDAPluggableAllocator takes.
 *
 * PyTorch (torch/csrc/cuda/Module.cpp) turns each int that Python passes
 * to a _CUDAPluggableAllocator setter into a std::function of one fixed
 * function type and calls it from C++:
 *
 *   alloc_fn                   void*(size_t, int, cudaStream_t)
 *   free_fn                    void(void*, size_t, int, cudaStream_t)
 *   set_record_stream_fn       void(void*, cudaStream_t)
 *   set_reset_fn               void()
 *   set_memory_fraction_fn     void(double, int)
 *   set_init_fn                void(int)
 *   set_begin_allocate_to_pool void(int, MempoolId_t,
 *                                   std::function<bool(cudaStream_t)>)
 *   set_end_allocate_to_pool_fn, set_release_pool
 *                              void(int, MempoolId_t)
 *
 * MempoolId_t is std::pair<unsigned long long, unsigned long long>: on
 * x86-64 (System V, Itanium C++ ABI) a 16-byte class with trivial copy and
 * destructor goes in two integer registers, while std::function (its copy
 * and destructor are not trivial) is built by the caller and passed by
 * address. C can name neither, so these are C++, built with the same ABI
 * as PyTorch; the C library (include/xseg.h) never links libstdc++.
 *
 * Each call clears xseg's kept failure, calls the C entry point and throws
 * what it kept: an allocation xseg cannot serve throws from the alloc_fn,
 * in the thread that asked, through PyTorch's own frames to the Python
 * call (or autograd's engine, which hands it to backward()).
 * python/xseg_torch.py installs a thrower built against the user's torch,
 * so that this is c10::OutOfMemoryError (torch.cuda.OutOfMemoryError in
 * Python); without one it is xseg_torch::OutOfMemoryError, a
 * std::runtime_error whose message starts "CUDA out of memory." (a Python
 * RuntimeError). free and release_pool never throw: PyTorch calls them
 * from destructors; their failures go to stderr.
 */
#ifndef XSEG_TORCH_H
#define XSEG_TORCH_H

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <utility>

#include "xseg.h"

namespace xseg_torch {

using Stream = struct CUstream_st *;                     /* cudaStream_t */
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using StreamFilter = std::function<bool(Stream)>;

/* A failed xseg call; what() is xseg's message. */
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/* An allocation xseg could not serve (when no thrower is installed). */
struct OutOfMemoryError : Error {
  using Error::Error;
};

}  // namespace xseg_torch

#define XSEG_TORCH_API extern "C" __attribute__((visibility("default")))

XSEG_TORCH_API void *xseg_torch_cxx_malloc(size_t size, int device,
                                           xseg_torch::Stream stream);
XSEG_TORCH_API void xseg_torch_cxx_free(void *ptr, size_t size, int device,
                                        xseg_torch::Stream stream);
/* A pointer no allocator of xseg knows is ignored, as PyTorch's own
   allocator ignores memory it did not allocate. */
XSEG_TORCH_API void xseg_torch_cxx_record_stream(void *ptr,
                                                 xseg_torch::Stream stream);
XSEG_TORCH_API void xseg_torch_cxx_empty_cache();
XSEG_TORCH_API void xseg_torch_cxx_set_memory_fraction(double fraction,
                                                       int device);
XSEG_TORCH_API void xseg_torch_cxx_init(int device_count);
XSEG_TORCH_API void xseg_torch_cxx_begin_allocate_to_pool(
    int device, xseg_torch::MempoolId id, xseg_torch::StreamFilter filter);
XSEG_TORCH_API void xseg_torch_cxx_end_allocate_to_pool(
    int device, xseg_torch::MempoolId id);
XSEG_TORCH_API void xseg_torch_cxx_release_pool(int device,
                                                xseg_torch::MempoolId id);

/* Throws the out-of-memory error of the caller's choice with `message`;
   must not return. NULL restores xseg_torch::OutOfMemoryError. */
typedef void (*xseg_torch_oom_thrower)(const char *message);
XSEG_TORCH_API void xseg_torch_cxx_set_oom_thrower(xseg_torch_oom_thrower t);
/* The message an allocation failure of this thread threw last ("" if
   none): what python/xseg_torch.py shows with PyTorch's error. */
XSEG_TORCH_API const char *xseg_torch_cxx_last_oom(void);

#endif
