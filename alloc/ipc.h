/* ipc.h: sharing live blocks with other processes (internal).
 *
 * A producer exports a live block as a handle: one POSIX fd per physical
 * handle the block touches, the block's offset inside them, and an fd of
 * the producer's reference table. A consumer maps exactly those handles at
 * a reservation of their size (never 9/8 of the device) and registers
 * itself, by pid and process start time, in the producer's table.
 *
 * The reference table is a memfd (alloc/ipc_table.c) rather than a named
 * shm_open object: it travels with every handle through SCM_RIGHTS like
 * the memory fds do, so it needs no name, no /dev/shm (which sandboxes
 * often lack or share), nothing to unlink when a producer is SIGKILLed,
 * and no process can find it that was not given a handle.
 *
 * A block is named by its producer's table, not by the producer process:
 * one process may have several allocators (one per device, or a new one
 * after xseg_destroy), each with its own table and its own block ids. The
 * table holds a random 64-bit id made with it; every handle carries it,
 * and a consumer keys what it has mapped by (pid, start time, table id,
 * block id), and refuses a handle whose table fd is not the table the id
 * names.
 *
 * Lifetime: a block freed by its producer while any holder remains is a
 * free held back: pending (pending_free_bytes), out of every tree; the
 * producer looks at its held frees whenever it completes pending frees (every
 * malloc while any is pending), reclaims the holds of processes that
 * died, and gives a block back once no holder is left.
 */
#ifndef XS_ALLOC_IPC_H
#define XS_ALLOC_IPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "alloc/types.h"

/* SCM_MAX_FD is 253 per message: the table's fd and the handles'. A block
   that touches more physical handles than this cannot be exported. */
enum { XS_IPC_MAX_HANDLES = 252 };
/* 2: the table id and the producer's PID namespace in the message, the
   table id in the table; a holder's claimant in its state word. */
enum { XS_IPC_VERSION = 2 };
#define XS_IPC_MAGIC "XSEGIPC"            /* 8 bytes with its NUL */

/* The message: sent whole, in one sendmsg with 1 + n_handles fds (the
   table first). Host byte order: both ends are on one machine. */
typedef struct xs_ipc_wire {
  char magic[8];
  uint32_t version;
  uint32_t n_handles;
  int32_t producer_pid;
  int32_t device;
  uint64_t producer_start;                /* clock ticks after boot */
  uint64_t table_id;                      /* the producer's table */
  uint64_t pid_ns;                        /* its PID namespace's inode */
  uint64_t block_id;                      /* key in the producer's table */
  uint64_t block_size;                    /* bytes of the block */
  uint64_t offset;                        /* of the block in the handles */
  uint64_t handle_size[XS_IPC_MAX_HANDLES];
} xs_ipc_wire;

struct xseg_ipc_handle {
  xs_ipc_wire wire;
  int table_fd;
  int fd[XS_IPC_MAX_HANDLES];             /* wire.n_handles of them */
};

/* ---- the shared reference table (ipc_table.c) -------------------------- */

enum { XS_IPC_EXPORTS = 4096, XS_IPC_HOLDERS = 8192 };

/* An export slot, written by the producer alone. A block id is
   generation * XS_IPC_EXPORTS + slot, never 0. Holders may register while
   the slot is LIVE or FREE_HELD (freed by the producer, kept for its
   holders); CLOSING means the producer is counting
   holders to give the block back (a consumer that sees it backs out). */
typedef enum xs_ipc_export_state {
  XS_IPC_EMPTY = 0, XS_IPC_LIVE, XS_IPC_FREE_HELD, XS_IPC_CLOSING
} xs_ipc_export_state;

typedef struct xs_ipc_export_slot {
  _Atomic uint64_t id;
  _Atomic uint32_t state;
  uint32_t pad;
} xs_ipc_export_slot;

/* A holder slot: one consumer process holding one block. Its word holds
   the state and the process that claimed it (pid and start time), so the
   claim itself names the claimant: a consumer killed at any point of
   xseg_ipc_open leaves a slot whose owner can be found dead. Claimed with
   a compare-and-swap FREE -> CLAIMING by the consumer (or from CLAIMING
   when that slot's claimant is dead: it never published), published HELD
   once id is written; set FREE by the consumer when it closes, or by the
   producer when a HELD slot's process is dead. */
typedef enum xs_ipc_holder_state {
  XS_IPC_HOLDER_FREE = 0, XS_IPC_HOLDER_CLAIMING, XS_IPC_HOLDER_HELD
} xs_ipc_holder_state;

