/* The process's own identity that every IPC hold carries (alloc/ipc_table.c,
 * xs_ipc_self_start): read from /proc once and kept with the pid it belongs
 * to. A fork's child forgets it (pthread_atfork): the pid key alone would
 * let a grandchild that got its grandparent's pid back, after that one
 * exited, take the grandparent's start time for its own, and its holds
 * would then name a process that no longer exists, to be reaped under it.
 *
 * The reuse is forced: a new PID namespace (as root, or in a new user
 * namespace where the kernel allows it), where writing ns_last_pid makes
 * the next fork get the pid asked for. Where neither can be made the test
 * says so and skips.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/ipc.h"
#include "xseg_test.h"

/* Exit codes of the namespace's processes: 0 the grandchild read its own
   start time, 1 it read the grandparent's, SKIP the reuse could not be
   forced here (the step in `identity_skip_why`). */
enum { IDENTITY_OWN = 0, IDENTITY_STALE = 1, IDENTITY_SKIP = 77 };

static bool write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text);
}

/* A new PID and mount namespace for the caller's next children: as root
   directly, else inside a new user namespace mapping the caller to root. */
static bool enter_namespaces(void) {
  if (unshare(CLONE_NEWPID | CLONE_NEWNS) == 0) return true;
  uid_t uid = geteuid();
  gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS) != 0) return false;
  char map[64];
  snprintf(map, sizeof map, "0 %u 1", (unsigned)uid);
  if (!write_file("/proc/self/uid_map", map)) return false;
  write_file("/proc/self/setgroups", "deny");
  snprintf(map, sizeof map, "0 %u 1", (unsigned)gid);
  return write_file("/proc/self/gid_map", map);
}

/* The start time /proc gives for this process now, under the mask holds
   compare it with. */
static uint64_t start_from_proc(void) {
  char buf[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  for (int field = 2; p != NULL && field < 22; field++) {
    p = strchr(p + 1, ' ');
  }
  return p != NULL ? strtoull(p + 1, NULL, 10) & XS_IPC_START_MASK : 0;
}

/* The exit code of child `pid`, reaping every other child met meanwhile
   (the namespace's init adopts orphans). */
static int wait_for(pid_t pid) {
  for (;;) {
    int status = 0;
    pid_t got = waitpid(-1, &status, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return IDENTITY_SKIP;
    if (got == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : IDENTITY_STALE;
  }
}

/* B, child of A, which has exited: makes the next fork get A's pid, then
   forks C there, which asks for its start time. */
static int grandchild_on_reused_pid(pid_t a_pid) {
  while (getppid() == a_pid) usleep(1000);      /* A gone, B adopted */
  /* Start times count clock ticks (10 ms at the usual 100 Hz): C must
     start in a later one than A. */
  usleep(50 * 1000);
  char last[32];
  snprintf(last, sizeof last, "%d", (int)a_pid - 1);
  if (!write_file("/proc/sys/kernel/ns_last_pid", last)) return IDENTITY_SKIP;
  pid_t c = fork();
  if (c == 0) {
    if (getpid() != a_pid) _exit(IDENTITY_SKIP);   /* another fork won */
    uint64_t cached = xs_ipc_self_start(), own = start_from_proc();
    _exit(own != 0 && cached == own ? IDENTITY_OWN : IDENTITY_STALE);
  }
  return c < 0 ? IDENTITY_SKIP : wait_for(c);
}

/* The namespace's init: A reads and keeps its start time, forks B and
   exits; B forks C on A's pid. */
static int namespace_init(void) {
  if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
            NULL) != 0)
    return IDENTITY_SKIP;
  pid_t a = fork();
  if (a == 0) {
    if (xs_ipc_self_start() == 0) _exit(IDENTITY_SKIP);
    pid_t me = getpid();
    pid_t b = fork();
    if (b == 0) _exit(grandchild_on_reused_pid(me));
    _exit(b < 0 ? IDENTITY_SKIP : 0);
  }
  if (a < 0) return IDENTITY_SKIP;
  /* A's own exit first (B is told by its parent changing), then B's. */
  for (;;) {
    int status = 0;
    pid_t got = waitpid(-1, &status, 0);
    if (got < 0) return IDENTITY_SKIP;
    if (got == a) {
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return WIFEXITED(status) ? WEXITSTATUS(status) : IDENTITY_SKIP;
      continue;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : IDENTITY_STALE;
  }
}

XSEG_TEST(ipc_identity, grandchild_on_its_grandparents_pid_reads_its_own_start) {
  pid_t x = fork();
  if (x == 0) {
    if (!enter_namespaces()) _exit(IDENTITY_SKIP);
    pid_t init = fork();
    if (init == 0) _exit(namespace_init());
    _exit(init < 0 ? IDENTITY_SKIP : wait_for(init));
  }
  XSEG_ASSERT_GT(x, 0);
  int status = 0;
  XSEG_ASSERT_EQ(waitpid(x, &status, 0), x);
  XSEG_ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == IDENTITY_SKIP) {
    xt_skip(__FILE__, __LINE__,
            "cannot make a PID namespace and reuse a pid in it here (needs "
            "root or unprivileged user namespaces)");
    return;
  }
  XSEG_EXPECT_EQ(WEXITSTATUS(status), IDENTITY_OWN);
}
