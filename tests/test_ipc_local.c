/* Sharing blocks between allocators of one process (alloc/ipc*.c),
 * continued from test_ipc.c: a second allocator is the consumer; handles
 * round-trip through a socket pair; forged or truncated messages and
 * handles are refused; the snapshot and stats show shared blocks; and
 * README's example, its consumer a worker process (ipc_helpers.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/ipc.h"
#include "alloc_helpers.h"
#include "ipc_helpers.h"

/* ---- in one process (a second allocator is the consumer) --------------- */

/* 2,000 opens and closes map and unmap the block's handles each time and
   leave no reservation, mapping or handle behind: the consumer's address
   space does not grow. */
XSEG_TEST(ipc, open_close_cycles_do_not_grow_address_space) {
  XT_REQUIRE_SIM_FOR("counts driver calls");
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_TRUE(b != NULL);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 3 * MiB, NULL, &p));
  XSEG_EXPECT_TRUE(ipc_fill(p, 4096, 6));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  xseg_ipc_handle *got = ipc_roundtrip(h);
  XSEG_ASSERT_TRUE(got != NULL);
  xsim_live before, now;
  xsim_get_live(&before);
  uint64_t reserves = xsim_call_count("cuMemAddressReserve");
  int bad = 0;
  for (int i = 0; i < 2000 && bad == 0; i++) {
    void *q = NULL, *again = NULL;
    bad += xseg_ipc_open(b, got, &q) != XSEG_OK || !ipc_same(q, 4096, 6);
    bad += xseg_ipc_open(b, got, &again) != XSEG_OK || again != q;
    bad += xseg_ipc_close(b, q) != XSEG_OK;
    bad += xseg_ipc_close(b, again) != XSEG_OK;
    xsim_get_live(&now);
    bad += now.reservations != before.reservations ||
           now.mappings != before.mappings || now.handles != before.handles;
  }
  XSEG_EXPECT_EQ(bad, 0);
  /* One reservation per open that mapped, each exactly the handles. */
  XSEG_EXPECT_EQ(xsim_call_count("cuMemAddressReserve") - reserves, 2000);
  xseg_ipc_stats s = ipc_stats(b);
  XSEG_EXPECT_EQ(s.opened_total, 2000);
  XSEG_EXPECT_EQ(s.opened_blocks, 0);
  xseg_ipc_handle_free(got);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* Sends raw bytes with fds[0 .. n_fds) (at most 8) as if they were a
   handle, or a piece of one. */
static bool ipc_send_raw(int sock, const void *bytes, size_t len,
                         const int *fds, int n_fds) {
  union { struct cmsghdr h; char buf[CMSG_SPACE(8 * sizeof(int))]; } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)bytes, len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n_fds > 8) return false;
  if (n_fds > 0) {
    msg.msg_control = u.buf;
    msg.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n_fds * sizeof(int));
  }
  return sendmsg(sock, &msg, 0) == (ssize_t)len;
}

/* Forgeries of a valid one-handle message, one field each. */
static void forge_magic(xs_ipc_wire *w) { w->magic[0] = 'Y'; }
static void forge_version(xs_ipc_wire *w) { w->version++; }
static void forge_no_handles(xs_ipc_wire *w) { w->n_handles = 0; }
static void forge_many_handles(xs_ipc_wire *w) {
  w->n_handles = XS_IPC_MAX_HANDLES + 1;
}
static void forge_empty_handle(xs_ipc_wire *w) { w->handle_size[0] = 0; }
static void forge_sizes_overflow(xs_ipc_wire *w) {   /* sent with 3 fds */
  w->n_handles = 2;
  w->handle_size[1] = UINT64_MAX - MiB;
}
static void forge_outside(xs_ipc_wire *w) { w->offset = 2 * MiB; }
static void forge_no_pid(xs_ipc_wire *w) { w->producer_pid = 0; }

/* A message cut short, or one that is not a handle, is refused with its
   cause named, and every fd that came with it is closed. */
