/* sim_device.c: initialization, devices, contexts, error names and the
 * driver's entry-point lookup.
 *
 * Contexts are never heap pointers the caller could outlive: the primary
 * context of each device lives in a static array, and contexts made by
 * cuCtxCreate come from a static pool whose slots are reused round-robin, so
 * a stale CUcontext still points at readable memory and reports
 * CUDA_ERROR_CONTEXT_IS_DESTROYED instead of crashing (cuda.h, cuCtxDestroy:
 * "attempting to access ctx from those threads will result in the error
 * CUDA_ERROR_CONTEXT_IS_DESTROYED"). Every CUcontext the caller passes in is
 * checked to be one of those slots before it is read.
 *
 * The current context is a per-thread stack (cuCtxPushCurrent /
 * cuCtxPopCurrent); its top is the current context.
 */
#define _GNU_SOURCE
#include "sim_internal.h"

#include <assert.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#define XSIM_CTX_POOL      64   /* contexts from cuCtxCreate alive at once */
#define XSIM_CTX_STACK_MAX 64   /* depth of a thread's context stack */
#define XSIM_DRIVER_VERSION CUDA_VERSION  /* 13000: the toolkit's cuda.h */

typedef enum xsim_ctx_state {
  XSIM_CTX_FREE = 0,   /* pool slot never used, or primary never retained */
  XSIM_CTX_LIVE,
  XSIM_CTX_DESTROYED   /* destroyed, or a primary released to refcount 0 */
} xsim_ctx_state;

/* CUcontext is `struct CUctx_st *`. Invariant: a slot is LIVE exactly while
   it may be made current; `device` and `primary` never change while LIVE. */
struct CUctx_st {
  _Atomic int state;  /* xsim_ctx_state */
  int device;
  bool primary;
  unsigned flags;
};

static struct {
  atomic_bool initialized;
  pthread_mutex_t lock;                       /* contexts and refcounts */
  struct CUctx_st primary[XSIM_MAX_DEVICES];
  unsigned primary_refs[XSIM_MAX_DEVICES];    /* retains minus releases */
  struct CUctx_st pool[XSIM_CTX_POOL];
  size_t pool_cursor;                         /* where the next search starts */
} xsim_dev = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local CUcontext xsim_stack[XSIM_CTX_STACK_MAX];
static _Thread_local int xsim_depth;

/* ---- shared with the other files --------------------------------------- */

