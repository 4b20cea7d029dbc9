/* ipc_table.c: the reference table a producer shares with the processes
 * that hold its blocks, and how a process is told alive from dead.
 *
 * One memfd per producing allocator, mapped MAP_SHARED by every holder
 * (see ipc.h for why a memfd). Lock-free: export slots are written by the
 * producer alone; holder slots are claimed by compare-and-swap. Giving a
 * block back races with a consumer registering, and both sides use the
 * same sequentially consistent handshake, so one of them always sees the
 * other:
 *
 *     producer                         consumer
 *     export.state = CLOSING           holder.state = HELD (id, pid)
 *     count HELD holders of id         read export.state of id
 *     0: EMPTY, give the block back    not LIVE/FREE_HELD: unhold, fail
 *     else: FREE_HELD, keep it         else: map it
 *
 * A process is identified by pid and start time (from /proc/<pid>/stat),
 * so a pid reused by a later process does not keep a dead one's holds.
 * A holder slot's claim names its claimant in the same compare-and-swap
 * (ipc.h, xs_ipc_holder_word), so a consumer killed between claiming a
 * slot and publishing it leaves a slot the next claim can take over.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc/ipc.h"
#include "vmm/error.h"

/* State and start time of `pid` from /proc; false when it has none. */
static bool table_proc_stat(pid_t pid, char *state, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  /* "pid (comm) S ppid ..." : comm may hold anything, so parse after the
     last ')'. starttime is field 22, the 20th after comm. */
  char *p = strrchr(buf, ')');
  if (p == NULL || p[1] != ' ') return false;
  *state = p[2];
  p += 2;
  for (int field = 3; field < 22 && p != NULL; field++) {
    p = strchr(p, ' ');
    if (p != NULL) p++;
  }
  if (p == NULL) return false;
  *start = strtoull(p, NULL, 10);
  return true;
}

pid_t xs_ipc_self_pid(void) { return getpid(); }

/* This process's start time and PID namespace do not change while it
   runs, so each is read from /proc once (every open and hold asked for
   them: four system calls a time) and kept in one word with the pid it
   belongs to, so that a forked child, whose pid differs, reads its own.
   One atomic word each: threads that race both store the same value, and
   no lock is held across a fork. A fork's child forgets both (its pid
   alone could name a process that had exited, reused by a grandchild);
   the pid key stays for a child made by clone() without fork's hooks. */
static _Atomic uint64_t self_start_word;  /* pid << 40 | start, 0: unread */
static _Atomic uint64_t self_ns_word;     /* pid << 32 | inode, 0: unread */
_Static_assert(XS_IPC_START_MASK == (UINT64_C(1) << 40) - 1,
               "the start word keeps the 40 bits start times compare in");
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static void self_forget(void) {
  atomic_store_explicit(&self_start_word, 0, memory_order_relaxed);
  atomic_store_explicit(&self_ns_word, 0, memory_order_relaxed);
}
static void self_watch_forks(void) { pthread_atfork(NULL, NULL, self_forget); }

/* The value `word` keeps for this process in its low `bits` bits, the pid
   above them; read(pid) when it keeps none for this pid. A value read
   that is 0 (unknown) or does not fit is returned, not kept. */
static uint64_t self_cached(_Atomic uint64_t *word, unsigned bits,
                            uint64_t (*read)(pid_t)) {
  pthread_once(&self_once, self_watch_forks);
  uint64_t pid = (uint64_t)getpid() & 0x3fffff;
  uint64_t w = atomic_load_explicit(word, memory_order_relaxed);
  if (w != 0 && w >> bits == pid) return w & ((UINT64_C(1) << bits) - 1);
  uint64_t value = read((pid_t)pid);
  if (value != 0 && value >> bits == 0)
    atomic_store_explicit(word, pid << bits | value, memory_order_relaxed);
  return value;
}

static uint64_t self_read_start(pid_t pid) {
  char state;
  uint64_t start = 0;
  if (!table_proc_stat(pid, &state, &start)) return 0;
  return start & XS_IPC_START_MASK;   /* compared under the mask everywhere */
}

