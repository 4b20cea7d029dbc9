/* What sharing through a queue adds to xseg's IPC (alloc/ipc_ticket.c,
 * alloc/ipc_event.c): a ticket holds a block for a consumer that has not
 * opened it yet, and an interprocess event orders the consumer's stream
 * after the producer's work without the producer waiting.
 *
 * The consumer here is a second allocator of the same process, which
 * opens the handle like another process would (the holds name this pid);
 * the same calls across real processes are tested by
 * tests/python/test_xseg_multiprocessing.py.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/ipc.h"
#include "alloc_helpers.h"
#include "sim_helpers.h"

#define XT_OK(call) XSEG_EXPECT_OK(call)

static xseg_ipc_stats qt_ipc(xseg_allocator *a) {
  xseg_ipc_stats s;
  memset(&s, 0, sizeof s);
  XT_OK(xseg_ipc_get_stats(a, &s));
  return s;
}

/* The producer's next malloc settles its pending frees: the shared block
   is given back, nothing pending or exported is left. */
static void qt_expect_given_back(xseg_allocator *a) {
  void *r = NULL;
  XT_OK(xseg_malloc(a, 512, NULL, &r));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(qt_ipc(a).exported_blocks, 0);
  XT_OK(xseg_free(a, r));
}

/* The end of a case with a producer a, a consumer b and a's handle h. */
static void qt_end(xseg_allocator *a, xseg_allocator *b, xseg_ipc_handle *h) {
  xseg_ipc_handle_free(h);
  XT_OK(xseg_check(a));
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* The producer frees the block while its only hold is a ticket: the block
   stays pending; the consumer opens it, gives the ticket back, closes, and
   the producer's next malloc frees it. */
XSEG_TEST(ipc_queue, ticket_keeps_a_freed_block_until_the_consumer_opens) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  const size_t size = 2 * MiB;
  void *p = NULL, *q = NULL, *r = NULL;
  XT_OK(xseg_malloc(a, size, NULL, &p));
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  XSEG_EXPECT_CU(cuMemsetD8(at_dptr(p), 0x33, size));
  xseg_ipc_handle *h = NULL;
  uint64_t ticket = 0;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_ticket_take(a, p, &ticket));
  XT_OK(xseg_free(a, p));                     /* "del" before the consumer */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XSEG_EXPECT_EQ(qt_ipc(a).pending_on_others, 1);
  XT_OK(xseg_malloc(a, 512, NULL, &r));       /* settles: a ticket is alive */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XT_OK(xseg_ipc_open(b, h, &q));
  XT_OK(xseg_ipc_ticket_give(b, q, ticket));
  XSEG_EXPECT_EQ(qt_ipc(a).open_by_others, 1);   /* b's own hold */
  XSEG_EXPECT_TRUE(at_bytes_are(q, size, 0x33));
  XSEG_EXPECT_EQ(xseg_ipc_ticket_give(b, q, ticket),
                 XSEG_ERR_INVALID_ARGUMENT);     /* not twice */
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "given back already") != NULL);
  XT_OK(xseg_ipc_close(b, q));
  XT_OK(xseg_free(a, r));
  qt_expect_given_back(a);
  qt_end(a, b, h);
}

/* A handle that was never sent: the producer gives its ticket back itself,
   even after freeing the block, which then goes at the next malloc. */
XSEG_TEST(ipc_queue, producer_gives_back_an_unsent_ticket) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p = NULL, *r = NULL;
  XT_OK(xseg_malloc(a, MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  uint64_t t1 = 0, t2 = 0;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_ticket_take(a, p, &t1));
  XT_OK(xseg_ipc_ticket_take(a, p, &t2));
  XSEG_EXPECT_NE(t1, t2);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_ipc_ticket_give(a, p, t1));
  XT_OK(xseg_malloc(a, 512, NULL, &r));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)MiB);  /* t2 */
  XT_OK(xseg_ipc_ticket_give(a, p, t2));
  XT_OK(xseg_free(a, r));
  XT_OK(xseg_malloc(a, 512, NULL, &r));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XT_OK(xseg_free(a, r));
  xseg_ipc_handle_free(h);
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A ticket given back twice, after its slot went to an open of the block
   by another allocator of the producer's process (as a tensor sent back to
   its producer is opened there): the second give is refused and the open's
   hold stays, so the block stays pending when freed and is not handed out
   again while it is open. (The hold of that open has the ticket's own
   word, the producer's pid and start time; only the tag tells them
   apart.) */
