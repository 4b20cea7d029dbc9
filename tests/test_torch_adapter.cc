/* libxseg_torch.so called the way PyTorch's CUDAPluggableAllocator calls a
 * pluggable allocator (torch/csrc/cuda/CUDAPluggableAllocator.cpp and the
 * _CUDAPluggableAllocator setters of torch/csrc/cuda/Module.cpp): each hook
 * is an address turned into a std::function of PyTorch's function type,
 * MempoolId_t is a std::pair passed by value, the pool's stream filter a
 * std::function, and a failure an exception that must reach the caller
 * through PyTorch's frames, from any thread. On the emulator: a recorded
 * stream really delays reuse (held by a latch), a capture's blocks stay out
 * of the cache, releasing a pool returns its memory, out of memory throws
 * with PyTorch's message and xseg's diagnosis.
 */
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "alloc/torch.h"
#include "xseg_test.h"
#include "xseg_torch.h"

namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;
constexpr size_t SIZE = 3 * MiB;

using cudaStream_t = CUstream;
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;

/* The calling convention the adapter relies on (xseg_torch.h): the pair is
   trivially copyable and destructible, so it travels in two registers; the
   std::function is not, so it travels by address. */
static_assert(std::is_trivially_copy_constructible<MempoolId_t>::value &&
                  std::is_trivially_destructible<MempoolId_t>::value &&
                  sizeof(MempoolId_t) == 16,
              "MempoolId_t is passed in two integer registers");
static_assert(!std::is_trivially_copy_constructible<
                  std::function<bool(cudaStream_t)>>::value,
              "the stream filter is passed by invisible reference");

/* What Module.cpp does with the int each setter receives. */
template <typename F>
std::function<F> hook(void *address) {
  auto as_int = reinterpret_cast<std::uint64_t>(address);
  return reinterpret_cast<F *>(as_int);
}

/* The members and the null checks of CUDAPluggableAllocator. */
struct Pluggable {
  std::function<void *(size_t, int, cudaStream_t)> alloc_fn_ =
      hook<void *(size_t, int, cudaStream_t)>(
          reinterpret_cast<void *>(xseg_torch_cxx_malloc));
  std::function<void(void *, size_t, int, cudaStream_t)> free_fn_ =
      hook<void(void *, size_t, int, cudaStream_t)>(
          reinterpret_cast<void *>(xseg_torch_cxx_free));
  std::function<void(int)> init_fn_ =
      hook<void(int)>(reinterpret_cast<void *>(xseg_torch_cxx_init));
  std::function<void()> reset_fn_ =
      hook<void()>(reinterpret_cast<void *>(xseg_torch_cxx_empty_cache));
  std::function<void(double, int)> memory_fraction_fn_ =
      hook<void(double, int)>(
          reinterpret_cast<void *>(xseg_torch_cxx_set_memory_fraction));
  std::function<void(void *, cudaStream_t)> record_stream_fn_ =
      hook<void(void *, cudaStream_t)>(
          reinterpret_cast<void *>(xseg_torch_cxx_record_stream));
  std::function<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)>
      begin_allocate_to_pool_fn_ =
          hook<void(int, MempoolId_t, std::function<bool(cudaStream_t)>)>(
              reinterpret_cast<void *>(xseg_torch_cxx_begin_allocate_to_pool));
  std::function<void(int, MempoolId_t)> end_allocate_to_pool_fn_ =
      hook<void(int, MempoolId_t)>(
          reinterpret_cast<void *>(xseg_torch_cxx_end_allocate_to_pool));
  std::function<void(int, MempoolId_t)> relase_pool_fn_ =
      hook<void(int, MempoolId_t)>(
          reinterpret_cast<void *>(xseg_torch_cxx_release_pool));

  void *malloc(size_t size, int device, cudaStream_t stream) {
    return alloc_fn_(size, device, stream);
  }
  void raw_delete(void *p, size_t size, int device, cudaStream_t stream) {
    free_fn_(p, size, device, stream);
  }
  void init(int n) {
    if (init_fn_) init_fn_(n);
  }
  void emptyCache() {
    if (reset_fn_) reset_fn_();
  }
  void recordStream(void *p, cudaStream_t s) {
    if (record_stream_fn_) record_stream_fn_(p, s);
  }
  void beginAllocateToPool(int device, MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) {
    if (begin_allocate_to_pool_fn_)
      begin_allocate_to_pool_fn_(device, id, std::move(filter));
  }
  void endAllocateToPool(int device, MempoolId_t id) {
    if (end_allocate_to_pool_fn_) end_allocate_to_pool_fn_(device, id);
  }
  void releasePool(int device, MempoolId_t id) {
    if (relase_pool_fn_) relase_pool_fn_(device, id);
  }
};

