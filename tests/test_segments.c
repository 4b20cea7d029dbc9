/* Host-side structures of segments/: the best-fit tree, the block cache,
   splitting and merging inside a segment, and the validator that checks
   the tiling against the page map. No driver is needed: the segment here is
   metadata over made-up addresses. */
#include <stdlib.h>
#include <string.h>

#include "segments/block.h"
#include "segments/freetree.h"
#include "segments/pool.h"
#include "segments/segment.h"
#include "xseg_test.h"

static xs_block *mk(size_t size, uint64_t addr) {
  xs_block *b = calloc(1, sizeof *b);
  b->size = size;
  b->addr = addr;
  b->mapped = true;
  return b;
}

XSEG_TEST(segments, freetree_best_fit_is_smallest_then_lowest_address) {
  xs_freetree t;
  xs_freetree_init(&t, NULL);
  xs_block *b[5] = {mk(4096, 0x9000), mk(1024, 0x1000), mk(4096, 0x5000),
                    mk(2048, 0x3000), mk(8192, 0x100000)};
  for (int i = 0; i < 5; i++) xs_freetree_insert(&t, b[i]);
  char msg[128];
  XSEG_EXPECT_TRUE(xs_freetree_is_valid(&t, msg, sizeof msg));
  XSEG_EXPECT_EQ(t.count, 5);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 1) == b[1]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 1024) == b[1]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 1025) == b[3]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 3000) == b[2]);  /* lower addr */
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 8192) == b[4]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 8193) == NULL);
  XSEG_EXPECT_TRUE(xs_freetree_largest(&t, 0) == b[4]);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(&t, b[4], 0) == b[0]);
  XSEG_EXPECT_TRUE(xs_freetree_smaller(&t, b[0], 0) == b[2]);
  xs_freetree_remove(&t, b[2]);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 3000) == b[0]);
  XSEG_EXPECT_TRUE(xs_freetree_is_valid(&t, msg, sizeof msg));
  for (int i = 0; i < 5; i++) {
    if (i != 2) xs_freetree_remove(&t, b[i]);
    free(b[i]);
  }
  XSEG_EXPECT_EQ(t.count, 0);
  XSEG_EXPECT_TRUE(xs_freetree_best_fit(&t, 1) == NULL);
}

/* The tree against a sorted-array model, over random inserts and removes. */
XSEG_TEST(segments, freetree_matches_brute_force) {
  enum { N = 2000 };
  xs_freetree t;
  xs_freetree_init(&t, NULL);
  xs_block *blk = calloc(N, sizeof *blk);
  bool in[N] = {false};
  unsigned seed = 7;
  for (int step = 0; step < 20000; step++) {
    seed = seed * 1103515245u + 12345u;
    int i = (int)((seed >> 8) % N);
    if (in[i]) {
      xs_freetree_remove(&t, &blk[i]);
      in[i] = false;
    } else {
      blk[i].addr = (uint64_t)i * 0x10000;
      blk[i].size = 512 * (1 + (seed >> 20) % 64);
      xs_freetree_insert(&t, &blk[i]);
      in[i] = true;
    }
    size_t want = 512 * (1 + (seed >> 4) % 70);
    xs_block *best = NULL;
    for (int j = 0; j < N; j++)
      if (in[j] && blk[j].size >= want &&
          (best == NULL || blk[j].size < best->size ||
           (blk[j].size == best->size && blk[j].addr < best->addr)))
        best = &blk[j];
    if (xs_freetree_best_fit(&t, want) != best) {
      XSEG_FAIL("step %d: best fit for %zu differs from brute force", step,
                want);
      break;
    }
  }
  char msg[128];
  XSEG_EXPECT_TRUE(xs_freetree_is_valid(&t, msg, sizeof msg));
  free(blk);
}

