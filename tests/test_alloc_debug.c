/* Debug builds validate the whole allocator after every operation
 * (XSEG_DEBUG_CHECK): a broken invariant must stop the process right after
 * the operation that exposed it, naming the rule, rather than surface at
 * the end of a test or never. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/types.h"
#include "xseg_test.h"

#ifndef NDEBUG
/* In a child: corrupts a stat behind the allocator's back, then makes one
   cached malloc (no driver call), which must abort at its unlock. */
static void corrupt_then_malloc(xseg_allocator *a) {
  xs_stats_move(&a->shared_stats, XS_GAUGE_allocated_bytes, XS_POOL_SMALL,
                512);
  void *p;
  xseg_malloc(a, 4096, NULL, &p);
  _exit(0);                   /* survived: the check did not run */
}
#endif

XSEG_TEST(alloc_debug, broken_invariant_aborts_after_the_operation) {
#ifdef NDEBUG
  xt_skip(__FILE__, __LINE__, "release build: no per-operation validation");
#else
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  setenv("XSEG_DEBUG_CHECK", "1", 1);
  xseg_allocator *a = NULL;
  XSEG_ASSERT_OK(xseg_create(0, "xseg_driver:sim", &a));
  void *p;
  XSEG_ASSERT_OK(xseg_malloc(a, 4096, NULL, &p));   /* maps a granule */
  XSEG_ASSERT_OK(xseg_free(a, p));
  fflush(NULL);
  pid_t child = fork();
  XSEG_ASSERT_TRUE(child >= 0);
  if (child == 0) corrupt_then_malloc(a);
  int status = 0;
  XSEG_ASSERT_EQ(waitpid(child, &status, 0), child);
  XSEG_EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  /* The parent's allocator was never touched: still valid. */
  XSEG_EXPECT_OK(xseg_check(a));
  xseg_destroy(a);
#endif
}