/* The word: state in bits 0-1, pid in bits 2-23 (Linux pids are below
   PID_MAX_LIMIT, 2^22), start time in bits 24-63 (2^40 clock ticks:
   centuries at USER_HZ). Start times are compared in those 40 bits. */
#define XS_IPC_START_MASK ((UINT64_C(1) << 40) - 1)
static inline uint64_t xs_ipc_holder_word(xs_ipc_holder_state state,
                                          pid_t pid, uint64_t start) {
  return (uint64_t)state | ((uint64_t)pid & 0x3fffff) << 2 |
         (start & XS_IPC_START_MASK) << 24;
}
static inline xs_ipc_holder_state xs_ipc_holder_state_of(uint64_t w) {
  return (xs_ipc_holder_state)(w & 3);
}
static inline pid_t xs_ipc_holder_pid(uint64_t w) {
  return (pid_t)(w >> 2 & 0x3fffff);
}
static inline uint64_t xs_ipc_holder_start(uint64_t w) { return w >> 24; }

typedef struct xs_ipc_holder {
  _Atomic uint64_t word;
  _Atomic uint64_t id;
  /* A ticket's number while the hold is a ticket's (ipc_ticket.c), else
     0: cleared by every claim before the hold is published, so that a
     ticket given back twice cannot match the next hold of its slot. */
  _Atomic uint64_t tag;
  uint64_t pad;
} xs_ipc_holder;

typedef struct xs_ipc_table {
  char magic[8];
  uint32_t version;
  int32_t producer_pid;
  uint64_t producer_start;
  _Atomic uint32_t holders_used;    /* slots below this were ever claimed:
                                       scans stop there */
  uint32_t pad32;
  uint64_t table_id;                /* random, never 0: names the table */
  uint64_t pad[3];
  xs_ipc_export_slot exports[XS_IPC_EXPORTS];
  xs_ipc_holder holders[XS_IPC_HOLDERS];
} xs_ipc_table;

/* A new table in a memfd, mapped shared; XSEG_ERR_* with a message. */
xseg_status xs_ipc_table_create(xs_ipc_table **out, int *fd);
/* Maps the table behind fd and checks its header against the producer and
   the table id the message names. `file` (or NULL) gets fd's fstat, which
   names the table's memfd. */
struct stat;
xseg_status xs_ipc_table_map(int fd, const xs_ipc_wire *w,
                             xs_ipc_table **out, struct stat *file);
void xs_ipc_table_unmap(xs_ipc_table *t);

/* This process's identity: pid and start time; and its PID namespace
   (the inode of /proc/self/ns/pid, 0 when unknown): pids and liveness
   mean something across processes of one namespace only. */
pid_t    xs_ipc_self_pid(void);
uint64_t xs_ipc_self_start(void);
uint64_t xs_ipc_self_pid_ns(void);
/* False only when process `pid` started at `start` is gone (exited,
   a zombie, or the pid now names a newer process). Start times compare
   under XS_IPC_START_MASK. */
bool xs_ipc_process_alive(pid_t pid, uint64_t start);

/* Liveness of holders, cheaply: a process first seen alive (by /proc) is
   kept with a pidfd, which polls readable once it has exited, zombie or
   not: one poll() per check instead of a /proc read. At most
   XS_IPC_ALIVE_MAX processes are kept (the oldest goes first); without
   pidfd_open every check reads /proc. */
enum { XS_IPC_ALIVE_MAX = 64 };
typedef struct xs_ipc_alive_entry {
  pid_t pid;
  uint64_t start;
  int pidfd;
} xs_ipc_alive_entry;
typedef struct xs_ipc_alive {
  xs_ipc_alive_entry e[XS_IPC_ALIVE_MAX];
  size_t n;
} xs_ipc_alive;
bool xs_ipc_alive_check(xs_ipc_alive *c, pid_t pid, uint64_t start);
void xs_ipc_alive_clear(xs_ipc_alive *c);

/* Holders of block `id` now (HELD slots). */
size_t xs_ipc_table_holders(xs_ipc_table *t, uint64_t id);
/* Frees the HELD slots of `id` whose process is dead; returns how many. */
size_t xs_ipc_table_reap(xs_ipc_table *t, uint64_t id, xs_ipc_alive *alive);
/* The producer's handshake before giving a block back: CLOSING, count the
   holders, then EMPTY (true: no holder, the block may go) or back to
   FREE_HELD (false). */