CUresult xsim_require_init(void) {
  return atomic_load_explicit(&xsim_dev.initialized, memory_order_acquire)
             ? CUDA_SUCCESS
             : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult xsim_device_check(int device) {
  return device >= 0 && device < xsim_knob_device_count()
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_DEVICE;
}

static CUcontext xsim_ctx_top(void) {
  return xsim_depth > 0 ? xsim_stack[xsim_depth - 1] : NULL;
}

static bool xsim_ctx_live(CUcontext c) {
  return atomic_load_explicit(&c->state, memory_order_acquire) == XSIM_CTX_LIVE;
}

CUcontext xsim_ctx_current(void) { return xsim_ctx_top(); }

CUresult xsim_current_device(int *device) {
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  CUcontext c = xsim_ctx_top();
  if (c == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (!xsim_ctx_live(c)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *device = c->device;
  return CUDA_SUCCESS;
}

/* ---- error names and strings ------------------------------------------- */

/* Every CUresult of the toolkit's cuda.h, in its order. The strings are short
   phrases in the style of the real driver's, not guaranteed to equal its
   text. */
#define XSIM_ERRORS(X)                                                         \
  X(CUDA_SUCCESS, "no error")                                                 \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                             \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                       \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                         \
  X(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled")                        \
  X(CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized")          \
  X(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started")          \
  X(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped")          \
  X(CUDA_ERROR_STUB_LIBRARY, "stub library")                                  \
  X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "call requires newer driver")      \
  X(CUDA_ERROR_DEVICE_UNAVAILABLE, "device unavailable")                      \
  X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")               \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                      \
  X(CUDA_ERROR_DEVICE_NOT_LICENSED, "device not licensed")                    \
  X(CUDA_ERROR_INVALID_IMAGE, "invalid image")                                \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                     \
  X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")            \
  X(CUDA_ERROR_MAP_FAILED, "map failed")                                      \
  X(CUDA_ERROR_UNMAP_FAILED, "unmap failed")                                  \
  X(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped")                            \
  X(CUDA_ERROR_ALREADY_MAPPED, "already mapped")                              \
  X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no binary for gpu")                        \
  X(CUDA_ERROR_ALREADY_ACQUIRED, "already acquired")                          \
  X(CUDA_ERROR_NOT_MAPPED, "not mapped")                                      \
  X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "not mapped as array")                    \
  X(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "not mapped as pointer")                \
  X(CUDA_ERROR_ECC_UNCORRECTABLE, "ecc uncorrectable")                        \
  X(CUDA_ERROR_UNSUPPORTED_LIMIT, "unsupported limit")                        \
  X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use")              \
  X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access unsupported")            \
  X(CUDA_ERROR_INVALID_PTX, "invalid ptx")                                    \
  X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid graphics context")          \
  X(CUDA_ERROR_NVLINK_UNCORRECTABLE, "nvlink uncorrectable")                  \
  X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "jit compiler not found")              \
  X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "unsupported ptx version")            \
  X(CUDA_ERROR_JIT_COMPILATION_DISABLED, "jit compilation disabled")          \
  X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "unsupported exec affinity")        \
  X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "unsupported devside sync")          \
  X(CUDA_ERROR_CONTAINED, "contained")                                        \
  X(CUDA_ERROR_INVALID_SOURCE, "invalid source")                              \
  X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                              \
  X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,                                \
    "shared object symbol not found")                                         \
  X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object init failed")        \
  X(CUDA_ERROR_OPERATING_SYSTEM, "operating system")                          \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                     \
  X(CUDA_ERROR_ILLEGAL_STATE,                                                 \
    "the operation cannot be performed in the present state")                 \
  X(CUDA_ERROR_LOSSY_QUERY, "lossy query")                                    \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                           \
  X(CUDA_ERROR_NOT_READY, "device not ready")                                 \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")   \
  X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "launch out of resources")            \
  X(CUDA_ERROR_LAUNCH_TIMEOUT, "launch timeout")                              \
  X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING,                                 \
    "launch incompatible texturing")                                          \
  X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access already enabled")    \
  X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access not enabled")            \
  X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active")              \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                  \
  X(CUDA_ERROR_ASSERT, "assert")                                              \
  X(CUDA_ERROR_TOO_MANY_PEERS, "too many peers")                              \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,                                \
    "host memory already registered")                                         \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "host memory not registered")      \
  X(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error")                  \
  X(CUDA_ERROR_ILLEGAL_INSTRUCTION, "illegal instruction")                    \
  X(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")                      \
  X(CUDA_ERROR_INVALID_ADDRESS_SPACE, "invalid address space")                \
  X(CUDA_ERROR_INVALID_PC, "invalid pc")                                      \
  X(CUDA_ERROR_LAUNCH_FAILED, "launch failed")                                \
  X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "cooperative launch too large")  \
  X(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory leak")                      \
  X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                      \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                      \
  X(CUDA_ERROR_SYSTEM_NOT_READY, "system not ready")                          \
  X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system driver mismatch")              \
  X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,                                \
    "compat not supported on device")                                         \
  X(CUDA_ERROR_MPS_CONNECTION_FAILED, "mps connection failed")                \
  X(CUDA_ERROR_MPS_RPC_FAILURE, "mps rpc failure")                            \
  X(CUDA_ERROR_MPS_SERVER_NOT_READY, "mps server not ready")                  \
  X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "mps max clients reached")            \
  X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "mps max connections reached")    \
  X(CUDA_ERROR_MPS_CLIENT_TERMINATED, "mps client terminated")                \
  X(CUDA_ERROR_CDP_NOT_SUPPORTED, "cdp not supported")                        \
  X(CUDA_ERROR_CDP_VERSION_MISMATCH, "cdp version mismatch")                  \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,                                    \
    "operation not permitted when stream is capturing")                       \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                    \
    "operation failed due to a previous error during capture")                \
  X(CUDA_ERROR_STREAM_CAPTURE_MERGE, "stream capture merge")                  \
  X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "stream capture unmatched")          \
  X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "stream capture unjoined")            \
  X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "stream capture isolation")          \
  X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "stream capture implicit")            \
  X(CUDA_ERROR_CAPTURED_EVENT, "captured event")                              \
  X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "stream capture wrong thread")    \
  X(CUDA_ERROR_TIMEOUT, "timeout")                                            \
  X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "graph exec update failure")        \
  X(CUDA_ERROR_EXTERNAL_DEVICE, "external device")                            \
  X(CUDA_ERROR_INVALID_CLUSTER_SIZE, "invalid cluster size")                  \
  X(CUDA_ERROR_FUNCTION_NOT_LOADED, "function not loaded")                    \
  X(CUDA_ERROR_INVALID_RESOURCE_TYPE, "invalid resource type")                \
  X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,                                \
    "invalid resource configuration")                                         \
  X(CUDA_ERROR_KEY_ROTATION, "key rotation")                                  \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