/* The entry points read XSEG_ALLOC_CONF: point it at the tests' driver. */
void adapter_setup(const char *extra = "") {
  const char *drv = getenv("XSEG_TEST_DRIVER");
  bool sim = drv == nullptr || strcmp(drv, "system") != 0;
  std::string conf = sim ? "xseg_driver:sim" : "";
  if (extra[0] != '\0') conf += (conf.empty() ? "" : ",") + std::string(extra);
  setenv("XSEG_ALLOC_CONF", conf.c_str(), 1);
  xseg_torch_clear_error();
}

xseg_stats adapter_stats() {
  xseg_stats s;
  memset(&s, 0, sizeof s);
  xseg_get_stats(xseg_torch_allocator(0), &s);
  return s;
}

CUstream stream_new() {
  CUstream s = nullptr;
  XSEG_EXPECT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

CUdeviceptr dptr(void *p) { return (CUdeviceptr)(uintptr_t)p; }

bool bytes_are(void *p, size_t n, unsigned char v) {
  std::vector<unsigned char> buf(n);
  if (cuMemcpyDtoH(buf.data(), dptr(p), n) != CUDA_SUCCESS) return false;
  for (unsigned char b : buf)
    if (b != v) return false;
  return true;
}

/* PyTorch's graph filter (CUDAGraph::capture_begin): the stream is in this
   capture. */
std::function<bool(cudaStream_t)> capture_filter(cuuint64_t capture_id) {
  return [capture_id](cudaStream_t s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (cuStreamGetCaptureInfo(s, &status, &id, nullptr, nullptr, nullptr,
                               nullptr) != CUDA_SUCCESS)
      throw std::runtime_error("cudaStreamGetCaptureInfo failed");
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE && id == capture_id;
  };
}

}  // namespace

XSEG_TEST(torch_adapter, record_stream_holds_the_block_until_the_stream_is_done) {
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  adapter_setup();
  Pluggable torch;
  torch.init(1);
  CUstream producer = stream_new(), consumer = stream_new();
  void *p = torch.malloc(SIZE, 0, producer);
  XSEG_ASSERT_CU(cuMemsetD8Async(dptr(p), 0x11, SIZE, producer));
  XSEG_ASSERT_CU(cuStreamSynchronize(producer));
  /* The consumer is held; the work queued behind the latch reads p. */
  xt_latch *l = xt_latch_new();
  XSEG_ASSERT_CU(xt_latch_hold(consumer, l));
  std::vector<unsigned char> seen(SIZE);
  XSEG_ASSERT_CU(cuMemcpyDtoHAsync(seen.data(), dptr(p), SIZE, consumer));
  torch.recordStream(p, consumer);
  torch.raw_delete(p, SIZE, 0, producer);
  XSEG_EXPECT_EQ(adapter_stats().pending_free_bytes, SIZE);
  /* The producer allocates again and overwrites what it gets at once. */
  void *q = torch.malloc(SIZE, 0, producer);
  XSEG_EXPECT_TRUE((char *)q + SIZE <= (char *)p || (char *)p + SIZE <= (char *)q);
  XSEG_ASSERT_CU(cuMemsetD8Async(dptr(q), 0x22, SIZE, producer));
  XSEG_ASSERT_CU(cuStreamSynchronize(producer));
  xseg_torch_empty_cache();   /* at once: keeps the pending block's granules */
  XSEG_EXPECT_GE(adapter_stats().reserved_bytes.current, 2 * SIZE);
  xt_latch_open(l);
  XSEG_ASSERT_CU(cuStreamSynchronize(consumer));
  xt_latch_free(l);
  bool intact = true;
  for (unsigned char b : seen) intact = intact && b == 0x11;
  XSEG_EXPECT_TRUE(intact);   /* the consumer read the producer's bytes */
  /* A pointer xseg never gave out is ignored, as PyTorch ignores memory
     its allocator did not make. */
  int not_ours = 0;
  torch.recordStream(&not_ours, consumer);
  torch.raw_delete(q, SIZE, 0, producer);
  torch.emptyCache();     /* PyTorch's: waits for the guarding work */
  XSEG_EXPECT_EQ(adapter_stats().pending_free_bytes, 0);
  XSEG_EXPECT_EQ(adapter_stats().reserved_bytes.current, 0);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  cuStreamDestroy(producer);
  cuStreamDestroy(consumer);
  xs_torch_destroy_all();
}