XSEG_TEST(ipc_queue, ticket_given_back_twice_frees_no_other_hold) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  void *p = NULL, *q = NULL, *r = NULL;
  XT_OK(xseg_malloc(a, 4 * MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  uint64_t t = 0;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_ticket_take(a, p, &t));
  XT_OK(xseg_ipc_ticket_give(a, p, t));
  XT_OK(xseg_ipc_open(b, h, &q));               /* the slot the ticket had */
  XSEG_EXPECT_EQ(qt_ipc(a).open_by_others, 1);
  XSEG_EXPECT_EQ(xseg_ipc_ticket_give(a, p, t), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "is no hold on this block") !=
                   NULL);
  XSEG_EXPECT_EQ(qt_ipc(a).open_by_others, 1);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_malloc(a, 4 * MiB, NULL, &r));
  XSEG_EXPECT_NE(r, p);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)(4 * MiB));
  XT_OK(xseg_ipc_close(b, q));
  XT_OK(xseg_free(a, r));
  qt_expect_given_back(a);
  qt_end(a, b, h);
}

/* A table full of tickets: the next take is refused naming the call that
   was made (the table's claim serves opens too), and nothing leaks. */
XSEG_TEST(ipc_queue, ticket_take_on_a_full_table_names_itself) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p = NULL;
  XT_OK(xseg_malloc(a, MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  static uint64_t tickets[XS_IPC_HOLDERS];
  for (size_t i = 0; i < XS_IPC_HOLDERS; i++)
    XSEG_ASSERT_OK(xseg_ipc_ticket_take(a, p, &tickets[i]));
  uint64_t more = 0;
  XSEG_EXPECT_EQ(xseg_ipc_ticket_take(a, p, &more), XSEG_ERR_OUT_OF_MEMORY);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(),
                          "xseg_ipc_ticket_take: producer pid") != NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "is full") != NULL);
  for (size_t i = 0; i < XS_IPC_HOLDERS; i++)
    XT_OK(xseg_ipc_ticket_give(a, p, tickets[i]));
  XT_OK(xseg_free(a, p));
  qt_expect_given_back(a);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A consumer sends the block on: its ticket, taken in the producer's
   table, keeps the block after the consumer closed and the producer freed
   it, until a third consumer opens it and gives the ticket back. */
XSEG_TEST(ipc_queue, ticket_of_a_consumer_keeps_the_block_for_the_next) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL),
                 *c = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL && c != NULL);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  const size_t size = MiB;
  void *p = NULL, *q = NULL, *s = NULL, *r = NULL;
  XT_OK(xseg_malloc(a, size, NULL, &p));
  XSEG_EXPECT_CU(cuMemsetD8(at_dptr(p), 0x42, size));
  xseg_ipc_handle *h = NULL;
  uint64_t t1 = 0, t2 = 0;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_ticket_take(a, p, &t1));
  XT_OK(xseg_ipc_open(b, h, &q));
  XT_OK(xseg_ipc_ticket_give(b, q, t1));
  XT_OK(xseg_ipc_ticket_take(b, q, &t2));     /* b sends it on */
  XT_OK(xseg_ipc_close(b, q));
  XSEG_EXPECT_EQ(xseg_ipc_ticket_take(b, q, &t1), XSEG_ERR_UNKNOWN_POINTER);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_malloc(a, 512, NULL, &r));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XT_OK(xseg_ipc_open(c, h, &s));
  XT_OK(xseg_ipc_ticket_give(c, s, t2));
  XSEG_EXPECT_TRUE(at_bytes_are(s, size, 0x42));
  XT_OK(xseg_ipc_close(c, s));
  XT_OK(xseg_free(a, r));
  qt_expect_given_back(a);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_check(a));
  xseg_destroy(c);
  xseg_destroy(b);
  xseg_destroy(a);
}

