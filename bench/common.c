/* common.c: error messages, byte sizes and the clock the bench times with. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench.h"

bool xb_fail(xb_error *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->text, sizeof e->text, fmt, ap);
  va_end(ap);
  return false;
}

static int size_shift(char suffix) {
  switch (suffix) {
    case 'K': case 'k': return 10;
    case 'M': case 'm': return 20;
    case 'G': case 'g': return 30;
    case 'T': case 't': return 40;
    default: return -1;
  }
}

bool xb_parse_size(const char *s, uint64_t *out) {
  uint64_t n = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (n > (UINT64_MAX - 9) / 10) return false;
    n = n * 10 + (uint64_t)(*p - '0');
  }
  if (p == s) return false;
  int shift = 0;
  if (*p != '\0') {
    shift = size_shift(*p++);
    if (shift < 0 || (*p != '\0' && strcmp(p, "iB") != 0 && strcmp(p, "B")))
      return false;
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) return false;
  *out = n << shift;
  return true;
}

const char *xb_format_bytes(uint64_t n, char *buf, size_t size) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, size, "%llu B", (unsigned long long)n);
  else
    snprintf(buf, size, "%.1f %s", v, units[u]);
  return buf;
}

uint64_t xb_splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t xb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
