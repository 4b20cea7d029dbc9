/* check.c: xseg_check, the whole-allocator validator. It walks every pool,
 * segment and block and verifies every invariant stated at the types
 * (block.h, segment.h, freetree.h), that each tree holds exactly the
 * blocks the walk finds in its state, that the pointer table holds exactly
 * the allocated blocks, that no two reservations overlap and no physical
 * handle is owned at two places (a lent handle's old mapping, an alias, is
 * listed as retiring by its pool and counted nowhere else, so reserved
 * bytes count a handle once; an orphan, owned nowhere while aliases map it,
 * counts once in vmm/aliases.c), and that every stat equals the walk. It never
 * aborts: the first broken rule becomes the message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/check.h"
#include "alloc/policy.h"
#include "alloc/pairs.h"
#include "alloc/types.h"
#include "vmm/array.h"
#include "vmm/error.h"

typedef struct check_ctx {
  xs_segment_walk walk;
  size_t segments, handles, cap;
  uint64_t *handle;             /* every mapped handle, for duplicates */
  uint64_t *range;              /* base, end of every reservation */
  bool out_of_memory;           /* the check itself ran out of host memory:
                                   nothing is known broken */
  char msg[512];
} check_ctx;

#define CHECK_FAIL(c, ...)                                                   \
  do {                                                                       \
    snprintf((c)->msg, sizeof (c)->msg, __VA_ARGS__);                        \
    return false;                                                            \
  } while (0)

/* The check could not go on for want of host memory (not a broken
   invariant: the caller says so, and a debug check skips). */
#define CHECK_OUT_OF_MEMORY(c)                                               \
  do {                                                                       \
    (c)->out_of_memory = true;                                               \
    CHECK_FAIL(c, "out of host memory");                                     \
  } while (0)

static bool check_push(uint64_t **arr, size_t *n, size_t *cap, uint64_t v) {
  if (!XS_ARRAY_RESERVE(*arr, *cap, *n + 1, 256)) return false;
  (*arr)[(*n)++] = v;
  return true;
}

static bool check_tree_members(check_ctx *c, const xs_pool *p,
                               const xs_freetree *t, bool mapped) {
  xs_block *b = xs_freetree_largest((xs_freetree *)t, 0);
  for (; b != NULL; b = xs_freetree_smaller((xs_freetree *)t, b, 0))
    if (b->mapped != mapped || b->seg->pool != p)
      CHECK_FAIL(c, "block 0x%llx is in the wrong tree",
                 (unsigned long long)b->addr);
  return true;
}

static bool check_segment(check_ctx *c, const xs_pool *p, const xs_segment *s,
                          size_t *rcap) {
  if (s->pool != p) CHECK_FAIL(c, "segment 0x%llx names another pool",
                               (unsigned long long)s->base);
  if (!xs_segment_is_valid(s, &c->walk, c->msg, sizeof c->msg)) return false;
  size_t nr = c->segments * 2;
  if (!check_push(&c->range, &nr, rcap, s->base) ||
      !check_push(&c->range, &nr, rcap, s->base + s->size))
    CHECK_OUT_OF_MEMORY(c);
  c->segments++;
  /* One entry per handle (a run of granules shares one, segment.h). */
  for (size_t g = 0; g < s->n_granules; g++)
    if (s->mapped[g] == XS_PAGE_OWNED && xs_segment_handle_head(s, g) == g &&
        !check_push(&c->handle, &c->handles, &c->cap, s->handle[g]))
      CHECK_OUT_OF_MEMORY(c);
  return true;
}

static bool check_pool(check_ctx *c, xs_pool *p, size_t *rcap) {
  if (!xs_freetree_is_valid(&p->free, c->msg, sizeof c->msg) ||
      !xs_freetree_is_valid(&p->unmapped, c->msg, sizeof c->msg) ||
      !check_tree_members(c, p, &p->free, true) ||
      !check_tree_members(c, p, &p->unmapped, false))
    return false;
  size_t free0 = c->walk.free_mapped, unm0 = c->walk.unmapped;
  size_t ret0 = c->walk.retiring, retiring = 0;
  for (const xs_segment *s = p->segments; s != NULL; s = s->next)
    if (!check_segment(c, p, s, rcap)) return false;
  for (const xs_block *r = p->retiring; r != NULL; r = r->retire_next, retiring++)
    if (!r->retiring || r->seg->pool != p || retiring == p->n_retiring)
      CHECK_FAIL(c, "pool of stream %p: its retiring list holds 0x%llx, "
                 "which is no retiring block of it", (void *)p->stream,
                 (unsigned long long)r->addr);
  if (retiring != p->n_retiring || c->walk.retiring - ret0 != retiring)
    CHECK_FAIL(c, "pool of stream %p: %zu retiring blocks listed, %zu "
               "counted, segments %zu", (void *)p->stream, retiring,
               p->n_retiring, c->walk.retiring - ret0);
  if (c->walk.free_mapped - free0 != p->free.count ||
      c->walk.unmapped - unm0 != p->unmapped.count)
    CHECK_FAIL(c, "pool of stream %p: trees hold %zu/%zu blocks, segments "
               "%zu/%zu", (void *)p->stream, p->free.count,
               p->unmapped.count, c->walk.free_mapped - free0,
               c->walk.unmapped - unm0);
  return true;
}

