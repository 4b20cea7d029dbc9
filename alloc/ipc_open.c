/* ipc_open.c: the consumer's side: xseg_ipc_open maps another process's
 * block, xseg_ipc_close unmaps it.
 *
 * A block is mapped once per allocator however often it is opened (a
 * reference count), at a reservation of exactly its handles' size: the
 * consumer's address space grows by what it maps, never by a reservation
 * of the device's size. Before anything is imported the consumer
 * registers in the producer's table (ipc_table.c), so the producer keeps
 * the block from the moment the open can succeed until the close, or until
 * this process dies. A producer's table stays mapped between opens (up
 * to XS_IPC_IDLE_PEERS idle ones), and its liveness is a poll of a pidfd
 * kept for it (xs_ipc_alive), so an open after the first reads no /proc
 * file and maps nothing but the block.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "vmm/error.h"
#include "vmm/ipc.h"

/* Whether p is the table the handle's message names: the same producer
   process and the same table (allocator) of it. */
static bool open_peer_is(const xs_ipc_peer *p, const xs_ipc_wire *w) {
  return p->pid == w->producer_pid && p->start == w->producer_start &&
         p->table_id == w->table_id;
}

/* The mapping of the block h names, if this allocator has it open: block
   ids are the producer's table's, so the table must match too. */
static xs_ipc_mapping *open_find_locked(xs_ipc *ipc, const xs_ipc_wire *w) {
  for (xs_ipc_mapping *m = ipc->mappings; m != NULL; m = m->next)
    if (m->id == w->block_id && open_peer_is(m->peer, w)) return m;
  return NULL;
}

/* Takes p out of the list of peers. */
static void open_peer_unlink_locked(xs_ipc *ipc, xs_ipc_peer *p) {
  xs_ipc_peer **link = &ipc->peers;
  while (*link != p) link = &(*link)->next;
  *link = p->next;
}

/* Puts p first in the list of peers: the most recently used. */
static void open_peer_push_locked(xs_ipc *ipc, xs_ipc_peer *p) {
  p->next = ipc->peers;
  ipc->peers = p;
}

/* Unlinks p from the peers and unmaps its table. */
static void open_peer_drop_locked(xs_ipc *ipc, xs_ipc_peer *p) {
  assert(p->mappings == 0 && "a peer goes once nothing of it is open");
  open_peer_unlink_locked(ipc, p);
  xs_ipc_table_unmap(p->table);
  free(p);
}

/* Unmaps the tables of idle peers whose producer has exited: nothing of
   theirs can be opened again. */
static void open_peers_prune_locked(xs_ipc *ipc) {
  for (xs_ipc_peer *p = ipc->peers, *next; p != NULL; p = next) {
    next = p->next;
    if (p->mappings == 0 && !xs_ipc_alive_check(&ipc->alive, p->pid, p->start))
      open_peer_drop_locked(ipc, p);
  }
}

/* Whether the handle's table fd is the file p mapped: a mapped peer is
   not mapped again, so a forged or mixed-up fd is told by its inode. */
static xseg_status open_peer_same_table_locked(const xs_ipc_peer *p,
                                               const xseg_ipc_handle *h) {
  struct stat file;
  if (fstat(h->table_fd, &file) == 0 && (uint64_t)file.st_dev == p->dev &&
      (uint64_t)file.st_ino == p->ino)
    return XSEG_OK;
  return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "xseg_ipc_open: block %llu's handle names reference table "
                  "%016llx of producer pid %d, but its table fd %d is "
                  "another file (another allocator's table, or none: a "
                  "forged or mixed-up handle)",
                  (unsigned long long)h->wire.block_id,
                  (unsigned long long)h->wire.table_id, (int)p->pid,
                  h->table_fd);
}

/* The producer's table: the one mapped already, else mapped now, on its
   first block. (Recency moves at the close: only idle peers are ever
   dropped, open_peer_put_locked.) */
