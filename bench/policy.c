/* policy.c: the replay policies by name.
 *
 * Modes are named for whose allocator they replay: xseg's own, PyTorch's
 * caching allocator with and without expandable segments, and exact (no
 * caching at all). The names the bench used before stay as aliases. */
#include <string.h>

#include "bench.h"

extern const xb_policy xb_policy_xseg, xb_policy_pytorch_native;

static const xb_policy *const policies[XB_N_MODES] = {
    &xb_policy_xseg,
    &xb_policy_pytorch_expandable,
    &xb_policy_pytorch_native,
    &xb_policy_exact,
};

const char *const xb_modes[XB_N_MODES] = {"xseg", "pytorch-expandable",
                                          "pytorch-native", "exact"};

static const struct {
  const char *alias, *mode;
} aliases[] = {
    {"expandable", "xseg"},         /* xseg, expandable_segments:True */
    {"classic", "pytorch-native"},  /* xseg, expandable_segments:False */
};

const xb_policy *xb_policy_find(const char *name) {
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(aliases[i].alias, name) == 0) name = aliases[i].mode;
  for (size_t i = 0; i < XB_N_MODES; i++)
    if (strcmp(policies[i]->name, name) == 0) return policies[i];
  return NULL;
}