typedef struct xsim_error {
  CUresult code;
  const char *name, *text;
} xsim_error;

static const xsim_error xsim_errors[] = {
#define XSIM_ERROR_ENTRY(code, text) {code, #code, text},
    XSIM_ERRORS(XSIM_ERROR_ENTRY)
#undef XSIM_ERROR_ENTRY
};

static const xsim_error *xsim_error_find(CUresult code) {
  for (size_t i = 0; i < sizeof xsim_errors / sizeof xsim_errors[0]; i++)
    if (xsim_errors[i].code == code) return &xsim_errors[i];
  return NULL;
}

bool xsim_error_parse(const char *name, CUresult *out) {
  for (size_t i = 0; i < sizeof xsim_errors / sizeof xsim_errors[0]; i++) {
    if (strcmp(xsim_errors[i].name, name) != 0) continue;
    *out = xsim_errors[i].code;
    return true;
  }
  return false;
}

/* cuda.h: "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE will
   be returned and *pStr will be set to the NULL address." Neither function
   needs cuInit. */
CUresult cuGetErrorName(CUresult error, const char **pStr) {
  XSIM_ENTER("cuGetErrorName");
  if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
  const xsim_error *e = xsim_error_find(error);
  *pStr = e ? e->name : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr) {
  XSIM_ENTER("cuGetErrorString");
  if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
  const xsim_error *e = xsim_error_find(error);
  *pStr = e ? e->text : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- initialization and version ---------------------------------------- */

/* cuda.h: "Currently, the Flags parameter must be 0." With no device at all
   the real driver's cuInit fails with CUDA_ERROR_NO_DEVICE; so does this one
   under XSIM_DEVICE_COUNT=0. */
CUresult cuInit(unsigned int Flags) {
  XSIM_ENTER("cuInit");
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  xsim_control_init();
  if (xsim_knob_device_count() == 0) return CUDA_ERROR_NO_DEVICE;
  atomic_store_explicit(&xsim_dev.initialized, true, memory_order_release);
  return CUDA_SUCCESS;
}

/* cuda.h: "(1000 * major + 10 * minor)"; "CUDA_ERROR_INVALID_VALUE if
   driverVersion is NULL". Needs no cuInit. */
CUresult cuDriverGetVersion(int *driverVersion) {
  XSIM_ENTER("cuDriverGetVersion");
  if (driverVersion == NULL) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = XSIM_DRIVER_VERSION;
  return CUDA_SUCCESS;
}

/* ---- devices ----------------------------------------------------------- */

/* Checks shared by the per-device queries: initialized, output, ordinal. */
static CUresult xsim_device_query_check(const void *out, CUdevice dev) {
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  return xsim_device_check(dev);
}

/* cuda.h: an ordinal "in the range [0, cuDeviceGetCount()-1]". */
CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  XSIM_ENTER("cuDeviceGet");
  CUresult r = xsim_device_query_check(device, ordinal);
  if (r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
  XSIM_ENTER("cuDeviceGetCount");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
  *count = xsim_knob_device_count();
  return CUDA_SUCCESS;
}

/* cuda.h: "name is shortened to the specified len". */
CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  XSIM_ENTER("cuDeviceGetName");
  CUresult r = xsim_device_query_check(name, dev);
  if (r != CUDA_SUCCESS) return r;
  if (len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "xsim emulated GPU (H100-like)");
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  XSIM_ENTER("cuDeviceTotalMem");
  CUresult r = xsim_device_query_check(bytes, dev);
  if (r != CUDA_SUCCESS) return r;
  *bytes = (size_t)xsim_knob_device_memory(dev);
  return CUDA_SUCCESS;
}