static int check_cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* No reservation overlaps another; no handle is mapped twice. */
static bool check_disjoint(check_ctx *c) {
  if (c->segments == 0) return true;   /* qsort wants a non-NULL array */
  /* range holds (base, end) pairs: sort the pairs by base. */
  qsort(c->range, c->segments, 2 * sizeof *c->range, check_cmp_u64);
  for (size_t i = 1; i < c->segments; i++)
    if (c->range[2 * i - 1] > c->range[2 * i])
      CHECK_FAIL(c, "reservations overlap at 0x%llx",
                 (unsigned long long)c->range[2 * i]);
  if (c->handles == 0) return true;
  qsort(c->handle, c->handles, sizeof *c->handle, check_cmp_u64);
  for (size_t i = 1; i < c->handles; i++)
    if (c->handle[i] == c->handle[i - 1])
      CHECK_FAIL(c, "handle 0x%llx is owned at two places",
                 (unsigned long long)c->handle[i]);
  return true;
}

/* Each pair's pointer table holds exactly its allocated blocks. */
static bool check_table(check_ctx *c, xseg_allocator *a) {
  size_t count = 0;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    if (!xs_ptrtable_is_valid(&pair->live, c->msg, sizeof c->msg)) return false;
    for (size_t i = 0; i <= pair->live.mask; i++) {
      if (pair->live.slot[i].addr == 0) continue;     /* empty */
      const xs_block *b = pair->live.slot[i].block;
      if (!b->allocated || b->pending)
        CHECK_FAIL(c, "%s block 0x%llx is in the pointer table",
                   b->pending ? "pending" : "free",
                   (unsigned long long)b->addr);
      if (xs_pool_pair(b->seg->pool) != pair)
        CHECK_FAIL(c, "block 0x%llx is in another pair's pointer table",
                   (unsigned long long)b->addr);
    }
    count += pair->live.count;
  }
  if (count != c->walk.allocated)
    CHECK_FAIL(c, "pointer tables hold %zu blocks, segments %zu allocated",
               count, c->walk.allocated);
  return true;
}

/* The lock order lists every pair in the list, in creation order, and
   otherwise only pairs gone during this operation; the stream index holds
   each stream's own pair; the range table is sorted. */
static bool check_pairs(check_ctx *c, xseg_allocator *a) {
  size_t n = 0;
  const xs_stream_index *x = atomic_load(&a->stream_index);
  size_t nx = x != NULL ? atomic_load(&x->n) : 0;
  for (const xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    if (pair->dead) CHECK_FAIL(c, "a dead pair is in the list");
    bool found = false;
    for (size_t i = 0; i < a->n_order; i++) found |= a->order[i] == pair;
    if (!found) CHECK_FAIL(c, "pair of stream %p is not in the lock order",
                           (void *)pair->stream);
    bool indexed = false;
    for (size_t i = 0; i < nx; i++)
      indexed |= x->entry[i].pair == pair && x->entry[i].stream == pair->stream;
    if (indexed != (pair->private_id == 0))
      CHECK_FAIL(c, "pair of stream %p (pool %llu) is %s the stream index",
                 (void *)pair->stream, (unsigned long long)pair->private_id,
                 indexed ? "in" : "not in");
    n++;
  }
  size_t alive = 0;
  for (size_t i = 0; i < a->n_order; i++) {
    if (i > 0 && a->order[i]->order <= a->order[i - 1]->order)
      CHECK_FAIL(c, "the pairs are not in lock order");
    alive += !a->order[i]->dead;
  }
  if (n != a->n_pairs || alive != n || nx > n)
    CHECK_FAIL(c, "%zu pairs listed, %zu counted, %zu in lock order, %zu "
               "in the stream index", n, a->n_pairs, alive, nx);
  size_t spares = 0;
  for (const xs_pair *pair = a->spare; pair != NULL; pair = pair->next) {
    if (!pair->dead) CHECK_FAIL(c, "a spare pair is not dead");
    spares++;
  }
  for (const xs_pair *pair = a->dying; pair != NULL; pair = pair->next)
    spares++;
  if (n + spares != a->pair_structs)
    CHECK_FAIL(c, "%zu pairs alive and %zu gone, %zu made", n, spares,
               a->pair_structs);
  const xs_range_array *r = atomic_load(&a->ranges);
  size_t nr = atomic_load(&a->n_ranges);
  for (size_t i = 1; r != NULL && i < nr; i++)
    if (atomic_load(&r->range[i].base) < atomic_load(&r->range[i - 1].end))
      CHECK_FAIL(c, "the range table is not sorted");
  return true;
}

