/* segment.c: the blocks and the page map of one reserved range (see
 * segment.h, where splitting and merging blocks are inline): recording
 * what is mapped, and the validator that checks the tiling against the
 * page map.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "segments/segment.h"

bool xs_segment_alloc_page_map(xs_segment *s, size_t n) {
  s->handle = calloc(n, sizeof *s->handle);
  s->hlen = calloc(n, sizeof *s->hlen);
  s->mapped = calloc(n, 1);
  if (s->handle != NULL && s->hlen != NULL && s->mapped != NULL) return true;
  xs_segment_free_page_map(s);
  return false;
}

void xs_segment_free_page_map(xs_segment *s) {
  free(s->handle);
  free(s->hlen);
  free(s->mapped);
  s->handle = NULL;
  s->hlen = NULL;
  s->mapped = NULL;
}

void xs_segment_record_map(xs_segment *s, uint64_t addr, size_t n,
                           const uint64_t *handles) {
  size_t g = xs_segment_granule_of(s, addr);
  assert(addr % s->granule == s->base % s->granule && g + n <= s->n_granules);
  assert((g == 0 || s->mapped[g - 1] != XS_PAGE_OWNED ||
          s->handle[g - 1] != handles[0]) &&
         "a handle is owned at one place only");
  for (size_t i = 0, run; i < n; i += run) {
    for (run = 1; i + run < n && handles[i + run] == handles[i]; run++) {}
    for (size_t j = i; j < i + run; j++) {
      assert(!s->mapped[g + j] && "mapping over a mapping");
      s->mapped[g + j] = XS_PAGE_OWNED;
      s->handle[g + j] = handles[i];
      s->hlen[g + j] = (uint32_t)run;
    }
  }
  s->mapped_granules += n;
}

void xs_segment_record_unmap(xs_segment *s, uint64_t addr, size_t n,
                             uint64_t *handles_out) {
  size_t g = xs_segment_granule_of(s, addr);
  assert(g + n <= s->n_granules && n > 0);
  assert(xs_segment_handle_head(s, g) == g && "unmapping part of a handle");
  assert(xs_segment_handle_head(s, g + n - 1) + s->hlen[g + n - 1] ==
             g + n && "unmapping part of a handle");
  uint8_t state = s->mapped[g];
  size_t *count =
      state == XS_PAGE_ALIAS ? &s->alias_granules : &s->mapped_granules;
  assert(state != XS_PAGE_UNMAPPED && *count >= n);
  for (size_t i = 0; i < n; i++) {
    assert(s->mapped[g + i] == state && "unmapping owned and aliases at once");
    s->mapped[g + i] = XS_PAGE_UNMAPPED;
    if (handles_out != NULL) handles_out[i] = s->handle[g + i];
    s->handle[g + i] = 0;
    s->hlen[g + i] = 0;
  }
  *count -= n;
}

void xs_segment_record_lend(xs_segment *s, uint64_t addr, size_t n,
                            uint64_t *handles_out) {
  size_t g = xs_segment_granule_of(s, addr);
  assert(g + n <= s->n_granules && s->mapped_granules >= n && n > 0);
  assert(xs_segment_handle_head(s, g) == g && "lending part of a handle");
  assert(xs_segment_handle_head(s, g + n - 1) + s->hlen[g + n - 1] ==
             g + n && "lending part of a handle");
  /* An alias keeps the address of its mapping's first granule instead of
     the handle (which it no longer owns, and which may be mapped, owned or
     lent again, right next to it): so each alias mapping stays a run of
     its own in the page map. */
  for (size_t i = 0; i < n; i += s->hlen[g + i]) {
    uint64_t token = s->base + (g + i) * s->granule;
    for (size_t j = i; j < i + s->hlen[g + i]; j++) {
      assert(s->mapped[g + j] == XS_PAGE_OWNED && "lending what is not owned");
      s->mapped[g + j] = XS_PAGE_ALIAS;
      handles_out[j] = s->handle[g + j];
      s->handle[g + j] = token;
    }
  }
  s->mapped_granules -= n;
  s->alias_granules += n;
}

#define SEG_FAIL(...)                                                        \
  do {                                                                       \
    snprintf(msg, msg_size, __VA_ARGS__);                                    \
    return false;                                                            \
  } while (0)

/* The page map agrees with b's mapped state over the granules it touches. */
static bool segment_block_pages_valid(const xs_segment *s, const xs_block *b,
                                      char *msg, size_t msg_size) {
  size_t g0 = xs_segment_granule_of(s, b->addr);
  size_t g1 = xs_segment_granule_of(s, xs_block_end(b) - 1);
  if (!b->mapped && ((b->addr - s->base) % s->granule != 0 ||
                     b->size % s->granule != 0))
    SEG_FAIL("unmapped block 0x%llx+%zu is not granule-aligned",
             (unsigned long long)b->addr, b->size);
  static const char *const state[] = {"unmapped", "mapped", "an alias"};
  uint8_t want = b->retiring ? XS_PAGE_ALIAS
                 : b->mapped ? XS_PAGE_OWNED : XS_PAGE_UNMAPPED;
  for (size_t g = g0; g <= g1; g++)
    if (s->mapped[g] != want)
      SEG_FAIL("block 0x%llx+%zu is %s but granule %zu is %s",
               (unsigned long long)b->addr, b->size,
               b->retiring ? "retiring" : state[want], g,
               s->mapped[g] <= XS_PAGE_ALIAS ? state[s->mapped[g]] : "bad");
  return true;
}