XSEG_TEST(ipc, truncated_or_forged_messages_are_refused) {
  int sv[2];
  XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  int fds_before = ipc_open_fds();
  xs_ipc_wire w;
  memset(&w, 0, sizeof w);
  memcpy(w.magic, XS_IPC_MAGIC, sizeof w.magic);
  w.version = XS_IPC_VERSION;
  w.n_handles = 1;
  w.producer_pid = getpid();
  w.block_size = 512;
  w.handle_size[0] = 2 * MiB;
  struct {
    const char *why;
    size_t len;
    int n_fds;
    void (*forge)(xs_ipc_wire *);
  } cases[] = {
      {"truncated message", 40, 2, NULL},
      {"the peer closed", 0, 0, NULL},
      {"the number of fds", sizeof w, 1, NULL},
      {"bad magic", sizeof w, 2, forge_magic},
      {"unsupported version", sizeof w, 2, forge_version},
      {"handle count out of range", sizeof w, 2, forge_no_handles},
      {"handle count out of range", sizeof w, 2, forge_many_handles},
      {"a handle size is zero", sizeof w, 2, forge_empty_handle},
      {"the sizes overflow", sizeof w, 3, forge_sizes_overflow},
      {"the block does not lie", sizeof w, 2, forge_outside},
      {"no producer pid", sizeof w, 2, forge_no_pid},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    xs_ipc_wire f = w;
    if (cases[i].forge != NULL) cases[i].forge(&f);
    int spare = memfd_create("not-a-handle", MFD_CLOEXEC);
    XSEG_ASSERT_TRUE(spare >= 0);
    const int copies[3] = {spare, spare, spare};
    XSEG_EXPECT_TRUE(ipc_send_raw(sv[0], &f, cases[i].len, copies,
                                  cases[i].n_fds));
    close(spare);
    xseg_ipc_handle *h = (xseg_ipc_handle *)1;
    XSEG_EXPECT_EQ(xseg_ipc_recv(sv[1], &h), XSEG_ERR_INVALID_ARGUMENT);
    XSEG_EXPECT_TRUE(h == NULL);
    if (!XSEG_EXPECT_TRUE(strstr(xseg_last_error(), cases[i].why) != NULL))
      fprintf(stderr, "case %zu: %s\n", i, xseg_last_error());
    XSEG_EXPECT_EQ(ipc_open_fds(), fds_before);
  }
  close(sv[0]);
  close(sv[1]);
}

/* On a stream socket a message may arrive in pieces: the receiver reads
   the rest (its fds came with the first piece). A peer that sends part of
   a message and then closes the socket gets "truncated message". */
XSEG_TEST(ipc, a_message_in_pieces_on_a_stream_socket) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 512, NULL, &p));
  xseg_ipc_handle *h = NULL, *got = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  int fds_before = ipc_open_fds();
  for (int closes = 0; closes < 2; closes++) {
    int sv[2];
    XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    size_t first = 64;
    XSEG_ASSERT_EQ(h->wire.n_handles, 1);
    const int fds[2] = {h->table_fd, h->fd[0]};
    XSEG_ASSERT_TRUE(ipc_send_raw(sv[0], &h->wire, first, fds, 2));
    if (closes) {
      close(sv[0]);
      XSEG_EXPECT_EQ(xseg_ipc_recv(sv[1], &got), XSEG_ERR_INVALID_ARGUMENT);
      XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "truncated message") != NULL);
      XSEG_EXPECT_TRUE(got == NULL);
    } else {
      const char *rest = (const char *)&h->wire + first;
      XSEG_ASSERT_EQ(send(sv[0], rest, sizeof h->wire - first, 0),
                     (ssize_t)(sizeof h->wire - first));
      XT_OK(xseg_ipc_recv(sv[1], &got));
      XSEG_ASSERT_TRUE(got != NULL);
      XSEG_EXPECT_EQ(memcmp(&got->wire, &h->wire, sizeof h->wire), 0);
      xseg_ipc_handle_free(got);
      got = NULL;
      close(sv[0]);
    }
    close(sv[1]);
    XSEG_EXPECT_EQ(ipc_open_fds(), fds_before);
  }
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

