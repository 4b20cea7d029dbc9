/* xseg_torch.cc: the C++ signatures of xseg_torch.h over the C entry
 * points of include/xseg.h, and the exceptions that carry their failures.
 */
#include "xseg_torch.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace {

std::atomic<xseg_torch_oom_thrower> oom_thrower{nullptr};
thread_local std::string last_oom;
/* What a stream filter threw, to be thrown again from the allocation that
   asked it (the filter runs inside C code, which no exception may cross). */
thread_local std::exception_ptr filter_failure;

/* PyTorch's out-of-memory message starts "CUDA out of memory." (handlers
   match on it); xseg's diagnosis follows: requested, free, allocated,
   reserved, the cap. */
std::string oom_message(const char *kept) {
  static const char xseg_prefix[] = "xseg: out of memory. ";
  const char *diagnosis = std::strstr(kept, xseg_prefix);
  std::string m = "CUDA out of memory. ";
  m += diagnosis != nullptr ? diagnosis + sizeof xseg_prefix - 1 : kept;
  m += " (xseg allocator)";
  return m;
}

[[noreturn]] void throw_oom(const char *kept) {
  last_oom = oom_message(kept);
  if (xseg_torch_oom_thrower t = oom_thrower.load()) t(last_oom.c_str());
  throw xseg_torch::OutOfMemoryError(last_oom);
}

/* Throws what the C entry point just kept, if anything. */
void throw_kept() {
  if (filter_failure) {
    std::exception_ptr e = filter_failure;
    filter_failure = nullptr;
    xseg_torch_clear_error();
    std::rethrow_exception(e);
  }
  xseg_status st = xseg_torch_last_status();
  if (st == XSEG_OK) return;
  std::string kept = xseg_torch_last_error();
  xseg_torch_clear_error();
  if (st == XSEG_ERR_OUT_OF_MEMORY) throw_oom(kept.c_str());
  throw xseg_torch::Error("xseg: " + kept);
}

/* For calls from PyTorch's destructors: reported, never thrown. */
void report_kept() {
  if (xseg_torch_last_status() == XSEG_OK) return;
  std::fprintf(stderr, "xseg: %s\n", xseg_torch_last_error());
  xseg_torch_clear_error();
}

int filter_call(void *ctx, xseg_torch::Stream stream) noexcept {
  try {
    return (*static_cast<xseg_torch::StreamFilter *>(ctx))(stream) ? 1 : 0;
  } catch (...) {
    filter_failure = std::current_exception();
    return -1;
  }
}

void filter_free(void *ctx) noexcept {
  delete static_cast<xseg_torch::StreamFilter *>(ctx);
}

}  // namespace

void *xseg_torch_cxx_malloc(size_t size, int device, xseg_torch::Stream s) {
  xseg_torch_clear_error();
  void *p = xseg_torch_malloc(static_cast<ssize_t>(size), device, s);
  if (p == nullptr) {
    throw_kept();
    throw xseg_torch::Error("xseg: xseg_torch_malloc returned NULL and kept "
                            "no failure");
  }
  return p;
}

void xseg_torch_cxx_free(void *ptr, size_t size, int device,
                         xseg_torch::Stream s) {
  /* xseg_torch_free reports its own failures on stderr. */
  xseg_torch_free(ptr, static_cast<ssize_t>(size), device, s);
  xseg_torch_clear_error();
}

void xseg_torch_cxx_record_stream(void *ptr, xseg_torch::Stream s) {
  xseg_torch_clear_error();
  xseg_torch_record_stream(ptr, s);
  if (xseg_torch_last_status() == XSEG_ERR_UNKNOWN_POINTER)
    xseg_torch_clear_error();
  throw_kept();
}

/* As PyTorch's emptyCache: waits for the work that guards free memory (its
   events, not whole streams), then unmaps every whole free granule. During
   a capture xseg may not wait; it then releases what is already safe, or,
   before the capture's pool has allocated (xseg cannot see the capture
   yet), nothing, and throws, as PyTorch's own allocator does
   (xseg_torch_empty_cache_device). */
void xseg_torch_cxx_empty_cache() {
  xseg_torch_clear_error();
  for (int d = 0; d < xseg_torch_device_limit(); d++) {
    if (!xseg_torch_has_allocator(d)) continue;
    xseg_status st = xseg_torch_empty_cache_device(d, 1);
    if (st != XSEG_OK)
      throw xseg_torch::Error(std::string("xseg: empty_cache of device ") +
                              std::to_string(d) + ": " + xseg_last_error());
  }
}

void xseg_torch_cxx_set_memory_fraction(double fraction, int device) {
  xseg_torch_clear_error();
  xseg_torch_set_memory_fraction(fraction, device);
  throw_kept();
}

void xseg_torch_cxx_init(int device_count) {
  xseg_torch_clear_error();
  xseg_torch_init(device_count);
  throw_kept();
}

void xseg_torch_cxx_begin_allocate_to_pool(int device, xseg_torch::MempoolId id,
                                           xseg_torch::StreamFilter filter) {
  xseg_torch_clear_error();
  if (filter)   /* the pool owns its copy until the end */
    xseg_torch_begin_allocate_to_pool_if(
        device, id.first, id.second, filter_call,
        new xseg_torch::StreamFilter(std::move(filter)), filter_free);
  else          /* claims no stream */
    xseg_torch_begin_allocate_to_pool_if(device, id.first, id.second, nullptr,
                                         nullptr, nullptr);
  throw_kept();
}

void xseg_torch_cxx_end_allocate_to_pool(int device, xseg_torch::MempoolId id) {
  xseg_torch_clear_error();
  xseg_torch_end_allocate_to_pool(device, id.first, id.second);
  throw_kept();
}

void xseg_torch_cxx_release_pool(int device, xseg_torch::MempoolId id) {
  xseg_torch_clear_error();
  xseg_torch_release_pool(device, id.first, id.second);
  report_kept();
}

void xseg_torch_cxx_set_oom_thrower(xseg_torch_oom_thrower t) {
  oom_thrower.store(t);
}

const char *xseg_torch_cxx_last_oom(void) { return last_oom.c_str(); }
