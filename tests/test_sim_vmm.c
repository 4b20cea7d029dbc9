/* Conformance of the emulator's virtual memory management (sim/sim_vmm.c) to
 * the driver reference: the comments of the toolkit's cuda.h, section
 * "Virtual Memory Management" (CUDA_VA). Each test names the function whose
 * comment it holds the emulator to. Every test releases what it creates: the
 * fixture fails on leaked handles, mappings and reservations.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "sim_helpers.h"

#define MiB (1024ull * 1024)

/* cuMemGetAllocationGranularity: "Calculates either the minimal or
   recommended granularity"; CUDA_ERROR_INVALID_VALUE for bad arguments. The
   device ordinal is not checked: observed on H100, driver 580, device 4096
   gets CUDA_SUCCESS (and the same granularity). */
XSEG_TEST(SimVmm, granularity_minimum_and_recommended) {
  size_t g = st_setup(), rec = 0;
  XSEG_ASSERT_GT(g, 0);
  XSEG_EXPECT_EQ(g & (g - 1), 0);
  CUmemAllocationProp p = st_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  XSEG_EXPECT_CU(cuMemGetAllocationGranularity(
      &rec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  XSEG_EXPECT_EQ(rec % g, 0);
  XSEG_EXPECT_CU_ERR(cuMemGetAllocationGranularity(
                         NULL, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemGetAllocationGranularity(
                         &rec, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_ERROR_INVALID_VALUE);
  p.location.id = 4096;
  rec = 0;
  XSEG_EXPECT_CU(cuMemGetAllocationGranularity(
      &rec, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  XSEG_EXPECT_EQ(rec, g);
}

/* The emulator's default granularity is 2 MiB (docs/DESIGN.md section 4). */
XSEG_TEST(SimVmm, default_granularity_is_2mib) {
  XT_REQUIRE_SIM_FOR("checks the emulator's default granularity");
  XSEG_EXPECT_EQ(st_setup(), 2 * MiB);
}

/* cuMemCreate: "The size of this allocation must be a multiple of the value
   given via cuMemGetAllocationGranularity with the
   CU_MEM_ALLOC_GRANULARITY_MINIMUM flag"; flags "must be zero now". */
XSEG_TEST(SimVmm, create_of_non_multiple_size_fails) {
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUmemGenericAllocationHandle h;
  XSEG_EXPECT_CU_ERR(st_create(&h, g + 4096, CU_MEM_HANDLE_TYPE_NONE),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(st_create(&h, g / 2, CU_MEM_HANDLE_TYPE_NONE),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(st_create(&h, 0, CU_MEM_HANDLE_TYPE_NONE),
                     CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp p = st_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  XSEG_EXPECT_CU_ERR(cuMemCreate(&h, g, &p, 1), CUDA_ERROR_INVALID_VALUE);
}

/* cuMemCreate: prop->type "Currently must be specified as
   CU_MEM_ALLOCATION_TYPE_PINNED"; a bad device is CUDA_ERROR_INVALID_DEVICE
   (in cuMemCreate's list of return codes). */
XSEG_TEST(SimVmm, create_checks_properties) {
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp p = st_prop(0, CU_MEM_HANDLE_TYPE_NONE);
  p.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  XSEG_EXPECT_CU_ERR(cuMemCreate(&h, g, &p, 0), CUDA_ERROR_INVALID_VALUE);
  p = st_prop(4096, CU_MEM_HANDLE_TYPE_NONE);
  XSEG_EXPECT_CU_ERR(cuMemCreate(&h, g, &p, 0), CUDA_ERROR_INVALID_DEVICE);
  XSEG_EXPECT_CU_ERR(cuMemCreate(NULL, g, &p, 0), CUDA_ERROR_INVALID_VALUE);
}

/* cuMemRelease: an invalid handle is undefined behaviour in cuda.h; the
   emulator answers CUDA_ERROR_INVALID_VALUE (in cuMemRelease's list) and
   never crashes, including on a second release. */
XSEG_TEST(SimVmm, release_of_unknown_or_released_handle_fails) {
  XT_REQUIRE_SIM_FOR("passes stale handles (undefined on a real driver)");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  XSEG_EXPECT_CU_ERR(cuMemRelease(12345), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_EXPECT_CU(cuMemRelease(h));
  XSEG_EXPECT_CU_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
}

/* cuMemAddressReserve: "the alignment must be a power of two or zero for
   default alignment"; flags "must be zero"; the result honours the
   alignment. */
XSEG_TEST(SimVmm, reserve_checks_arguments_and_aligns) {
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUdeviceptr p;
  XSEG_EXPECT_CU_ERR(cuMemAddressReserve(&p, g, 3 * g, 0, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemAddressReserve(&p, g, 0, 0, 1),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemAddressReserve(&p, 0, 0, 0, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemAddressReserve(NULL, g, 0, 0, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_ASSERT_CU(cuMemAddressReserve(&p, 2 * g, 16 * g, 0, 0));
  XSEG_EXPECT_EQ(p % (16 * g), 0);
  XSEG_EXPECT_CU(cuMemAddressFree(p, 2 * g));
}

/* The emulator also refuses a size that is not whole granules (the real
   driver's rule; cuda.h states only the host-page rule). */
XSEG_TEST(SimVmm, reserve_of_partial_granule_fails) {
  XT_REQUIRE_SIM_FOR("checks the emulator's error codes for misuse");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUdeviceptr p;
  XSEG_EXPECT_CU_ERR(cuMemAddressReserve(&p, g + 4096, 0, 0, 0),
                     CUDA_ERROR_INVALID_VALUE);
}

/* cuMemAddressReserve: "when it is non-zero then the driver treats it as a
   hint about where to place the reservation". A free hint is honoured. */
XSEG_TEST(SimVmm, reserve_honours_a_free_hint) {
  XT_REQUIRE_SIM_FOR("relies on the emulator's address placement");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUdeviceptr a, b;
  XSEG_ASSERT_CU(cuMemAddressReserve(&a, 4 * g, 0, 0, 0));
  XSEG_ASSERT_CU(cuMemAddressReserve(&b, 4 * g, 0, a + 4 * g, 0));
  /* Right after `a` may already be taken by someone else; then b is
     elsewhere but still valid. Either way the two never overlap. */
  XSEG_EXPECT_TRUE(b >= a + 4 * g || b + 4 * g <= a);
  XSEG_EXPECT_CU(cuMemAddressFree(b, 4 * g));
  XSEG_EXPECT_CU(cuMemAddressFree(a, 4 * g));
  CUdeviceptr again;
  XSEG_ASSERT_CU(cuMemAddressReserve(&again, 4 * g, 0, a, 0));
  XSEG_EXPECT_EQ(again, a);
  XSEG_EXPECT_CU(cuMemAddressFree(again, 4 * g));
}

/* cuMemAddressFree: "The size must match what was given to memAddressReserve
   and the ptr given must match what was returned from memAddressReserve." */
XSEG_TEST(SimVmm, address_free_needs_the_exact_reservation) {
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUdeviceptr p;
  XSEG_ASSERT_CU(cuMemAddressReserve(&p, 4 * g, 0, 0, 0));
  XSEG_EXPECT_CU_ERR(cuMemAddressFree(p, 2 * g), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemAddressFree(p + g, 3 * g), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuMemAddressFree(p, 4 * g));
  XSEG_EXPECT_CU_ERR(cuMemAddressFree(p, 4 * g), CUDA_ERROR_INVALID_VALUE);
}

/* A reserved range, a handle of `granules` granules, both released by
   st_fini. */
typedef struct st_space {
  size_t g;
  CUdeviceptr va;
  size_t va_size;
} st_space;

static bool st_space_init(st_space *s, size_t granules) {
  s->g = st_setup();
  s->va_size = granules * s->g;
  return s->g != 0 &&
         cuMemAddressReserve(&s->va, s->va_size, 0, 0, 0) == CUDA_SUCCESS;
}

static void st_space_fini(st_space *s) {
  XSEG_EXPECT_CU(cuMemAddressFree(s->va, s->va_size));
}

/* cuMemMap: offset "Note: currently must be zero"; flags "must be zero".
   Observed on H100, driver 580: a non-zero offset is
   CUDA_ERROR_NOT_SUPPORTED, non-zero flags CUDA_ERROR_INVALID_VALUE. */
XSEG_TEST(SimVmm, map_with_nonzero_offset_fails) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 4));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, 2 * s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_EXPECT_CU_ERR(cuMemMap(s.va, s.g, s.g, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  XSEG_EXPECT_CU_ERR(cuMemMap(s.va, s.g, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
}

/* cuMemMap: "Both ptr, size, and offset must be a multiple of the value given
   via cuMemGetAllocationGranularity"; the range "must be an address
   reservation previously reserved with cuMemAddressReserve"; offset + size
   must lie inside the allocation. Observed on H100, driver 580: a
   misaligned ptr and a range past the reservation are
   CUDA_ERROR_INVALID_VALUE, a size beyond the handle
   CUDA_ERROR_NOT_SUPPORTED. */
XSEG_TEST(SimVmm, map_checks_alignment_reservation_and_size) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 2));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_EXPECT_CU_ERR(cuMemMap(s.va + 4096, s.g, 0, h, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemMap(s.va + 2 * s.g, s.g, 0, h, 0),
                     CUDA_ERROR_INVALID_VALUE);           /* past the end */
  XSEG_EXPECT_CU_ERR(cuMemMap(s.va, 2 * s.g, 0, h, 0),
                     CUDA_ERROR_NOT_SUPPORTED);           /* bigger than h */
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
}

/* cuMemMap: "cuMemMap can only create mappings on VA range reservations that
   are not currently mapped." */
XSEG_TEST(SimVmm, double_map_fails) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 4));
  CUmemGenericAllocationHandle h, h2;
  XSEG_ASSERT_CU(st_create(&h, 2 * s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(st_create(&h2, 2 * s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, 2 * s.g, 0, h, 0));
  XSEG_EXPECT_CU_ERR(cuMemMap(s.va, 2 * s.g, 0, h, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemMap(s.va + s.g, 2 * s.g, 0, h2, 0),
                     CUDA_ERROR_INVALID_VALUE);           /* overlaps */
  XSEG_EXPECT_CU(cuMemMap(s.va + 2 * s.g, 2 * s.g, 0, h2, 0));
  XSEG_EXPECT_CU(cuMemUnmap(s.va, 4 * s.g));
  XSEG_EXPECT_CU(cuMemRelease(h));
  XSEG_EXPECT_CU(cuMemRelease(h2));
  st_space_fini(&s);
}

/* cuMemUnmap: "cuMemUnmap cannot unmap a sub-range of an address range mapped
   by cuMemCreate / cuMemMap" (CUDA_ERROR_INVALID_VALUE). Observed on H100,
   driver 580: a range of whole mappings plus never-mapped space, and
   never-mapped space alone, unmap with CUDA_SUCCESS. */
XSEG_TEST(SimVmm, unmap_of_sub_range_fails) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 4));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(st_create(&h, 2 * s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, 2 * s.g, 0, h, 0));
  XSEG_EXPECT_CU_ERR(cuMemUnmap(s.va, s.g), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemUnmap(s.va + s.g, s.g), CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuMemUnmap(s.va + 2 * s.g, s.g));       /* never mapped */
  XSEG_EXPECT_CU(cuMemUnmap(s.va, 3 * s.g));     /* the mapping and a gap */
  CUmemGenericAllocationHandle r;
  XSEG_EXPECT_CU_ERR(cuMemRetainAllocationHandle(&r, (void *)s.va),
                     CUDA_ERROR_INVALID_VALUE);           /* it is gone */
  XSEG_EXPECT_CU(cuMemUnmap(s.va, 2 * s.g));               /* again: empty */
  XSEG_EXPECT_CU(cuMemRelease(h));
  st_space_fini(&s);
}

/* cuMemUnmap: "The range must be the entire contiguous address range that
   was mapped to": two adjacent whole mappings go in one call. */
XSEG_TEST(SimVmm, unmap_of_two_adjacent_mappings_in_one_call) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 4));
  CUmemGenericAllocationHandle a, b;
  XSEG_ASSERT_CU(st_create(&a, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(st_create(&b, 2 * s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va + s.g, s.g, 0, a, 0));
  XSEG_ASSERT_CU(cuMemMap(s.va + 2 * s.g, 2 * s.g, 0, b, 0));
  XSEG_EXPECT_CU(cuMemUnmap(s.va + s.g, 3 * s.g));
  CUmemGenericAllocationHandle r;
  XSEG_EXPECT_CU_ERR(cuMemRetainAllocationHandle(&r, (void *)(s.va + s.g)),
                     CUDA_ERROR_INVALID_VALUE);           /* nothing there */
  XSEG_EXPECT_CU(cuMemRelease(a));
  XSEG_EXPECT_CU(cuMemRelease(b));
  st_space_fini(&s);
}

/* cuMemSetAccess: "The range must be a fully mapped address range containing
   all allocations created by cuMemMap / cuMemCreate": one call may span two
   mappings, and both become usable. */
XSEG_TEST(SimVmm, set_access_across_two_mappings) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 2));
  CUmemGenericAllocationHandle a, b;
  XSEG_ASSERT_CU(st_create(&a, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(st_create(&b, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, s.g, 0, a, 0));
  XSEG_ASSERT_CU(cuMemMap(s.va + s.g, s.g, 0, b, 0));
  XSEG_ASSERT_CU(st_access(s.va, 2 * s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  unsigned long long flags = 0;
  XSEG_EXPECT_CU(cuMemGetAccess(&flags, &loc, s.va + s.g + 100));
  XSEG_EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  if (xt_have_sim()) {  /* device memory is host memory only on the emulator */
    char *p = (char *)s.va;
    memset(p + s.g - 8, 0x5a, 16);                 /* across the boundary */
    XSEG_EXPECT_EQ(p[s.g + 7], 0x5a);
  }
  XSEG_EXPECT_CU(cuMemUnmap(s.va, 2 * s.g));
  XSEG_EXPECT_CU(cuMemRelease(a));
  XSEG_EXPECT_CU(cuMemRelease(b));
  st_space_fini(&s);
}

/* cuMemSetAccess on a range that is not fully mapped fails. The emulator
   also wants whole mappings (see sim_vmm.c). Observed on H100, driver 580:
   all three are CUDA_ERROR_INVALID_VALUE, the bad device (4096) too. */
XSEG_TEST(SimVmm, set_access_on_unmapped_range_fails) {
  st_space s;
  XSEG_ASSERT_TRUE(st_space_init(&s, 3));
  CUmemGenericAllocationHandle a;
  XSEG_ASSERT_CU(st_create(&a, s.g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(cuMemMap(s.va, s.g, 0, a, 0));
  XSEG_EXPECT_CU_ERR(
      st_access(s.va, 2 * s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
      CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(
      st_access(s.va + s.g, s.g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
      CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(
      st_access(s.va, s.g, 4096, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
      CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU(cuMemUnmap(s.va, s.g));
  XSEG_EXPECT_CU(cuMemRelease(a));
  st_space_fini(&s);
}

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