XSEG_TEST(segments, freetree_validator_catches_a_wrong_count) {
  xs_freetree t;
  xs_freetree_init(&t, NULL);
  xs_block *b = mk(512, 0x200);
  xs_freetree_insert(&t, b);
  t.count++;
  char msg[128] = "";
  XSEG_EXPECT_FALSE(xs_freetree_is_valid(&t, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "counts") != NULL);
  t.count--;
  xs_freetree_remove(&t, b);
  free(b);
}

XSEG_TEST(segments, block_cache_recycles_structs) {
  xs_blocks c = {0};
  xs_block *a = xs_blocks_get(&c);
  xs_block *b = xs_blocks_get(&c);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL && a != b);
  XSEG_EXPECT_EQ(c.live, 2);
  a->size = 77;
  xs_blocks_put(&c, a);
  xs_block *again = xs_blocks_get(&c);
  XSEG_EXPECT_TRUE(again == a);     /* as it was: the caller sets it */
  for (int i = 0; i < 1000; i++) XSEG_ASSERT_TRUE(xs_blocks_get(&c) != NULL);
  XSEG_EXPECT_EQ(c.live, 1002);
  xs_blocks_destroy(&c);
}

/* A fake segment of `n` granules of 2 MiB, mapped where map[i] is set, as
   one block per mapped state run, and the pool around it (no driver). */
typedef struct fake {
  xs_segment seg;
  xs_pool pool;
  xs_vmm vmm;                   /* no driver: only its alias records */
  xs_blocks cache;
  xs_stats stats;
} fake;

static void fake_init(fake *f, size_t n, const uint8_t *map) {
  memset(f, 0, sizeof *f);
  xs_pool_init(&f->pool, XS_POOL_LARGE, NULL, &f->vmm, &f->cache, &f->stats,
               NULL);
  xs_segment *s = &f->seg;
  s->base = 0x7f0000000000ull;
  s->granule = 2u << 20;
  s->n_granules = n;
  s->size = n * s->granule;
  xs_segment_alloc_page_map(s, n);
  s->pool = &f->pool;
  f->pool.segments = s;
  xs_block *prev = NULL;
  for (size_t i = 0; i < n; i++) {
    if (map[i]) {
      uint64_t h = 100 + i;
      xs_segment_record_map(s, s->base + i * s->granule, 1, &h);
    }
    if (prev != NULL && prev->mapped == (map[i] != 0)) {
      prev->size += s->granule;
      continue;
    }
    xs_block *b = xs_blocks_get(&f->cache);
    *b = (xs_block){.addr = s->base + i * s->granule, .size = s->granule,
                    .mapped = map[i] != 0, .seg = s, .prev = prev};
    if (prev) prev->next = b; else s->first = b;
    prev = b;
  }
  s->last = prev;
  for (xs_block *b = s->first; b; b = b->next) xs_pool_index(&f->pool, b);
}

static void fake_free(fake *f) {
  xs_vmm_alias_destroy(&f->vmm);
  xs_segment_free_page_map(&f->seg);
  xs_blocks_destroy(&f->cache);
}

static bool fake_valid(fake *f, char *msg, size_t n) {
  xs_segment_walk w = {0};
  return xs_segment_is_valid(&f->seg, &w, msg, n);
}

