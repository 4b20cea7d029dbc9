/* The harness's own tests: the fixture's leak check catches a leaked handle,
   and the assertion macros report what they compare. */
#include <string.h>

#include "xseg_test.h"

/* A physical handle created and not released must be reported by the check
   that the fixture runs after every test. */
XSEG_TEST(harness, leak_check_catches_a_leaked_handle) {
  XT_REQUIRE_SIM_FOR("reads the emulator's live-object counts");
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xsim_live before, after;
  xsim_get_live(&before);

  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  XSEG_ASSERT_CU(cuMemGetAllocationGranularity(
      &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(cuMemCreate(&h, gran, &prop, 0));

  xsim_get_live(&after);
  char msg[256];
  XSEG_EXPECT_FALSE(xt_live_unchanged(&before, &after, msg, sizeof msg));
  XSEG_EXPECT_TRUE(strstr(msg, "handles ") != NULL);
  XSEG_EXPECT_TRUE(strstr(msg, "physical_bytes ") != NULL);

  XSEG_EXPECT_CU(cuMemRelease(h));
  xsim_get_live(&after);
  XSEG_EXPECT_TRUE(xt_live_unchanged(&before, &after, msg, sizeof msg));
}

XSEG_TEST(harness, leak_check_ignores_fewer_objects) {
  xsim_live before = {3, 2, 1, 0, 0, 4096};
  xsim_live after = {1, 0, 0, 0, 0, 0};
  char msg[64];
  XSEG_EXPECT_TRUE(xt_live_unchanged(&before, &after, msg, sizeof msg));
  XSEG_EXPECT_STREQ(msg, "");
}
