/* ptrtable.h: the pointer table, address -> live block.
 *
 * Open addressing with linear probing over a power-of-two array of
 * (address, block) slots; address 0 marks an empty slot (no block starts at
 * 0; an empty slot's block is stale, never read). The hash is Fibonacci
 * hashing of addr >> 9 (blocks are 512-byte aligned): the block's index
 * times 2^64 / phi, the top bits of the product kept, which spreads evenly
 * spaced blocks over the table. It is written as the address times that
 * constant shifted down 9 bits, which is the index times the constant with
 * its low 9 bits cleared: the same hash up to those bits, without a shift
 * of the address (measured, bench/callgrind.sh: mixed 10000 465.3 ->
 * 461.0, random 10000 376.4 -> 372.3). The address times the constant
 * itself (one try at this) hashes the index by 512 / phi modulo 1, which
 * spreads evenly spaced blocks badly: 10^5 blocks 64 KiB apart probed 7
 * slots on average (bench/README.md, "The pointer table's hash without
 * its shift"). Deletion shifts the following run back (no
 * tombstones), so a long churn of inserts and deletes never degrades
 * probes. The table only grows (load kept <= 1/4), so once warm a
 * malloc/free pair allocates nothing; growth is asked for before a block is
 * taken (xs_ptrtable_reserve), so a host OOM leaves everything unchanged.
 *
 * Why 1/4: every cached pair finds, removes and adds an entry, and the
 * probes and the run a removal shifts back grow with the load. Measured
 * with bench/callgrind.sh: at most 1/2 (a table a third full at 10^4
 * live) -> 1/4, mixed 10000 602 -> 588 instructions per pair, random
 * 10000 439 -> 428; the cost is 16 bytes more per slot kept: 64 bytes of
 * table per live block at the most, 128 just after a growth.
 *
 * Invariants (xs_ptrtable_is_valid): every entry is reachable from its home
 * slot without crossing an empty slot; `count` entries; count <= limit =
 * cap / 4.
 */
#ifndef XS_ALLOC_PTRTABLE_H
#define XS_ALLOC_PTRTABLE_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "segments/block.h"

typedef struct xs_ptrtable_slot {
  uint64_t addr;                /* 0: empty */
  xs_block *block;
} xs_ptrtable_slot;

typedef struct xs_ptrtable {
  xs_ptrtable_slot *slot;
  size_t mask;                  /* capacity - 1; capacity a power of two */
  size_t count;
  size_t limit;                 /* capacity / 4: the most entries it holds
                                   before it grows (one compare per malloc) */
  unsigned shift;               /* 64 - log2(capacity) */
} xs_ptrtable;

/* An empty table with room for a few thousand blocks; false on host OOM. */
bool xs_ptrtable_init(xs_ptrtable *t);
void xs_ptrtable_destroy(xs_ptrtable *t);

static inline size_t xs_ptrtable_home(const xs_ptrtable *t, uint64_t addr) {
  return (size_t)((addr * (0x9E3779B97F4A7C15ull >> 9)) >> t->shift);
}

/* Room for one more entry; false (table unchanged) on host OOM. */
bool xs_ptrtable_grow(xs_ptrtable *t);
static inline bool xs_ptrtable_reserve(xs_ptrtable *t) {
  return t->count < t->limit || xs_ptrtable_grow(t);
}

/* Adds b (its address must not be in the table); room was reserved. */
static inline void xs_ptrtable_add(xs_ptrtable *t, xs_block *b) {
  size_t i = xs_ptrtable_home(t, b->addr);
  while (t->slot[i].addr != 0) i = (i + 1) & t->mask;
  t->slot[i] = (xs_ptrtable_slot){b->addr, b};
  t->count++;
}

/* The slot holding addr, or SIZE_MAX. */
static inline size_t xs_ptrtable_find(const xs_ptrtable *t, uint64_t addr) {
  if (addr == 0) return SIZE_MAX;
  for (size_t i = xs_ptrtable_home(t, addr);; i = (i + 1) & t->mask) {
    if (t->slot[i].addr == addr) return i;
    if (t->slot[i].addr == 0) return SIZE_MAX;
  }
}

static inline xs_block *xs_ptrtable_get(const xs_ptrtable *t, uint64_t addr) {
  size_t i = xs_ptrtable_find(t, addr);
  return i == SIZE_MAX ? NULL : t->slot[i].block;
}

/* Empties slot i (from xs_ptrtable_find) and closes the gap: a
   backward-shift deletion walks the run after the hole and moves back
   every entry whose home is not in (hole, j], so each stays reachable.
   Inline: every cached free that does not park removes its block
   (measured, bench/callgrind.sh random 10000: 548 -> 540 instructions
   per pair). */
static inline void xs_ptrtable_remove_at(xs_ptrtable *t, size_t i) {
  assert(i <= t->mask && t->slot[i].addr != 0 && t->count > 0);
  size_t hole = i;
  for (size_t j = (i + 1) & t->mask; t->slot[j].addr != 0;
       j = (j + 1) & t->mask) {
    size_t home = xs_ptrtable_home(t, t->slot[j].addr);
    /* Cyclic distance from home to j vs from hole to j. */
    if (((j - home) & t->mask) >= ((j - hole) & t->mask)) {
      t->slot[hole] = t->slot[j];
      hole = j;
    }
  }
  t->slot[hole].addr = 0;       /* the block stays, stale (measured,
                                   mixed 10000: 2 fewer per pair) */
  t->count--;
}

/* Probe chains and the count are intact; `msg` gets the first problem. */
bool xs_ptrtable_is_valid(const xs_ptrtable *t, char *msg, size_t msg_size);

#endif /* XS_ALLOC_PTRTABLE_H */
