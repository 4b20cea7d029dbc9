/* epoch.h: the time source of the pairs' free clocks (allocator.h).
 *
 * Each pair stamps its frees from its own clock, so the cached free writes
 * nothing shared; but garbage collection orders free blocks of every pair
 * by age (reclaim.c), so the stamps of different pairs must compare as the
 * frees happened. A counter per pair cannot give that; the processor's
 * time stamp counter can, read without a system call or a shared write
 * (constant-rate and synchronised across cores on the processors xseg
 * runs on; a skew would only misorder garbage collection, never break a
 * guard, which compares a pair's stamps with its own clock alone). A
 * pair's stamps are made strictly increasing on top of it (xs_pair_tick).
 */
#ifndef XS_ALLOC_EPOCH_H
#define XS_ALLOC_EPOCH_H

#include <stdint.h>
#include <time.h>

static inline uint64_t xs_epoch_now(void) {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
  uint64_t t;
  __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(t));
  return t;
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

#endif /* XS_ALLOC_EPOCH_H */