XSEG_TEST(segments, take_splits_and_give_merges_back) {
  fake f;
  const uint8_t map[4] = {1, 1, 0, 0};
  fake_init(&f, 4, map);
  char msg[256];
  XSEG_ASSERT_TRUE(fake_valid(&f, msg, sizeof msg));
  xs_block *whole = f.seg.first;
  XSEG_EXPECT_EQ(f.pool.free.count, 1);
  XSEG_EXPECT_EQ(f.pool.unmapped.count, 1);

  xs_block *a = xs_freetree_best_fit(&f.pool.free, 4096);
  xs_pool_take(&f.pool, a, 4096, true);
  xs_block *b = xs_freetree_best_fit(&f.pool.free, 8192);
  xs_pool_take(&f.pool, b, 8192, true);
  XSEG_EXPECT_TRUE(a == whole && b->addr == a->addr + 4096);
  XSEG_EXPECT_TRUE(fake_valid(&f, msg, sizeof msg));
  XSEG_EXPECT_EQ(xs_stats_current(&f.stats, XS_GAUGE_inactive_split), 1);

  xs_pool_give(&f.pool, a);          /* no free neighbour: stays apart */
  XSEG_EXPECT_EQ(f.pool.free.count, 2);
  XSEG_EXPECT_EQ(xs_stats_current(&f.stats, XS_GAUGE_inactive_split), 2);
  xs_block *m = xs_pool_give(&f.pool, b);  /* merges both ways */
  XSEG_EXPECT_TRUE(m == whole && m->size == 4u << 20);
  XSEG_EXPECT_EQ(f.pool.free.count, 1);
  /* Mapped never merges with the unmapped tail. */
  XSEG_EXPECT_TRUE(m->next != NULL && !m->next->mapped);
  XSEG_EXPECT_TRUE(fake_valid(&f, msg, sizeof msg));
  XSEG_EXPECT_EQ(f.cache.live, 2);
  fake_free(&f);
}

/* Every gauge of both fakes' stats, in every scope, and their free
   indexes agree. */
static bool fakes_agree(const fake *x, const fake *y) {
  for (int g = 0; g < XS_GAUGE_COUNT; g++)
    for (int scope = 0; scope < XS_STAT_SCOPES; scope++) {
      xseg_stat a = xs_stats_get(&x->stats, (xs_gauge)g, scope);
      xseg_stat b = xs_stats_get(&y->stats, (xs_gauge)g, scope);
      if (a.current != b.current || a.peak != b.peak ||
          a.allocated != b.allocated || a.freed != b.freed)
        return false;
    }
  if (x->pool.free.count != y->pool.free.count) return false;
  /* The same sizes, in the same order, largest first. */
  xs_freetree *tx = (xs_freetree *)&x->pool.free;
  xs_freetree *ty = (xs_freetree *)&y->pool.free;
  xs_block *bx = xs_freetree_largest(tx, 0);
  xs_block *by = xs_freetree_largest(ty, 0);
  for (; bx != NULL && by != NULL; bx = xs_freetree_smaller(tx, bx, 0),
                                   by = xs_freetree_smaller(ty, by, 0))
    if (bx->size != by->size) return false;
  return bx == NULL && by == NULL;
}

/* The cached path's inline take of a whole block and give of a block that
   merges with nothing (pool.h) against the pool's own take and give, from
   the same state: the same trees, blocks and stats, and the retake the
   pool knew is forgotten (a tree changed). */
