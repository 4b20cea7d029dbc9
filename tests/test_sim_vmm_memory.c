/* Conformance of the emulator's virtual memory management (sim/sim_vmm.c) to
 * the driver reference, continued from test_sim_vmm.c: access, the memory
 * behind mappings (data, capacity, handles mapped at several addresses,
 * lazy commitment) and peer access. Each test names the function whose
 * comment it holds the emulator to. Every test releases what it creates.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "sim_helpers.h"

#define MiB (1024ull * 1024)

/* Reads one byte of device memory through the driver, so that the check
   runs on a GPU too. */
static unsigned char st_byte(CUdeviceptr p) {
  unsigned char v = 0;
  XSEG_EXPECT_CU(cuMemcpyDtoH(&v, p, 1));
  return v;
}

static void st_touch(void *p) { (void)*(volatile char *)p; }

static void st_write(void *p) { *(volatile char *)p = 1; }

/* cuMemMap: "calling cuMemMap does not make the address accessible, the
   caller needs to update accessibility ... by calling cuMemSetAccess". On
   the emulator an access-less page faults like a GPU page: a child that
   touches it dies of SIGSEGV; after cuMemSetAccess it does not; after
   PROT_READ, writing faults again. */
XSEG_TEST(SimVmm, access_before_set_access_faults) {
  XT_REQUIRE_SIM_FOR("touches device memory from the host");
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 1));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, s.g, 0, h, 0));
  XSEG_EXPECT_EQ(st_child_run(st_touch, (void *)s.va), SIGSEGV);
  XSEG_EXPECT_CU(st_access(s.va, s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  XSEG_EXPECT_EQ(st_child_run(st_write, (void *)s.va), 0);
  XSEG_EXPECT_CU(st_access(s.va, s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READ));
  XSEG_EXPECT_EQ(st_child_run(st_touch, (void *)s.va), 0);
  XSEG_EXPECT_EQ(st_child_run(st_write, (void *)s.va), SIGSEGV);
  XSEG_EXPECT_CU(cuMemUnmap(s.va, s.g));
  /* cuMemUnmap: "Any new mapping to this virtual address will need to have
     access granted through cuMemSetAccess": an unmapped range faults. */
  XSEG_EXPECT_EQ(st_child_run(st_touch, (void *)s.va), SIGSEGV);
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
}

/* Freeing a reservation that still holds a mapping is refused (docs/DESIGN.md
   section 4, "faithful errors"; cuda.h names no code): observed on H100,
   driver 580, CUDA_ERROR_INVALID_VALUE, as the emulator answers. The
   mapping stays usable. */
XSEG_TEST(SimVmm, free_of_reservation_with_mappings_fails) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 2));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va + s.g, s.g, 0, h, 0));
  XSEG_ASSERT_CU(st_access(s.va + s.g, s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  XSEG_EXPECT_CU_ERR(cuMemAddressFree(s.va, s.va_size),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuMemsetD8(s.va + s.g, 7, 1));
  XSEG_EXPECT_EQ(st_byte(s.va + s.g), 7);
  XSEG_EXPECT_CU(cuMemUnmap(s.va + s.g, s.g));
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
}

/* cuMemCreate returns CUDA_ERROR_OUT_OF_MEMORY beyond the device's memory;
   cuMemGetInfo's free follows what live handles hold, and comes back on
   release. */
XSEG_TEST(SimVmm, capacity_is_enforced_and_mem_get_info_follows) {
  XT_REQUIRE_SIM_FOR("sets the device capacity");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  xsim_set_device_memory(0, 4 * g);
  size_t free0, total;
  XSEG_ASSERT_CU(cuMemGetInfo(&free0, &total));
  XSEG_EXPECT_EQ(total, 4 * g);
  XSEG_EXPECT_EQ(free0, 4 * g);
  CUmemGenericAllocationHandle a, b, c;
  XSEG_ASSERT_CU(st_create(&a, 3 * g, CU_MEM_HANDLE_TYPE_NONE));
  size_t free1;
  XSEG_EXPECT_CU(cuMemGetInfo(&free1, &total));
  XSEG_EXPECT_EQ(free1, g);
  XSEG_EXPECT_CU_ERR(st_create(&b, 2 * g, CU_MEM_HANDLE_TYPE_NONE),
                     CUDA_ERROR_OUT_OF_MEMORY);
  XSEG_ASSERT_CU(st_create(&c, g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_EXPECT_CU(cuMemGetInfo(&free1, &total));
  XSEG_EXPECT_EQ(free1, 0);
  XSEG_EXPECT_CU(cuMemRelease(a));
  XSEG_EXPECT_CU(cuMemGetInfo(&free1, &total));
  XSEG_EXPECT_EQ(free1, 3 * g);
  XSEG_EXPECT_CU(cuMemRelease(c));
}

/* Mappings of one allocation show the same memory (cuMemMap maps "bytes of
   memory represented by handle"): bytes written through one mapping are read
   through a second mapping of the same handle. */
XSEG_TEST(SimVmm, data_written_through_one_mapping_is_read_through_another) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 2));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, s.g, 0, h, 0));
  XSEG_ASSERT_CU(cuMemMap(s.va + s.g, s.g, 0, h, 0));
  XSEG_ASSERT_CU(st_access(s.va, 2 * s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  enum { N = 4096 };
  static unsigned char in[N], out[N];
  for (size_t i = 0; i < N; i++) in[i] = (unsigned char)(i * 31);
  XSEG_EXPECT_CU(cuMemcpyHtoD(s.va + s.g - N, in, N));   /* the first's end */
  XSEG_EXPECT_CU(cuMemcpyDtoH(out, s.va + 2 * s.g - N, N));
  XSEG_EXPECT_TRUE(memcmp(in, out, N) == 0);
  XSEG_EXPECT_CU(cuMemUnmap(s.va, 2 * s.g));
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
}

/* cuMemRelease: "The generic memory handle can be freed when there are still
   outstanding mappings made with this handle"; the memory is freed only
   "when all outstanding mappings to the memory are unmapped". Observed on
   H100, driver 580: bytes stay readable and writable through the mapping
   after the release. The emulator's live counts also show the memory held
   until the unmap. */
XSEG_TEST(SimVmm, physical_memory_survives_release_while_mapped) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 1));
  xsim_live before = {0}, mid = {0}, after = {0};
  if (xt_have_sim()) xsim_get_live(&before);
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, s.g, 0, h, 0));
  XSEG_ASSERT_CU(st_access(s.va, s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  XSEG_EXPECT_CU(cuMemsetD8(s.va, 0x42, 4096));
  XSEG_ASSERT_CU(cuMemRelease(h));
  unsigned char back[2] = {0, 0};
  XSEG_EXPECT_CU(cuMemcpyDtoH(&back[0], s.va + 4095, 1));
  XSEG_EXPECT_EQ(back[0], 0x42);
  XSEG_EXPECT_CU(cuMemsetD8(s.va, 0x43, 1));
  XSEG_EXPECT_CU(cuMemcpyDtoH(&back[1], s.va, 1));
  XSEG_EXPECT_EQ(back[1], 0x43);
  if (xt_have_sim()) {
    xsim_get_live(&mid);
    XSEG_EXPECT_EQ(mid.handles, before.handles + 1);
    XSEG_EXPECT_EQ(mid.physical_bytes, before.physical_bytes + s.g);
    /* A released handle is stale: the driver's answer is undefined. */
    XSEG_EXPECT_CU_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  }
  XSEG_EXPECT_CU(cuMemUnmap(s.va, s.g));
  if (xt_have_sim()) {
    xsim_get_live(&after);
    XSEG_EXPECT_EQ(after.handles, before.handles);
    XSEG_EXPECT_EQ(after.physical_bytes, before.physical_bytes);
  }
  st_space_fini(&s);
}

/* One handle at three addresses at once: twice in one reservation and once
   in another, each with its own cuMemSetAccess. Observed on H100, driver
   580 (every call succeeded; bytes written through one address were read
   through the others; unmapping one left the others working; cuMemRelease
   while mapped kept the memory until the last unmap). The allocator relies
   on it: a handle can serve a new block at one address while an old
   mapping of it waits to be unmapped. */
XSEG_TEST(SimVmm, one_handle_mapped_at_three_addresses) {
  st_space one, two;
  XSEG_ASSERT_TRUE(st_space_init(&one, 3));
  XSEG_ASSERT_TRUE(st_space_init(&two, 1));
  const size_t g = one.g;
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, g, CU_MEM_HANDLE_TYPE_NONE));
  const CUdeviceptr at[3] = {one.va, one.va + 2 * g, two.va};
  for (int i = 0; i < 3; i++) {
    XSEG_ASSERT_CU(cuMemMap(at[i], g, 0, h, 0));
    XSEG_ASSERT_CU(st_access(at[i], g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  }
  XSEG_EXPECT_CU(cuMemsetD8(at[0], 0x11, g));
  XSEG_EXPECT_CU(cuMemsetD8(at[1] + g - 64, 0x22, 64));
  XSEG_EXPECT_EQ(st_byte(at[2]), 0x11);
  XSEG_EXPECT_EQ(st_byte(at[2] + g - 1), 0x22);
  XSEG_EXPECT_EQ(st_byte(at[0] + g - 64), 0x22);
  XSEG_EXPECT_CU(cuMemUnmap(at[0], g));          /* the others stay */
  XSEG_EXPECT_CU(cuMemsetD8(at[2] + 5, 0x33, 1));
  XSEG_EXPECT_EQ(st_byte(at[1] + 5), 0x33);
  XSEG_EXPECT_CU(cuMemRelease(h));               /* still mapped twice */
  XSEG_EXPECT_EQ(st_byte(at[1] + 5), 0x33);
  XSEG_EXPECT_CU(cuMemsetD8(at[1] + 6, 0x44, 1));
  XSEG_EXPECT_EQ(st_byte(at[2] + 6), 0x44);
  XSEG_EXPECT_CU(cuMemUnmap(at[1], g));
  XSEG_EXPECT_EQ(st_byte(at[2] + 6), 0x44);      /* the last mapping */
  xsim_live before, after;
  if (xt_have_sim()) xsim_get_live(&before);
  XSEG_EXPECT_CU(cuMemUnmap(at[2], g));          /* the memory goes now */
  if (xt_have_sim()) {
    xsim_get_live(&after);
    XSEG_EXPECT_EQ(after.handles + 1, before.handles);
    XSEG_EXPECT_EQ(after.physical_bytes + g, before.physical_bytes);
  }
  st_space_fini(&one);
  st_space_fini(&two);
}

/* cuMemRetainAllocationHandle: "The handle is guaranteed to be the same
   handle value used to map the memory"; "addr, can be any address in a range
   previously mapped"; "The returned handle must be released with
   corresponding number of calls to cuMemRelease." */
XSEG_TEST(SimVmm, retain_allocation_handle_returns_the_mapped_handle) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 2));
  CUmemGenericAllocationHandle h, r1, r2;
  XSEG_ASSERT_CU(st_create(&h, 2 * s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, 2 * s.g, 0, h, 0));
  XSEG_ASSERT_CU(cuMemRetainAllocationHandle(&r1, (void *)(s.va + s.g + 5)));
  XSEG_EXPECT_EQ(r1, h);
  XSEG_EXPECT_CU(cuMemRelease(h));
  XSEG_ASSERT_CU(cuMemRetainAllocationHandle(&r2, (void *)s.va));
  XSEG_EXPECT_EQ(r2, h);
  XSEG_EXPECT_CU(cuMemRelease(r1));   /* one reference left: r2's */
  XSEG_EXPECT_CU(cuMemUnmap(s.va, 2 * s.g));
  XSEG_EXPECT_CU(cuMemRelease(r2));
  XSEG_EXPECT_CU_ERR(cuMemRetainAllocationHandle(&r1, (void *)s.va),
                     CUDA_ERROR_INVALID_VALUE);
  st_space_fini(&s);
}