static xseg_status open_peer_locked(xs_ipc *ipc, const xseg_ipc_handle *h,
                                    xs_ipc_peer **out) {
  const xs_ipc_wire *w = &h->wire;
  for (xs_ipc_peer *p = ipc->peers; p != NULL; p = p->next)
    if (open_peer_is(p, w)) {
      xseg_status st = open_peer_same_table_locked(p, h);
      if (st == XSEG_OK) *out = p;
      return st;
    }
  open_peers_prune_locked(ipc);
  xs_ipc_peer *p = calloc(1, sizeof *p);
  if (p == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_ipc_open: out of host "
                    "memory");
  struct stat file;
  xseg_status st = xs_ipc_table_map(h->table_fd, w, &p->table, &file);
  if (st != XSEG_OK) {
    free(p);
    return st;
  }
  p->pid = w->producer_pid;
  p->start = w->producer_start;
  p->table_id = w->table_id;
  p->dev = (uint64_t)file.st_dev;
  p->ino = (uint64_t)file.st_ino;
  open_peer_push_locked(ipc, p);
  *out = p;
  return XSEG_OK;
}

/* p's last mapping closed (or its first open failed): it stays mapped,
   idle and most recently used, unless more than XS_IPC_IDLE_PEERS are
   (then the least recently used idle one goes) or no hold was ever
   published in it (a table that only claims to be its producer's, whose
   inode would refuse the real one's handles: it goes at once). */
static void open_peer_put_locked(xs_ipc *ipc, xs_ipc_peer *p) {
  if (p->mappings != 0) return;
  if (!p->held) {
    open_peer_drop_locked(ipc, p);
    return;
  }
  open_peer_unlink_locked(ipc, p);
  open_peer_push_locked(ipc, p);
  size_t idle = 0;
  xs_ipc_peer *oldest = NULL;
  for (xs_ipc_peer *q = ipc->peers; q != NULL; q = q->next)
    if (q->mappings == 0) idle++, oldest = q;
  if (idle > XS_IPC_IDLE_PEERS) open_peer_drop_locked(ipc, oldest);
}

/* Imports the handles of h into m (m->n of them on return, all or those
   before the one that failed). */
static xseg_status open_import(xs_vmm *v, const xseg_ipc_handle *h,
                               xs_ipc_mapping *m) {
  for (m->n = 0; m->n < h->wire.n_handles; m->n++) {
    xseg_status st = xs_vmm_handle_import(v, h->fd[m->n], &m->handles[m->n]);
    if (st != XSEG_OK) return st;
    m->size += h->wire.handle_size[m->n];
  }
  return XSEG_OK;
}

/* Maps m's imported handles one after another at a fresh reservation of
   their size and grants access; on failure undoes what it did (the
   handles stay imported). */
static xseg_status open_map(xs_vmm *v, const xseg_ipc_handle *h,
                            xs_ipc_mapping *m) {
  xseg_status st = xs_vmm_reserve(v, m->size, &m->va);
  size_t mapped = 0;
  for (uint32_t i = 0; i < m->n && st == XSEG_OK; i++) {
    st = xs_vmm_map(v, m->va + mapped, h->wire.handle_size[i], m->handles[i]);
    if (st == XSEG_OK) mapped += h->wire.handle_size[i];
  }
  if (st == XSEG_OK) st = xs_vmm_set_access(v, m->va, m->size);
  if (st == XSEG_OK) return XSEG_OK;
  /* Undone quietly: the message stays the failing call's. */
  if (m->va != 0) xs_vmm_unreserve_quietly(v, m->va, m->size, mapped);
  m->va = 0;
  return st;
}

/* Releases m's imported handles (unmapped already); one whose release
   fails is kept and released later (xs_vmm_handle_release_quietly). */
static void open_release(xs_vmm *v, xs_ipc_mapping *m) {
  for (uint32_t i = 0; i < m->n; i++)
    xs_vmm_handle_release_quietly(v, m->handles[i]);
  m->n = 0;
}