XSEG_TEST(segments, whole_take_and_lone_give_move_as_the_pool_does) {
  fake x, y;
  const uint8_t map[2] = {1, 0};
  fake_init(&x, 2, map);
  fake_init(&y, 2, map);
  xs_block *bx[4], *by[4];
  for (int i = 0; i < 4; i++) {
    bx[i] = xs_freetree_best_fit(&x.pool.free, 4096);
    xs_pool_take(&x.pool, bx[i], 4096, true);
    by[i] = xs_freetree_best_fit(&y.pool.free, 4096);
    xs_pool_take(&y.pool, by[i], 4096, true);
  }
  /* Four live pieces, then the free rest of the granule. */
  XSEG_EXPECT_EQ(xs_pool_merges(by[1]), 0);
  XSEG_EXPECT_EQ(xs_pool_merges(by[3]), XS_MERGE_NEXT);
  XSEG_EXPECT_TRUE(xs_pool_parkable(by[3]) && !xs_pool_parkable(by[1]));

  xs_pool_give(&x.pool, bx[1]);
  y.pool.retake_known = by[0];
  xs_pool_give_alone(&y.pool, &y.stats, XS_POOL_LARGE, by[1]);
  XSEG_EXPECT_TRUE(y.pool.retake_known == NULL);
  XSEG_EXPECT_TRUE(fakes_agree(&x, &y));
  XSEG_EXPECT_EQ(xs_stats_current(&y.stats, XS_GAUGE_inactive_split), 2);
  /* Its neighbours are live: the piece is free on its own, and frees on
     either side of it now merge with it. */
  XSEG_EXPECT_TRUE(!by[1]->allocated && by[1]->size == 4096);
  XSEG_EXPECT_EQ(xs_pool_merges(by[0]), XS_MERGE_NEXT);
  XSEG_EXPECT_EQ(xs_pool_merges(by[2]), XS_MERGE_PREV);

  xs_pool_take(&x.pool, bx[1], 4096, false);
  y.pool.retake_known = by[0];
  xs_pool_take_whole(&y.pool, &y.stats, XS_POOL_LARGE, by[1]);
  XSEG_EXPECT_TRUE(y.pool.retake_known == NULL);
  XSEG_EXPECT_TRUE(by[1]->allocated);
  XSEG_EXPECT_TRUE(fakes_agree(&x, &y));
  XSEG_EXPECT_EQ(xs_stats_current(&y.stats, XS_GAUGE_inactive_split), 1);
  char msg[256];
  XSEG_EXPECT_TRUE(fake_valid(&y, msg, sizeof msg));
  fake_free(&x);
  fake_free(&y);

  /* A whole segment's block is no piece: inactive_split does not move. */
  const uint8_t one[1] = {1};
  fake_init(&x, 1, one);
  fake_init(&y, 1, one);
  xs_pool_take(&x.pool, x.seg.first, 2u << 20, false);
  xs_pool_take_whole(&y.pool, &y.stats, XS_POOL_LARGE, y.seg.first);
  XSEG_EXPECT_TRUE(fakes_agree(&x, &y));
  XSEG_EXPECT_EQ(xs_pool_merges(y.seg.first), 0);
  xs_pool_give(&x.pool, x.seg.first);
  xs_pool_give_alone(&y.pool, &y.stats, XS_POOL_LARGE, y.seg.first);
  XSEG_EXPECT_TRUE(fakes_agree(&x, &y));
  XSEG_EXPECT_EQ(xs_stats_current(&y.stats, XS_GAUGE_inactive_split), 0);
  XSEG_EXPECT_EQ(y.pool.free.count, 1);
  XSEG_EXPECT_TRUE(fake_valid(&y, msg, sizeof msg));
  fake_free(&x);
  fake_free(&y);
}

XSEG_TEST(segments, take_without_split_keeps_the_slack) {
  fake f;
  const uint8_t map[2] = {1, 0};
  fake_init(&f, 2, map);
  xs_block *a = f.seg.first;
  xs_pool_take(&f.pool, a, 1024, false);
  XSEG_EXPECT_EQ(a->size, 2u << 20);
  XSEG_EXPECT_EQ(f.pool.free.count, 0);
  xs_pool_give(&f.pool, a);
  char msg[256];
  XSEG_EXPECT_TRUE(fake_valid(&f, msg, sizeof msg));
  fake_free(&f);
}

XSEG_TEST(segments, validator_catches_broken_tiling_and_page_map) {
  fake f;
  const uint8_t map[3] = {1, 0, 1};
  fake_init(&f, 3, map);
  char msg[256];
  XSEG_ASSERT_TRUE(fake_valid(&f, msg, sizeof msg));
  xs_block *mid = f.seg.first->next;
  mid->size -= 512;                 /* a gap */
  XSEG_EXPECT_FALSE(fake_valid(&f, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "gap or overlap") != NULL);
  mid->size += 512;
  f.seg.mapped[1] = 1;              /* page map disagrees with the block */
  f.seg.mapped_granules++;
  XSEG_EXPECT_FALSE(fake_valid(&f, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "granule 1") != NULL);
  f.seg.mapped[1] = 0;
  f.seg.mapped_granules--;
  mid->mapped = true;               /* two free mapped neighbours */
  uint64_t h = 999;
  xs_segment_record_map(&f.seg, f.seg.base + f.seg.granule, 1, &h);
  XSEG_EXPECT_FALSE(fake_valid(&f, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "should have merged") != NULL);
  fake_free(&f);
}