/* An H100 SXM5 as the emulated device; attributes absent here answer
   CUDA_ERROR_INVALID_VALUE, as the real driver does for an attribute it does
   not know. Features the emulator lacks (memory pools, fabric handles,
   multicast) report 0. */
typedef struct xsim_attr { CUdevice_attribute attr; int value; } xsim_attr;

static const xsim_attr xsim_attrs[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0},
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
    {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
    {CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 2},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0},
    {CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0},
    {CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0},
    {CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED, 0},
};

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                              CUdevice dev) {
  XSIM_ENTER("cuDeviceGetAttribute");
  CUresult r = xsim_device_query_check(pi, dev);
  if (r != CUDA_SUCCESS) return r;
  if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
    *pi = dev + 1;  /* distinct per device, as on a multi-GPU host */
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < sizeof xsim_attrs / sizeof xsim_attrs[0]; i++) {
    if (xsim_attrs[i].attr != attrib) continue;
    *pi = xsim_attrs[i].value;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

/* ---- contexts ---------------------------------------------------------- */

/* Whether c is one of our context slots: checked before c is read. */
static bool xsim_ctx_known(CUcontext c) {
  uintptr_t p = (uintptr_t)c;
  uintptr_t pb = (uintptr_t)xsim_dev.primary, qb = (uintptr_t)xsim_dev.pool;
  bool in_primary = p >= pb && p < pb + sizeof xsim_dev.primary &&
                    (p - pb) % sizeof *c == 0;
  bool in_pool = p >= qb && p < qb + sizeof xsim_dev.pool &&
                 (p - qb) % sizeof *c == 0;
  return in_primary || in_pool;
}

/* cuda.h (cuDevicePrimaryCtxRetain): retains the one primary context of dev,
   creating it on first use; each retain is paired with a release. */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  XSIM_ENTER("cuDevicePrimaryCtxRetain");
  CUresult r = xsim_device_query_check(pctx, dev);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&xsim_dev.lock);
  CUcontext c = &xsim_dev.primary[dev];
  if (xsim_dev.primary_refs[dev]++ == 0) {
    c->device = dev;
    c->primary = true;
    atomic_store_explicit(&c->state, XSIM_CTX_LIVE, memory_order_release);
  }
  pthread_mutex_unlock(&xsim_dev.lock);
  *pctx = c;
  return CUDA_SUCCESS;
}

/* cuda.h: "Releasing a primary context that has not been previously retained
   will fail with CUDA_ERROR_INVALID_CONTEXT"; the context "is automatically
   reset once the last reference to it is released" (it stays on any thread's
   stack, where using it reports CUDA_ERROR_CONTEXT_IS_DESTROYED). */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  XSIM_ENTER("cuDevicePrimaryCtxRelease");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if ((r = xsim_device_check(dev)) != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&xsim_dev.lock);
  if (xsim_dev.primary_refs[dev] == 0) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else if (--xsim_dev.primary_refs[dev] == 0) {
    atomic_store_explicit(&xsim_dev.primary[dev].state, XSIM_CTX_DESTROYED,
                          memory_order_release);
  }
  pthread_mutex_unlock(&xsim_dev.lock);
  return r;
}