/* What one pair's walk found, against its own shard: the gauges that only
   its blocks move. */
static bool check_shard(check_ctx *c, const xs_pair *pair,
                        const xs_segment_walk *before) {
  const xs_segment_walk *w = &c->walk;
  const xs_stats *s = &pair->stats;
  struct {
    xs_gauge g;
    size_t want;
  } rules[] = {
      {XS_GAUGE_allocation, w->allocated - before->allocated},
      {XS_GAUGE_allocated_bytes, w->allocated_bytes - before->allocated_bytes},
      {XS_GAUGE_requested_bytes, w->requested_bytes - before->requested_bytes},
      {XS_GAUGE_active, w->allocated + w->pending - before->allocated -
                            before->pending},
      {XS_GAUGE_inactive_split, w->split_free - before->split_free},
      {XS_GAUGE_inactive_split_bytes,
       w->split_free_bytes - before->split_free_bytes},
  };
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
    if (xs_stats_current(s, rules[i].g) != (int64_t)rules[i].want)
      CHECK_FAIL(c, "pair of stream %p: its shard's gauge %d is %lld, its "
                 "walk finds %zu", (void *)pair->stream, (int)rules[i].g,
                 (long long)xs_stats_current(s, rules[i].g), rules[i].want);
  return true;
}