/* The page map records which granules share a handle; a run shorter than
   the handle (a partial unmap) is caught. */
XSEG_TEST(segments, validator_checks_multi_granule_handles) {
  fake f;
  const uint8_t map[4] = {0, 0, 0, 0};
  fake_init(&f, 4, map);
  xs_segment *s = &f.seg;
  const uint64_t h[3] = {7, 7, 7};          /* one handle of 3 granules */
  xs_segment_record_map(s, s->base, 3, h);
  XSEG_EXPECT_EQ(s->hlen[0], 3);
  XSEG_EXPECT_EQ(s->hlen[2], 3);
  XSEG_EXPECT_EQ(xs_segment_handle_head(s, 2), 0);
  char msg[256];
  xs_segment_walk w = {0};
  /* Blocks disagree with the page map now, so check the map alone. */
  s->mapped[2] = 0;                         /* a partial unmap */
  s->handle[2] = 0;
  s->hlen[2] = 0;
  s->mapped_granules--;
  XSEG_EXPECT_FALSE(xs_segment_is_valid(s, &w, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "says it has 3") != NULL);
  s->mapped[2] = 1;
  s->handle[2] = 7;
  s->hlen[2] = 3;
  s->mapped_granules++;
  uint64_t out[3];
  xs_segment_record_unmap(s, s->base, 3, out);
  XSEG_EXPECT_TRUE(out[0] == 7 && out[2] == 7 && s->mapped_granules == 0);
  fake_free(&f);
}

/* Lending a free block its stream may still use (map before unmap): its
   whole handles come out, its granules stay mapped as aliases under a
   retiring block, reserved bytes drop, and the validator holds the alias
   to its rules. */
XSEG_TEST(segments, lending_leaves_a_retiring_alias_the_validator_checks) {
  fake f;
  const uint8_t map[4] = {1, 1, 0, 0};
  fake_init(&f, 4, map);
  xs_segment *s = &f.seg;
  xs_stats_move(&f.stats, XS_GAUGE_reserved_bytes, XS_POOL_LARGE,
                (int64_t)(2 * s->granule));
  f.pool.safe_epoch = 0;                    /* the guard vouches for nothing */
  s->first->free_epoch = 5;
  uint64_t out[2] = {0, 0};
  xseg_status st;
  XSEG_EXPECT_EQ(xs_pool_harvest(&f.pool, s->granule, 2, 2, NULL, 0, out,
                                 &st), 0);  /* not lendable: nothing */
  XSEG_EXPECT_EQ(xs_pool_harvest(&f.pool, s->granule, 2, 2, NULL, 5, out,
                                 &st), 2);
  XSEG_EXPECT_EQ(st, XSEG_OK);
  XSEG_EXPECT_TRUE(out[0] == 100 && out[1] == 101);
  XSEG_EXPECT_EQ(s->mapped_granules, 0);
  XSEG_EXPECT_EQ(s->alias_granules, 2);
  XSEG_EXPECT_EQ(f.pool.n_retiring, 1);
  XSEG_EXPECT_EQ(xs_stats_current(&f.stats, XS_GAUGE_reserved_bytes), 0);
  xs_block *r = f.pool.retiring;
  XSEG_ASSERT_TRUE(r == s->first && r->retiring && r->allocated && !r->mapped);
  XSEG_EXPECT_EQ(f.pool.free.count, 0);
  char msg[256];
  xs_segment_walk w = {0};
  XSEG_EXPECT_TRUE(xs_segment_is_valid(s, &w, msg, sizeof msg));
  XSEG_EXPECT_EQ(w.retiring, 1);
  XSEG_EXPECT_EQ(w.allocated, 0);           /* an alias is no live block */
  XSEG_EXPECT_EQ(w.mapped_bytes, 0);        /* nor reserved memory */
  XSEG_EXPECT_EQ(xs_pool_unsafe_epoch(&f.pool), 5);  /* the guard's target */
  /* The handle mapped again right after its own alias is its own run. */
  xs_segment_record_map(s, s->base + 2 * s->granule, 1, &out[1]);
  XSEG_EXPECT_EQ(xs_segment_handle_head(s, 2), 2);
  XSEG_EXPECT_EQ(xs_segment_handle_head(s, 1), 1);
  xs_segment_record_unmap(s, s->base + 2 * s->granule, 1, NULL);
  s->mapped[0] = XS_PAGE_OWNED;             /* an alias counted as owned */
  XSEG_EXPECT_FALSE(xs_segment_is_valid(s, &w, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "aliases") != NULL);
  s->mapped_granules++;
  s->alias_granules--;
  XSEG_EXPECT_FALSE(xs_segment_is_valid(s, &w, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "retiring") != NULL);
  s->mapped[0] = XS_PAGE_ALIAS;
  s->mapped_granules--;
  s->alias_granules++;
  XSEG_EXPECT_TRUE(xs_segment_is_valid(s, &w, msg, sizeof msg));
  fake_free(&f);
}

