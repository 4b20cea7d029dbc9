// pluggable.cc: the C++ half of the stand-in of torch (standin/torch/):
// what torch/csrc/cuda/CUDAPluggableAllocator.cpp, the _CUDAPluggableAllocator
// bindings of torch/csrc/cuda/Module.cpp and CUDAGraph::capture_begin/_end
// do with a pluggable allocator's hooks, reached from Python by ctypes.
// Every entry returns 0, or 1 with the message of the C++ exception that
// escaped (as HANDLE_TH_ERRORS turns a std::exception into RuntimeError).
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace {

using cudaStream_t = CUstream;
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;

struct Metadata {
  size_t size;
  int device;
  cudaStream_t stream;
};

struct Pluggable {
  std::function<void *(size_t, int, cudaStream_t)> alloc_fn_;
  std::function<void(void *, size_t, int, cudaStream_t)> free_fn_;
  std::function<void(int)> init_fn_;
  std::function<void()> reset_fn_;
  std::function<void(double, int)> memory_fraction_fn_;
  std::function<void(void *, cudaStream_t)> record_stream_fn_;
  std::function<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)>
      begin_allocate_to_pool_fn_;
  std::function<void(int, MempoolId_t)> end_allocate_to_pool_fn_;
  std::function<void(int, MempoolId_t)> relase_pool_fn_;
  std::mutex mutex_;
  std::unordered_map<void *, Metadata> allocation_metadata_;
};

// Module.cpp: "std::function<FuncType> func = reinterpret_cast<FuncType*>(ptr)".
template <typename F>
std::function<F> from_int(uint64_t ptr) {
  return reinterpret_cast<F *>(ptr);
}

template <typename Body>
int guarded(char *err, size_t n, Body body) {
  try {
    body();
    return 0;
  } catch (const std::exception &e) {
    snprintf(err, n, "%s", e.what());
  } catch (...) {
    snprintf(err, n, "unknown C++ exception");
  }
  return 1;
}

void cu_check(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: " +
                             std::to_string(r));
}

}  // namespace