/* Driver side of an open: import and map, in the device's context. */
static xseg_status open_driver(xs_vmm *v, const xseg_ipc_handle *h,
                               xs_ipc_mapping *m) {
  for (uint32_t i = 0; i < h->wire.n_handles; i++)
    if (h->wire.handle_size[i] % v->granularity != 0)
      return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                      "xseg_ipc_open: handle %u's size %llu is not a "
                      "multiple of the granularity %zu", i,
                      (unsigned long long)h->wire.handle_size[i],
                      v->granularity);
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(v, &saved);
  if (st != XSEG_OK) return st;
  st = open_import(v, h, m);
  if (st == XSEG_OK) st = open_map(v, h, m);
  if (st != XSEG_OK) open_release(v, m);
  xs_vmm_ctx_leave(v, saved);
  return st;
}

/* Why this allocator cannot open h at all, or XSEG_OK. The producer's
   liveness is a poll of the pidfd `alive` keeps for it, once seen alive. */
static xseg_status open_check_locked(const xseg_allocator *a,
                                     xs_ipc_alive *alive,
                                     const xseg_ipc_handle *h) {
  const xs_ipc_wire *w = &h->wire;
  if (w->device != a->vmm.device)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_open: the handle is for device %d, the "
                    "allocator for device %d", (int)w->device, a->vmm.device);
  /* A pid names no process of another PID namespace (or another one):
     neither side could tell whether the other is alive. */
  uint64_t ns = xs_ipc_self_pid_ns();
  if (w->pid_ns != 0 && ns != 0 && w->pid_ns != ns)
    return xs_error(XSEG_ERR_UNSUPPORTED,
                    "xseg_ipc_open: the producer of block %llu (pid %d in its "
                    "namespace) runs in another PID namespace (pid:[%llu], "
                    "this process pid:[%llu]); blocks are shared only "
                    "between processes of one PID namespace, where each can "
                    "tell whether the other is alive",
                    (unsigned long long)w->block_id, (int)w->producer_pid,
                    (unsigned long long)w->pid_ns, (unsigned long long)ns);
  if (!xs_ipc_alive_check(alive, w->producer_pid, w->producer_start))
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_open: the producer of block %llu (pid %d) has "
                    "exited; its blocks cannot be opened",
                    (unsigned long long)w->block_id, (int)w->producer_pid);
  return XSEG_OK;
}

/* A new mapping of h: registered as a holder, imported and mapped. */
static xseg_status open_new_locked(xseg_allocator *a, xs_ipc *ipc,
                                   const xseg_ipc_handle *h,
                                   xs_ipc_mapping **out) {
  xs_ipc_mapping *m = calloc(1, sizeof *m);
  uint64_t *handles = calloc(h->wire.n_handles, sizeof *handles);
  if (m == NULL || handles == NULL) {
    free(m);
    free(handles);
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_ipc_open: out of host "
                    "memory");
  }
  m->handles = handles;
  xseg_status st = open_peer_locked(ipc, h, &m->peer);
  if (st == XSEG_OK) {
    m->peer->mappings++;
    st = xs_ipc_table_hold(m->peer->table, h->wire.block_id, &m->holder);
    if (st == XSEG_OK) {
      m->peer->held = true;
      st = open_driver(&a->vmm, h, m);
      if (st != XSEG_OK) xs_ipc_table_unhold(m->peer->table, m->holder);
    }
    if (st != XSEG_OK) {
      m->peer->mappings--;
      open_peer_put_locked(ipc, m->peer);
    }
  }
  if (st != XSEG_OK) {
    free(handles);
    free(m);
    return st;
  }
  m->id = h->wire.block_id;
  m->ptr = m->va + h->wire.offset;
  m->refs = 1;
  m->next = ipc->mappings;
  ipc->mappings = m;
  ipc->opened_total++;
  *out = m;
  return XSEG_OK;
}

