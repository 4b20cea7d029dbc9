/* Conformance of the emulator's virtual memory management (sim/sim_vmm.c) to
 * the driver reference: the comments of the toolkit's cuda.h, section
 * "Virtual Memory Management" (CUDA_VA). Each test names the function whose
 * comment it holds the emulator to. Every test releases what it creates: the
 * fixture fails on leaked handles, mappings and reservations.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

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
