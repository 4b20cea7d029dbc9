/* sim_vmm.c: the virtual memory management API on real virtual memory.
 *
 *   reservation  an mmap(PROT_NONE, MAP_NORESERVE) range of the process
 *   handle       a memfd of the allocation's size (ftruncate only: pages are
 *                committed when first touched, so an 80 GiB device is cheap)
 *   mapping      mmap(MAP_FIXED | MAP_SHARED) of a handle's memfd over part
 *                of a reservation, PROT_NONE until cuMemSetAccess
 *
 * Device pointers are thus host addresses: data written through one mapping
 * is read through every other mapping of the same memory, in this process or
 * another that imported the fd, and touching memory without access faults
 * (SIGSEGV), as on a GPU.
 *
 *   reservation [base ......................................... base+size)
 *                 | mapping A (h1) | mapping B (h2) |  PROT_NONE hole  |
 *
 * Unmapping puts a PROT_NONE anonymous range back in place (never munmap), so
 * the hole stays reserved and no other mmap in the process can land in it.
 *
 * State, all under xsim_vmm.lock:
 *   handles       by id       (RB tree)  the physical allocations
 *   reservations  by base     (RB tree)  disjoint ranges
 *   mappings      by base     (RB tree)  disjoint; each inside one reservation
 * Invariants: a handle lives while refs > 0 or maps > 0 (cuda.h, cuMemRelease:
 * freed "when all outstanding mappings to the memory are unmapped and when all
 * outstanding references to the handle ... are also released"); maps counts
 * its mappings; a reservation's nmapped counts the mappings inside it.
 *
 * Handle ids are opaque: a tag in the top 16 bits makes them non-canonical
 * addresses, so a caller dereferencing one faults instead of reading ours.
 */
#define _GNU_SOURCE
#include "sim_internal.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stddef.h>  /* bsd/sys/tree.h uses NULL without including it */
#include <bsd/sys/tree.h>

/* libbsd's RB_GENERATE_STATIC needs a __unused it does not define. */
#define XSIM_RB_GENERATE(name, type, field, cmp) \
  RB_GENERATE_INTERNAL(name, type, field, cmp, static __attribute__((unused)))

#define XSIM_HANDLE_TAG 0xC0DA000000000000ull

typedef struct xsim_handle {
  RB_ENTRY(xsim_handle) node;
  CUmemGenericAllocationHandle id;
  int fd;                     /* the memfd; closed when the handle dies */
  size_t size;
  CUmemAllocationProp prop;
  uint64_t refs;              /* create/import + retains - releases */
  uint64_t maps;              /* live mappings of this handle */
  bool imported;              /* charged to the exporter, not to this device */
} xsim_handle;

typedef struct xsim_reservation {
  RB_ENTRY(xsim_reservation) node;
  uintptr_t base;
  size_t size;
  uint64_t nmapped;           /* mappings inside */
} xsim_reservation;

typedef struct xsim_mapping {
  RB_ENTRY(xsim_mapping) node;
  uintptr_t base;
  size_t size;
  xsim_handle *handle;
  xsim_reservation *res;
  /* CUmemAccess_flags per device; the owner's entry is what mprotect shows. */
  unsigned long long access[XSIM_MAX_DEVICES];
} xsim_mapping;

static int xsim_handle_cmp(const xsim_handle *a, const xsim_handle *b) {
  return a->id < b->id ? -1 : a->id > b->id;
}
static int xsim_res_cmp(const xsim_reservation *a, const xsim_reservation *b) {
  return a->base < b->base ? -1 : a->base > b->base;
}
static int xsim_map_cmp(const xsim_mapping *a, const xsim_mapping *b) {
  return a->base < b->base ? -1 : a->base > b->base;
}

RB_HEAD(xsim_handle_tree, xsim_handle);
RB_HEAD(xsim_res_tree, xsim_reservation);
RB_HEAD(xsim_map_tree, xsim_mapping);
XSIM_RB_GENERATE(xsim_handle_tree, xsim_handle, node, xsim_handle_cmp)
XSIM_RB_GENERATE(xsim_res_tree, xsim_reservation, node, xsim_res_cmp)
XSIM_RB_GENERATE(xsim_map_tree, xsim_mapping, node, xsim_map_cmp)