/* Bad input names its cause and changes nothing. */
XSEG_TEST(ipc_queue, bad_tickets_are_refused) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p = NULL;
  uint64_t t = 0;
  XT_OK(xseg_malloc(a, MiB, NULL, &p));
  XSEG_EXPECT_EQ(xseg_ipc_ticket_take(a, p, &t), XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "exported") != NULL);
  XSEG_EXPECT_EQ(xseg_ipc_ticket_take(a, p, NULL),
                 XSEG_ERR_INVALID_ARGUMENT);
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_ticket_take(a, p, &t));
  XSEG_EXPECT_EQ(xseg_ipc_ticket_give(a, p, t + XS_IPC_HOLDERS),
                 XSEG_ERR_INVALID_ARGUMENT);     /* same slot, not it */
  XSEG_EXPECT_EQ(xseg_ipc_ticket_give(a, p, t + 1),
                 XSEG_ERR_INVALID_ARGUMENT);     /* another slot */
  XSEG_EXPECT_EQ(xseg_ipc_ticket_give(a, (char *)p + 512, t),
                 XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_EQ(qt_ipc(a).open_by_others, 1);   /* the ticket still holds */
  XT_OK(xseg_ipc_ticket_give(a, p, t));
  XSEG_EXPECT_EQ(qt_ipc(a).open_by_others, 0);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* The consumer's stream waits for the work the producer queued before
   xseg_ipc_record, on the device: the producer's stream is held by a
   latch, the consumer's copy behind the wait does not run until the latch
   opens, and the producer never waited. Both are in one process here,
   whose own handle the driver refuses to open (an H200 with driver 580:
   CUDA_ERROR_INVALID_CONTEXT): xseg waits on the event itself. Once the
   producer is destroyed, with its event, the handle names the cause. */
XSEG_TEST(ipc_queue, consumer_stream_waits_for_the_recorded_work) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream ps = at_stream_new(), cs = at_stream_new();
  XSEG_ASSERT_TRUE(ps != NULL && cs != NULL);
  const size_t size = MiB;
  void *p = NULL, *q = NULL, *dst = NULL;
  XT_OK(xseg_malloc(a, size, ps, &p));
  XT_OK(xseg_malloc(b, size, cs, &dst));
  XSEG_EXPECT_CU(cuMemsetD8(at_dptr(dst), 0, size));
  xt_latch *l = xt_latch_new();
  XSEG_EXPECT_CU(xt_latch_hold(ps, l));
  XSEG_EXPECT_CU(cuMemsetD8Async(at_dptr(p), 0x5c, size, ps));
  unsigned char ev[XSEG_IPC_EVENT_BYTES];
  XT_OK(xseg_ipc_record(a, ps, ev));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_open(b, h, &q));
  XT_OK(xseg_ipc_wait(b, ev, cs));
  XSEG_EXPECT_CU(cuMemcpyDtoDAsync(at_dptr(dst), at_dptr(q), size, cs));
  XSEG_EXPECT_CU_ERR(cuStreamQuery(cs), CUDA_ERROR_NOT_READY);
  XSEG_EXPECT_TRUE(at_bytes_are(dst, size, 0));  /* nothing copied yet */
  xt_latch_open(l);
  XSEG_EXPECT_CU(cuStreamSynchronize(cs));
  XSEG_EXPECT_TRUE(at_bytes_are(dst, size, 0x5c));
  XT_OK(xseg_ipc_close(b, q));
  XT_OK(xseg_ipc_record(a, ps, ev));             /* the same event again */
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_free(b, dst));
  xseg_ipc_handle_free(h);
  XSEG_EXPECT_CU(cuStreamSynchronize(ps));
  XT_OK(xseg_check(a));
  XT_OK(xseg_check(b));
  xseg_destroy(a);
  XSEG_EXPECT_EQ(xseg_ipc_wait(b, ev, cs), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "this process's own") != NULL);
  xseg_destroy(b);
  XSEG_EXPECT_CU(cuStreamDestroy(ps));
  XSEG_EXPECT_CU(cuStreamDestroy(cs));
  xt_latch_free(l);
}

/* A child forked after its parent recorded an event does not take the
   parent's event for its own (the table of this process's events is the
   pid's that filled it): it opens the handle through the driver, as any
   other process does. Exits 0 when it did, 1-3 at the failing step. */
