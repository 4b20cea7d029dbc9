/* aliases.c: the old mappings of lent handles (see vmm.h).
 *
 * A lent handle is mapped at two addresses until its old mapping, the
 * alias, is unmapped (segments/release.c). The driver keeps a handle's
 * memory until it is released and its last mapping is gone (cuMemRelease
 * on an H100 and in the emulator alike), so a handle released while an
 * alias maps it would still hold device memory that no stat counts. The
 * release passes ask here first and keep such a handle for a later pass;
 * a handle its owner must give up all the same (a growth that failed
 * after taking it) becomes an orphan: its bytes still count (orphan_bytes,
 * and the caller's reserved bytes), and it is released when its last alias
 * is unmapped.
 * Few aliases live at once (one per lent handle, until its stream's guard
 * passes), so a flat array is searched.
 */
#include <assert.h>
#include <stdlib.h>

#include "vmm/array.h"
#include "vmm/vmm.h"

static bool alias_in(const xs_vmm_alias *e, uint64_t addr, size_t size) {
  return e->addr >= addr && e->addr - addr < size;
}

bool xs_vmm_alias_reserve(xs_vmm *v, size_t n) {
  return XS_ARRAY_RESERVE(v->aliases, v->cap_aliases, v->n_aliases + n, 16);
}

void xs_vmm_alias_add(xs_vmm *v, uint64_t addr, uint64_t handle, size_t size,
                      int tag) {
  assert(v->n_aliases < v->cap_aliases && "xs_vmm_alias_reserve first");
  v->aliases[v->n_aliases++] =
      (xs_vmm_alias){.addr = addr, .handle = handle, .size = size, .tag = tag};
}

bool xs_vmm_alias_maps(const xs_vmm *v, uint64_t handle) {
  for (size_t i = 0; i < v->n_aliases; i++)
    if (v->aliases[i].handle == handle) return true;
  return false;
}

bool xs_vmm_alias_orphan(xs_vmm *v, uint64_t handle, xs_vmm_alias *out) {
  bool found = false;
  for (size_t i = 0; i < v->n_aliases; i++) {
    xs_vmm_alias *e = &v->aliases[i];
    if (e->handle != handle) continue;
    assert(!e->orphan && "an orphan has no owner to give it up");
    if (!found) *out = *e;
    e->orphan = true;
    e->tag = out->tag;          /* counted once, for the first alias */
    found = true;
  }
  if (found) v->orphan_bytes += out->size;
  return found;
}

/* Removes every alias of `handle` in [addr, addr + size); false (removing
   nothing) when another alias outside still maps it. */
static bool alias_take_all(xs_vmm *v, uint64_t handle, uint64_t addr,
                           size_t size) {
  for (size_t i = 0; i < v->n_aliases; i++)
    if (v->aliases[i].handle == handle && !alias_in(&v->aliases[i], addr, size))
      return false;
  size_t kept = 0;
  for (size_t i = 0; i < v->n_aliases; i++)
    if (v->aliases[i].handle != handle) v->aliases[kept++] = v->aliases[i];
  v->n_aliases = kept;
  return true;
}

bool xs_vmm_alias_take_orphan(xs_vmm *v, uint64_t addr, size_t size,
                              xs_vmm_alias *out) {
  for (size_t i = 0; i < v->n_aliases; i++) {
    xs_vmm_alias e = v->aliases[i];
    if (!e.orphan || !alias_in(&e, addr, size)) continue;
    if (!alias_take_all(v, e.handle, addr, size)) continue;
    assert(v->orphan_bytes >= e.size);
    v->orphan_bytes -= e.size;
    *out = e;
    return true;
  }
  return false;
}

void xs_vmm_alias_drop(xs_vmm *v, uint64_t addr, size_t size) {
  size_t kept = 0;
  for (size_t i = 0; i < v->n_aliases; i++)
    if (!alias_in(&v->aliases[i], addr, size))
      v->aliases[kept++] = v->aliases[i];
  v->n_aliases = kept;
}

void xs_vmm_alias_destroy(xs_vmm *v) {
  xs_vmm_alias e;
  while (xs_vmm_alias_take_orphan(v, 0, SIZE_MAX, &e))
    xs_vmm_handle_release_or_keep(v, e.handle);
  free(v->aliases);
  v->aliases = NULL;
  v->n_aliases = v->cap_aliases = 0;
  v->orphan_bytes = 0;
}
