/* Sharing blocks between allocators of one process (alloc/ipc*.c) when a
 * single driver call fails on the consumer's side: nothing the consumer
 * reserved, mapped or imported is lost, whether the failure comes at a
 * close, in an open's undo, or in the destroy of an allocator with a
 * block still open. The driver's own count of live objects (the
 * emulator's) is the judge.
 */
#define _GNU_SOURCE
#include <string.h>

#include "alloc_helpers.h"
#include "ipc_helpers.h"

/* A producer `a` with a block `p` exported as `h`, a consumer `b`, and
   the driver's count of live objects before any of it. */
typedef struct shared_block {
  xseg_allocator *a, *b;
  void *p;
  xseg_ipc_handle *h;
  xsim_live before;
} shared_block;

static shared_block shared_block_new(size_t size) {
  shared_block s = {0};
  xsim_get_live(&s.before);
  s.a = at_create(NULL);
  s.b = at_create(NULL);
  if (s.a != NULL && s.b != NULL &&
      xseg_malloc(s.a, size, NULL, &s.p) == XSEG_OK)
    xseg_ipc_export(s.a, s.p, &s.h);
  return s;
}

/* Everything goes; the driver then holds what it held before. */
static void shared_block_end(shared_block *s) {
  xseg_ipc_handle_free(s->h);
  if (s->b != NULL) {                   /* NULL: destroyed already */
    XSEG_EXPECT_OK(xseg_check(s->b));
    xseg_destroy(s->b);
  }
  XSEG_EXPECT_OK(xseg_free(s->a, s->p));
  XSEG_EXPECT_OK(xseg_check(s->a));
  xseg_destroy(s->a);
  xsim_live after;
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(after.reservations, s->before.reservations);
  XSEG_EXPECT_EQ(after.mappings, s->before.mappings);
  XSEG_EXPECT_EQ(after.handles, s->before.handles);
}

#define SHARED_BLOCK_OPEN(s, size)                                          \
  XT_REQUIRE_SIM_FOR("injects driver faults");                              \
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);                                  \
  shared_block s = shared_block_new(size);                                  \
  XSEG_ASSERT_TRUE(s.h != NULL)

/* The close's cuMemAddressFree fails once: the close says so, the block
   is closed, and the range is kept and freed later (before, it was lost
   for the life of the process, and a second close was refused). */
XSEG_TEST(ipc_faults, a_close_whose_range_will_not_go_keeps_it) {
  SHARED_BLOCK_OPEN(s, 5 * MiB);
  void *q;
  XT_OK(xseg_ipc_open(s.b, s.h, &q));
  xsim_fail_call("cuMemAddressFree", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_ipc_close(s.b, q), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "kept and freed later") !=
                   NULL);
  xsim_fail_call("cuMemAddressFree", 0, CUDA_SUCCESS);
  XSEG_EXPECT_EQ(ipc_stats(s.b).opened_blocks, 0);
  XSEG_EXPECT_OK(xseg_empty_cache(s.b));     /* a release pass frees it */
  xsim_live now;
  xsim_get_live(&now);
  XSEG_EXPECT_EQ(now.reservations - s.before.reservations, 1);  /* a's */
  shared_block_end(&s);
}

/* An open fails at its access, and the undo's cuMemAddressFree fails
   too: the open fails naming the first, and the range is kept (before,
   it was lost). */
