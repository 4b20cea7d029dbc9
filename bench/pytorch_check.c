/* pytorch_check.c: the pytorch-expandable policy's check, its blocks
 * against their invariants (pytorch_blocks.h, pt_block) and its count of
 * mapped bytes against the segments' pages.
 */
#include "pytorch_blocks.h"

/* The head of b's segment. */
static const pt_block *segment_head(const pt_block *b) {
  while (b->prev != NULL) b = b->prev;
  return b;
}

/* One segment's blocks against the invariants at pt_block; adds its mapped
   bytes to *mapped. */
static bool segment_check(const pt_block *head, uint64_t *mapped,
                          xb_error *err) {
  const xb_pt_segment *s = head->seg;
  uint64_t at = s->base;
  for (const pt_block *b = head; b != NULL; at += b->size, b = b->next) {
    if (b->ptr != at || b->seg != s)
      return xb_fail(err, "block at 0x%llx does not follow its neighbour",
                     (unsigned long long)b->ptr);
    if (b->next != NULL && !b->allocated && !b->next->allocated &&
        b->mapped == b->next->mapped)
      return xb_fail(err, "free neighbours at 0x%llx are not merged",
                     (unsigned long long)b->ptr);
    for (uint64_t p = b->ptr; p < b->ptr + b->size; p += XB_PT_MIN_BLOCK) {
      size_t page = (size_t)((p - s->base) / s->page);
      if (s->present[page] != b->mapped)
        return xb_fail(err, "block at 0x%llx: page %zu is %smapped",
                       (unsigned long long)b->ptr, page,
                       s->present[page] ? "" : "not ");
      p = s->base + (page + 1) * s->page - XB_PT_MIN_BLOCK;
    }
    if (b->mapped) *mapped += b->size;
  }
  if (at != s->base + s->n_pages * s->page)
    return xb_fail(err, "segment at 0x%llx: blocks end at 0x%llx",
                   (unsigned long long)s->base, (unsigned long long)at);
  return true;
}

bool xb_pt_check(void *self, xb_error *err) {
  xb_pytorch *x = self;
  uint64_t mapped = 0;
  size_t n_segments = 0;
  for (const xb_pt_segment *s = x->segments; s != NULL; s = s->next)
    n_segments++;
  size_t seen = 0;
  for (size_t i = 0; i < x->n_pools; i++) {
    pt_block *b;
    /* Each segment has an unmapped block or a free one, unless it is
       wholly allocated: walk from the heads found in either set. */
    RB_FOREACH(b, pt_by_addr, &x->pools[i].unmapped) {
      if (segment_head(b) != b) continue;
      if (!segment_check(b, &mapped, err)) return false;
      seen++;
    }
    RB_FOREACH(b, pt_by_size, &x->pools[i].blocks) {
      if (segment_head(b) != b) continue;
      if (!segment_check(b, &mapped, err)) return false;
      seen++;
    }
  }
  for (uint32_t i = 0; x->slot != NULL && i < x->n_slots; i++) {
    const pt_block *b = x->slot[i];
    if (b == NULL || segment_head(b) != b) continue;
    if (!segment_check(b, &mapped, err)) return false;
    seen++;
  }
  if (seen != n_segments)
    return xb_fail(err, "%zu segments, %zu found through their blocks",
                   n_segments, seen);
  if (mapped != x->mapped)
    return xb_fail(err, "blocks map %llu bytes, the count says %llu",
                   (unsigned long long)mapped,
                   (unsigned long long)x->mapped);
  return true;
}