/* cuMemGetAllocationPropertiesFromHandle: "Retrieve the contents of the
   property structure defining properties for this handle". */
XSEG_TEST(SimVmm, properties_from_handle) {
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, g, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUmemAllocationProp p;
  memset(&p, 0xff, sizeof p);
  XSEG_EXPECT_CU(cuMemGetAllocationPropertiesFromHandle(&p, h));
  XSEG_EXPECT_EQ(p.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  XSEG_EXPECT_EQ(p.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  XSEG_EXPECT_EQ(p.location.id, 0);
  XSEG_EXPECT_EQ(p.requestedHandleTypes,
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  XSEG_EXPECT_CU_ERR(cuMemGetAllocationPropertiesFromHandle(NULL, h),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuMemRelease(h));
}

/* docs/DESIGN.md section 4: "physical pages are only committed when touched", so
   an 80 GiB device costs nothing until used. The memfd behind a handle has no
   blocks until a page of it is written. */
XSEG_TEST(SimVmm, pages_are_committed_only_when_touched) {
  XT_REQUIRE_SIM_FOR("inspects the emulator's memory files");
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 512));       /* 1 GiB at 2 MiB */
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, s.va_size,
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  int fd = -1;
  XSEG_ASSERT_CU(cuMemExportToShareableHandle(
      &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  struct stat st;
  XSEG_ASSERT_TRUE(fstat(fd, &st) == 0);
  XSEG_EXPECT_EQ(st.st_size, (off_t)s.va_size);
  XSEG_EXPECT_EQ(st.st_blocks, 0);
  XSEG_ASSERT_CU(cuMemMap(s.va, s.va_size, 0, h, 0));
  XSEG_ASSERT_CU(st_access(s.va, s.va_size, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  ((volatile char *)s.va)[s.va_size / 2] = 1;
  XSEG_ASSERT_TRUE(fstat(fd, &st) == 0);
  XSEG_EXPECT_GT(st.st_blocks, 0);
  XSEG_EXPECT_LT((uint64_t)st.st_blocks * 512, 64 * MiB);
  close(fd);
  XSEG_EXPECT_CU(cuMemUnmap(s.va, s.va_size));
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
}

/* cuMemSetAccess sets "the access flags for each location specified in desc";
   cuMemGetAccess reads them back per location. The emulator records a peer
   device's flags; host access follows the owning device's. */
XSEG_TEST(SimVmm, peer_device_access_is_recorded) {
  XT_REQUIRE_SIM_FOR("emulates a second device, touches memory from the host");
  st_env("XSIM_DEVICE_COUNT", "2");
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 1));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, s.g, 0, h, 0));
  CUmemAccessDesc d[2];
  memset(d, 0, sizeof d);
  d[0].location.type = d[1].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d[0].location.id = 0;
  d[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  d[1].location.id = 1;
  d[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  XSEG_EXPECT_CU(cuMemSetAccess(s.va, s.g, d, 2));
  unsigned long long f0 = 9, f1 = 9;
  CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  XSEG_EXPECT_CU(cuMemGetAccess(&f0, &l0, s.va));
  XSEG_EXPECT_CU(cuMemGetAccess(&f1, &l1, s.va));
  XSEG_EXPECT_EQ(f0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  XSEG_EXPECT_EQ(f1, CU_MEM_ACCESS_FLAGS_PROT_READ);
  ((volatile char *)s.va)[0] = 1;   /* the owner's read-write shows */
  XSEG_EXPECT_CU(cuMemUnmap(s.va, s.g));
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
  st_env("XSIM_DEVICE_COUNT", NULL);
}