xseg_status xseg_ipc_open(xseg_allocator *a, const xseg_ipc_handle *h,
                          void **ptr) {
  if (a == NULL || h == NULL || ptr == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_open: %s is NULL",
                    a == NULL ? "allocator" : h == NULL ? "handle" : "ptr");
  *ptr = NULL;
  xseg_status st = XSEG_OK;
  xs_alloc_enter(a);
  xs_ipc *ipc = xs_ipc_get_locked(a);
  xs_ipc_mapping *m = ipc != NULL ? open_find_locked(ipc, &h->wire) : NULL;
  if (ipc == NULL)
    st = XSEG_ERR_OUT_OF_MEMORY;
  else if (m != NULL)
    m->refs++;               /* the same block again: the same mapping */
  else if ((st = open_check_locked(a, &ipc->alive, h)) == XSEG_OK)
    st = open_new_locked(a, ipc, h, &m);
  if (st == XSEG_OK) *ptr = (void *)(uintptr_t)m->ptr;
  xs_alloc_leave(a);
  return st;
}

/* Unmaps m, releases its handles and its hold, and forgets it. */
static xseg_status close_mapping_locked(xseg_allocator *a, xs_ipc *ipc,
                                        xs_ipc_mapping *m, bool entered) {
  xs_vmm *v = &a->vmm;
  xseg_status st = XSEG_OK;
  if (entered) {
    st = xs_vmm_unmap(v, m->va, m->size);
    if (st != XSEG_OK) {               /* still mapped: keep everything */
      m->refs = 1;
      return st;
    }
    open_release(v, m);
    /* The block is closed either way: a range that will not go is kept
       and tried again by later release passes and at destroy. */
    st = xs_vmm_unreserve_or_keep(v, m->va, m->size);
  }
  xs_ipc_table_unhold(m->peer->table, m->holder);
  m->peer->mappings--;
  open_peer_put_locked(ipc, m->peer);
  xs_ipc_mapping **link = &ipc->mappings;
  while (*link != m) link = &(*link)->next;
  *link = m->next;
  free(m->handles);
  free(m);
  return st;
}

xseg_status xseg_ipc_close(xseg_allocator *a, void *ptr) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_close(%p): "
                    "allocator is NULL", ptr);
  xs_alloc_enter(a);
  xs_ipc *ipc = a->ipc;
  xs_ipc_mapping *m = ipc != NULL ? ipc->mappings : NULL;
  while (m != NULL && m->ptr != (uint64_t)(uintptr_t)ptr) m = m->next;
  xseg_status st = XSEG_OK;
  if (m == NULL) {
    st = xs_error(XSEG_ERR_UNKNOWN_POINTER,
                  "xseg_ipc_close(%p): not a block this allocator opened "
                  "with xseg_ipc_open (or already closed)", ptr);
  } else if (--m->refs == 0) {
    CUcontext saved;
    st = xs_vmm_ctx_enter(&a->vmm, &saved);
    if (st != XSEG_OK) {
      m->refs = 1;
    } else {
      /* m is gone unless unmap failed */
      st = close_mapping_locked(a, ipc, m, true);
      xs_vmm_ctx_leave(&a->vmm, saved);
    }
  }
  xs_alloc_leave(a);
  return st;
}

void xs_ipc_destroy_locked(xseg_allocator *a, bool entered) {
  xs_ipc *ipc = a->ipc;
  if (ipc == NULL) return;
  if (ipc->mappings != NULL) {
    size_t n = 0;
    for (xs_ipc_mapping *m = ipc->mappings; m != NULL; m = m->next) n++;
    fprintf(stderr, "xseg_destroy: device %d still has %zu blocks of other "
            "processes open; closing them\n", a->vmm.device, n);
  }
  while (ipc->mappings != NULL) {
    xs_ipc_mapping *m = ipc->mappings;
    /* A close that failed keeps m (still mapped) only when its unmap
       failed: one more try, as an undo makes (xs_vmm_unmap_quietly),
       before forgetting what cannot go. */
    xseg_status st = close_mapping_locked(a, ipc, m, entered);
    if (st != XSEG_OK && entered && ipc->mappings == m)
      st = close_mapping_locked(a, ipc, m, true);
    if (st != XSEG_OK && ipc->mappings == m)
      close_mapping_locked(a, ipc, m, false);
  }
  while (ipc->peers != NULL) open_peer_drop_locked(ipc, ipc->peers);
  xs_ipc_events_destroy_locked(a, entered);
  xs_ipc_withdraw_locked(ipc);
  free(ipc);
  a->ipc = NULL;
}
