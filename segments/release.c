/* release.c: page-granular release — unmapping the whole granules that lie
 * inside free blocks, either to hand their physical handles to growth
 * elsewhere (xs_pool_harvest: reuse instead of release and re-create) or to
 * give them back to the driver (xs_pool_release: empty_cache, the OOM path).
 *
 * A free mapped block rarely starts or ends on a granule boundary. Only the
 * granules wholly inside it can go; the partial granules at its ends stay
 * mapped, because live neighbours share them:
 *
 *     granules:  |   g0   |   g1   |   g2   |   g3   |   g4   |
 *     blocks:    [live][ free block b .......................][live]
 *                      ^ b->addr                              ^ end(b)
 *     after:     [live][hd][       mid: unmapped    ][  tl   ][live]
 *                          ^ align_up(b->addr)      ^ align_down(end(b))
 *
 *   hd (mapped, free): b->addr .. align_up(b->addr), inside g0
 *   mid (unmapped):    the whole granules g1..g3 (whole handles only, see
 *                      release_span; from the low end when fewer are
 *                      wanted)
 *   tl (mapped, free): the rest up to end(b), inside g4 — or more whole
 *                      granules when fewer were wanted
 *
 * hd and tl go back to the free tree; mid merges with unmapped neighbours
 * (never with hd or tl: mapped never merges with unmapped) and goes to the
 * unmapped tree, where growth can map it again.
 *
 * Lending (map before unmap): a free block whose stream's guard has not
 * passed its free cannot be unmapped yet, but its whole handles can still
 * serve growth on the same stream (stream order queues the new user after
 * the old ones) or, behind a cuStreamWaitEvent, on another. Then mid is not
 * unmapped: it becomes a retiring block (its granules XS_PAGE_ALIAS, its
 * bytes leave reserved_bytes, which the new mapping adds back), and
 * xs_pool_retire unmaps it once the guard has passed its free. One handle
 * is then mapped at two addresses for a while: physical memory is counted
 * once, only address space twice. The driver frees a handle only when it
 * is released and its last mapping is gone, so while an alias maps a
 * handle (vmm/aliases.c) a release pass leaves that handle mapped where it
 * is owned (releasing it would free nothing, and reserved_bytes would stop
 * counting memory the device still holds); a handle that a failed growth
 * gives up while an alias maps it is an orphan, counted in reserved_bytes
 * until xs_pool_retire unmaps its last alias and releases it.
 *
 * Unmapping does not wait for work in flight. PyTorch's expandable segments
 * synchronize the stream before every unmap; here nothing waits: a block is
 * cut only when its stream's guard has passed its free epoch
 * (p->safe_epoch, kept by streams/guard.c), and the others stay mapped
 * until a later pass finds them safe.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "segments/pool.h"
#include "vmm/error.h"

/* The whole handles inside b: [*lo, *lo + *n * granule). A handle that
   sticks out of b on either side stays (the driver unmaps whole handles):
 *
 *     handles:  |  A  A  |  B  |  C  C  C  |  D  D  |
 *     block b:      [ free ..................... ]
 *     span:            [ B ][  C  C  C  ]
 */
static void release_span(const xs_block *b, uint64_t *lo, size_t *n) {
  const xs_segment *s = b->seg;
  size_t g0 = (size_t)((b->addr - s->base + s->granule - 1) / s->granule);
  size_t g1 = (size_t)((xs_block_end(b) - s->base) / s->granule);
  if (g0 < g1 && xs_segment_handle_head(s, g0) != g0)
    g0 = xs_segment_handle_head(s, g0) + s->hlen[g0];
  if (g0 < g1) {
    size_t head = xs_segment_handle_head(s, g1 - 1);
    if (head + s->hlen[g1 - 1] > g1) g1 = head;
  }
  *lo = s->base + g0 * s->granule;
  *n = g1 > g0 ? g1 - g0 : 0;
}