static CUresult xsim_stack_push(CUcontext c) {
  if (xsim_depth == XSIM_CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
  xsim_stack[xsim_depth++] = c;
  return CUDA_SUCCESS;
}

/* A free (or destroyed) pool slot, searched round-robin from the cursor so
   that a just-destroyed context is reused last. */
static CUcontext xsim_pool_take_locked(void) {
  for (size_t i = 0; i < XSIM_CTX_POOL; i++) {
    size_t k = (xsim_dev.pool_cursor + i) % XSIM_CTX_POOL;
    CUcontext c = &xsim_dev.pool[k];
    if (xsim_ctx_live(c)) continue;
    xsim_dev.pool_cursor = (k + 1) % XSIM_CTX_POOL;
    return c;
  }
  return NULL;
}

/* cuda.h (cuCtxCreate): a new context on dev, pushed on the calling thread's
   stack. Execution-affinity and CIG parameters are not emulated:
   CUDA_ERROR_NOT_SUPPORTED, as cuda.h says for CIG on a device without it. */
CUresult cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                     unsigned int flags, CUdevice dev) {
  XSIM_ENTER("cuCtxCreate");
  CUresult r = xsim_device_query_check(pctx, dev);
  if (r != CUDA_SUCCESS) return r;
  if (flags & ~(unsigned)CU_CTX_FLAGS_MASK) return CUDA_ERROR_INVALID_VALUE;
  if (ctxCreateParams != NULL && (ctxCreateParams->numExecAffinityParams != 0 ||
                                  ctxCreateParams->cigParams != NULL))
    return CUDA_ERROR_NOT_SUPPORTED;
  if (xsim_depth == XSIM_CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&xsim_dev.lock);
  CUcontext c = xsim_pool_take_locked();
  if (c != NULL) {
    c->device = dev;
    c->primary = false;
    c->flags = flags;
    atomic_store_explicit(&c->state, XSIM_CTX_LIVE, memory_order_release);
  }
  pthread_mutex_unlock(&xsim_dev.lock);
  if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  r = xsim_stack_push(c);
  assert(r == CUDA_SUCCESS && "depth checked above");
  *pctx = c;
  return r;
}

/* cuda.h (cuCtxDestroy): "If ctx is current to the calling thread then ctx
   will also be popped from the current thread's context stack". A primary
   context is not destroyed this way (it is released):
   CUDA_ERROR_INVALID_CONTEXT. */
CUresult cuCtxDestroy(CUcontext ctx) {
  XSIM_ENTER("cuCtxDestroy");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!xsim_ctx_known(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&xsim_dev.lock);
  if (xsim_ctx_live(ctx))
    atomic_store_explicit(&ctx->state, XSIM_CTX_DESTROYED,
                          memory_order_release);
  else
    r = CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_unlock(&xsim_dev.lock);
  if (r == CUDA_SUCCESS && xsim_ctx_top() == ctx) xsim_depth--;
  return r;
}

/* A context the caller passes in must be ours and live. */
static CUresult xsim_ctx_check(CUcontext ctx) {
  return xsim_ctx_known(ctx) && xsim_ctx_live(ctx) ? CUDA_SUCCESS
                                               : CUDA_ERROR_INVALID_CONTEXT;
}

/* Checks shared by calls on a named context: initialized, a non-NULL
   argument `arg` (CUDA_ERROR_INVALID_VALUE), then xsim_ctx_check(ctx). */
static CUresult xsim_ctx_call_check(const void *arg, CUcontext ctx) {
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (arg == NULL) return CUDA_ERROR_INVALID_VALUE;
  return xsim_ctx_check(ctx);
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  XSIM_ENTER("cuCtxPushCurrent");
  CUresult r = xsim_ctx_call_check(ctx, ctx);
  return r ? r : xsim_stack_push(ctx);
}