XSEG_TEST(segments, split_and_absorb_keep_first_and_last) {
  fake f;
  const uint8_t map[2] = {1, 1};
  fake_init(&f, 2, map);
  xs_block *b = f.seg.first;
  xs_pool_unindex(&f.pool, b);
  xs_block *spare = xs_blocks_get(&f.cache);
  xs_block *hi = xs_segment_split(&f.seg, b, 1536, spare);
  XSEG_EXPECT_TRUE(f.seg.last == hi && hi->prev == b && b->next == hi);
  XSEG_EXPECT_EQ(hi->addr, b->addr + 1536);
  XSEG_EXPECT_EQ(hi->size, (4u << 20) - 1536);
  xs_block *gone = xs_segment_absorb_next(&f.seg, b);
  XSEG_EXPECT_TRUE(gone == hi && f.seg.last == b && b->next == NULL);
  xs_blocks_put(&f.cache, gone);
  xs_pool_index(&f.pool, b);
  char msg[256];
  XSEG_EXPECT_TRUE(fake_valid(&f, msg, sizeof msg));
  fake_free(&f);
}

/* Placement: the fewest granules, counting a free block at the mapped end. */
XSEG_TEST(segments, place_prefers_the_free_block_at_the_mapped_end) {
  fake f;
  /* [mapped][hole 3 granules][mapped][tail 4 granules] */
  const uint8_t map[9] = {1, 0, 0, 0, 1, 0, 0, 0, 0};
  fake_init(&f, 9, map);
  size_t g = 2u << 20;
  xs_block *first = f.seg.first, *hole = first->next;
  xs_block *last_mapped = hole->next;
  xs_pool_take(&f.pool, first, g, false);    /* the hole has no free keep */
  xs_place pl;
  /* 1.5 granules: the hole needs 2 (nothing free below it to merge
     with), the tail only 1 after the free mapped granule before it. */
  XSEG_ASSERT_TRUE(xs_pool_place(&f.pool, g + g / 2, &pl));
  XSEG_EXPECT_TRUE(pl.hole == last_mapped->next && pl.keep == last_mapped);
  XSEG_EXPECT_EQ(pl.n, 1);
  /* 3 granules: the hole needs 3, the tail 2. */
  XSEG_ASSERT_TRUE(xs_pool_place(&f.pool, 3 * g, &pl));
  XSEG_EXPECT_TRUE(pl.hole == f.seg.last && pl.keep == last_mapped);
  XSEG_EXPECT_EQ(pl.n, 2);
  /* More than the reservation holds: no placement. */
  XSEG_EXPECT_FALSE(xs_pool_place(&f.pool, 6 * g, &pl));
  xs_pool_give(&f.pool, first);
  fake_free(&f);
}