/* Whether the owned handle at granule g is still mapped by an alias (a
   mapping it was lent from, perhaps in another pool). Releasing it would
   free no device memory until that alias is unmapped, while reserved
   bytes would stop counting it: it stays for a pass after the alias went
   (vmm/aliases.c). Moving it to a new mapping is fine: it stays owned. */
static bool release_pinned(const xs_pool *p, const xs_segment *s, size_t g) {
  return s->mapped[g] == XS_PAGE_OWNED &&
         xs_vmm_alias_maps(p->vmm, s->handle[g]);
}

/* How many granules of the span from granule *g (*n of them) to cut: whole
   handles from its low end until at least `want`, never more than `max`.
   A release to the driver (`release`) first skips the pinned handles at
   the low end (moving *g and *n) and stops before the next one. */
static size_t release_take(const xs_pool *p, const xs_segment *s, size_t *g,
                           size_t *n, size_t want, size_t max, bool release) {
  while (release && *n > 0 && release_pinned(p, s, *g)) {
    size_t k = s->hlen[*g];
    *g += k;
    *n -= k;
  }
  size_t took = 0;
  while (took < *n && took < want && took + s->hlen[*g + took] <= max &&
         !(release && release_pinned(p, s, *g + took)))
    took += s->hlen[*g + took];
  return took;
}

/* Releases one handle. A failed cuMemRelease keeps the handle for a later
   retry (vmm/unreleased.c): it is already unmapped, and losing it would
   leak its memory for the life of the process. */
static xseg_status release_handle(xs_pool *p, uint64_t h) {
  xseg_status st = xs_vmm_handle_release_or_keep(p->vmm, h);
  p->stats->counter[XS_COUNTER_num_device_free]++;
  return st;
}

/* Releases the handles mapped at granules [g, g + n) of s, one call per
   handle (not per granule); the first failure goes to *late. */
static void release_handles(xs_pool *p, const xs_segment *s, size_t g,
                            size_t n, xseg_status *late) {
  for (size_t i = g; i < g + n; i += s->hlen[i]) {
    assert(s->hlen[i] > 0 && xs_segment_handle_head(s, i) == i);
    if (s->mapped[i] == XS_PAGE_ALIAS) continue;   /* owned elsewhere */
    xseg_status st = release_handle(p, s->handle[i]);
    if (st != XSEG_OK && *late == XSEG_OK) *late = st;
  }
}

/* Driver side of cutting [lo, lo + n granules): one unmap, then, unless the
   handles are kept for reuse, one release per handle. A failed unmap
   changed nothing and is returned; a failed release after a good unmap
   still leaves the range unmapped, so it only lands in *late. */
static xseg_status release_driver(xs_pool *p, xs_segment *s, uint64_t lo,
                                  size_t n, bool keep_handles,
                                  xseg_status *late) {
  xseg_status st = xs_vmm_unmap(p->vmm, lo, n * s->granule);
  if (st != XSEG_OK || keep_handles) return st;
  release_handles(p, s, xs_segment_granule_of(s, lo), n, late);
  return XSEG_OK;
}

/* Cuts the granules [lo, lo + n*granule) out of free mapped block b
   (picture above) after the driver has unmapped them, or, when `lend`,
   turns them into a retiring block whose handles go out (no driver call:
   the mapping stays until xs_pool_retire). */
