/* policy.c: the replay policies by name.
 *
 * Exact mode needs only vmm/ and is always built. The allocator's modes
 * (expandable, classic) are built once include/xseg.h declares the allocator
 * (bench/CMakeLists.txt defines XB_HAVE_ALLOCATOR then); before that they are
 * reported as not built, never imitated.
 */
#include <string.h>

#include "bench.h"

#ifdef XB_HAVE_ALLOCATOR
extern const xb_policy xb_policy_expandable, xb_policy_classic;
#endif

static const xb_policy *const policies[] = {
#ifdef XB_HAVE_ALLOCATOR
    &xb_policy_expandable,
    &xb_policy_classic,
#endif
    &xb_policy_exact,
};

const char *const xb_modes[3] = {"expandable", "classic", "exact"};

bool xb_allocator_built(void) {
#ifdef XB_HAVE_ALLOCATOR
  return true;
#else
  return false;
#endif
}

const xb_policy *xb_policy_find(const char *name) {
  for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
    if (strcmp(policies[i]->name, name) == 0) return policies[i];
  return NULL;
}