static bool segment_block_valid(const xs_segment *s, const xs_block *b,
                                char *msg, size_t msg_size) {
  if (b->seg != s) SEG_FAIL("block 0x%llx names another segment",
                            (unsigned long long)b->addr);
  if (b->size == 0 || b->size % 512 != 0 || b->addr % 512 != 0)
    SEG_FAIL("block 0x%llx+%zu is not 512-byte aligned",
             (unsigned long long)b->addr, b->size);
  if (b->pending && !b->allocated)
    SEG_FAIL("pending block 0x%llx is not allocated",
             (unsigned long long)b->addr);
  if (b->allocated && !b->mapped && !b->retiring)
    SEG_FAIL("allocated block 0x%llx is not mapped",
             (unsigned long long)b->addr);
  if (b->retiring && (!b->allocated || b->mapped || b->pending))
    SEG_FAIL("retiring block 0x%llx is not an unusable alias",
             (unsigned long long)b->addr);
  if (b->next != NULL && b->next->addr != xs_block_end(b))
    SEG_FAIL("block 0x%llx+%zu is followed by 0x%llx (gap or overlap)",
             (unsigned long long)b->addr, b->size,
             (unsigned long long)b->next->addr);
  if (b->next != NULL && b->next->prev != b)
    SEG_FAIL("block 0x%llx: next->prev does not point back",
             (unsigned long long)b->addr);
  if (b->next != NULL && !b->allocated && !b->next->allocated &&
      b->mapped == b->next->mapped)
    SEG_FAIL("free blocks 0x%llx and 0x%llx should have merged",
             (unsigned long long)b->addr, (unsigned long long)b->next->addr);
  return segment_block_pages_valid(s, b, msg, msg_size);
}

static void segment_walk_add(xs_segment_walk *w, const xs_block *b) {
  if (b->retiring) {
    w->retiring++;
    w->alias_bytes += b->size;
  } else if (b->pending) {
    w->pending++;
    w->pending_bytes += b->size;
  } else if (b->allocated) {
    w->allocated++;
    w->allocated_bytes += b->size;
    w->requested_bytes += b->requested;
  } else if (b->mapped) {
    w->free_mapped++;
    if (b->seg->counts_split && xs_block_is_split(b)) {
      w->split_free++;
      w->split_free_bytes += b->size;
    }
  } else {
    w->unmapped++;
  }
}

/* Each maximal run of equal handle values is one whole handle: its length
   is the hlen every granule of it records (a partial unmap would leave a
   shorter run). */
static bool segment_handles_valid(const xs_segment *s, char *msg,
                                  size_t msg_size) {
  size_t g = 0;
  while (g < s->n_granules) {
    if (!s->mapped[g]) {
      if (s->handle[g] != 0 || s->hlen[g] != 0)
        SEG_FAIL("segment 0x%llx: unmapped granule %zu keeps a handle",
                 (unsigned long long)s->base, g);
      g++;
      continue;
    }
    if (s->mapped[g] > XS_PAGE_ALIAS)
      SEG_FAIL("segment 0x%llx: granule %zu has page state %u",
               (unsigned long long)s->base, g, s->mapped[g]);
    size_t run = 1;
    while (g + run < s->n_granules && s->mapped[g + run] == s->mapped[g] &&
           s->handle[g + run] == s->handle[g])
      run++;
    for (size_t i = g; i < g + run; i++)
      if (s->hlen[i] != run)
        SEG_FAIL("segment 0x%llx: handle 0x%llx is mapped at %zu granules "
                 "from granule %zu, but granule %zu says it has %u",
                 (unsigned long long)s->base,
                 (unsigned long long)s->handle[g], run, g, i, s->hlen[i]);
    g += run;
  }
  return true;
}

bool xs_segment_is_valid(const xs_segment *s, xs_segment_walk *walk,
                         char *msg, size_t msg_size) {
  if (s->first == NULL || s->first->addr != s->base || s->first->prev != NULL)
    SEG_FAIL("segment 0x%llx: first block does not start it",
             (unsigned long long)s->base);
  size_t mapped = 0, alias = 0;
  for (size_t g = 0; g < s->n_granules; g++) {
    mapped += s->mapped[g] == XS_PAGE_OWNED;
    alias += s->mapped[g] == XS_PAGE_ALIAS;
  }
  if (mapped != s->mapped_granules || alias != s->alias_granules)
    SEG_FAIL("segment 0x%llx: %zu granules mapped and %zu aliases, %zu and "
             "%zu counted", (unsigned long long)s->base, mapped, alias,
             s->mapped_granules, s->alias_granules);
  if (!segment_handles_valid(s, msg, msg_size)) return false;
  const xs_block *b = s->first;
  for (; b->next != NULL; b = b->next)
    if (!segment_block_valid(s, b, msg, msg_size)) return false;
  if (!segment_block_valid(s, b, msg, msg_size)) return false;
  if (b != s->last || xs_block_end(b) != s->base + s->size)
    SEG_FAIL("segment 0x%llx+%zu: blocks end at 0x%llx",
             (unsigned long long)s->base, s->size,
             (unsigned long long)xs_block_end(b));
  for (b = s->first; b != NULL; b = b->next) segment_walk_add(walk, b);
  walk->mapped_bytes += s->mapped_granules * s->granule;
  return true;
}