#define CHECK_STAT(c, name, want)                                            \
  if (xs_stats_current(sum, XS_GAUGE_##name) != (int64_t)(want))             \
  CHECK_FAIL(c, "stat " #name " is %lld, the walk finds %lld",               \
             (long long)xs_stats_current(sum, XS_GAUGE_##name),              \
             (long long)(want))

static bool check_stats(check_ctx *c, xseg_allocator *a, const xs_stats *sum) {
  const xs_segment_walk *w = &c->walk;
  if (!xs_stats_group_valid(&a->stats, c->msg, sizeof c->msg)) return false;
  CHECK_STAT(c, allocation, w->allocated);
  CHECK_STAT(c, active, w->allocated + w->pending);
  CHECK_STAT(c, allocated_bytes, w->allocated_bytes);
  CHECK_STAT(c, active_bytes, w->allocated_bytes + w->pending_bytes);
  size_t pending = atomic_load(&a->pending_blocks);
  int64_t pending_bytes = atomic_load(&a->pending_bytes);
  if (pending != w->pending || pending_bytes != (int64_t)w->pending_bytes)
    CHECK_FAIL(c, "%zu pending blocks (%lld bytes) counted, the walk finds "
               "%zu (%zu bytes)", pending, (long long)pending_bytes,
               w->pending, w->pending_bytes);
  CHECK_STAT(c, requested_bytes, w->requested_bytes);
  CHECK_STAT(c, inactive_split, w->split_free);
  CHECK_STAT(c, inactive_split_bytes, w->split_free_bytes);
  /* Orphans: handles owned nowhere that aliases still map (vmm/aliases.c). */
  CHECK_STAT(c, reserved_bytes, w->mapped_bytes + a->vmm.orphan_bytes);
  size_t most = xs_alloc_mapped_most(a);
  if ((size_t)xs_stats_current(sum, XS_GAUGE_reserved_bytes) > most)
    CHECK_FAIL(c, "%lld bytes mapped, more than the memory fraction's cap "
               "of %zu bytes", (long long)xs_stats_current(
                   sum, XS_GAUGE_reserved_bytes), most);
  CHECK_STAT(c, segment, c->segments);
  for (int g = 0; g < XS_GAUGE_COUNT; g++) {
    xseg_stat s[XS_STAT_SCOPES];
    for (int sc = 0; sc < XS_STAT_SCOPES; sc++)
      s[sc] = xs_stats_get(sum, (xs_gauge)g, sc);
    /* (active's read is never below its current: xs_stats_get.) */
    bool peaks_ok = true;
    for (int sc = 0; sc < XS_STAT_SCOPES; sc++)
      peaks_ok = peaks_ok && s[sc].peak >= s[sc].current;
    if (s[0].current != s[1].current + s[2].current ||
        s[0].current != s[0].allocated - s[0].freed || !peaks_ok)
      CHECK_FAIL(c, "gauge %d: all != small + large, or peak/allocated/"
                 "freed disagree with current", g);
  }
  return true;
}

/* A block's recorded streams and events agree with its state. */
static bool check_block_streams(check_ctx *c, const xs_block *b,
                                uint64_t *events, size_t *eventless) {
  if (!b->allocated && (b->uses.n != 0 || b->pending_events != 0))
    CHECK_FAIL(c, "free block 0x%llx still has recorded streams",
               (unsigned long long)b->addr);
  if (b->pending && b->pending_events > b->uses.n)
    CHECK_FAIL(c, "pending block 0x%llx waits on %u events for %u streams",
               (unsigned long long)b->addr, b->pending_events, b->uses.n);
  if (!b->pending && b->pending_events != 0)
    CHECK_FAIL(c, "live block 0x%llx has events",
               (unsigned long long)b->addr);
  *events += b->pending_events;
  *eventless += b->pending && b->pending_events == 0;
  return true;
}

/* Every queued event belongs to one pending block; a pending block without
   events waits for them to be recorded once no capture is under way
   (a->deferred), or for other processes to let go of it (ipc_held_frees). */
static bool check_pending(check_ctx *c, xseg_allocator *a) {
  uint64_t events = 0, queued = 0;
  size_t eventless = 0;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    queued += pair->pending.entries;
    size_t pending = 0;
    for (int k = 0; k < 2; k++)
      for (xs_segment *s = pair->pool[k].segments; s != NULL; s = s->next)
        for (xs_block *b = s->first; b != NULL; b = b->next) {
          if (!check_block_streams(c, b, &events, &eventless)) return false;
          pending += b->pending;
        }
    size_t counted = atomic_load(&pair->n_pending);
    if (pending != counted)
      CHECK_FAIL(c, "the pair of stream %p counts %zu pending blocks, its "
                 "segments hold %zu", (void *)pair->stream, counted, pending);
  }
  /* Blocks that other processes hold wait on no event either. */
  if (events != queued ||
      eventless != a->n_deferred + a->ipc_held_frees)
    CHECK_FAIL(c, "blocks wait on %llu events and %zu pending blocks on none; "
               "the queues hold %llu events, %zu frees wait unrecorded and "
               "%zu are held by other processes", (unsigned long long)events,
               eventless, (unsigned long long)queued, a->n_deferred,
               a->ipc_held_frees);
  return true;
}

static bool check_all(check_ctx *c, xseg_allocator *a) {
  size_t rcap = 0;
  for (xs_pair *pair = a->streams; pair != NULL; pair = pair->next) {
    xs_segment_walk before = c->walk;
    for (int k = 0; k < 2; k++)
      if (!check_pool(c, &pair->pool[k], &rcap)) return false;
    if (!check_shard(c, pair, &before)) return false;
  }
  xs_stats *sum = malloc(sizeof *sum);
  if (sum == NULL) CHECK_OUT_OF_MEMORY(c);
  xs_stats_sum(&a->stats, sum);
  bool ok = check_disjoint(c) && check_table(c, a) && check_pairs(c, a) &&
            check_stats(c, a, sum) && check_pending(c, a);
  free(sum);
  return ok;
}

#ifndef NDEBUG
void xs_alloc_debug_check_locked(xseg_allocator *a) {
  check_ctx *c = calloc(1, sizeof *c);
  if (c == NULL) return;                 /* no memory to check with: skip */
  /* Nor when the walk's arrays find none. */
  if (!check_all(c, a) && !c->out_of_memory) {
    fprintf(stderr, "xseg: device %d: invariant broken by operation %u: %s\n",
            a->vmm.device, a->debug_ops, c->msg);
    abort();
  }
  free(c->handle);
  free(c->range);
  free(c);
}
#endif

xseg_status xs_alloc_check_locked(xseg_allocator *a) {
  check_ctx *c = calloc(1, sizeof *c);
  if (c == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_check: out of host memory");
  bool ok = check_all(c, a);
  xseg_status st = ok ? XSEG_OK
                      : xs_error(c->out_of_memory ? XSEG_ERR_OUT_OF_MEMORY
                                                  : XSEG_ERR_INVALID_ARGUMENT,
                                 "xseg_check: device %d: %s", a->vmm.device,
                                 c->msg);
  free(c->handle);
  free(c->range);
  free(c);
  return st;
}