/* The wire's own failures name their cause: no handle to send, a peer
   gone before the send, nowhere to put what is received, a descriptor
   that is not a socket; and an open names what is NULL. */
XSEG_TEST(ipc, bad_arguments_are_refused_with_their_cause) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 512, NULL, &p));
  xseg_ipc_handle *h = NULL, *got = (xseg_ipc_handle *)1;
  XT_OK(xseg_ipc_export(a, p, &h));
  int sv[2];
  XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  XSEG_EXPECT_EQ(xseg_ipc_send(sv[0], NULL), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "handle is NULL") != NULL);
  close(sv[1]);
  XSEG_EXPECT_EQ(xseg_ipc_send(sv[0], h), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "sendmsg") != NULL);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), strerror(EPIPE)) != NULL);
  close(sv[0]);
  XSEG_EXPECT_EQ(xseg_ipc_recv(0, NULL), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "out is NULL") != NULL);
  int not_a_socket = memfd_create("not-a-socket", MFD_CLOEXEC);
  XSEG_ASSERT_TRUE(not_a_socket >= 0);
  XSEG_EXPECT_EQ(xseg_ipc_recv(not_a_socket, &got),
                 XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "recvmsg failed") != NULL);
  XSEG_EXPECT_TRUE(got == NULL);
  close(not_a_socket);
  void *q = (void *)1;
  XSEG_EXPECT_EQ(xseg_ipc_open(NULL, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "allocator is NULL") != NULL);
  XSEG_EXPECT_EQ(xseg_ipc_open(a, NULL, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "handle is NULL") != NULL);
  XSEG_EXPECT_EQ(xseg_ipc_open(a, h, NULL), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "ptr is NULL") != NULL);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  xseg_destroy(a);
}

/* Handles that parse but lie: an fd that is not driver memory, another
   device, a block the producer never exported or freed already, a table
   that is not the producer's. Each fails with its cause, and nothing is
   left mapped, imported, reserved or held. */
