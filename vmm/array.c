/* array.c: see array.h. */
#include "vmm/array.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

bool xs_array_grow(void *items_at, size_t *cap, size_t need, size_t item_size,
                   size_t first) {
  assert(first > 0 && item_size > 0);
  size_t c = *cap ? *cap : first;
  while (c < need) {
    if (c > SIZE_MAX / 2) return false;
    c *= 2;
  }
  if (c > SIZE_MAX / item_size) return false;
  /* The pointer is copied in and out with memcpy: items_at is the address
     of a T *, which is not a void * object. */
  void *old;
  memcpy(&old, items_at, sizeof old);
  void *grown = realloc(old, c * item_size);
  if (grown == NULL) return false;
  memcpy(items_at, &grown, sizeof grown);
  *cap = c;
  return true;
}