/* nsfs inodes are 32-bit; a larger one is read again each time. */
static uint64_t self_read_pid_ns(pid_t pid) {
  (void)pid;
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

uint64_t xs_ipc_self_start(void) {
  return self_cached(&self_start_word, 40, self_read_start);
}

uint64_t xs_ipc_self_pid_ns(void) {
  return self_cached(&self_ns_word, 32, self_read_pid_ns);
}

bool xs_ipc_process_alive(pid_t pid, uint64_t start) {
  if (pid <= 0) return false;
  char state;
  uint64_t now;
  if (table_proc_stat(pid, &state, &now))
    return ((now ^ start) & XS_IPC_START_MASK) == 0 && state != 'Z' &&
           state != 'X';
  /* No /proc entry: gone, unless /proc is not there to ask. */
  return kill(pid, 0) == 0 || errno == EPERM;
}

static void alive_forget(xs_ipc_alive *c, size_t i) {
  close(c->e[i].pidfd);
  memmove(&c->e[i], &c->e[i + 1], (c->n - i - 1) * sizeof c->e[0]);
  c->n--;
}

/* A pidfd of the process pid started at start, or -1. Opened, then the
   start time checked again: the pidfd cannot name a later process. */
static int alive_pidfd(pid_t pid, uint64_t start) {
#ifdef SYS_pidfd_open
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0 && !xs_ipc_process_alive(pid, start)) {
    close(fd);
    fd = -1;
  }
  return fd;
#else
  (void)pid, (void)start;
  return -1;
#endif
}

bool xs_ipc_alive_check(xs_ipc_alive *c, pid_t pid, uint64_t start) {
  for (size_t i = 0; i < c->n; i++) {
    if (c->e[i].pid != pid || c->e[i].start != start) continue;
    struct pollfd p = {.fd = c->e[i].pidfd, .events = POLLIN};
    int r = poll(&p, 1, 0);
    if (r == 0) return true;                 /* still running */
    alive_forget(c, i);
    return r < 0 && xs_ipc_process_alive(pid, start);
  }
  if (!xs_ipc_process_alive(pid, start)) return false;
  int fd = alive_pidfd(pid, start);
  if (fd < 0) return xs_ipc_process_alive(pid, start);
  if (c->n == XS_IPC_ALIVE_MAX) alive_forget(c, 0);
  c->e[c->n++] = (xs_ipc_alive_entry){pid, start, fd};
  return true;
}

void xs_ipc_alive_clear(xs_ipc_alive *c) {
  while (c->n != 0) alive_forget(c, c->n - 1);
}

/* A table's id: random, so that no two tables of one process (or of
   processes whose pid and start time collide) share one; never 0. Without
   getrandom, the table's address and the clock still differ between the
   tables of one process. */
static uint64_t table_new_id(const xs_ipc_table *t) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    id = ((uint64_t)(uintptr_t)t ^ (uint64_t)ts.tv_nsec << 20 ^
          (uint64_t)ts.tv_sec) * UINT64_C(0x9E3779B97F4A7C15);
  }
  return id != 0 ? id : 1;
}

xseg_status xs_ipc_table_create(xs_ipc_table **out, int *fd) {
  int f = memfd_create("xseg-ipc-table", MFD_CLOEXEC);
  if (f < 0)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "memfd_create for the IPC reference table failed: %s",
                    strerror(errno));
  xs_ipc_table *t = MAP_FAILED;
  if (ftruncate(f, sizeof *t) == 0)
    t = mmap(NULL, sizeof *t, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (t == MAP_FAILED) {
    int e = errno;
    close(f);
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "sizing or mapping the IPC reference table (%zu bytes) "
                    "failed: %s", sizeof *t, strerror(e));
  }
  /* A fresh memfd reads as zeros: every slot EMPTY or FREE. */
  memcpy(t->magic, XS_IPC_MAGIC, sizeof t->magic);
  t->table_id = table_new_id(t);
  t->version = XS_IPC_VERSION;
  t->producer_pid = xs_ipc_self_pid();
  t->producer_start = xs_ipc_self_start();
  *out = t;
  *fd = f;
  return XSEG_OK;
}