XSEG_TEST(torch_adapter, graph_pool_takes_only_the_capturing_streams) {
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  adapter_setup();
  Pluggable torch;
  CUstream s = stream_new(), other = stream_new();
  /* A cached block of s: a capture must not be handed it. */
  void *cached = torch.malloc(SIZE, 0, s);
  torch.raw_delete(cached, SIZE, 0, s);
  XSEG_ASSERT_CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus status;
  cuuint64_t capture_id = 0;
  XSEG_ASSERT_CU(cuStreamGetCaptureInfo(s, &status, &capture_id, nullptr,
                                        nullptr, nullptr, nullptr));
  MempoolId_t pool{capture_id, 0};
  torch.beginAllocateToPool(0, pool, capture_filter(capture_id));
  void *in_pool = torch.malloc(SIZE, 0, s);
  XSEG_EXPECT_TRUE(in_pool != cached);
  XSEG_ASSERT_CU(cuMemsetD8Async(dptr(in_pool), 0x5A, SIZE, s));
  /* A stream outside the capture allocates as before, not from the pool. */
  void *outside = torch.malloc(SIZE, 0, other);
  CUgraph g = nullptr;
  XSEG_ASSERT_CU(cuStreamEndCapture(s, &g));
  torch.endAllocateToPool(0, pool);
  /* The graph's block, freed, stays the graph's while the pool lives. */
  torch.raw_delete(in_pool, SIZE, 0, s);
  void *after = torch.malloc(SIZE, 0, s);
  XSEG_EXPECT_TRUE(after != in_pool);
  CUgraphExec x = nullptr;
  XSEG_ASSERT_CU(cuGraphInstantiate(&x, g, 0));
  XSEG_ASSERT_CU(cuGraphLaunch(x, s));
  XSEG_ASSERT_CU(cuStreamSynchronize(s));
  XSEG_EXPECT_TRUE(bytes_are(in_pool, SIZE, 0x5A));   /* replayed there */
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  /* Releasing the pool returns its memory: empty_cache unmaps it. */
  cuGraphExecDestroy(x);
  cuGraphDestroy(g);
  int64_t before = adapter_stats().reserved_bytes.current;
  torch.releasePool(0, pool);
  torch.emptyCache();
  int64_t reserved = adapter_stats().reserved_bytes.current;
  XSEG_EXPECT_LE(reserved, before - (int64_t)SIZE);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  torch.raw_delete(after, SIZE, 0, s);
  torch.raw_delete(outside, SIZE, 0, other);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  cuStreamDestroy(s);
  cuStreamDestroy(other);
  xs_torch_destroy_all();
}

