/* pytorch_segment.c: PyTorch's ExpandableSegment on vmm's driver table.
 *
 * As c10/cuda/CUDACachingAllocator.cpp has it: the range is reserved once,
 * large enough for 1 1/8 of the device's memory ("some cases where we have
 * to unmap pages earlier in the segment to put them at the end"); a map
 * creates one physical handle per page and maps each on its own, then
 * grants access to the whole run at once; an unmap synchronises the
 * segment's stream first, since cuMemUnmap does not wait for work queued on
 * the memory, then unmaps and releases page by page. PyTorch frees the
 * range only when the segment has nothing mapped left (empty_cache or the
 * out-of-memory path); the destructor unmaps what is still mapped.
 */
#include <assert.h>
#include <stdlib.h>

#include "pytorch.h"
#include "vmm/error.h"

xseg_status xb_pt_segment_create(xs_vmm *v, CUstream stream, uint64_t page,
                                 uint64_t total_memory, xb_pt_segment **out) {
  assert(page % v->granularity == 0 && "pages are granule multiples");
  xb_pt_segment *s = calloc(1, sizeof *s);
  if (s == NULL) return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  uint64_t want = total_memory + total_memory / 8;
  s->v = v;
  s->stream = stream;
  s->page = page;
  s->n_pages = (size_t)((want + page - 1) / page);
  s->handles = calloc(s->n_pages ? s->n_pages : 1, sizeof *s->handles);
  s->present = calloc(s->n_pages ? s->n_pages : 1, sizeof *s->present);
  xseg_status st =
      s->handles != NULL && s->present != NULL
          ? xs_vmm_reserve(v, s->n_pages * page, &s->base)
          : xs_error(XSEG_ERR_OUT_OF_MEMORY,
                     "out of host memory for %zu pages", s->n_pages);
  if (st != XSEG_OK) {
    free(s->handles);
    free(s->present);
    free(s);
    return st;
  }
  *out = s;
  return XSEG_OK;
}

xseg_status xb_pt_segment_map(xb_pt_segment *s, uint64_t addr, uint64_t size,
                              uint64_t *mapped) {
  assert((addr - s->base) % s->page == 0 && "maps start at a page");
  size_t begin = (size_t)((addr - s->base) / s->page);
  size_t end = (size_t)((addr - s->base + size + s->page - 1) / s->page);
  assert(end <= s->n_pages && "inside the reserved range");
  *mapped = 0;
  if (begin == end) return XSEG_OK;
  for (size_t i = begin; i < end; i++)
    assert(!s->present[i] && "a page is mapped once");
  /* xs_vmm_map_run is PyTorch's map: a handle per page, created then
     mapped one by one, one cuMemSetAccess; what it created is released
     again when anything fails. */
  xseg_status st = xs_vmm_map_run(s->v, s->base + begin * s->page, s->page,
                                  end - begin, &s->handles[begin]);
  if (st != XSEG_OK) return st;
  for (size_t i = begin; i < end; i++) s->present[i] = true;
  *mapped = (end - begin) * s->page;
  return XSEG_OK;
}

static xseg_status segment_unmap_pages(xb_pt_segment *s, size_t begin,
                                       size_t end) {
  xs_vmm *v = s->v;
  CUresult r = XS_DRV(v->drv, cuStreamSynchronize, s->stream);
  if (r != CUDA_SUCCESS)
    return xs_driver_error(v->drv, r, "cuStreamSynchronize");
  for (size_t i = begin; i < end; i++) {
    if (!s->present[i]) continue;
    xseg_status st = xs_vmm_unmap(v, s->base + i * s->page, s->page);
    if (st != XSEG_OK) return st;
    s->present[i] = false;
    st = xs_vmm_handle_release(v, s->handles[i]);
    if (st != XSEG_OK) return st;
  }
  return XSEG_OK;
}

void xb_pt_segment_inner(const xb_pt_segment *s, uint64_t addr,
                         uint64_t size, uint64_t *inner_addr,
                         uint64_t *inner_size) {
  uint64_t off = addr - s->base;
  uint64_t begin = (off + s->page - 1) / s->page, end = (off + size) / s->page;
  *inner_addr = s->base + begin * s->page;
  *inner_size = begin < end ? (end - begin) * s->page : 0;
}

xseg_status xb_pt_segment_unmap(xb_pt_segment *s, uint64_t addr,
                                uint64_t size) {
  assert((addr - s->base) % s->page == 0 && size % s->page == 0 && size > 0);
  size_t begin = (size_t)((addr - s->base) / s->page);
  return segment_unmap_pages(s, begin, begin + (size_t)(size / s->page));
}

void xb_pt_segment_destroy(xb_pt_segment *s) {
  if (s == NULL) return;
  /* PyTorch unmaps each mapped run with its own synchronize; at teardown
     one covers them all (nothing is counted after a replay ends). */
  bool any = false;
  for (size_t i = 0; i < s->n_pages && !any; i++) any = s->present[i];
  if (any) segment_unmap_pages(s, 0, s->n_pages);
  xs_vmm_unreserve(s->v, s->base, s->n_pages * s->page);
  free(s->handles);
  free(s->present);
  free(s);
}