static struct {
  pthread_mutex_t lock;
  struct xsim_handle_tree handles;
  struct xsim_res_tree reservations;
  struct xsim_map_tree mappings;
  uint64_t next_id;
  uint64_t nhandles, nreservations, nmappings;
  uint64_t used[XSIM_MAX_DEVICES];   /* bytes of live, non-imported handles */
  uint64_t physical;                 /* bytes of all live handles */
} xsim_vmm = {
  .lock = PTHREAD_MUTEX_INITIALIZER,
  .handles = RB_INITIALIZER(&xsim_vmm.handles),
  .reservations = RB_INITIALIZER(&xsim_vmm.reservations),
  .mappings = RB_INITIALIZER(&xsim_vmm.mappings),
};

/* ---- lookups (callers hold xsim_vmm.lock) -------------------------------- */

static xsim_handle *xsim_handle_find_locked(CUmemGenericAllocationHandle id) {
  xsim_handle key = {.id = id};
  return RB_FIND(xsim_handle_tree, &xsim_vmm.handles, &key);
}

/* A handle the caller may still name: live and not fully released. */
static xsim_handle *xsim_handle_owned_locked(CUmemGenericAllocationHandle id) {
  xsim_handle *h = xsim_handle_find_locked(id);
  return h != NULL && h->refs > 0 ? h : NULL;
}

/* Defines name(addr): the element of the base-ordered tree `head` whose
   [base, base+size) holds addr, or NULL. The last element with base <= addr
   is the one before the first with base > addr (or the maximum). */
#define XSIM_RANGE_CONTAINING(name, tree, type, head)                          \
  static type *name(uintptr_t addr) {                                        \
    type key = {.base = addr + 1};                                           \
    type *x = RB_NFIND(tree, head, &key);                                    \
    x = x ? RB_PREV(tree, head, x) : RB_MAX(tree, head);                     \
    return x != NULL && addr - x->base < x->size ? x : NULL;                 \
  }

XSIM_RANGE_CONTAINING(xsim_res_containing_locked, xsim_res_tree,
                      xsim_reservation, &xsim_vmm.reservations)
XSIM_RANGE_CONTAINING(xsim_map_containing_locked, xsim_map_tree, xsim_mapping,
                    &xsim_vmm.mappings)

/* The first mapping that ends after addr (it may start after addr too). */
static xsim_mapping *xsim_map_from_locked(uintptr_t addr) {
  xsim_mapping *m = xsim_map_containing_locked(addr);
  if (m != NULL) return m;
  xsim_mapping key = {.base = addr};
  return RB_NFIND(xsim_map_tree, &xsim_vmm.mappings, &key);
}

/* Whether [ptr, ptr+size) is tiled exactly by whole mappings, with no gap and
   no mapping sticking out at either end (cuda.h, cuMemSetAccess: "a fully
   mapped address range containing all allocations"). */
static bool xsim_range_whole_mappings_locked(uintptr_t ptr, size_t size) {
  uintptr_t at = ptr, end = ptr + size;
  xsim_mapping key = {.base = ptr};
  xsim_mapping *m = RB_FIND(xsim_map_tree, &xsim_vmm.mappings, &key);
  while (m != NULL && m->base == at && at < end) {
    at += m->size;
    m = RB_NEXT(xsim_map_tree, &xsim_vmm.mappings, m);
  }
  return at == end;
}

/* ---- arguments --------------------------------------------------------- */

static bool xsim_aligned(uintptr_t v, uint64_t g) { return (v & (g - 1)) == 0; }

/* A range of whole granules that does not wrap around. */
static bool xsim_range_valid(uintptr_t ptr, size_t size) {
  uint64_t g = xsim_knob_granularity();
  return size != 0 && xsim_aligned(ptr, g) && xsim_aligned(size, g) &&
         ptr + size > ptr;
}

/* cuda.h (cuMemCreate): prop->type "Currently must be specified as
   CU_MEM_ALLOCATION_TYPE_PINNED"; a device location names a valid ordinal
   (CUDA_ERROR_INVALID_DEVICE); HOST and HOST_NUMA locations are valid in the
   driver but not emulated (CUDA_ERROR_NOT_SUPPORTED); of the export types
   only POSIX file descriptors exist on Linux without a fabric. */