extern "C" {

// _cuda_customAllocator(malloc_ptr, free_ptr)
Pluggable *standin_custom_allocator(uint64_t malloc_ptr, uint64_t free_ptr) {
  auto *p = new Pluggable;
  p->alloc_fn_ = from_int<void *(size_t, int, cudaStream_t)>(malloc_ptr);
  p->free_fn_ = from_int<void(void *, size_t, int, cudaStream_t)>(free_ptr);
  return p;
}

// The _CUDAPluggableAllocator setters, by name.
int standin_set(Pluggable *p, const char *setter, uint64_t fn) {
  std::string s = setter;
  if (s == "set_init_fn") p->init_fn_ = from_int<void(int)>(fn);
  else if (s == "set_reset_fn") p->reset_fn_ = from_int<void()>(fn);
  else if (s == "set_memory_fraction_fn")
    p->memory_fraction_fn_ = from_int<void(double, int)>(fn);
  else if (s == "set_record_stream_fn")
    p->record_stream_fn_ = from_int<void(void *, cudaStream_t)>(fn);
  else if (s == "set_begin_allocate_to_pool")
    p->begin_allocate_to_pool_fn_ = from_int<void(
        int, MempoolId_t, std::function<bool(cudaStream_t)>)>(fn);
  else if (s == "set_end_allocate_to_pool_fn")
    p->end_allocate_to_pool_fn_ = from_int<void(int, MempoolId_t)>(fn);
  else if (s == "set_release_pool")
    p->relase_pool_fn_ = from_int<void(int, MempoolId_t)>(fn);
  else return 1;
  return 0;
}

// CUDAPluggableAllocator::malloc (allocate, raw_alloc_with_stream).
int standin_malloc(Pluggable *p, size_t size, int device, cudaStream_t stream,
                   void **out, char *err, size_t n) {
  return guarded(err, n, [&] {
    void *r = p->alloc_fn_(size, device, stream);
    std::lock_guard<std::mutex> lock(p->mutex_);
    p->allocation_metadata_.emplace(r, Metadata{size, device, stream});
    *out = r;
  });
}

// CUDAPluggableAllocator::raw_delete.
int standin_raw_delete(Pluggable *p, void *ptr, char *err, size_t n) {
  return guarded(err, n, [&] {
    Metadata m;
    {
      std::lock_guard<std::mutex> lock(p->mutex_);
      auto it = p->allocation_metadata_.find(ptr);
      if (it == p->allocation_metadata_.end())
        throw std::runtime_error("Trying to free a pointer not allocated here");
      m = it->second;
      p->allocation_metadata_.erase(it);
    }
    p->free_fn_(ptr, m.size, m.device, m.stream);
  });
}

int standin_init(Pluggable *p, int device_count, char *err, size_t n) {
  return guarded(err, n, [&] {
    if (p->init_fn_) p->init_fn_(device_count);
  });
}

int standin_empty_cache(Pluggable *p, char *err, size_t n) {
  return guarded(err, n, [&] {
    if (p->reset_fn_) p->reset_fn_();
  });
}

int standin_set_memory_fraction(Pluggable *p, double f, int device, char *err,
                                size_t n) {
  return guarded(err, n, [&] {
    if (p->memory_fraction_fn_) p->memory_fraction_fn_(f, device);
  });
}

int standin_record_stream(Pluggable *p, void *ptr, cudaStream_t s, char *err,
                          size_t n) {
  return guarded(err, n, [&] {
    if (p->record_stream_fn_) p->record_stream_fn_(ptr, s);
  });
}

// CUDAGraph::capture_begin: the capture begins on `stream` (global mode),
// then the pool is announced with the filter "this stream is in this
// capture". A pool of (0, 0) becomes (capture id, 0).
int standin_capture_begin(Pluggable *p, int device, cudaStream_t stream,
                          unsigned long long *pool, char *err, size_t n) {
  return guarded(err, n, [&] {
    cu_check(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
             "cudaStreamBeginCapture");
    CUstreamCaptureStatus status;
    cuuint64_t id = 0;
    cu_check(cuStreamGetCaptureInfo(stream, &status, &id, nullptr, nullptr,
                                    nullptr, nullptr),
             "cudaStreamGetCaptureInfo");
    if (pool[0] == 0 && pool[1] == 0) pool[0] = id;
    auto filter = [id](cudaStream_t s) {
      CUstreamCaptureStatus st;
      cuuint64_t sid = 0;
      cu_check(cuStreamGetCaptureInfo(s, &st, &sid, nullptr, nullptr,
                                      nullptr, nullptr),
               "cudaStreamGetCaptureInfo");
      return st == CU_STREAM_CAPTURE_STATUS_ACTIVE && sid == id;
    };
    if (p->begin_allocate_to_pool_fn_)
      p->begin_allocate_to_pool_fn_(device, {pool[0], pool[1]}, filter);
  });
}

// CUDAGraph::capture_end: the capture ends, then the pool; the graph is
// instantiated.
int standin_capture_end(Pluggable *p, int device, cudaStream_t stream,
                        const unsigned long long *pool, CUgraphExec *exec,
                        char *err, size_t n) {
  return guarded(err, n, [&] {
    CUgraph g = nullptr;
    cu_check(cuStreamEndCapture(stream, &g), "cudaStreamEndCapture");
    if (p->end_allocate_to_pool_fn_)
      p->end_allocate_to_pool_fn_(device, {pool[0], pool[1]});
    cu_check(cuGraphInstantiate(exec, g, 0), "cudaGraphInstantiate");
    cu_check(cuGraphDestroy(g), "cudaGraphDestroy");
  });
}

// CUDAGraph::reset: the graph goes, then its use of the pool.
int standin_graph_reset(Pluggable *p, int device, CUgraphExec exec,
                        const unsigned long long *pool, char *err, size_t n) {
  return guarded(err, n, [&] {
    cu_check(cuGraphExecDestroy(exec), "cudaGraphExecDestroy");
    if (p->relase_pool_fn_) p->relase_pool_fn_(device, {pool[0], pool[1]});
  });
}

}  // extern "C"
