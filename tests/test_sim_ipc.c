/* Conformance of the emulator's shareable handles (sim/sim_ipc.c) to the
 * comments of cuMemExportToShareableHandle and cuMemImportFromShareableHandle
 * in the toolkit's cuda.h, with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
 * ("Allows a file descriptor to be used for exporting. Permitted only on
 * POSIX systems. (int)").
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "sim_helpers.h"

#define ST_POSIX CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
#define ST_PATTERN_BYTES 4096

/* Sends one fd over a Unix socket (SCM_RIGHTS). */
static bool st_fd_send(int sock, int fd) {
  char byte = 'x';
  struct iovec iov = {&byte, 1};
  union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
  memset(&u, 0, sizeof u);
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &msg, 0) == 1;
}

/* Receives one fd sent by st_fd_send; -1 on failure. */
static int st_fd_recv(int sock) {
  char byte;
  struct iovec iov = {&byte, 1};
  union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  if (recvmsg(sock, &msg, 0) != 1) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  if (c == NULL || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

/* The importing side, in the child: receive the fd, import it (cuda.h: the
   osHandle is the fd cast to void *), reserve, map, grant access, check the
   parent's bytes, write its own after them, and release everything. Exits
   with the number of the step that failed. */
static void st_importer(void *arg) {
  int sock = *(int *)arg, fd = st_fd_recv(sock);
  if (fd < 0) _exit(10);
  size_t g = 0;
  CUmemGenericAllocationHandle h;
  CUdeviceptr va;
  CUmemAllocationProp p = st_prop(0, ST_POSIX);
  if (cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    _exit(11);
  if (cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, ST_POSIX))
    _exit(12);
  if (cuMemAddressReserve(&va, g, 0, 0, 0)) _exit(13);
  if (cuMemMap(va, g, 0, h, 0)) _exit(14);
  if (st_access(va, g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)) _exit(15);
  unsigned char *b = (unsigned char *)va;
  for (int i = 0; i < ST_PATTERN_BYTES; i++)
    if (b[i] != (unsigned char)(i * 7 + 1)) _exit(16);
  for (int i = 0; i < ST_PATTERN_BYTES; i++)
    b[ST_PATTERN_BYTES + i] = (unsigned char)(i * 5 + 3);
  if (cuMemUnmap(va, g) || cuMemRelease(h) || cuMemAddressFree(va, g))
    _exit(17);
  close(fd);
  if (write(sock, "k", 1) != 1) _exit(18);
}

/* The exporter maps a POSIX-fd handle, writes a pattern, exports the fd and
   sends it to a forked child through a Unix socket; the child imports, maps
   and reads the parent's bytes and writes its own, which the parent then
   reads through its own mapping: both processes share one memory. */
XSEG_TEST(SimIpc, export_import_across_fork_through_unix_socket) {
  /* A forked child cannot use the parent's context on a real GPU. */
  XT_REQUIRE_SIM_FOR("shares device memory with a forked child");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  int sv[2];
  XSEG_ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h;
  XSEG_ASSERT_CU(cuMemAddressReserve(&va, g, 0, 0, 0));
  XSEG_ASSERT_CU(st_create(&h, g, ST_POSIX));
  XSEG_ASSERT_CU(cuMemMap(va, g, 0, h, 0));
  XSEG_ASSERT_CU(st_access(va, g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  unsigned char *b = (unsigned char *)va;
  for (int i = 0; i < ST_PATTERN_BYTES; i++) b[i] = (unsigned char)(i * 7 + 1);
  int fd = -1;
  XSEG_ASSERT_CU(cuMemExportToShareableHandle(&fd, h, ST_POSIX, 0));
  XSEG_EXPECT_TRUE(st_fd_send(sv[0], fd));
  close(fd);   /* the child holds its own copy now */
  int child_sock = sv[1];
  XSEG_EXPECT_EQ(st_child_run(st_importer, &child_sock), 0);
  char ack = 0;
  XSEG_EXPECT_EQ(read(sv[0], &ack, 1), 1);
  XSEG_EXPECT_EQ(ack, 'k');
  int wrong = 0;
  for (int i = 0; i < ST_PATTERN_BYTES; i++)
    wrong += b[ST_PATTERN_BYTES + i] != (unsigned char)(i * 5 + 3);
  XSEG_EXPECT_EQ(wrong, 0);
  close(sv[0]);
  close(sv[1]);
  XSEG_EXPECT_CU(cuMemUnmap(va, g));
  XSEG_EXPECT_CU(cuMemRelease(h));
  XSEG_EXPECT_CU(cuMemAddressFree(va, g));
}

/* Importing in the same process gives a new handle over the same memory
   (cuda.h: "There is no guarantee that the contents of handle will be the
   same CUDA memory handle"), released on its own ("Each time a recipient
   process imports a shareable handle, it needs to pair it with
   cuMemRelease"). */
XSEG_TEST(SimIpc, import_in_same_process_shares_bytes) {
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h, imp;
  XSEG_ASSERT_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
  XSEG_ASSERT_CU(st_create(&h, g, ST_POSIX));
  int fd = -1;
  XSEG_ASSERT_CU(cuMemExportToShareableHandle(&fd, h, ST_POSIX, 0));
  XSEG_ASSERT_CU(cuMemImportFromShareableHandle(&imp, (void *)(intptr_t)fd,
                                                ST_POSIX));
  close(fd);   /* the importer keeps no claim on the caller's fd */
  XSEG_ASSERT_CU(cuMemMap(va, g, 0, h, 0));
  XSEG_ASSERT_CU(cuMemMap(va + g, g, 0, imp, 0));
  XSEG_ASSERT_CU(st_access(va, 2 * g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  if (xt_have_sim()) {
    ((volatile char *)va)[123] = 0x77;
    XSEG_EXPECT_EQ(((volatile char *)va)[g + 123], 0x77);
  }
  CUmemAllocationProp p;
  XSEG_EXPECT_CU(cuMemGetAllocationPropertiesFromHandle(&p, imp));
  XSEG_EXPECT_EQ(p.location.id, 0);
  /* Observed on H100, driver 580: an imported handle requests no export
     type, whatever the exporter's handle did. */
  XSEG_EXPECT_EQ(p.requestedHandleTypes, CU_MEM_HANDLE_TYPE_NONE);
  XSEG_EXPECT_CU(cuMemUnmap(va, 2 * g));
  XSEG_EXPECT_CU(cuMemRelease(imp));
  XSEG_EXPECT_CU(cuMemRelease(h));
  XSEG_EXPECT_CU(cuMemAddressFree(va, 2 * g));
}

/* cuMemCreate's prop->requestedHandleTypes decides what the handle may be
   exported as; CU_MEM_HANDLE_TYPE_NONE "Does not allow any export
   mechanism". The emulator answers CUDA_ERROR_INVALID_VALUE; Windows and
   fabric handles are CUDA_ERROR_NOT_SUPPORTED here; flags are "Reserved,
   must be zero". */
XSEG_TEST(SimIpc, export_needs_the_posix_handle_type) {
  XT_REQUIRE_SIM_FOR("checks the emulator's error codes for misuse");
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUmemGenericAllocationHandle none, posix;
  XSEG_ASSERT_CU(st_create(&none, g, CU_MEM_HANDLE_TYPE_NONE));
  XSEG_ASSERT_CU(st_create(&posix, g, ST_POSIX));
  int fd = -1;
  XSEG_EXPECT_CU_ERR(cuMemExportToShareableHandle(&fd, none, ST_POSIX, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(
      cuMemExportToShareableHandle(&fd, posix, CU_MEM_HANDLE_TYPE_WIN32, 0),
      CUDA_ERROR_NOT_SUPPORTED);
  XSEG_EXPECT_CU_ERR(cuMemExportToShareableHandle(&fd, posix, ST_POSIX, 1),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemExportToShareableHandle(NULL, posix, ST_POSIX, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemExportToShareableHandle(&fd, 777, ST_POSIX, 0),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_EQ(fd, -1);
  XSEG_EXPECT_CU(cuMemRelease(none));
  XSEG_EXPECT_CU(cuMemRelease(posix));
}

/* cuMemImportFromShareableHandle: "If the current process cannot support the
   memory described by this shareable handle, this API will error as
   CUDA_ERROR_NOT_SUPPORTED": an fd that is not emulator memory. A closed fd
   is an invalid argument. */
XSEG_TEST(SimIpc, import_of_foreign_or_closed_fd_fails) {
  XT_REQUIRE_SIM_FOR("imports a file that is not device memory");
  XSEG_ASSERT_TRUE(st_setup() > 0);
  CUmemGenericAllocationHandle h;
  int foreign = memfd_create("not-xsim", MFD_CLOEXEC);
  XSEG_ASSERT_TRUE(foreign >= 0);
  XSEG_EXPECT_EQ(ftruncate(foreign, 2 << 20), 0);
  XSEG_EXPECT_CU_ERR(cuMemImportFromShareableHandle(
                         &h, (void *)(intptr_t)foreign, ST_POSIX),
                     CUDA_ERROR_NOT_SUPPORTED);
  close(foreign);
  XSEG_EXPECT_CU_ERR(cuMemImportFromShareableHandle(
                         &h, (void *)(intptr_t)foreign, ST_POSIX),
                     CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(
      cuMemImportFromShareableHandle(&h, (void *)(intptr_t)-1, ST_POSIX),
      CUDA_ERROR_INVALID_VALUE);
  XSEG_EXPECT_CU_ERR(cuMemImportFromShareableHandle(NULL, NULL, ST_POSIX),
                     CUDA_ERROR_INVALID_VALUE);
}

/* The memory lives while either side holds it (cuMemExportToShareableHandle:
   "Once all shareable handles are closed and the allocation is released, the
   allocated memory referenced will be released"): after the exporter
   releases its handle, the importer's mapping still reads the bytes. */
XSEG_TEST(SimIpc, imported_memory_outlives_the_exporting_handle) {
  size_t g = st_setup();
  XSEG_ASSERT_GT(g, 0);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h, imp;
  XSEG_ASSERT_CU(cuMemAddressReserve(&va, g, 0, 0, 0));
  XSEG_ASSERT_CU(st_create(&h, g, ST_POSIX));
  int fd = -1;
  XSEG_ASSERT_CU(cuMemExportToShareableHandle(&fd, h, ST_POSIX, 0));
  XSEG_ASSERT_CU(cuMemMap(va, g, 0, h, 0));
  XSEG_ASSERT_CU(st_access(va, g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  XSEG_ASSERT_CU(cuMemsetD8(va + 9, 0x19, 1));
  XSEG_ASSERT_CU(cuMemUnmap(va, g));
  XSEG_ASSERT_CU(cuMemRelease(h));
  XSEG_ASSERT_CU(cuMemImportFromShareableHandle(&imp, (void *)(intptr_t)fd,
                                                ST_POSIX));
  close(fd);
  XSEG_ASSERT_CU(cuMemMap(va, g, 0, imp, 0));
  XSEG_ASSERT_CU(st_access(va, g, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
  unsigned char v = 0;
  XSEG_EXPECT_CU(cuMemcpyDtoH(&v, va + 9, 1));
  XSEG_EXPECT_EQ(v, 0x19);
  XSEG_EXPECT_CU(cuMemUnmap(va, g));
  XSEG_EXPECT_CU(cuMemRelease(imp));
  XSEG_EXPECT_CU(cuMemAddressFree(va, g));
}