XSEG_TEST(ipc, forged_handles_fail_and_leave_nothing) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_TRUE(b != NULL);
  void *p = NULL, *p2 = NULL;
  XT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
  XT_OK(xseg_malloc(a, 512, NULL, &p2));
  xseg_ipc_handle *h = NULL, *h2 = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_export(a, p2, &h2));
  XSEG_ASSERT_TRUE(h != NULL);
  XSEG_ASSERT_GE(h->wire.n_handles, 2);
  xsim_live before = {0}, now = {0};
  if (xt_have_sim()) xsim_get_live(&before);   /* the driver's own count */
  void *q = (void *)1;

  /* The second handle's fd replaced by memory the driver never made: the
     emulator answers CUDA_ERROR_NOT_SUPPORTED (XSEG_ERR_UNSUPPORTED), an
     H200 (driver 580) another refusal (XSEG_ERR_DRIVER). */
  int real = h->fd[1];
  h->fd[1] = memfd_create("not-driver-memory", MFD_CLOEXEC);
  xseg_status refused = xseg_ipc_open(b, h, &q);
  if (refused != XSEG_ERR_UNSUPPORTED || xt_have_sim())
    XSEG_EXPECT_EQ(refused, xt_have_sim() ? XSEG_ERR_UNSUPPORTED
                                          : XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(),
                          "cuMemImportFromShareableHandle") != NULL);
  XSEG_EXPECT_TRUE(q == NULL);
  close(h->fd[1]);
  h->fd[1] = real;

  h->wire.handle_size[0] += 512;
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "granularity") != NULL);
  h->wire.handle_size[0] -= 512;

  h->wire.device = 1;
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "device 1") != NULL);
  h->wire.device = 0;

  uint64_t id = h->wire.block_id;
  h->wire.block_id = id + 1;
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "no longer exported") != NULL);
  h->wire.block_id = id;

  int table = h->table_fd;
  h->table_fd = memfd_create("not-a-table", MFD_CLOEXEC);
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "reference table") != NULL);
  close(h->table_fd);
  h->table_fd = table;

  XT_OK(xseg_free(a, p2));               /* nobody held it: gone */
  XSEG_EXPECT_EQ(xseg_ipc_open(b, h2, &q), XSEG_ERR_INVALID_ARGUMENT);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "no longer exported") != NULL);

  if (xt_have_sim()) xsim_get_live(&now);
  XSEG_EXPECT_EQ(now.handles, before.handles);
  XSEG_EXPECT_EQ(now.mappings, before.mappings);
  XSEG_EXPECT_EQ(now.reservations, before.reservations);
  xseg_ipc_stats s = ipc_stats(a);
  XSEG_EXPECT_EQ(s.open_by_others, 0);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 0);

  /* The untouched handle still opens. */
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_EXPECT_EQ(xseg_ipc_close(b, (char *)q + 512), XSEG_ERR_UNKNOWN_POINTER);
  XT_OK(xseg_ipc_close(b, q));
  xseg_ipc_handle_free(h2);
  XSEG_EXPECT_EQ(xseg_ipc_export(a, p2, &h2), XSEG_ERR_UNKNOWN_POINTER);
  XSEG_EXPECT_TRUE(h2 == NULL);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* A driver failure in the middle of an open (an import, the reservation,
   a map after the first, the access grant) fails the open with the
   failing call named, and leaves nothing behind: no handle imported, no
   range mapped or reserved, no reference counted at the producer. The
   same open then succeeds. The last case fails the grant and then the
   first unmap of the rollback too: the rollback tries again, as growth's
   does, so nothing stays mapped. A close whose unmap fails keeps the
   block open; one whose release fails keeps the handle for later. */
