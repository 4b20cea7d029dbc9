/* policy.c: the replay policies by name. */
#include <string.h>

#include "bench.h"

extern const xb_policy xb_policy_expandable, xb_policy_classic;

static const xb_policy *const policies[] = {
    &xb_policy_expandable,
    &xb_policy_classic,
    &xb_policy_exact,
};

const char *const xb_modes[3] = {"expandable", "classic", "exact"};

const xb_policy *xb_policy_find(const char *name) {
  for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
    if (strcmp(policies[i]->name, name) == 0) return policies[i];
  return NULL;
}
