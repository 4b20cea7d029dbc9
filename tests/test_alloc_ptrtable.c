/* The pointer table (alloc/ptrtable.h) against a brute-force array: random
   adds and removes, colliding addresses whose probe runs wrap around the
   end of the array, and growth, with the validator after every step. */
#include <stdlib.h>

#include "alloc/ptrtable.h"
#include "xseg_test.h"

enum { N_BLOCKS = 20000 };

/* Addresses whose home slot is the last one: their runs wrap to slot 0. */
static size_t wrapping_addrs(const xs_ptrtable *t, uint64_t *out, size_t n) {
  size_t got = 0;
  for (uint64_t a = 512; got < n; a += 512)
    if (xs_ptrtable_home(t, a) == t->mask) out[got++] = a;
  return got;
}

XSEG_TEST(alloc_ptrtable, colliding_runs_wrap_and_survive_removal) {
  xs_ptrtable t;
  XSEG_ASSERT_TRUE(xs_ptrtable_init(&t));
  uint64_t addr[6];
  wrapping_addrs(&t, addr, 6);
  xs_block b[6] = {{0}};
  for (int i = 0; i < 6; i++) {
    b[i].addr = addr[i];
    XSEG_ASSERT_TRUE(xs_ptrtable_reserve(&t));
    xs_ptrtable_add(&t, &b[i]);
  }
  char msg[160];
  XSEG_EXPECT_TRUE(xs_ptrtable_is_valid(&t, msg, sizeof msg));
  /* Remove from the middle of the run, then the head: the rest stay. */
  static const int order[] = {2, 0, 5};
  for (int k = 0; k < 3; k++) {
    xs_ptrtable_remove_at(&t, xs_ptrtable_find(&t, addr[order[k]]));
    XSEG_EXPECT_TRUE(xs_ptrtable_is_valid(&t, msg, sizeof msg));
  }
  XSEG_EXPECT_TRUE(xs_ptrtable_get(&t, addr[1]) == &b[1]);
  XSEG_EXPECT_TRUE(xs_ptrtable_get(&t, addr[3]) == &b[3]);
  XSEG_EXPECT_TRUE(xs_ptrtable_get(&t, addr[4]) == &b[4]);
  XSEG_EXPECT_TRUE(xs_ptrtable_get(&t, addr[0]) == NULL);
  XSEG_EXPECT_TRUE(xs_ptrtable_get(&t, 0) == NULL);
  XSEG_EXPECT_EQ(t.count, 3);
  xs_ptrtable_destroy(&t);
}

XSEG_TEST(alloc_ptrtable, random_adds_and_removes_match_a_plain_array) {
  xs_ptrtable t;
  XSEG_ASSERT_TRUE(xs_ptrtable_init(&t));
  xs_block *b = calloc(N_BLOCKS, sizeof *b);
  bool *in = calloc(N_BLOCKS, sizeof *in);
  XSEG_ASSERT_TRUE(b != NULL && in != NULL);
  for (size_t i = 0; i < N_BLOCKS; i++) b[i].addr = 0x7f0000000000ull + 512 * i;
  size_t count = 0;
  uint64_t s = 1;
  char msg[160];
  for (int step = 0; step < 200000; step++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    size_t i = (size_t)(s >> 33) % N_BLOCKS;
    if (in[i]) {
      size_t slot = xs_ptrtable_find(&t, b[i].addr);
      XSEG_ASSERT_TRUE(slot != SIZE_MAX && t.slot[slot].block == &b[i]);
      xs_ptrtable_remove_at(&t, slot);
      count--;
    } else {
      XSEG_ASSERT_TRUE(xs_ptrtable_get(&t, b[i].addr) == NULL);
      XSEG_ASSERT_TRUE(xs_ptrtable_reserve(&t));
      xs_ptrtable_add(&t, &b[i]);
      count++;
    }
    in[i] = !in[i];
    XSEG_ASSERT_EQ(t.count, count);
    if (step % 20000 == 0)
      XSEG_ASSERT_TRUE(xs_ptrtable_is_valid(&t, msg, sizeof msg));
  }
  XSEG_EXPECT_TRUE(xs_ptrtable_is_valid(&t, msg, sizeof msg));
  for (size_t i = 0; i < N_BLOCKS; i++)
    XSEG_ASSERT_TRUE(xs_ptrtable_get(&t, b[i].addr) == (in[i] ? &b[i] : NULL));
  xs_ptrtable_destroy(&t);
  free(in);
  free(b);
}

/* Blocks evenly spaced, as a stream's tensors of one size are, land on
   evenly spread home slots: few probes at any spacing from 512 bytes to
   2 MiB. (A hash that multiplied the address itself by 2^64 / phi, not
   its block index, probed 2.2 to 7.1 slots on average for 10^5 blocks
   16 KiB to 512 KiB apart.) */
XSEG_TEST(alloc_ptrtable, evenly_spaced_blocks_probe_few_slots) {
  enum { N = 100000 };
  static const uint64_t spacing[] = {512,          2048,       16384,
                                     65536,        262144,     524288,
                                     2ull << 20};
  xs_block *b = calloc(N, sizeof *b);
  XSEG_ASSERT_TRUE(b != NULL);
  for (size_t k = 0; k < sizeof spacing / sizeof spacing[0]; k++) {
    xs_ptrtable t;
    XSEG_ASSERT_TRUE(xs_ptrtable_init(&t));
    for (size_t i = 0; i < N; i++) {
      b[i].addr = 0x7f0000000000ull + spacing[k] * i;
      XSEG_ASSERT_TRUE(xs_ptrtable_reserve(&t));
      xs_ptrtable_add(&t, &b[i]);
    }
    /* Each entry's probes: its distance from its home slot, plus one. */
    size_t probes = 0, most = 0;
    for (size_t i = 0; i <= t.mask; i++) {
      if (t.slot[i].addr == 0) continue;
      size_t p = ((i - xs_ptrtable_home(&t, t.slot[i].addr)) & t.mask) + 1;
      probes += p;
      if (p > most) most = p;
    }
    XSEG_EXPECT_EQ(t.count, N);
    XSEG_EXPECT_LE(probes, N + N / 2);       /* <= 1.5 on average */
    XSEG_EXPECT_LE(most, 6);
    xs_ptrtable_destroy(&t);
  }
  free(b);
}
