/* ipc_wire.c: a handle on a Unix socket: the fixed-size message
 * (xs_ipc_wire) in one sendmsg, its fds as SCM_RIGHTS ancillary data (the
 * reference table first, then one per physical handle).
 *
 * The receiver trusts nothing: it takes every fd that arrived (closing them
 * all on any error), insists on the whole message, the magic and version,
 * exactly 1 + n_handles fds, and sizes that hold the block. What only the
 * producer's table and the driver can tell (is the block still exported,
 * is an fd really driver memory) is checked by xseg_ipc_open.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc/ipc.h"
#include "vmm/error.h"

enum { WIRE_MAX_FDS = 1 + XS_IPC_MAX_HANDLES };

typedef union wire_control {
  struct cmsghdr align;
  char buf[CMSG_SPACE(WIRE_MAX_FDS * sizeof(int))];
} wire_control;

void xseg_ipc_handle_free(xseg_ipc_handle *h) {
  if (h == NULL) return;
  if (h->table_fd >= 0) close(h->table_fd);
  for (uint32_t i = 0; i < h->wire.n_handles && i < XS_IPC_MAX_HANDLES; i++)
    if (h->fd[i] >= 0) close(h->fd[i]);
  free(h);
}

xseg_status xseg_ipc_send(int unix_socket, const xseg_ipc_handle *h) {
  if (h == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_send: handle is "
                    "NULL");
  uint32_t n = h->wire.n_handles;
  assert(n >= 1 && n <= XS_IPC_MAX_HANDLES);
  int fds[WIRE_MAX_FDS];
  fds[0] = h->table_fd;
  memcpy(fds + 1, h->fd, n * sizeof *fds);
  wire_control u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)&h->wire, sizeof h->wire};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = u.buf,
                       .msg_controllen = CMSG_SPACE((1 + n) * sizeof(int))};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN((1 + n) * sizeof(int));
  memcpy(CMSG_DATA(c), fds, (1 + n) * sizeof(int));
  ssize_t sent;
  do sent = sendmsg(unix_socket, &msg, MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  if (sent != (ssize_t)sizeof h->wire)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_send(socket %d): sendmsg of the %zu-byte "
                    "message with %u fds failed: %s", unix_socket,
                    sizeof h->wire, 1 + n,
                    sent < 0 ? strerror(errno) : "short write");
  return XSEG_OK;
}

/* Takes the fds of every SCM_RIGHTS block into h (table, then handles);
   returns how many there were (more than fit are closed). */
static size_t wire_take_fds(struct msghdr *msg, xseg_ipc_handle *h) {
  size_t n = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL;
       c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++, n++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof fd, sizeof fd);
      if (n == 0) h->table_fd = fd;
      else if (n <= XS_IPC_MAX_HANDLES) h->fd[n - 1] = fd;
      else close(fd);
    }
  }
  return n;
}

/* The rest of a message that arrived in pieces: only a stream socket
   splits one (and then a peer that sends less than a message and keeps
   the socket open makes this wait, as any reader of a stream would);
   datagram and seqpacket messages are whole or truncated. */
static ssize_t wire_read_rest(int sock, char *buf, size_t got, size_t want) {
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_STREAM)
    return (ssize_t)got;
  while (got < want) {
    ssize_t r = recv(sock, buf + got, want - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* Why a message cannot be a handle, or NULL. */
static const char *wire_invalid(const xs_ipc_wire *w, size_t n_fds) {
  if (memcmp(w->magic, XS_IPC_MAGIC, sizeof w->magic) != 0)
    return "bad magic (not an xseg IPC message)";
  if (w->version != XS_IPC_VERSION) return "unsupported version";
  if (w->n_handles < 1 || w->n_handles > XS_IPC_MAX_HANDLES)
    return "handle count out of range";
  if (n_fds != 1 + (size_t)w->n_handles)
    return "the number of fds does not match the handle count";
  uint64_t total = 0;
  for (uint32_t i = 0; i < w->n_handles; i++) {
    if (w->handle_size[i] == 0 || total + w->handle_size[i] < total)
      return "a handle size is zero or the sizes overflow";
    total += w->handle_size[i];
  }
  if (w->block_size == 0 || w->offset >= total ||
      w->block_size > total - w->offset)
    return "the block does not lie inside its handles";
  if (w->producer_pid <= 0) return "no producer pid";
  return NULL;
}

xseg_status xseg_ipc_recv(int unix_socket, xseg_ipc_handle **out) {
  if (out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_recv: out is NULL");
  *out = NULL;
  xseg_ipc_handle *h = calloc(1, sizeof *h);
  if (h == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_ipc_recv: out of host "
                    "memory");
  h->table_fd = -1;
  for (int i = 0; i < XS_IPC_MAX_HANDLES; i++) h->fd[i] = -1;
  wire_control u;
  struct iovec iov = {&h->wire, sizeof h->wire};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  ssize_t got;
  do got = recvmsg(unix_socket, &msg, MSG_CMSG_CLOEXEC);
  while (got < 0 && errno == EINTR);
  if (got < 0) {
    int e = errno;
    free(h);
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_recv(socket %d): "
                    "recvmsg failed: %s", unix_socket, strerror(e));
  }
  size_t n_fds = wire_take_fds(&msg, h);
  if (got > 0)
    got = wire_read_rest(unix_socket, (char *)&h->wire, (size_t)got,
                         sizeof h->wire);
  const char *why = NULL;
  if ((size_t)got != sizeof h->wire)
    why = got == 0 ? "the peer closed the socket" : "truncated message";
  else if (msg.msg_flags & MSG_CTRUNC)
    why = "too many fds (ancillary data truncated)";
  else
    why = wire_invalid(&h->wire, n_fds);
  if (why != NULL) {
    /* Every fd that arrived is closed, whatever the message claims. */
    h->wire.n_handles = XS_IPC_MAX_HANDLES;
    xseg_ipc_handle_free(h);
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_recv(socket %d): %s (%zd of %zu bytes, %zu "
                    "fds)", unix_socket, why, got, sizeof h->wire, n_fds);
  }
  *out = h;
  return XSEG_OK;
}