static void release_cut(xs_pool *p, xs_block *b, uint64_t lo, size_t n,
                        xs_block *spare[2], bool lend,
                        uint64_t *handles_out) {
  xs_segment *s = b->seg;
  uint64_t hi = lo + n * s->granule;
  xs_pool_unindex(p, b);
  xs_block *mid = b;
  if (lo > b->addr) {
    mid = xs_segment_split(s, b, (size_t)(lo - b->addr), spare[0]);
    spare[0] = NULL;
    xs_pool_index(p, b);
  }
  if (hi < xs_block_end(mid)) {
    xs_pool_index(p, xs_segment_split(s, mid, (size_t)(hi - mid->addr),
                                      spare[1]));
    spare[1] = NULL;
  }
  mid->mapped = false;
  xs_stats_move(p->stats, XS_GAUGE_reserved_bytes, p->kind,
                -(int64_t)(n * s->granule));
  /* The range leaves the pool's memory (and the snapshot) now, lent or
     not: a lent one's alias stays mapped until xs_pool_retire, but the
     trace says so now, before the borrower maps the handles again. */
  if (p->on_unmap != NULL) p->on_unmap(p->on_unmap_ctx, p, lo, n * s->granule);
  if (lend) {
    xs_segment_record_lend(s, lo, n, handles_out);
    size_t g = xs_segment_granule_of(s, lo);
    for (size_t i = 0; i < n; i += s->hlen[g + i])
      xs_vmm_alias_add(p->vmm, lo + i * s->granule, handles_out[i],
                       s->hlen[g + i] * s->granule, (int)p->kind);
    mid->allocated = true;
    mid->retiring = true;
    mid->retire_next = p->retiring;
    p->retiring = mid;
    p->n_retiring++;
    return;
  }
  xs_segment_record_unmap(s, lo, n, handles_out);
  xs_pool_coalesce(p, mid);
}

/* After [addr, addr + size) of s was unmapped: releases the orphans whose
   last aliases were there (their bytes leave reserved_bytes only now) and
   forgets the other aliases there. */
static void release_aliases(xs_pool *p, uint64_t addr, size_t size,
                            xseg_status *late) {
  xs_vmm_alias e;
  while (xs_vmm_alias_take_orphan(p->vmm, addr, size, &e)) {
    xs_stats_move(p->stats, XS_GAUGE_reserved_bytes, (xs_pool_kind)e.tag,
                  -(int64_t)e.size);
    /* Its bytes came back at its first alias when it became an orphan
       (alloc/physical.c traces a segment_map there): they go now. */
    if (p->on_unmap != NULL) p->on_unmap(p->on_unmap_ctx, p, e.addr, e.size);
    xseg_status st = release_handle(p, e.handle);
    if (st != XSEG_OK && *late == XSEG_OK) *late = st;
  }
  xs_vmm_alias_drop(p->vmm, addr, size);
}

static void release_put_spares(xs_pool *p, xs_block *spare[2]) {
  for (int i = 0; i < 2; i++)
    if (spare[i] != NULL) xs_blocks_put(p->blocks, spare[i]);
}

/* Unmaps whole handles of free mapped block b, from its low end, until at
   least `want` granules (but never more than `max`), or lends them (see
   the top; handles_out then required); returns how many granules.
   Failures leave b as it was and land in *st. */
static size_t release_block(xs_pool *p, xs_block *b, size_t want, size_t max,
                            bool lend, uint64_t *handles_out,
                            xseg_status *st) {
  assert(!lend || handles_out != NULL);
  xs_segment *s = b->seg;
  uint64_t lo;
  size_t n;
  release_span(b, &lo, &n);
  size_t g = xs_segment_granule_of(s, lo);
  n = release_take(p, s, &g, &n, want, max, !lend && handles_out == NULL);
  if (n == 0) return 0;
  lo = s->base + g * s->granule;
  uint64_t hi = lo + n * s->granule;
  xs_block *spare[2] = {NULL, NULL};
  if (lo > b->addr) spare[0] = xs_blocks_get(p->blocks);
  if (hi < xs_block_end(b)) spare[1] = xs_blocks_get(p->blocks);
  if ((lo > b->addr && spare[0] == NULL) ||
      (hi < xs_block_end(b) && spare[1] == NULL) ||
      (lend && !xs_vmm_alias_reserve(p->vmm, n))) {
    release_put_spares(p, spare);
    *st = xs_error(XSEG_ERR_OUT_OF_MEMORY,
                   "out of host memory for a block or an alias record");
    return 0;
  }
  xseg_status late = XSEG_OK;
  xseg_status ds = lend ? XSEG_OK
                        : release_driver(p, b->seg, lo, n,
                                         handles_out != NULL, &late);
  if (ds != XSEG_OK) {
    release_put_spares(p, spare);
    *st = ds;
    return 0;
  }
  release_cut(p, b, lo, n, spare, lend, handles_out);
  release_put_spares(p, spare);
  if (late != XSEG_OK) *st = late;
  return n;
}