XSEG_TEST(torch_adapter, shared_pool_is_released_by_its_last_user) {
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  adapter_setup();
  Pluggable torch;
  CUstream s = stream_new();
  MempoolId_t pool{0, 3};   /* graph_pool_handle(): shared by two graphs */
  auto only_s = [s](cudaStream_t t) { return t == s; };
  void *blocks[2];
  for (void *&b : blocks) {
    torch.beginAllocateToPool(0, pool, only_s);
    b = torch.malloc(SIZE, 0, s);
    torch.endAllocateToPool(0, pool);
    torch.raw_delete(b, SIZE, 0, s);
  }
  XSEG_EXPECT_TRUE(blocks[1] == blocks[0]);   /* the pool's own reuse */
  torch.releasePool(0, pool);    /* one graph gone: the other still uses it */
  torch.emptyCache();
  XSEG_EXPECT_GE(adapter_stats().reserved_bytes.current, SIZE);
  torch.releasePool(0, pool);
  torch.emptyCache();
  XSEG_EXPECT_EQ(adapter_stats().reserved_bytes.current, 0);
  /* A pool nothing was allocated to releases nothing, and fails nothing. */
  torch.beginAllocateToPool(0, {9, 0}, only_s);
  torch.endAllocateToPool(0, {9, 0});
  torch.releasePool(0, {9, 0});
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  /* Ending a pool never begun throws, naming it. */
  try {
    torch.endAllocateToPool(0, {5, 6});
    XSEG_FAIL("ending a pool that was never begun threw nothing");
  } catch (const xseg_torch::Error &e) {
    XSEG_EXPECT_TRUE(strstr(e.what(), "pool (5, 6)") != nullptr);
  }
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  cuStreamDestroy(s);
  xs_torch_destroy_all();
}

XSEG_TEST(torch_adapter, out_of_memory_throws_at_the_failing_call) {
  if (xt_have_sim()) xsim_set_device_memory(0, 1 * GiB);
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  if (xt_have_sim()) {
    adapter_setup();
  } else {   /* a GPU: a cap a MiB above 1 GiB stands for the device */
    CUdevice dev;
    size_t total = 0;
    XSEG_ASSERT_CU(cuDeviceGet(&dev, 0));
    XSEG_ASSERT_CU(cuDeviceTotalMem(&total, dev));
    adapter_setup(("xseg_memory_fraction:" +
                   std::to_string(((double)GiB + (double)MiB) / (double)total))
                      .c_str());
  }
  Pluggable torch;
  void *p = torch.malloc(512 * MiB, 0, nullptr);
  std::string message;
  try {
    torch.malloc(768 * MiB, 0, nullptr);
  } catch (const xseg_torch::OutOfMemoryError &e) {
    message = e.what();
  }
  XSEG_EXPECT_EQ(message.rfind("CUDA out of memory. Tried to allocate "
                               "768.00 MiB", 0), 0);
  XSEG_EXPECT_TRUE(message.find("is free") != std::string::npos);
  XSEG_EXPECT_TRUE(message.find("may map at most") != std::string::npos);
  XSEG_EXPECT_STREQ(xseg_torch_cxx_last_oom(), message.c_str());
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");   /* thrown, not kept */

  /* From another thread (autograd's engine runs backward on its own):
     caught there as an exception_ptr and thrown again to the caller. */
  std::exception_ptr from_worker;
  std::thread worker([&] {
    try {
      torch.malloc(900 * MiB, 0, nullptr);
    } catch (...) {
      from_worker = std::current_exception();
    }
  });
  worker.join();
  bool rethrown = false;
  try {
    if (from_worker) std::rethrow_exception(from_worker);
  } catch (const xseg_torch::OutOfMemoryError &e) {
    rethrown = strstr(e.what(), "Tried to allocate 900.00 MiB") != nullptr;
  }
  XSEG_EXPECT_TRUE(rethrown);

  /* A thrower (python/xseg_torch_oom.cc throws c10::OutOfMemoryError)
     replaces the type; the message is the same. */
  struct TorchOom : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  xseg_torch_cxx_set_oom_thrower([](const char *m) { throw TorchOom(m); });
  bool replaced = false;
  try {
    torch.malloc(768 * MiB, 0, nullptr);
  } catch (const TorchOom &e) {
    replaced = strncmp(e.what(), "CUDA out of memory.", 19) == 0;
  }
  xseg_torch_cxx_set_oom_thrower(nullptr);
  XSEG_EXPECT_TRUE(replaced);

  /* The program goes on: a smaller request fits, nothing was lost. */
  void *q = torch.malloc(256 * MiB, 0, nullptr);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  XSEG_EXPECT_EQ(adapter_stats().num_ooms, 3);
  torch.raw_delete(q, 256 * MiB, 0, nullptr);
  torch.raw_delete(p, 512 * MiB, 0, nullptr);
  xs_torch_destroy_all();
}