bool xs_ipc_table_try_close(xs_ipc_table *t, uint64_t id);
/* The consumer's side: claims a holder slot for `id` (a FREE one, or one
   a dead claimant left CLAIMING) and checks, after publishing it, that
   the block is still exported (LIVE or FREE_HELD). The slot in *slot, or an
   error with a message. */
xseg_status xs_ipc_table_hold(xs_ipc_table *t, uint64_t id, size_t *slot);
/* The same in the name of process (pid, start), e.g. a ticket's hold
   (ipc_ticket.c), which names the producer: never reaped while it runs.
   `caller` names the public function in the error messages. */
xseg_status xs_ipc_table_hold_as(xs_ipc_table *t, uint64_t id, pid_t pid,
                                 uint64_t start, const char *caller,
                                 size_t *slot);
void xs_ipc_table_unhold(xs_ipc_table *t, size_t slot);

/* ---- the allocator's side ---------------------------------------------- */

/* A block this allocator exported. */
typedef struct xs_ipc_export {
  xs_block *block;
  uint64_t id;
  bool free_held;              /* freed by the caller, held by others */
} xs_ipc_export;

/* A block of another process that this allocator has open. */
typedef struct xs_ipc_mapping {
  struct xs_ipc_peer *peer;
  uint64_t id;
  size_t holder;               /* slot in the peer's table */
  uint64_t va;                 /* reservation, exactly the handles' size */
  size_t size;
  uint64_t ptr;                /* va + offset: what the caller got */
  uint32_t n;                  /* imported handles */
  uint64_t refs;               /* xseg_ipc_open calls not yet closed */
  uint64_t *handles;
  struct xs_ipc_mapping *next;
} xs_ipc_mapping;

/* A producer's table (one allocator of that process) that this allocator
   has mapped. It stays mapped while nothing of it is open (idle), at most
   XS_IPC_IDLE_PEERS of them, so that blocks a producer sends one after
   another (a DataLoader's batches) map its table once (ipc_open.c). */
enum { XS_IPC_IDLE_PEERS = 8 };
typedef struct xs_ipc_peer {
  pid_t pid;
  uint64_t start;
  uint64_t table_id;
  xs_ipc_table *table;
  uint64_t dev, ino;           /* the table's memfd: a handle's table fd
                                  must be this file */
  size_t mappings;             /* xs_ipc_mapping's on it */
  bool held;                   /* a hold was published in it: the table
                                  its producer's blocks really name */
  struct xs_ipc_peer *next;    /* most recently used first */
} xs_ipc_peer;

typedef struct xs_ipc {
  /* Producer. */
  xs_ipc_table *table;         /* NULL until the first export */
  int table_fd;
  uint64_t generation;
  xs_ipc_export *exports;
  size_t n_exports, cap_exports;
  int64_t exported_total, reclaimed;
  xs_ipc_alive alive;          /* holders known to be running */
  /* Consumer. */
  xs_ipc_peer *peers;
  xs_ipc_mapping *mappings;
  int64_t opened_total;
  /* Interprocess events of xseg_ipc_record / xseg_ipc_wait (ipc_event.c);
     NULL until the first. */
  struct xs_ipc_events *events;
} xs_ipc;

/* a->ipc, made on first use; NULL (message set) on host OOM. */
xs_ipc *xs_ipc_get_locked(xseg_allocator *a);

/* Hook of xseg_free: true when b, exported and still held by another
   process, was held back pending (a->ipc_held_frees) instead of freed. */
bool xs_ipc_hold_free_locked(xseg_allocator *a, xs_block *b);
/* Hook of pending frees: reclaims dead holders and gives back held
   frees that no one holds any more. */
void xs_ipc_reap_locked(xseg_allocator *a);
/* xseg_destroy: unmaps what this allocator opened and withdraws what it
   exported (held frees go with their segments). Context current when
   `entered`. */
void xs_ipc_destroy_locked(xseg_allocator *a, bool entered);
/* xseg_destroy: destroys the events of xseg_ipc_record / xseg_ipc_wait
   (driver calls only when `entered`). */
void xs_ipc_events_destroy_locked(xseg_allocator *a, bool entered);
/* Counts for xseg_ipc_get_stats and xseg_stats_json. */
void xs_ipc_stats_locked(xseg_allocator *a, xseg_ipc_stats *out);
/* Empties every export slot (a late open fails cleanly) and lets go of
   the table. */
void xs_ipc_withdraw_locked(xs_ipc *ipc);
/* For the snapshot: "exported", "open_by_others" or NULL. */
const char *xs_ipc_block_mark_locked(xseg_allocator *a, const xs_block *b);

#endif /* XS_ALLOC_IPC_H */