/* Whether b has a whole handle to give. */
static bool release_worthwhile(const xs_block *b) {
  uint64_t lo;
  size_t n;
  release_span(b, &lo, &n);
  return n > 0;
}

bool xs_pool_block_releasable(const xs_pool *p, const xs_block *b) {
  assert(!b->allocated && b->mapped && "a free mapped block");
  return b->free_epoch <= p->safe_epoch && release_worthwhile(b);
}

uint64_t xs_pool_unsafe_epoch(xs_pool *p) {
  uint64_t newest = 0;
  for (const xs_block *r = p->retiring; r != NULL; r = r->retire_next)
    if (r->free_epoch > p->safe_epoch && r->free_epoch > newest)
      newest = r->free_epoch;
  size_t granule = p->vmm->granularity;
  xs_block *b = xs_freetree_largest(&p->free, granule);
  for (; b != NULL; b = xs_freetree_smaller(&p->free, b, granule))
    if (b->free_epoch > p->safe_epoch && b->free_epoch > newest &&
        release_worthwhile(b))
      newest = b->free_epoch;
  return newest;
}

size_t xs_pool_harvest(xs_pool *p, size_t granule, size_t want, size_t max,
                       const xs_block *keep, uint64_t lend_upto,
                       uint64_t *handles_out, xseg_status *st) {
  size_t got = 0;
  *st = XSEG_OK;
  xs_block *b = xs_freetree_largest(&p->free, granule);
  while (b != NULL && got < want) {
    /* Cutting b only touches b and unmapped neighbours (lending: not even
       them), so the next smaller block stays valid. */
    xs_block *next = xs_freetree_smaller(&p->free, b, granule);
    bool safe = b->free_epoch <= p->safe_epoch;
    if (b != keep && b->seg->granule == granule &&
        (safe || b->free_epoch <= lend_upto) && release_worthwhile(b)) {
      got += release_block(p, b, want - got, max - got, !safe,
                           handles_out + got, st);
      if (*st != XSEG_OK) break;
    }
    b = next;
  }
  return got;
}

uint64_t xs_pool_lendable_epoch(xs_pool *p, size_t granule) {
  uint64_t oldest = 0;
  xs_block *b = xs_freetree_largest(&p->free, granule);
  for (; b != NULL; b = xs_freetree_smaller(&p->free, b, granule))
    if (b->seg->granule == granule && b->free_epoch > p->safe_epoch &&
        (oldest == 0 || b->free_epoch < oldest) && release_worthwhile(b))
      oldest = b->free_epoch;
  return oldest;
}

xseg_status xs_pool_retire(xs_pool *p) {
  xseg_status first = XSEG_OK;
  xs_block **link = &p->retiring;
  while (*link != NULL) {
    xs_block *r = *link;
    assert(r->retiring && r->allocated && !r->mapped);
    if (r->free_epoch > p->safe_epoch) {   /* old work may still touch it */
      link = &r->retire_next;
      continue;
    }
    xseg_status st = xs_vmm_unmap(p->vmm, r->addr, r->size);
    if (st != XSEG_OK) {                   /* keep it for a later pass */
      if (first == XSEG_OK) first = st;
      link = &r->retire_next;
      continue;
    }
    *link = r->retire_next;
    p->n_retiring--;
    release_aliases(p, r->addr, r->size, &first);
    xs_segment *s = r->seg;
    xs_segment_record_unmap(s, r->addr, r->size / s->granule, NULL);
    /* (Its segment_unmap was traced when it was lent: release_cut.) */
    r->retiring = false;
    r->allocated = false;
    r->retire_next = NULL;
    xs_pool_coalesce(p, r);
  }
  return first;
}