XSEG_TEST(ipc, driver_failure_in_an_open_leaves_nothing) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  void *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XSEG_ASSERT_TRUE(h != NULL);
  XSEG_ASSERT_GE(h->wire.n_handles, 2);       /* a map after the first */
  const struct {
    const char *call;
    uint64_t nth;
    bool unmap_fails_too;
  } cases[] = {
      {"cuMemImportFromShareableHandle", 2, false},
      {"cuMemAddressReserve", 1, false},
      {"cuMemMap", 2, false},
      {"cuMemSetAccess", 1, false},
      {"cuMemSetAccess", 1, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    xsim_live before, after;
    xsim_get_live(&before);
    xsim_fail_call(cases[i].call, cases[i].nth, CUDA_ERROR_UNKNOWN);
    if (cases[i].unmap_fails_too)
      xsim_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
    q = (void *)1;
    XSEG_EXPECT_EQ(xseg_ipc_open(b, h, &q), XSEG_ERR_DRIVER);
    XSEG_EXPECT_TRUE(q == NULL);
    if (!XSEG_EXPECT_TRUE(strstr(xseg_last_error(), cases[i].call) != NULL))
      fprintf(stderr, "case %zu: %s\n", i, xseg_last_error());
    xsim_fail_call("cuMemUnmap", 0, CUDA_SUCCESS);    /* disarmed */
    xsim_get_live(&after);
    XSEG_EXPECT_EQ(after.handles, before.handles);
    XSEG_EXPECT_EQ(after.mappings, before.mappings);
    XSEG_EXPECT_EQ(after.reservations, before.reservations);
    XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 0);
    XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 0);
  }
  /* A close whose release of an imported handle fails keeps that handle
     and releases it later (here at destroy; the harness checks that no
     handle outlives the test). */
  xsim_live opened, closed;
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 1);
  xsim_get_live(&opened);
  /* A close whose unmap fails keeps the block open, whole. */
  xsim_fail_call("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
  XSEG_EXPECT_EQ(xseg_ipc_close(b, q), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "cuMemUnmap") != NULL);
  xsim_get_live(&closed);
  XSEG_EXPECT_EQ(closed.mappings, opened.mappings);
  XSEG_EXPECT_EQ(ipc_stats(b).opened_blocks, 1);
  XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 1);
  xsim_fail_call("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
  XT_OK(xseg_ipc_close(b, q));
  xsim_get_live(&closed);
  XSEG_EXPECT_EQ(closed.handles, opened.handles - h->wire.n_handles + 1);
  XSEG_EXPECT_EQ(closed.mappings, opened.mappings - h->wire.n_handles);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  XT_OK(xseg_check(b));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* The snapshot marks exported blocks ("ipc": "exported" or
   "open_by_others") and the stats JSON carries the ipc counts. */
XSEG_TEST(ipc, snapshot_and_stats_json_show_shared_blocks) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  XSEG_ASSERT_TRUE(b != NULL);
  void *p = NULL, *p2 = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 1 * MiB, NULL, &p));
  XT_OK(xseg_malloc(a, 1 * MiB, NULL, &p2));
  xseg_ipc_handle *h = NULL, *h2 = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_export(a, p2, &h2));
  XT_OK(xseg_ipc_open(b, h, &q));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  XT_OK(xseg_snapshot_json(a, f));
  fclose(f);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc\": \"open_by_others\"") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc\": \"exported\"") != NULL);
  free(buf);
  f = open_memstream(&buf, &len);
  XT_OK(xseg_stats_json(a, f));
  fclose(f);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc.exported_blocks\": 2,") != NULL);
  XSEG_EXPECT_TRUE(strstr(buf, "\"ipc.open_by_others\": 1,") != NULL);
  free(buf);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(ipc_stats(a).pending_on_others, 1);
  XT_OK(xseg_ipc_close(b, q));
  XT_OK(xseg_empty_cache(a));                          /* completes it */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 1);
  xseg_ipc_handle_free(h);
  xseg_ipc_handle_free(h2);
  XT_OK(xseg_free(a, p2));
  XT_OK(xseg_check(a));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* A block both recorded on another stream and held by another process
   waits for both: once the holder closes, it still waits for the held
   stream's work queued before the free. */
XSEG_TEST(ipc, held_block_with_recorded_stream_waits_for_both) {
  XSEG_ASSERT_TRUE(xt_context(0) != NULL);
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  CUstream s1 = NULL;
  XSEG_ASSERT_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  xt_latch *held = xt_latch_new();
  const size_t size = 64 * 1024;
  void *p = NULL, *q = NULL, *r = NULL;
  XT_OK(xseg_malloc(a, size, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_ASSERT_CU(xt_latch_hold(s1, held));
  XT_OK(xseg_record_stream(a, p, s1));
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XT_OK(xseg_check(a));
  XT_OK(xseg_ipc_close(b, q));
  XT_OK(xseg_malloc(a, size, NULL, &r));       /* holder gone, s1 not done */
  XSEG_EXPECT_TRUE(r != p);
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, (int64_t)size);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);
  XT_OK(xseg_check(a));
  XT_OK(xseg_free(a, r));
  xt_latch_open(held);
  XSEG_ASSERT_CU(cuStreamSynchronize(s1));
  XT_OK(xseg_malloc(a, size, NULL, &r));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_TRUE(r == p);
  XT_OK(xseg_free(a, r));
  XT_OK(xseg_check(a));
  xseg_ipc_handle_free(h);
  xseg_destroy(b);
  xseg_destroy(a);
  xt_latch_free(held);
  XSEG_EXPECT_CU(cuStreamDestroy(s1));
}

/* A driver that cannot create fd-exportable handles
   (CUDA_ERROR_NOT_SUPPORTED) gets plain ones: allocation goes on, and an
   export then fails saying why. */