CUresult xsim_vmm_prop_check(const CUmemAllocationProp *prop) {
  if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_INVALID_VALUE;
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA: return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = xsim_device_check(prop->location.id);
  if (r != CUDA_SUCCESS) return r;
  unsigned types = (unsigned)prop->requestedHandleTypes;
  if (types & ~(unsigned)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                          CU_MEM_HANDLE_TYPE_WIN32 |
                          CU_MEM_HANDLE_TYPE_WIN32_KMT |
                          CU_MEM_HANDLE_TYPE_FABRIC))
    return CUDA_ERROR_INVALID_VALUE;
  if (types & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

/* ---- granularity ------------------------------------------------------- */

/* cuda.h (cuMemGetAllocationGranularity): "Calculates either the minimal or
   recommended granularity"; both are the XSIM_GRANULARITY knob here. The
   location's device ordinal is not checked: observed on H100, driver 580, a
   prop naming device 4096 gets CUDA_SUCCESS. */
CUresult cuMemGetAllocationGranularity(
    size_t *granularity, const CUmemAllocationProp *prop,
    CUmemAllocationGranularity_flags option) {
  XSIM_ENTER("cuMemGetAllocationGranularity");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (granularity == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  r = xsim_vmm_prop_check(prop);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_DEVICE) return r;
  *granularity = (size_t)xsim_knob_granularity();
  return CUDA_SUCCESS;
}

/* ---- reservations ------------------------------------------------------ */

/* A PROT_NONE range of `size` at an `align`-aligned address: over-reserve by
   `align`, then trim both ends. */
static void *xsim_va_reserve(size_t size, size_t align) {
  if (size + align < size) return NULL;
  int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  char *p = mmap(NULL, size + align, PROT_NONE, fl, -1, 0);
  if (p == MAP_FAILED) return NULL;
  uintptr_t base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
  size_t head = base - (uintptr_t)p, tail = align - head;
  if (head) munmap(p, head);
  if (tail) munmap((char *)base + size, tail);
  return (void *)base;
}

/* The hint, if [addr, addr+size) is free in the whole process: the kernel
   refuses MAP_FIXED_NOREPLACE over any existing mapping. */
static void *xsim_va_reserve_at(uintptr_t addr, size_t size) {
  int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE;
  void *p = mmap((void *)addr, size, PROT_NONE, fl, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if ((uintptr_t)p == addr) return p;
  munmap(p, size);  /* kernels before 4.17 treat the flag as a mere hint */
  return NULL;
}

/* cuda.h (cuMemAddressReserve): "the alignment must be a power of two or zero
   for default alignment"; flags "must be zero"; a non-zero addr is a hint,
   honoured when that range is free. Sizes must be whole granules (the real
   driver's rule too; cuda.h only states the weaker page-size rule); an
   alignment below the granularity is raised to it. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) {
  XSIM_ENTER("cuMemAddressReserve");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  uint64_t g = xsim_knob_granularity();
  if (ptr == NULL || flags != 0 || size == 0 || !xsim_aligned(size, g))
    return CUDA_ERROR_INVALID_VALUE;
  if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
  if (!xsim_aligned(addr, 4096)) return CUDA_ERROR_INVALID_VALUE;
  if (alignment < g) alignment = g;
  xsim_reservation *res = calloc(1, sizeof *res);
  if (res == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  void *p = NULL;
  if (addr != 0 && xsim_aligned(addr, alignment) && addr + size > addr)
    p = xsim_va_reserve_at((uintptr_t)addr, size);
  if (p == NULL) p = xsim_va_reserve(size, alignment);
  if (p == NULL) {
    free(res);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  res->base = (uintptr_t)p;
  res->size = size;
  pthread_mutex_lock(&xsim_vmm.lock);
  RB_INSERT(xsim_res_tree, &xsim_vmm.reservations, res);
  xsim_vmm.nreservations++;
  pthread_mutex_unlock(&xsim_vmm.lock);
  *ptr = (CUdeviceptr)res->base;
  return CUDA_SUCCESS;
}

/* cuda.h (cuMemAddressFree): "The size must match what was given to
   memAddressReserve and the ptr given must match what was returned".
   A reservation that still holds mappings is refused with
   CUDA_ERROR_INVALID_VALUE (cuda.h names no code for it; we keep the memory
   safe rather than leave mappings without a reservation). */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  XSIM_ENTER("cuMemAddressFree");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_reservation key = {.base = (uintptr_t)ptr};
  xsim_reservation *res = RB_FIND(xsim_res_tree, &xsim_vmm.reservations, &key);
  if (res == NULL || res->size != size || res->nmapped != 0) {
    pthread_mutex_unlock(&xsim_vmm.lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  RB_REMOVE(xsim_res_tree, &xsim_vmm.reservations, res);
  xsim_vmm.nreservations--;
  pthread_mutex_unlock(&xsim_vmm.lock);
  munmap((void *)res->base, res->size);
  free(res);
  return CUDA_SUCCESS;
}

/* ---- physical handles -------------------------------------------------- */

static void xsim_handle_insert_locked(xsim_handle *h) {
  h->id = XSIM_HANDLE_TAG | ++xsim_vmm.next_id;
  RB_INSERT(xsim_handle_tree, &xsim_vmm.handles, h);
  xsim_vmm.nhandles++;
  xsim_vmm.physical += h->size;
  if (!h->imported) xsim_vmm.used[h->prop.location.id] += h->size;
}

/* Frees the handle once nothing names or maps it any more. */
static void xsim_handle_unref_locked(xsim_handle *h) {
  if (h->refs > 0 || h->maps > 0) return;
  RB_REMOVE(xsim_handle_tree, &xsim_vmm.handles, h);
  xsim_vmm.nhandles--;
  xsim_vmm.physical -= h->size;
  if (!h->imported) xsim_vmm.used[h->prop.location.id] -= h->size;
  close(h->fd);
  free(h);
}

/* Whether `size` more bytes fit in the device's capacity. */
static bool xsim_capacity_fits_locked(int device, size_t size) {
  uint64_t cap = xsim_knob_device_memory(device);
  uint64_t used = xsim_vmm.used[device];
  return used <= cap && size <= cap - used;
}

/* cuda.h (cuMemCreate): "The size of this allocation must be a multiple of
   the value given via cuMemGetAllocationGranularity with the
   CU_MEM_ALLOC_GRANULARITY_MINIMUM flag"; flags "must be zero now".
   Beyond the device's capacity: CUDA_ERROR_OUT_OF_MEMORY. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop,
                     unsigned long long flags) {
  XSIM_ENTER("cuMemCreate");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (handle == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((r = xsim_vmm_prop_check(prop)) != CUDA_SUCCESS) return r;
  if (size == 0 || !xsim_aligned(size, xsim_knob_granularity()))
    return CUDA_ERROR_INVALID_VALUE;
  xsim_handle *h = calloc(1, sizeof *h);
  if (h == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  h->fd = xsim_ipc_memfd_create(prop);
  if (h->fd < 0 || ftruncate(h->fd, (off_t)size) != 0) {
    if (h->fd >= 0) close(h->fd);
    free(h);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  h->size = size;
  h->prop = *prop;
  h->refs = 1;
  pthread_mutex_lock(&xsim_vmm.lock);
  bool fits = xsim_capacity_fits_locked(prop->location.id, size);
  if (fits) xsim_handle_insert_locked(h);
  pthread_mutex_unlock(&xsim_vmm.lock);
  if (!fits) {
    close(h->fd);
    free(h);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *handle = h->id;
  return CUDA_SUCCESS;
}

/* cuda.h (cuMemRelease): "The generic memory handle can be freed when there
   are still outstanding mappings made with this handle"; the memory goes
   when the last mapping goes too. An unknown (or already released) handle is
   undefined behaviour in cuda.h; here it is CUDA_ERROR_INVALID_VALUE. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  XSIM_ENTER("cuMemRelease");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_handle *h = xsim_handle_owned_locked(handle);
  if (h != NULL) {
    h->refs--;
    xsim_handle_unref_locked(h);
  }
  pthread_mutex_unlock(&xsim_vmm.lock);
  return h != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* cuda.h: "Retrieve the contents of the property structure defining
   properties for this handle". */
CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
  XSIM_ENTER("cuMemGetAllocationPropertiesFromHandle");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (prop == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_handle *h = xsim_handle_owned_locked(handle);
  if (h != NULL) *prop = h->prop;
  pthread_mutex_unlock(&xsim_vmm.lock);
  return h != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* cuda.h (cuMemRetainAllocationHandle): "The handle is guaranteed to be the
   same handle value used to map the memory. If the address requested is not
   mapped, the function will fail. The returned handle must be released with
   corresponding number of calls to cuMemRelease." Any address inside the
   mapping will do. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                     void *addr) {
  XSIM_ENTER("cuMemRetainAllocationHandle");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (handle == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_mapping *m = xsim_map_containing_locked((uintptr_t)addr);
  if (m != NULL) {
    m->handle->refs++;
    *handle = m->handle->id;
  }
  pthread_mutex_unlock(&xsim_vmm.lock);
  return m != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- mappings ---------------------------------------------------------- */

/* Why cuMemMap may not map [ptr, ptr+size) with h: inside one reservation,
   over no existing mapping, no larger than h (CUDA_ERROR_NOT_SUPPORTED:
   observed on H100, driver 580, for a 2-granule map of a 1-granule
   handle). */
static CUresult xsim_map_check_locked(uintptr_t ptr, size_t size,
                                    const xsim_handle *h,
                                    xsim_reservation **res) {
  if (h == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (size > h->size) return CUDA_ERROR_NOT_SUPPORTED;
  *res = xsim_res_containing_locked(ptr);
  if (*res == NULL || size > (*res)->size - (ptr - (*res)->base))
    return CUDA_ERROR_INVALID_VALUE;
  xsim_mapping *m = xsim_map_from_locked(ptr);
  if (m != NULL && m->base < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

/* cuda.h (cuMemMap): the range "must be an address reservation previously
   reserved with cuMemAddressReserve"; ptr, size and offset are whole
   granules; offset "currently must be zero"; flags "must be zero now";
   "cuMemMap can only create mappings on VA range reservations that are not
   currently mapped"; and "calling cuMemMap does not make the address
   accessible" (PROT_NONE until cuMemSetAccess). cuda.h says offset + size
   must be "less than" the allocation's size; mapping the whole allocation is
   the common case, so size may equal it. A non-zero offset, and a size
   beyond the handle, are CUDA_ERROR_NOT_SUPPORTED (observed on H100, driver
   580: cuda.h's "currently must be zero" is a missing feature, not a bad
   argument); every other misuse (misaligned ptr, outside the reservation,
   flags) is CUDA_ERROR_INVALID_VALUE, as observed there too. */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  XSIM_ENTER("cuMemMap");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (flags != 0 || !xsim_range_valid((uintptr_t)ptr, size))
    return CUDA_ERROR_INVALID_VALUE;
  if (offset != 0) return CUDA_ERROR_NOT_SUPPORTED;
  xsim_mapping *m = calloc(1, sizeof *m);
  if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_handle *h = xsim_handle_owned_locked(handle);
  r = xsim_map_check_locked((uintptr_t)ptr, size, h, &m->res);
  if (r == CUDA_SUCCESS &&
      mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, 0) ==
          MAP_FAILED)
    r = CUDA_ERROR_OUT_OF_MEMORY;  /* e.g. vm.max_map_count reached */
  if (r == CUDA_SUCCESS) {
    m->base = (uintptr_t)ptr;
    m->size = size;
    m->handle = h;
    h->maps++;
    m->res->nmapped++;
    RB_INSERT(xsim_map_tree, &xsim_vmm.mappings, m);
    xsim_vmm.nmappings++;
  }
  pthread_mutex_unlock(&xsim_vmm.lock);
  if (r != CUDA_SUCCESS) free(m);
  return r;
}

/* Turns one mapping back into reserved address space and forgets it. */
static CUresult xsim_map_remove_locked(xsim_mapping *m) {
  int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
  if (mmap((void *)m->base, m->size, PROT_NONE, fl, -1, 0) == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  RB_REMOVE(xsim_map_tree, &xsim_vmm.mappings, m);
  xsim_vmm.nmappings--;
  assert(m->res->nmapped > 0 && m->handle->maps > 0 && "mapping counted");
  m->res->nmapped--;
  m->handle->maps--;
  xsim_handle_unref_locked(m->handle);
  free(m);
  return CUDA_SUCCESS;
}

/* Whether no mapping sticks out of [ptr, ptr+size) at either end: every
   mapping the range touches lies wholly inside it (cuda.h, cuMemUnmap:
   "cannot unmap a sub-range"). Gaps are allowed. */
static bool xsim_range_no_partial_mapping_locked(uintptr_t ptr, size_t size) {
  uintptr_t end = ptr + size;
  xsim_mapping *m = xsim_map_from_locked(ptr);
  for (; m != NULL && m->base < end;
       m = RB_NEXT(xsim_map_tree, &xsim_vmm.mappings, m))
    if (m->base < ptr || m->base + m->size > end) return false;
  return true;
}

/* cuda.h (cuMemUnmap): "The range must be the entire contiguous address range
   that was mapped to. In other words, cuMemUnmap cannot unmap a sub-range of
   an address range mapped by cuMemCreate / cuMemMap." Observed on H100,
   driver 580: a range holding whole mappings and never-mapped space (va, 3
   granules where only va, 2 granules is mapped), or never-mapped space
   alone, is CUDA_SUCCESS; part of one mapping is CUDA_ERROR_INVALID_VALUE.
   The range must lie inside one reservation (not observed: the emulator's
   choice, so that a stray address is still an error). The memory goes if no
   mapping and no handle reference remains. */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  XSIM_ENTER("cuMemUnmap");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (!xsim_range_valid((uintptr_t)ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_reservation *res = xsim_res_containing_locked((uintptr_t)ptr);
  if (res == NULL || size > res->size - ((uintptr_t)ptr - res->base) ||
      !xsim_range_no_partial_mapping_locked((uintptr_t)ptr, size))
    r = CUDA_ERROR_INVALID_VALUE;
  uintptr_t end = (uintptr_t)ptr + size;
  for (xsim_mapping *m = xsim_map_from_locked((uintptr_t)ptr);
       r == CUDA_SUCCESS && m != NULL && m->base < end;
       m = xsim_map_from_locked((uintptr_t)ptr))
    r = xsim_map_remove_locked(m);
  pthread_mutex_unlock(&xsim_vmm.lock);
  return r;
}

/* ---- access ------------------------------------------------------------ */

static int xsim_prot_of(unsigned long long flags) {
  if (flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return PROT_READ | PROT_WRITE;
  if (flags == CU_MEM_ACCESS_FLAGS_PROT_READ) return PROT_READ;
  return PROT_NONE;
}

static CUresult xsim_access_desc_check(const CUmemAccessDesc *d) {
  if (d->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (d->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
      d->flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
      d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return CUDA_ERROR_INVALID_VALUE;
  /* Observed on H100, driver 580: device 4096 is CUDA_ERROR_INVALID_VALUE
     here, not CUDA_ERROR_INVALID_DEVICE. */
  return xsim_device_check(d->location.id) == CUDA_SUCCESS
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

/* Records the descs on one mapping and shows the owner's access through
   mprotect. */
static CUresult xsim_access_apply_locked(xsim_mapping *m,
                                         const CUmemAccessDesc *d,
                                         size_t count) {
  for (size_t i = 0; i < count; i++)
    m->access[d[i].location.id] = d[i].flags;
  int owner = m->handle->prop.location.id;
  if (mprotect((void *)m->base, m->size, xsim_prot_of(m->access[owner])) != 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

/* cuda.h (cuMemSetAccess): "The range must be a fully mapped address range
   containing all allocations created by cuMemMap / cuMemCreate" — one or
   several whole mappings. Host access to the memory follows the access of
   the device that owns it; other devices' flags are recorded (and read back
   by cuMemGetAccess). */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                        const CUmemAccessDesc *desc, size_t count) {
  XSIM_ENTER("cuMemSetAccess");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (desc == NULL || count == 0 || !xsim_range_valid((uintptr_t)ptr, size))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; i++)
    if ((r = xsim_access_desc_check(&desc[i])) != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&xsim_vmm.lock);
  if (!xsim_range_whole_mappings_locked((uintptr_t)ptr, size))
    r = CUDA_ERROR_INVALID_VALUE;
  uintptr_t end = (uintptr_t)ptr + size;
  xsim_mapping key = {.base = (uintptr_t)ptr};
  xsim_mapping *m = RB_FIND(xsim_map_tree, &xsim_vmm.mappings, &key);
  for (; r == CUDA_SUCCESS && m != NULL && m->base < end;
       m = RB_NEXT(xsim_map_tree, &xsim_vmm.mappings, m))
    r = xsim_access_apply_locked(m, desc, count);
  pthread_mutex_unlock(&xsim_vmm.lock);
  return r;
}

/* cuda.h (cuMemGetAccess): "Get the access flags set for the given location
   and ptr"; ptr may be anywhere inside a mapping. */
CUresult cuMemGetAccess(unsigned long long *flags,
                        const CUmemLocation *location, CUdeviceptr ptr) {
  XSIM_ENTER("cuMemGetAccess");
  CUresult r = xsim_require_init();
  if (r != CUDA_SUCCESS) return r;
  if (flags == NULL || location == NULL ||
      location->type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if ((r = xsim_device_check(location->id)) != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_mapping *m = xsim_map_containing_locked((uintptr_t)ptr);
  if (m != NULL) *flags = m->access[location->id];
  pthread_mutex_unlock(&xsim_vmm.lock);
  return m != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- for sim_ipc.c ----------------------------------------------------- */

CUresult xsim_vmm_handle_export_fd(CUmemGenericAllocationHandle handle,
                                   int *fd) {
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_handle *h = xsim_handle_owned_locked(handle);
  if (h == NULL || !(h->prop.requestedHandleTypes &
                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    r = CUDA_ERROR_INVALID_VALUE;
  else if ((*fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0)) < 0)
    r = CUDA_ERROR_OUT_OF_MEMORY;  /* out of file descriptors */
  pthread_mutex_unlock(&xsim_vmm.lock);
  return r;
}

CUresult xsim_vmm_handle_import_fd(int fd, const CUmemAllocationProp *prop,
                                   CUmemGenericAllocationHandle *handle) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0 ||
      !xsim_aligned((uint64_t)st.st_size, xsim_knob_granularity())) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  xsim_handle *h = calloc(1, sizeof *h);
  if (h == NULL) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  h->fd = fd;
  h->size = (size_t)st.st_size;
  h->prop = *prop;
  h->refs = 1;
  h->imported = true;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_handle_insert_locked(h);
  *handle = h->id;
  pthread_mutex_unlock(&xsim_vmm.lock);
  return CUDA_SUCCESS;
}

/* ---- live objects ------------------------------------------------------ */

void xsim_vmm_live(xsim_live *out) {
  pthread_mutex_lock(&xsim_vmm.lock);
  out->handles = xsim_vmm.nhandles;
  out->mappings = xsim_vmm.nmappings;
  out->reservations = xsim_vmm.nreservations;
  out->physical_bytes = xsim_vmm.physical;
  pthread_mutex_unlock(&xsim_vmm.lock);
}

uint64_t xsim_vmm_used_bytes(int device) {
  assert(device >= 0 && device < XSIM_MAX_DEVICES && "device ordinal");
  pthread_mutex_lock(&xsim_vmm.lock);
  uint64_t used = xsim_vmm.used[device];
  pthread_mutex_unlock(&xsim_vmm.lock);
  return used;
}

uint64_t xsim_vmm_report_live(FILE *out) {
  uint64_t lines = 0;
  pthread_mutex_lock(&xsim_vmm.lock);
  xsim_handle *h;
  RB_FOREACH(h, xsim_handle_tree, &xsim_vmm.handles) {
    fprintf(out, "xsim: live handle 0x%llx: %zu bytes on device %d, "
            "%llu reference(s), %llu mapping(s)%s\n",
            (unsigned long long)h->id, h->size, h->prop.location.id,
            (unsigned long long)h->refs, (unsigned long long)h->maps,
            h->imported ? ", imported" : "");
    lines++;
  }
  xsim_mapping *m;
  RB_FOREACH(m, xsim_map_tree, &xsim_vmm.mappings) {
    fprintf(out, "xsim: live mapping [0x%llx, +%zu) of handle 0x%llx\n",
            (unsigned long long)m->base, m->size,
            (unsigned long long)m->handle->id);
    lines++;
  }
  xsim_reservation *res;
  RB_FOREACH(res, xsim_res_tree, &xsim_vmm.reservations) {
    fprintf(out, "xsim: live reservation [0x%llx, +%zu), %llu mapping(s)\n",
            (unsigned long long)res->base, res->size,
            (unsigned long long)res->nmapped);
    lines++;
  }
  pthread_mutex_unlock(&xsim_vmm.lock);
  return lines;
}