size_t xs_pool_release_block(xs_pool *p, xs_block *b, size_t want,
                             xseg_status *st) {
  assert(xs_pool_block_releasable(p, b));
  *st = XSEG_OK;
  return release_block(p, b, want, SIZE_MAX, false, NULL, st);
}

xseg_status xs_pool_drop_empty(xs_pool *p) {
  xseg_status first = XSEG_OK;
  xs_segment *s = p->segments;
  while (s != NULL) {
    xs_segment *next = s->next;
    if (s->mapped_granules == 0 && s->alias_granules == 0) {
      xseg_status st = xs_pool_drop_segment(p, s);
      if (first == XSEG_OK) first = st;
    }
    s = next;
  }
  return first;
}

xseg_status xs_pool_release(xs_pool *p, size_t goal, size_t *released) {
  size_t bytes = 0;
  xseg_status first = XSEG_OK;
  size_t granule = p->vmm->granularity;
  xs_block *b = xs_freetree_largest(&p->free, granule);
  while (b != NULL && bytes < goal) {
    xs_block *next = xs_freetree_smaller(&p->free, b, granule);
    if (xs_pool_block_releasable(p, b)) {
      xseg_status st = XSEG_OK;
      size_t g = b->seg->granule;
      /* Granules to cover what is left, rounded up without overflow: a
         goal near SIZE_MAX must not wrap to nothing. */
      size_t left = goal - bytes;
      size_t want = goal == SIZE_MAX ? SIZE_MAX : left / g + (left % g != 0);
      bytes += release_block(p, b, want, SIZE_MAX, false, NULL, &st) * g;
      if (first == XSEG_OK) first = st;
    }
    b = next;
  }
  xseg_status st = xs_pool_drop_empty(p);
  if (first == XSEG_OK) first = st;
  if (released != NULL) *released = bytes;
  return first;
}

/* Unmaps every mapped run of s with one call each and releases its
   handles; live blocks go too. Nothing keeps s after this (destroy): an
   unmap that fails is tried once more, and a range that will not go is
   kept by the vmm layer. Returns the first failure. */
static xseg_status release_segment_all(xs_pool *p, xs_segment *s) {
  xseg_status first = XSEG_OK;
  size_t g = 0;
  while (g < s->n_granules) {
    if (!s->mapped[g]) { g++; continue; }
    size_t run = 1;
    while (g + run < s->n_granules && s->mapped[g + run]) run++;
    uint64_t addr = s->base + g * s->granule;
    xseg_status st = xs_vmm_unmap(p->vmm, addr, run * s->granule);
    if (st != XSEG_OK) st = xs_vmm_unmap(p->vmm, addr, run * s->granule);
    if (st == XSEG_OK) release_handles(p, s, g, run, &first);
    if (first == XSEG_OK) first = st;
    g += run;
  }
  release_aliases(p, s->base, s->size, &first);
  xseg_status st = xs_vmm_unreserve_or_keep(p->vmm, s->base, s->size);
  return first != XSEG_OK ? first : st;
}

xseg_status xs_pool_destroy(xs_pool *p) {
  xseg_status first = XSEG_OK;
  while (p->segments != NULL) {
    xs_segment *s = p->segments;
    xseg_status st = release_segment_all(p, s);
    if (first == XSEG_OK) first = st;
    for (xs_block *b = s->first, *next; b != NULL; b = next) {
      next = b->next;
      xs_blocks_put(p->blocks, b);
    }
    p->segments = s->next;
    xs_segment_free_page_map(s);
    free(s);
  }
  xs_freetree_init(&p->free, p->free.bins);
  xs_freetree_init(&p->unmapped, NULL);
  p->retiring = NULL;
  p->n_retiring = 0;
  return first;
}