/* cuda.h lists CUDA_ERROR_INVALID_CONTEXT: popping an empty stack. */
CUresult cuCtxPopCurrent(CUcontext *pctx) {
  XSIM_ENTER("cuCtxPopCurrent");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (xsim_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = xsim_stack[--xsim_depth];
  if (pctx != NULL) *pctx = c;
  return CUDA_SUCCESS;
}

/* cuda.h: replaces the top of the stack with ctx; NULL pops it (a no-op on
   an empty stack). */
CUresult cuCtxSetCurrent(CUcontext ctx) {
  XSIM_ENTER("cuCtxSetCurrent");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (ctx == NULL) {
    if (xsim_depth > 0) xsim_depth--;
    return CUDA_SUCCESS;
  }
  if ((r = xsim_ctx_check(ctx)) != CUDA_SUCCESS) return r;
  if (xsim_depth == 0) return xsim_stack_push(ctx);
  xsim_stack[xsim_depth - 1] = ctx;
  return CUDA_SUCCESS;
}

/* cuda.h: "If no context is bound to the calling CPU thread then *pctx is set
   to NULL and CUDA_SUCCESS is returned." */
CUresult cuCtxGetCurrent(CUcontext *pctx) {
  XSIM_ENTER("cuCtxGetCurrent");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *pctx = xsim_ctx_top();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  XSIM_ENTER("cuCtxGetDevice");
  int dev;
  CUresult r = xsim_current_device(&dev);
  if (r != CUDA_SUCCESS) return r;
  if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
  *device = dev;
  return CUDA_SUCCESS;
}

/* cuda.h (cuCtxGetDevice_v2): "If the specified context is NULL, the API will
   return the current context's device." cuGetProcAddress hands this one out
   for "cuCtxGetDevice" at cudaVersion 13000. */
CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
  XSIM_ENTER("cuCtxGetDevice");
  if (ctx == NULL) {
    int dev;
    CUresult r = xsim_current_device(&dev);
    if (r == CUDA_SUCCESS && device == NULL) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) *device = dev;
    return r;
  }
  CUresult r = xsim_ctx_call_check(device, ctx);
  if (r != CUDA_SUCCESS) return r;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

/* cuda.h (cuMemGetInfo): total is the device's memory; free is what is left
   after the bytes held by live cuMemCreate handles on the current device. */