xseg_status xs_ipc_table_map(int fd, const xs_ipc_wire *w,
                             xs_ipc_table **out, struct stat *file) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (size_t)st.st_size != sizeof(xs_ipc_table))
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_open: the handle's table fd %d is not an xseg "
                    "reference table (expected a %zu-byte memfd)", fd,
                    sizeof(xs_ipc_table));
  xs_ipc_table *t = mmap(NULL, sizeof *t, PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, 0);
  if (t == MAP_FAILED)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "xseg_ipc_open: mapping the reference table failed: %s",
                    strerror(errno));
  if (memcmp(t->magic, XS_IPC_MAGIC, sizeof t->magic) != 0 ||
      t->version != XS_IPC_VERSION || t->producer_pid != w->producer_pid ||
      t->producer_start != w->producer_start) {
    xs_ipc_table_unmap(t);
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_open: the reference table does not belong to "
                    "producer pid %d named by the handle (forged or mixed-up "
                    "handle)", (int)w->producer_pid);
  }
  if (t->table_id != w->table_id) {
    uint64_t found = t->table_id;
    xs_ipc_table_unmap(t);
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_open: block %llu's handle names reference "
                    "table %016llx of producer pid %d, but its table fd is "
                    "table %016llx (another allocator's: a forged or "
                    "mixed-up handle)",
                    (unsigned long long)w->block_id,
                    (unsigned long long)w->table_id, (int)w->producer_pid,
                    (unsigned long long)found);
  }
  if (file != NULL) *file = st;
  *out = t;
  return XSEG_OK;
}

void xs_ipc_table_unmap(xs_ipc_table *t) {
  if (t != NULL) munmap(t, sizeof *t);
}

static xs_ipc_export_slot *table_export(xs_ipc_table *t, uint64_t id) {
  return &t->exports[id % XS_IPC_EXPORTS];
}

/* Holder slots that may be in use: a forged header cannot make a scan
   run past the table. */
static size_t table_used(xs_ipc_table *t) {
  uint32_t n = atomic_load(&t->holders_used);
  return n < XS_IPC_HOLDERS ? n : XS_IPC_HOLDERS;
}

static bool table_holds(xs_ipc_holder *h, uint64_t id) {
  return xs_ipc_holder_state_of(atomic_load(&h->word)) ==
             XS_IPC_HOLDER_HELD &&
         atomic_load_explicit(&h->id, memory_order_relaxed) == id;
}

size_t xs_ipc_table_holders(xs_ipc_table *t, uint64_t id) {
  size_t n = 0, used = table_used(t);
  for (size_t i = 0; i < used; i++) n += table_holds(&t->holders[i], id);
  return n;
}

/* Whether slot word w's process is dead: a claim it never published, or
   (`held_too`) a hold it never closed. */
static bool table_dead_claim(uint64_t w, bool held_too) {
  xs_ipc_holder_state st = xs_ipc_holder_state_of(w);
  return (st == XS_IPC_HOLDER_CLAIMING ||
          (held_too && st == XS_IPC_HOLDER_HELD)) &&
         !xs_ipc_process_alive(xs_ipc_holder_pid(w), xs_ipc_holder_start(w));
}

size_t xs_ipc_table_reap(xs_ipc_table *t, uint64_t id, xs_ipc_alive *alive) {
  size_t n = 0, used = table_used(t);
  for (size_t i = 0; i < used; i++) {
    xs_ipc_holder *h = &t->holders[i];
    uint64_t w = atomic_load(&h->word);
    /* A claim never published holds nothing: it goes, uncounted. */
    if (table_dead_claim(w, false)) {
      atomic_compare_exchange_strong(&h->word, &w, XS_IPC_HOLDER_FREE);
      continue;
    }
    if (!table_holds(h, id) ||
        xs_ipc_alive_check(alive, xs_ipc_holder_pid(w),
                           xs_ipc_holder_start(w)))
      continue;
    n += atomic_compare_exchange_strong(&h->word, &w, XS_IPC_HOLDER_FREE);
  }
  return n;
}