XSEG_TEST(ipc_faults, a_failed_opens_undo_keeps_a_range_that_will_not_go) {
  SHARED_BLOCK_OPEN(s, 5 * MiB);
  void *q = (void *)1;
  xsim_fail_call("cuMemSetAccess", 1, CUDA_ERROR_UNKNOWN);
  xsim_fail_call("cuMemAddressFree", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_ipc_open(s.b, s.h, &q), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuMemSetAccess") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  xsim_fail_call("cuMemSetAccess", 0, CUDA_SUCCESS);
  xsim_fail_call("cuMemAddressFree", 0, CUDA_SUCCESS);
  shared_block_end(&s);                       /* destroy frees it */
}

/* The consumer is destroyed with the block still open, and its first
   cuMemUnmap fails once: the unmap is tried again, and the handles,
   mapping and range all go (before, all three were forgotten). */
XSEG_TEST(ipc_faults, a_destroy_whose_unmap_fails_once_loses_nothing) {
  SHARED_BLOCK_OPEN(s, 5 * MiB);
  void *q;
  XT_OK(xseg_ipc_open(s.b, s.h, &q));
  xsim_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  xseg_allocator *b = s.b;
  s.b = NULL;
  xseg_destroy(b);
  xsim_fail_call("cuMemUnmap", 0, CUDA_SUCCESS);
  shared_block_end(&s);
}

/* A consumer's open fails (its import, once) while the producer holds a
   ticket for the handle: the consumer gives the ticket back through the
   handle alone, and the producer's free then gives the block back
   (before, the ticket kept it until the producer exited). A second give
   is refused, freeing nothing. */
XSEG_TEST(ipc_faults, a_ticket_of_a_failed_open_is_given_back) {
  SHARED_BLOCK_OPEN(s, 2 * MiB);
  uint64_t ticket;
  void *q = (void *)1, *x;
  XT_OK(xseg_ipc_ticket_take(s.a, s.p, &ticket));
  xsim_fail_call("cuMemImportFromShareableHandle", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_ipc_open(s.b, s.h, &q), XSEG_ERR_DRIVER);
  xsim_fail_call("cuMemImportFromShareableHandle", 0, CUDA_SUCCESS);
  XSEG_EXPECT_STATUS(xseg_ipc_ticket_give(s.b, q, ticket),
                     XSEG_ERR_UNKNOWN_POINTER);       /* nothing opened */
  XT_OK(xseg_ipc_ticket_give_unopened(s.h, ticket));
  XSEG_EXPECT_STATUS(xseg_ipc_ticket_give_unopened(s.h, ticket),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_ipc_ticket_give_unopened(NULL, ticket),
                     XSEG_ERR_INVALID_ARGUMENT);
  XT_OK(xseg_free(s.a, s.p));
  XT_OK(xseg_malloc(s.a, 512, NULL, &x));             /* reaps */
  XT_OK(xseg_free(s.a, x));
  XT_OK(xseg_empty_cache(s.a));
  XSEG_EXPECT_EQ(at_stats(s.a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(ipc_stats(s.a).open_by_others, 0);
  /* shared_block_end frees p: it went already; a fresh one stands in. */
  XT_OK(xseg_malloc(s.a, 512, NULL, &s.p));
  shared_block_end(&s);
}

/* Ticket 0 is no ticket: every hold that is no ticket's has tag 0, and a
   consumer in the producer's own process holds in the producer's name,
   as a ticket does. Giving 0 back frees nothing (before, it freed the
   consumer's open hold, and the producer's free then gave the block back
   while the consumer had it mapped). */
XSEG_TEST(ipc_faults, ticket_zero_frees_no_open_hold) {
  SHARED_BLOCK_OPEN(s, 2 * MiB);
  void *q, *x;
  XT_OK(xseg_ipc_open(s.b, s.h, &q));
  XSEG_EXPECT_STATUS(xseg_ipc_ticket_give_unopened(s.h, 0),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_STATUS(xseg_ipc_ticket_give(s.b, q, 0),
                     XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_EQ(ipc_stats(s.a).open_by_others, 1);
  XT_OK(xseg_free(s.a, s.p));
  XT_OK(xseg_malloc(s.a, 512, NULL, &x));               /* reaps */
  XT_OK(xseg_free(s.a, x));
  XSEG_EXPECT_EQ(at_stats(s.a).pending_free_bytes, 2 * MiB);   /* held */
  XT_OK(xseg_ipc_close(s.b, q));
  XT_OK(xseg_malloc(s.a, 512, NULL, &s.p));
  shared_block_end(&s);
}

/* An open fails at its access, and the undo's unmap fails twice: the
   range is kept with what is still mapped, and the retry (the next
   release pass) unmaps it before freeing it (before, the range was kept
   as if unmapped, cuMemAddressFree refused it at every pass, so every
   empty_cache failed, and the handles and mapping leaked). */
XSEG_TEST(ipc_faults, an_undo_whose_unmap_fails_keeps_the_mapping_too) {
  SHARED_BLOCK_OPEN(s, 5 * MiB);
  void *q = (void *)1;
  xsim_fail_call("cuMemSetAccess", 1, CUDA_ERROR_UNKNOWN);
  xsim_fail_calls("cuMemUnmap", 1, 2, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_STATUS(xseg_ipc_open(s.b, s.h, &q), XSEG_ERR_DRIVER);
  xsim_fail_call("cuMemSetAccess", 0, CUDA_SUCCESS);
  xsim_fail_call("cuMemUnmap", 0, CUDA_SUCCESS);
  for (int i = 0; i < 2; i++) XSEG_EXPECT_OK(xseg_empty_cache(s.b));
  shared_block_end(&s);
}