static int forked_child_waits(const unsigned char *ev) {
  if (xt_context(0) == NULL) return 1;
  char conf[64];
  xseg_allocator *b = NULL;
  if (xseg_create(0, at_conf(NULL, conf, sizeof conf), &b) != XSEG_OK)
    return 1;
  CUstream cs;
  if (cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 1;
  uint64_t opens = xsim_call_count("cuIpcOpenEventHandle");
  if (xseg_ipc_wait(b, ev, cs) != XSEG_OK) return 2;
  if (xsim_call_count("cuIpcOpenEventHandle") != opens + 1) return 3;
  return 0;
}

XSEG_TEST(ipc_queue, a_forked_child_opens_its_parents_event) {
  XT_REQUIRE_SIM_FOR("uses the emulator in a forked child");
  XT_REQUIRE_NO_TSAN_FOR_FORKED_THREADS();
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream ps = at_stream_new();
  unsigned char ev[XSEG_IPC_EVENT_BYTES];
  XT_OK(xseg_ipc_record(a, ps, ev));
  pid_t pid = fork();
  XSEG_ASSERT_TRUE(pid >= 0);
  if (pid == 0) _exit(forked_child_waits(ev));
  int status = 0;
  XSEG_ASSERT_TRUE(waitpid(pid, &status, 0) == pid);
  XSEG_EXPECT_TRUE(WIFEXITED(status));
  XSEG_EXPECT_EQ(WEXITSTATUS(status), 0);
  XT_OK(xseg_ipc_wait(a, ev, ps));     /* here: its own, opened by nobody */
  XSEG_EXPECT_CU(cuStreamSynchronize(ps));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(ps));
}

/* Bytes that are no event handle: the driver's error, named. */
XSEG_TEST(ipc_queue, wait_on_junk_names_the_driver_call) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  unsigned char junk[XSEG_IPC_EVENT_BYTES];
  memset(junk, 0x33, sizeof junk);
  XSEG_EXPECT_EQ(xseg_ipc_wait(a, junk, NULL), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuIpcOpenEventHandle") != NULL);
  XSEG_EXPECT_EQ(xseg_ipc_wait(a, NULL, NULL), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_EQ(xseg_ipc_record(a, NULL, NULL), XSEG_ERR_INVALID_ARGUMENT);
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A driver failure at each step of xseg_ipc_record and xseg_ipc_wait
   names the failing call and loses nothing: a record whose event could not
   be created keeps none (the next record creates it), and a wait whose
   stream wait fails leaves no event behind (in this one process it opened
   none: it waited on the producer's own). */
XSEG_TEST(ipc_queue, driver_failures_in_record_and_wait_are_named) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  CUstream ps = at_stream_new(), cs = at_stream_new();
  XSEG_ASSERT_TRUE(ps != NULL && cs != NULL);
  unsigned char ev[XSEG_IPC_EVENT_BYTES];
  const char *record_calls[] = {"cuEventCreate", "cuEventRecord",
                                "cuIpcGetEventHandle"};
  for (size_t i = 0; i < 3; i++) {
    xsim_live before, after;
    xsim_get_live(&before);
    xsim_fail_call(record_calls[i], 1, CUDA_ERROR_UNKNOWN);
    XSEG_EXPECT_EQ(xseg_ipc_record(a, ps, ev), XSEG_ERR_DRIVER);
    XSEG_EXPECT_TRUE(strstr(xseg_last_error(), record_calls[i]) != NULL);
    xsim_get_live(&after);
    /* The stream's event is kept once created (the first case made
       none). */
    XSEG_EXPECT_EQ(after.events, before.events + (i == 1));
  }
  XT_OK(xseg_ipc_record(a, ps, ev));
  xsim_live before, after;
  xsim_get_live(&before);
  xsim_fail_call("cuStreamWaitEvent", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_EQ(xseg_ipc_wait(b, ev, cs), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuStreamWaitEvent") != NULL);
  xsim_get_live(&after);
  XSEG_EXPECT_EQ(after.events, before.events);
  XT_OK(xseg_ipc_wait(b, ev, cs));
  XSEG_EXPECT_CU(cuStreamSynchronize(cs));
  XT_OK(xseg_check(a));
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  xseg_destroy(a);
  XSEG_EXPECT_CU(cuStreamDestroy(ps));
  XSEG_EXPECT_CU(cuStreamDestroy(cs));
}