bool xs_ipc_table_try_close(xs_ipc_table *t, uint64_t id) {
  xs_ipc_export_slot *e = table_export(t, id);
  assert(atomic_load(&e->id) == id && "the producer owns its slots");
  atomic_store(&e->state, XS_IPC_CLOSING);
  if (xs_ipc_table_holders(t, id) != 0) {
    atomic_store(&e->state, XS_IPC_FREE_HELD);
    return false;
  }
  atomic_store(&e->id, 0);
  atomic_store(&e->state, XS_IPC_EMPTY);
  return true;
}

/* A holder slot, claimed as `mine` (CLAIMING, this process); SIZE_MAX
   when the table is full. The first pass takes a FREE slot or one a dead
   claimant left CLAIMING (a rare state: few liveness checks); only a full
   table makes the second pass take the HELD slot of a dead holder too,
   which the producer would reap once that block is freed (taking it over
   drops the dead hold just as the reap does). */
static size_t table_claim(xs_ipc_table *t, uint64_t mine) {
  for (size_t i = 0; i < 2 * (size_t)XS_IPC_HOLDERS; i++) {
    xs_ipc_holder *h = &t->holders[i % XS_IPC_HOLDERS];
    uint64_t w = atomic_load(&h->word);
    if ((w != XS_IPC_HOLDER_FREE &&
         !table_dead_claim(w, i >= XS_IPC_HOLDERS)) ||
        !atomic_compare_exchange_strong(&h->word, &w, mine))
      continue;
    i %= XS_IPC_HOLDERS;
    uint32_t used = atomic_load(&t->holders_used);
    while (used <= i &&
           !atomic_compare_exchange_weak(&t->holders_used, &used,
                                         (uint32_t)i + 1))
      continue;
    return i;
  }
  return SIZE_MAX;
}

xseg_status xs_ipc_table_hold(xs_ipc_table *t, uint64_t id, size_t *slot) {
  return xs_ipc_table_hold_as(t, id, xs_ipc_self_pid(), xs_ipc_self_start(),
                              "xseg_ipc_open", slot);
}

xseg_status xs_ipc_table_hold_as(xs_ipc_table *t, uint64_t id, pid_t pid,
                                 uint64_t start, const char *caller,
                                 size_t *slot) {
  assert(pid == xs_ipc_holder_pid(xs_ipc_holder_word(0, pid, 0)) &&
         "a Linux pid fits the holder word");
  size_t i =
      table_claim(t, xs_ipc_holder_word(XS_IPC_HOLDER_CLAIMING, pid, start));
  if (i == SIZE_MAX)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "%s: producer pid %d's reference table is full (%d "
                    "holds)", caller, (int)t->producer_pid, XS_IPC_HOLDERS);
  xs_ipc_holder *h = &t->holders[i];
  atomic_store_explicit(&h->id, id, memory_order_relaxed);
  /* A ticket's tag left by the slot's last hold goes before this hold is
     published: with the same word (the producer's process holding as a
     ticket does), it would let that old ticket free this hold. */
  atomic_store_explicit(&h->tag, 0, memory_order_relaxed);
  atomic_store(&h->word, xs_ipc_holder_word(XS_IPC_HOLDER_HELD, pid, start));
  xs_ipc_export_slot *e = table_export(t, id);
  uint32_t state = atomic_load(&e->state);
  if (atomic_load(&e->id) != id ||
      (state != XS_IPC_LIVE && state != XS_IPC_FREE_HELD)) {
    xs_ipc_table_unhold(t, i);
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "%s: block %llu is no longer exported by producer pid "
                    "%d (freed, or the handle is forged)", caller,
                    (unsigned long long)id, (int)t->producer_pid);
  }
  *slot = i;
  return XSEG_OK;
}

void xs_ipc_table_unhold(xs_ipc_table *t, size_t slot) {
  assert(slot < XS_IPC_HOLDERS);
  atomic_store(&t->holders[slot].word, XS_IPC_HOLDER_FREE);
}