XSEG_TEST(torch_adapter, other_failures_throw_with_their_cause) {
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  adapter_setup();
  Pluggable torch;
  torch.init(2);
  auto throws = [](const std::function<void()> &call, const char *part) {
    try {
      call();
    } catch (const xseg_torch::Error &e) {
      return strstr(e.what(), part) != nullptr;
    }
    return false;
  };
  XSEG_EXPECT_TRUE(throws([&] { torch.malloc(4096, 2, nullptr); },
                          "device 2 is not in [0, 2)"));
  XSEG_EXPECT_TRUE(throws([&] { torch.memory_fraction_fn_(1.5, 0); },
                          "XSEG_ERR_INVALID_ARGUMENT"));
  XSEG_EXPECT_TRUE(throws([&] { torch.init(1000); }, "1000 devices"));
  /* A filter that throws: its exception reaches the allocation's caller. */
  CUstream s = stream_new();
  torch.beginAllocateToPool(0, {4, 0}, [](cudaStream_t) -> bool {
    throw std::logic_error("filter broke");
  });
  bool filter_error = false;
  try {
    torch.malloc(4096, 0, s);
  } catch (const std::logic_error &e) {
    filter_error = strcmp(e.what(), "filter broke") == 0;
  }
  XSEG_EXPECT_TRUE(filter_error);
  torch.endAllocateToPool(0, {4, 0});
  torch.releasePool(0, {4, 0});
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  XSEG_EXPECT_EQ(adapter_stats().allocation.current, 0);
  cuStreamDestroy(s);
  xs_torch_destroy_all();
}

/* While a pool is open every allocation asks its filter: threads on other
   streams and one on the claimed stream at once (TSan watches the pool
   table and the filter's copy). */
XSEG_TEST(torch_adapter, threads_allocate_while_a_pool_is_open) {
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  adapter_setup();
  Pluggable torch;
  enum { THREADS = 4, ROUNDS = 200 };
  CUstream streams[THREADS];
  for (CUstream &s : streams) s = stream_new();
  CUstream claimed = streams[0];
  torch.beginAllocateToPool(0, {0, 11},
                            [claimed](cudaStream_t t) { return t == claimed; });
  std::vector<void *> last(THREADS);
  std::vector<std::thread> threads;
  for (int i = 0; i < THREADS; i++)
    threads.emplace_back([&, i] {
      for (int r = 0; r < ROUNDS; r++) {
        void *p = torch.malloc(4096 * (1 + r % 7), 0, streams[i]);
        if (r + 1 < ROUNDS) torch.raw_delete(p, 0, 0, streams[i]);
        else last[i] = p;     /* the last one stays live */
      }
    });
  for (std::thread &t : threads) t.join();
  torch.endAllocateToPool(0, {0, 11});
  XSEG_EXPECT_EQ(adapter_stats().allocation.current, THREADS);
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  for (int i = 0; i < THREADS; i++) torch.raw_delete(last[i], 0, 0, streams[i]);
  torch.releasePool(0, {0, 11});
  torch.emptyCache();
  XSEG_EXPECT_EQ(adapter_stats().reserved_bytes.current, 0);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  for (CUstream s : streams) cuStreamDestroy(s);
  xs_torch_destroy_all();
}