XSEG_TEST(ipc, driver_without_fd_export_still_allocates) {
  XT_REQUIRE_SIM_FOR("injects driver faults");
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  xsim_fail_call("cuMemCreate", 1, CUDA_ERROR_NOT_SUPPORTED);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 1 * MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XSEG_EXPECT_EQ(xseg_ipc_export(a, p, &h), XSEG_ERR_DRIVER);
  XSEG_EXPECT_TRUE(strstr(xseg_last_error(), "refused exportable") != NULL);
  XSEG_EXPECT_TRUE(h == NULL);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);   /* nothing kept */
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* Classic segments (one handle per segment) share the same way. */
XSEG_TEST(ipc, classic_segments_are_shared_too) {
  xseg_allocator *a = at_create("expandable_segments:False");
  xseg_allocator *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  void *pad = NULL, *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 3 * MiB, NULL, &pad));
  XT_OK(xseg_malloc(a, 5 * MiB, NULL, &p));
  XSEG_EXPECT_TRUE(ipc_fill(p, 5 * MiB, 8));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  xseg_ipc_handle *got = ipc_roundtrip(h);
  XSEG_ASSERT_TRUE(got != NULL);
  XT_OK(xseg_ipc_open(b, got, &q));
  XSEG_EXPECT_TRUE(ipc_same(q, 5 * MiB, 8));
  XT_OK(xseg_ipc_close(b, q));
  xseg_ipc_handle_free(got);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_free(a, pad));
  XT_OK(xseg_check(a));
  xseg_destroy(b);
  xseg_destroy(a);
}

/* README's example as written: produce() here, consume() in another
   process, over a stream socket; afterwards the block is free. */
XSEG_TEST(ipc, readme_example) {
  xseg_allocator *a = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL);
  int sv[2];
  XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ipc_child c = ipc_spawn(sv[1]);
  close(sv[1]);
  XSEG_ASSERT_GT(c.pid, 0);
  ipc_cmd use = {.op = 'u'};
  XSEG_EXPECT_EQ(send(c.ctl, &use, sizeof use, 0), (ssize_t)sizeof use);
  XSEG_EXPECT_EQ(produce(a, sv[0]), 0);
  int32_t st = -1;
  XSEG_EXPECT_EQ(recv(c.ctl, &st, sizeof st, 0), (ssize_t)sizeof st);
  XSEG_EXPECT_EQ(st, 0);                       /* consume() returned 0 */
  XSEG_EXPECT_EQ(ipc_finish(c), 0);
  close(sv[0]);
  void *p = NULL;
  XT_OK(xseg_malloc(a, 512, NULL, &p));        /* completes the hold */
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_blocks, 0);
  XSEG_EXPECT_EQ(ipc_stats(a).exported_total, 1);
  XT_OK(xseg_free(a, p));
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}

/* A consumer destroyed with blocks still open lets go of them (its
   mappings unmapped, its holds released): the producer's free is then
   immediate. */
XSEG_TEST(ipc, consumer_destroy_releases_what_it_holds) {
  xseg_allocator *a = at_create(NULL), *b = at_create(NULL);
  XSEG_ASSERT_TRUE(a != NULL && b != NULL);
  void *p = NULL, *q = NULL;
  XT_OK(xseg_malloc(a, 2 * MiB, NULL, &p));
  xseg_ipc_handle *h = NULL;
  XT_OK(xseg_ipc_export(a, p, &h));
  XT_OK(xseg_ipc_open(b, h, &q));
  XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 1);
  xseg_destroy(b);                        /* reports the open block */
  XSEG_EXPECT_EQ(ipc_stats(a).open_by_others, 0);
  XT_OK(xseg_free(a, p));
  XSEG_EXPECT_EQ(at_stats(a).pending_free_bytes, 0);
  xseg_ipc_handle_free(h);
  XT_OK(xseg_check(a));
  xseg_destroy(a);
}