CUresult cuMemGetInfo(size_t *free, size_t *total) {
  XSIM_ENTER("cuMemGetInfo");
  int dev;
  CUresult r = xsim_current_device(&dev);
  if (r != CUDA_SUCCESS) return r;
  if (free == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
  uint64_t cap = xsim_knob_device_memory(dev);
  uint64_t used = xsim_vmm_used_bytes(dev);
  *total = (size_t)cap;
  *free = (size_t)(used < cap ? cap - used : 0);
  return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress -------------------------------------------------- */

/* Which symbol serves a base name from which CUDA version on (the versions
   of cudaTypedefs.h's PFN_<name>_v<version> typedefs). A base name with no
   entry is served by the symbol of that name. A base name whose entries all
   start after the requested version existed only in an ABI the emulator does
   not implement: CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. */
typedef struct xsim_proc {
  const char *base;
  int since;
  const char *symbol;
} xsim_proc;

static const xsim_proc xsim_procs[] = {
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuCtxCreate", 12050, "cuCtxCreate_v4"},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"},
    {"cuCtxGetDevice", 2000, "cuCtxGetDevice"},
    {"cuCtxGetDevice", 13000, "cuCtxGetDevice_v2"},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2"},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2"},
    {"cuEventElapsedTime", 2000, "cuEventElapsedTime"},
    {"cuEventElapsedTime", 12080, "cuEventElapsedTime_v2"},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2"},
    {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2"},
    {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2"},
    {"cuMemcpyDtoHAsync", 3020, "cuMemcpyDtoHAsync_v2"},
    {"cuMemsetD8", 3020, "cuMemsetD8_v2"},
    {"cuMemsetD32", 3020, "cuMemsetD32_v2"},
    {"cuMemcpyDtoD", 3020, "cuMemcpyDtoD_v2"},
    {"cuMemcpyDtoDAsync", 3020, "cuMemcpyDtoDAsync_v2"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2"},
    {"cuStreamGetCaptureInfo", 10010, "cuStreamGetCaptureInfo"},
    {"cuStreamGetCaptureInfo", 11030, "cuStreamGetCaptureInfo_v2"},
    {"cuStreamGetCaptureInfo", 12030, "cuStreamGetCaptureInfo_v3"},
    {"cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags"},
    {"cuMemAddressReserve", 10020, "cuMemAddressReserve"},
    {"cuMemAddressFree", 10020, "cuMemAddressFree"},
    {"cuMemCreate", 10020, "cuMemCreate"},
    {"cuMemRelease", 10020, "cuMemRelease"},
    {"cuMemMap", 10020, "cuMemMap"},
    {"cuMemUnmap", 10020, "cuMemUnmap"},
    {"cuMemSetAccess", 10020, "cuMemSetAccess"},
    {"cuMemGetAccess", 10020, "cuMemGetAccess"},
    {"cuMemGetAllocationGranularity", 10020, "cuMemGetAllocationGranularity"},
    {"cuMemGetAllocationPropertiesFromHandle", 10020,
     "cuMemGetAllocationPropertiesFromHandle"},
    {"cuMemExportToShareableHandle", 10020, "cuMemExportToShareableHandle"},
    {"cuMemImportFromShareableHandle", 10020,
     "cuMemImportFromShareableHandle"},
    {"cuMemRetainAllocationHandle", 11000, "cuMemRetainAllocationHandle"},
};

/* The symbol serving `base` at cudaVersion; NULL with *newer set when only
   later versions have one. */
static const char *xsim_proc_symbol(const char *base, int version,
                                    bool *newer) {
  const xsim_proc *best = NULL;
  *newer = false;
  for (size_t i = 0; i < sizeof xsim_procs / sizeof xsim_procs[0]; i++) {
    const xsim_proc *p = &xsim_procs[i];
    if (strcmp(p->base, base) != 0) continue;
    if (p->since > version) *newer = true;
    else if (best == NULL || p->since > best->since) best = p;
  }
  if (best != NULL) return best->symbol;
  return *newer ? NULL : base;
}

/* The emulator's own handle, so lookups never find another library's
   symbol. dlopen with RTLD_NOLOAD only takes a reference to ourselves. */
static void *xsim_self;
static pthread_once_t xsim_self_once = PTHREAD_ONCE_INIT;

static void xsim_self_open(void) {
  Dl_info info;
  if (dladdr((void *)&cuInit, &info) && info.dli_fname != NULL)
    xsim_self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
}

/* `symbol` as exported by this library itself, or NULL. dlsym on a library
   handle also searches its dependencies (libc exports "cuserid"), hence the
   dladdr check that the address is ours. */
static void *xsim_self_lookup(const char *symbol) {
  pthread_once(&xsim_self_once, xsim_self_open);
  if (xsim_self == NULL || strncmp(symbol, "cu", 2) != 0) return NULL;
  void *fn = dlsym(xsim_self, symbol);
  Dl_info mine, found;
  if (fn == NULL || !dladdr((void *)&cuInit, &mine) || !dladdr(fn, &found))
    return NULL;
  return mine.dli_fbase == found.dli_fbase ? fn : NULL;
}

/* cuda.h (cuGetProcAddress): "If the specified CUDA version is greater than
   the driver version, the API will return CUDA_ERROR_INVALID_VALUE"; a symbol
   not found is CUDA_SUCCESS with *pfn NULL and symbolStatus telling why.
   Per-thread-stream variants are not emulated, so every flag gets the legacy
   symbol ("If a per-thread version is not found, the API will return the
   legacy version"). Needs no cuInit: it is how a runtime finds cuInit. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags,
                          CUdriverProcAddressQueryResult *symbolStatus) {
  XSIM_ENTER("cuGetProcAddress");
  if (symbol == NULL || pfn == NULL || cudaVersion > XSIM_DRIVER_VERSION)
    return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
    return CUDA_ERROR_INVALID_VALUE;
  bool newer;
  const char *name = xsim_proc_symbol(symbol, cudaVersion, &newer);
  *pfn = name ? xsim_self_lookup(name) : NULL;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  if (*pfn == NULL)
    status = newer ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                   : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (symbolStatus != NULL) *symbolStatus = status;
  return CUDA_SUCCESS;
}