/* torch/csrc/cuda/Module.cpp's _cuda_beginAllocateCurrentThreadToPool, as
   torch.cuda.use_mem_pool calls it: the filter claims the calling thread,
   whatever the stream. */
static std::function<bool(cudaStream_t)> thread_filter(
    std::atomic<int> *others) {
  auto tid = std::this_thread::get_id();
  return [tid, others](cudaStream_t) {
    auto current_tid = std::this_thread::get_id();
    if (current_tid != tid) ++*others;
    return current_tid == tid;
  };
}

/* The end of a case on stream s whose pools were released: empty_cache
   unmaps everything, nothing failed, and the allocator goes. */
static void expect_all_given_back(Pluggable &torch, CUstream s) {
  torch.emptyCache();
  XSEG_EXPECT_EQ(adapter_stats().reserved_bytes.current, 0);
  XSEG_EXPECT_STREQ(xseg_torch_last_error(), "");
  XSEG_EXPECT_OK(xseg_check(xseg_torch_allocator(0)));
  cuStreamDestroy(s);
  xs_torch_destroy_all();
}

/* A pool of one thread (use_mem_pool), on the stream other threads use too:
   each allocation asks the filter, as PyTorch's allocator does, so another
   thread's allocation on that stream comes from the stream's own pools,
   not the pool (freed, the next allocation on the stream takes it back),
   though the stream was announced to the pool by the first. */
XSEG_TEST(torch_adapter, thread_pool_takes_only_its_threads_allocations) {
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  adapter_setup();
  Pluggable torch;
  CUstream s = stream_new();
  MempoolId_t pool{0, 13};
  std::atomic<int> others{0};
  torch.beginAllocateToPool(0, pool, thread_filter(&others));
  void *mine = torch.malloc(SIZE, 0, s);
  void *theirs = nullptr;
  std::thread([&] { theirs = torch.malloc(SIZE, 0, s); }).join();
  torch.endAllocateToPool(0, pool);
  XSEG_ASSERT_TRUE(mine != nullptr && theirs != nullptr);
  XSEG_EXPECT_GE(others.load(), 1);
  torch.raw_delete(mine, SIZE, 0, s);
  torch.raw_delete(theirs, SIZE, 0, s);
  void *again = torch.malloc(SIZE, 0, s);
  XSEG_EXPECT_TRUE(again == theirs);       /* the stream's own block */
  torch.raw_delete(again, SIZE, 0, s);
  torch.releasePool(0, pool);
  expect_all_given_back(torch, s);
}

/* Two threads, each in a pool of its own, on one stream: the second
   thread's allocation comes from its pool, though the stream is announced
   to the first's, and neither pool's blocks go to the other or to the
   stream. */
XSEG_TEST(torch_adapter, two_thread_pools_on_one_stream_stay_apart) {
  XSEG_ASSERT_TRUE(xt_context(0) != nullptr);
  adapter_setup();
  Pluggable torch;
  CUstream s = stream_new();
  MempoolId_t first{0, 14}, second{0, 15};
  std::atomic<int> others{0};
  torch.beginAllocateToPool(0, first, thread_filter(&others));
  void *x = torch.malloc(SIZE, 0, s);
  torch.raw_delete(x, SIZE, 0, s);           /* free in the first pool */
  void *y = nullptr;
  std::thread([&] {
    torch.beginAllocateToPool(0, second, thread_filter(&others));
    y = torch.malloc(SIZE, 0, s);
    torch.endAllocateToPool(0, second);
  }).join();
  torch.endAllocateToPool(0, first);
  XSEG_ASSERT_TRUE(x != nullptr && y != nullptr);
  XSEG_EXPECT_TRUE(y != x);
  void *plain = torch.malloc(SIZE, 0, s);
  XSEG_EXPECT_TRUE(plain != x && plain != y);
  torch.raw_delete(y, SIZE, 0, s);
  torch.raw_delete(plain, SIZE, 0, s);
  torch.releasePool(0, first);
  torch.releasePool(0, second);
  expect_all_given_back(torch, s);
}
