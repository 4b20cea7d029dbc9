/* Conformance of the emulator's initialization, device, context, error-name
 * and entry-point functions (sim/sim_device.c) to the comments of the
 * toolkit's cuda.h (sections CUDA_INITIALIZE, CUDA_VERSION, CUDA_DEVICE,
 * CUDA_PRIMARY_CTX, CUDA_CTX, CUDA_ERROR, CUDA_DRIVER_ENTRY_POINT).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>

#include "sim_helpers.h"

/* cuDriverGetVersion: "(1000 * major + 10 * minor)"; "CUDA_ERROR_INVALID_VALUE
   if driverVersion is NULL". The emulator is the toolkit's version. */
XSEG_TEST(SimDevice, driver_version) {
  int v = 0;
  XSEG_EXPECT_CU(cuDriverGetVersion(&v));
  XSEG_EXPECT_GE(v, 12000);
  if (xt_have_sim()) XSEG_EXPECT_EQ(v, CUDA_VERSION);
  XSEG_EXPECT_CU_ERR(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
}

/* cuInit: "Currently, the Flags parameter must be 0." cuDeviceGet: an ordinal
   "in the range [0, cuDeviceGetCount()-1]" (else CUDA_ERROR_INVALID_DEVICE). */
XSEG_TEST(SimDevice, init_count_and_get) {
  XSEG_EXPECT_CU_ERR(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  XSEG_ASSERT_CU(cuInit(0));
  int n = 0;
  XSEG_ASSERT_CU(cuDeviceGetCount(&n));
  XSEG_ASSERT_GE(n, 1);
  CUdevice d = -1;
  XSEG_EXPECT_CU(cuDeviceGet(&d, n - 1));
  XSEG_EXPECT_EQ(d, n - 1);
  XSEG_EXPECT_CU_ERR(cuDeviceGet(&d, n), CUDA_ERROR_INVALID_DEVICE);
  XSEG_EXPECT_CU_ERR(cuDeviceGet(&d, -1), CUDA_ERROR_INVALID_DEVICE);
  XSEG_EXPECT_CU_ERR(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuDeviceGetCount(NULL), CUDA_ERROR_INVALID_VALUE);
}

/* cuDeviceGetAttribute: the attributes the allocator relies on. The emulated
   device is an H100 (compute capability 9.0) with VMM and POSIX-fd export;
   an attribute outside the enum is CUDA_ERROR_INVALID_VALUE. */
XSEG_TEST(SimDevice, attributes) {
  XSEG_ASSERT_CU(cuInit(0));
  int v = -1;
  XSEG_EXPECT_CU(cuDeviceGetAttribute(
      &v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  XSEG_EXPECT_EQ(v, 1);
  XSEG_EXPECT_CU(cuDeviceGetAttribute(
      &v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
  XSEG_EXPECT_EQ(v, 1);
  XSEG_EXPECT_CU(
      cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
  XSEG_EXPECT_EQ(v, 1);
  XSEG_EXPECT_CU(
      cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  XSEG_EXPECT_GT(v, 0);
  XSEG_EXPECT_CU_ERR(
      cuDeviceGetAttribute(&v, (CUdevice_attribute)100000, 0),
      CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 999),
                     CUDA_ERROR_INVALID_DEVICE);
  if (!xt_have_sim()) return;
  XSEG_EXPECT_CU(cuDeviceGetAttribute(
      &v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  XSEG_EXPECT_EQ(v, 9);
  XSEG_EXPECT_CU(cuDeviceGetAttribute(
      &v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0));
  XSEG_EXPECT_EQ(v, 0);
}

/* cuDeviceGetName: "name is shortened to the specified len";
   cuDeviceTotalMem: "the total amount of memory available on the device". */
XSEG_TEST(SimDevice, name_and_total_memory) {
  XSEG_ASSERT_CU(cuInit(0));
  char name[256], shortname[5];
  XSEG_EXPECT_CU(cuDeviceGetName(name, sizeof name, 0));
  XSEG_EXPECT_GT(strlen(name), 4);
  XSEG_EXPECT_CU(cuDeviceGetName(shortname, sizeof shortname, 0));
  XSEG_EXPECT_EQ(strlen(shortname), 4);
  XSEG_EXPECT_EQ(strncmp(name, shortname, 4), 0);
  size_t total = 0;
  XSEG_EXPECT_CU(cuDeviceTotalMem(&total, 0));
  XSEG_EXPECT_GT(total, 0);
  if (xt_have_sim()) XSEG_EXPECT_EQ(total, 80ull << 30);  /* docs/DESIGN.md 4 */
}

/* cuDevicePrimaryCtxRetain returns the device's one primary context;
   retains and releases pair up ("A retained context should always be
   released"). */
XSEG_TEST(SimDevice, primary_context_is_one_and_refcounted) {
  CUcontext held = xt_context(0);   /* the harness's retain stays */
  XSEG_ASSERT_TRUE(held != NULL);
  CUcontext a = NULL, b = NULL;
  XSEG_ASSERT_CU(cuDevicePrimaryCtxRetain(&a, 0));
  XSEG_ASSERT_CU(cuDevicePrimaryCtxRetain(&b, 0));
  XSEG_EXPECT_TRUE(a == held && a == b);
  XSEG_EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  XSEG_EXPECT_CU(cuDevicePrimaryCtxRelease(0));
  XSEG_EXPECT_CU_ERR(cuDevicePrimaryCtxRetain(NULL, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuDevicePrimaryCtxRelease(999), CUDA_ERROR_INVALID_DEVICE);
}

/* cuDevicePrimaryCtxRelease: "Releasing a primary context that has not been
   previously retained will fail with CUDA_ERROR_INVALID_CONTEXT." Device 1
   (two emulated, or a real second GPU) is retained by no one else in this
   process. */
XSEG_TEST(SimDevice, release_of_unretained_primary_context_fails) {
  if (xt_have_sim()) st_env("XSIM_DEVICE_COUNT", "2");
  XT_REQUIRE_DEVICES(2);
  XSEG_EXPECT_CU(cuInit(0));
  CUcontext c;
  XSEG_EXPECT_CU_ERR(cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);
  XSEG_EXPECT_CU(cuDevicePrimaryCtxRetain(&c, 1));
  XSEG_EXPECT_CU(cuDevicePrimaryCtxRelease(1));
  XSEG_EXPECT_CU_ERR(cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);
  if (xt_have_sim()) st_env("XSIM_DEVICE_COUNT", NULL);
}

/* Context stack rules, run on a fresh thread (whose stack starts empty):
   cuCtxPushCurrent / cuCtxPopCurrent ("Pops the current CUDA context"; an
   empty stack is CUDA_ERROR_INVALID_CONTEXT), cuCtxCreate pushes the new
   context, cuCtxDestroy pops it "as though cuCtxPopCurrent() were called",
   cuCtxSetCurrent replaces the top and NULL pops it. A destroyed context's
   handle is refused by the emulator only: on H100, driver 580, passing it
   again crashed the process (SIGSEGV), as cuda.h leaves it undefined. */
static void *st_stack_thread(void *arg) {
  int *bad = arg;
  CUcontext primary, made, cur, popped;
  CUdevice dev = -1;
  *bad |= cuDevicePrimaryCtxRetain(&primary, 0) != CUDA_SUCCESS;
  *bad |= (cuCtxPopCurrent(&popped) != CUDA_ERROR_INVALID_CONTEXT) << 1;
  *bad |= (cuCtxPushCurrent(primary) != CUDA_SUCCESS) << 2;
  *bad |= (cuCtxCreate(&made, NULL, 0, 0) != CUDA_SUCCESS) << 3;
  *bad |= (cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != made) << 4;
  *bad |= (cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev != 0) << 5;
  *bad |= (cuCtxDestroy(made) != CUDA_SUCCESS) << 6;
  *bad |= (cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != primary) << 7;
  if (xt_have_sim()) {   /* a stale handle: see above */
    *bad |= (cuCtxDestroy(made) != CUDA_ERROR_INVALID_CONTEXT) << 8;
    *bad |= (cuCtxSetCurrent(made) != CUDA_ERROR_INVALID_CONTEXT) << 9;
  }
  *bad |= (cuCtxPopCurrent(&popped) != CUDA_SUCCESS || popped != primary) << 10;
  *bad |= (cuCtxSetCurrent(primary) != CUDA_SUCCESS) << 11;
  *bad |= (cuCtxSetCurrent(NULL) != CUDA_SUCCESS) << 12;
  *bad |= (cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != NULL) << 13;
  *bad |= (cuDevicePrimaryCtxRelease(0) != CUDA_SUCCESS) << 14;
  return NULL;
}

XSEG_TEST(SimDevice, context_stack_push_pop_create_destroy) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);  /* keeps the primary retained */
  int bad = 0;
  pthread_t t;
  XSEG_ASSERT_EQ(pthread_create(&t, NULL, st_stack_thread, &bad), 0);
  pthread_join(t, NULL);
  XSEG_EXPECT_EQ(bad, 0);   /* bit i set: step i of st_stack_thread failed */
}

/* With no current context, calls that need one fail with
   CUDA_ERROR_INVALID_CONTEXT (cuMemGetInfo, cuCtxGetDevice list it);
   cuCtxGetCurrent: "If no context is bound to the calling CPU thread then
   *pctx is set to NULL and CUDA_SUCCESS is returned." */
static void *st_no_context_thread(void *arg) {
  int *bad = arg;
  size_t f, t;
  CUdevice d;
  CUcontext c = (CUcontext)1;
  *bad |= cuMemGetInfo(&f, &t) != CUDA_ERROR_INVALID_CONTEXT;
  *bad |= (cuCtxGetDevice(&d) != CUDA_ERROR_INVALID_CONTEXT) << 1;
  *bad |= (cuCtxGetCurrent(&c) != CUDA_SUCCESS || c != NULL) << 2;
  return NULL;
}

XSEG_TEST(SimDevice, no_context_errors) {
  XSEG_ASSERT_CU(cuInit(0));
  int bad = 0;
  pthread_t t;
  XSEG_ASSERT_EQ(pthread_create(&t, NULL, st_no_context_thread, &bad), 0);
  pthread_join(t, NULL);
  XSEG_EXPECT_EQ(bad, 0);
}

/* A fresh instance of the emulator, loaded from a private copy of the
   library so that none of this process's state (cuInit done) carries over. */
typedef struct st_fresh {
  void *lib;
  char path[64];
} st_fresh;

static bool st_fresh_open(st_fresh *f) {
  Dl_info info;
  if (!dladdr((void *)&cuInit, &info) || info.dli_fname == NULL) return false;
  snprintf(f->path, sizeof f->path, "/tmp/xsim-fresh-XXXXXX");
  int out = mkstemp(f->path), in = open(info.dli_fname, O_RDONLY);
  struct stat st;
  bool ok = out >= 0 && in >= 0 && fstat(in, &st) == 0 &&
            sendfile(out, in, NULL, (size_t)st.st_size) == st.st_size;
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  f->lib = ok ? dlopen(f->path, RTLD_NOW | RTLD_LOCAL) : NULL;
  unlink(f->path);
  return f->lib != NULL;
}

/* cuInit: "If cuInit() has not been called, any function from the driver API
   will return CUDA_ERROR_NOT_INITIALIZED." cuDriverGetVersion and the error
   names need no initialization; after cuInit the same calls that need a
   context say so instead. */
XSEG_TEST(SimDevice, not_initialized_errors) {
  XT_REQUIRE_SIM_FOR("loads a fresh copy of the emulator");
  st_fresh f;
  XSEG_ASSERT_TRUE(st_fresh_open(&f));
  CUresult (*count)(int *) = (CUresult(*)(int *))dlsym(f.lib, "cuDeviceGetCount");
  CUresult (*info)(size_t *, size_t *) =
      (CUresult(*)(size_t *, size_t *))dlsym(f.lib, "cuMemGetInfo_v2");
  CUresult (*version)(int *) =
      (CUresult(*)(int *))dlsym(f.lib, "cuDriverGetVersion");
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(f.lib, "cuInit");
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                      unsigned long long) =
      (CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                   unsigned long long))dlsym(f.lib, "cuMemAddressReserve");
  XSEG_ASSERT_TRUE(count && info && version && init && reserve);
  int n;
  size_t fr, tot;
  CUdeviceptr p;
  XSEG_EXPECT_CU_ERR(count(&n), CUDA_ERROR_NOT_INITIALIZED);
  XSEG_EXPECT_CU_ERR(info(&fr, &tot), CUDA_ERROR_NOT_INITIALIZED);
  XSEG_EXPECT_CU_ERR(reserve(&p, 2u << 20, 0, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
  XSEG_EXPECT_CU(version(&n));
  XSEG_EXPECT_CU(init(0));
  XSEG_EXPECT_CU(count(&n));
  XSEG_EXPECT_CU_ERR(info(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
  dlclose(f.lib);
}

/* cuGetErrorName / cuGetErrorString: "If the error code is not recognized,
   CUDA_ERROR_INVALID_VALUE will be returned and *pStr will be set to the NULL
   address." */
XSEG_TEST(SimDevice, error_names_and_strings) {
  const char *s = NULL;
  XSEG_EXPECT_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  XSEG_EXPECT_STREQ(s, "CUDA_ERROR_OUT_OF_MEMORY");
  XSEG_EXPECT_CU(cuGetErrorName(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, &s));
  XSEG_EXPECT_STREQ(s, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
  XSEG_EXPECT_CU(cuGetErrorName(CUDA_SUCCESS, &s));
  XSEG_EXPECT_STREQ(s, "CUDA_SUCCESS");
  XSEG_EXPECT_CU(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
  XSEG_EXPECT_TRUE(s != NULL && strlen(s) > 0);
  s = "unchanged";
  XSEG_EXPECT_CU_ERR(cuGetErrorName((CUresult)12345, &s),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_TRUE(s == NULL);
  s = "unchanged";
  XSEG_EXPECT_CU_ERR(cuGetErrorString((CUresult)12345, &s),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_TRUE(s == NULL);
}

typedef CUresult (*st_meminfo_fn)(size_t *, size_t *);

/* cuGetProcAddress: "if the specified CUDA version is greater than or equal
   to the CUDA version in which the driver symbol was introduced, this API
   will return the function pointer to the corresponding versioned function"
   (cuMemGetInfo -> cuMemGetInfo_v2 from 3.2); an unknown symbol is
   CUDA_SUCCESS with pfn NULL and CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; a
   version above the driver's is CUDA_ERROR_INVALID_VALUE. */
XSEG_TEST(SimDevice, get_proc_address_finds_versioned_names) {
  XSEG_ASSERT_TRUE(st_setup() > 0);
  void *pfn = NULL;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  XSEG_ASSERT_CU(cuGetProcAddress("cuMemGetInfo", &pfn, 12000,
                                  CU_GET_PROC_ADDRESS_DEFAULT, &st));
  XSEG_EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
  XSEG_ASSERT_TRUE(pfn != NULL);
  size_t f1, t1, f2, t2;
  XSEG_EXPECT_CU(((st_meminfo_fn)pfn)(&f1, &t1));
  XSEG_EXPECT_CU(cuMemGetInfo(&f2, &t2));
  XSEG_EXPECT_EQ(t1, t2);
  XSEG_EXPECT_CU(cuGetProcAddress("cuNoSuchFunction", &pfn, 12000, 0, &st));
  XSEG_EXPECT_TRUE(pfn == NULL);
  XSEG_EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  XSEG_EXPECT_CU_ERR(cuGetProcAddress("cuInit", &pfn, 99990, 0, &st),
                     CUDA_ERROR_INVALID_VALUE);
  if (!xt_have_sim()) return;
  Dl_info info;
  XSEG_EXPECT_CU(cuGetProcAddress("cuMemGetInfo", &pfn, 13000, 0, &st));
  XSEG_ASSERT_TRUE(pfn != NULL && dladdr(pfn, &info) && info.dli_sname);
  XSEG_EXPECT_STREQ(info.dli_sname, "cuMemGetInfo_v2");
  XSEG_EXPECT_CU(cuGetProcAddress("cuCtxCreate", &pfn, 13000, 0, &st));
  XSEG_ASSERT_TRUE(pfn != NULL && dladdr(pfn, &info) && info.dli_sname);
  XSEG_EXPECT_STREQ(info.dli_sname, "cuCtxCreate_v4");
  /* Only cuCtxCreate_v4 (12.5) is emulated: older ABIs are "found but not
     supported by cudaVersion specified". */
  XSEG_EXPECT_CU(cuGetProcAddress("cuCtxCreate", &pfn, 12000, 0, &st));
  XSEG_EXPECT_TRUE(pfn == NULL);
  XSEG_EXPECT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  /* libc's cuserid is reachable from our handle, but it is not a driver
     function. */
  XSEG_EXPECT_CU(cuGetProcAddress("cuserid", &pfn, 13000, 0, &st));
  XSEG_EXPECT_TRUE(pfn == NULL);
}

/* Every driver function a caller may look up by its cuda.h base name comes
   back as the versioned symbol cuda.h's macros name at CUDA 13, for the
   memory copies and sets as much as for the VMM calls. */
XSEG_TEST(SimDevice, get_proc_address_serves_copy_and_set_versions) {
  XT_REQUIRE_SIM_FOR("checks the emulator's own entry points");
  XSEG_ASSERT_TRUE(st_setup() > 0);
  static const char *const pairs[][2] = {
      {"cuMemcpyDtoD", "cuMemcpyDtoD_v2"},
      {"cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2"},
      {"cuMemsetD32", "cuMemsetD32_v2"},
      {"cuMemsetD8", "cuMemsetD8_v2"},
      {"cuStreamDestroy", "cuStreamDestroy_v2"},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    void *pfn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    XSEG_EXPECT_CU(cuGetProcAddress(pairs[i][0], &pfn, 13000, 0, &st));
    Dl_info info;
    XSEG_ASSERT_TRUE(pfn != NULL && dladdr(pfn, &info) && info.dli_sname);
    XSEG_EXPECT_STREQ(info.dli_sname, pairs[i][1]);
  }
}
