/* ipc_ticket.c: a hold on an exported block for a consumer that has not
 * opened it yet: xseg_ipc_ticket_take and xseg_ipc_ticket_give.
 *
 * A handle that waits in a queue (torch.multiprocessing's case) has no
 * holder yet, so a producer that frees the block at once would give it
 * back before the consumer can open it. A ticket is a holder slot of the
 * producer's reference table claimed in the producer's own name (its pid
 * and start time: alive as long as the producer is, so never reaped), and
 * tagged with a number unique to it in the slot's tag (which every claim
 * of a slot clears before publishing its hold):
 *
 *     ticket = serial * XS_IPC_HOLDERS + slot
 *
 * The consumer gives it back once its own hold (xseg_ipc_open) keeps the
 * block, through the table it mapped with the block. A ticket never given
 * back keeps its block until the producer exits or destroys its allocator.
 */
#include <stdatomic.h>

#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "vmm/error.h"

/* Tickets of this process, counted: with the slot, a ticket names one hold
   only, so giving one back twice cannot free another's. The pid spreads
   the serials of the processes that take tickets in one table (a producer
   and those that send its blocks on); only equality matters, so the
   arithmetic may wrap (XS_IPC_HOLDERS divides 2^64: the slot survives). */
static _Atomic uint64_t ticket_count;

static uint64_t ticket_serial(void) {
  return atomic_fetch_add(&ticket_count, 1) + 1 +
         (uint64_t)xs_ipc_self_pid() * 0x9e3779b97f4a7c15u;
}

/* The export record of the block at addr (live, or freed and held by
   others). */
static const xs_ipc_export *ticket_export(const xs_ipc *ipc, uint64_t addr) {
  for (size_t i = 0; ipc != NULL && i < ipc->n_exports; i++)
    if (ipc->exports[i].block->addr == addr) return &ipc->exports[i];
  return NULL;
}

/* The table and block id that `ptr` names here: a block of another process
   opened at ptr, else one this allocator exported at ptr. */
static bool ticket_block_locked(xs_ipc *ipc, uint64_t ptr,
                                xs_ipc_table **table, uint64_t *id) {
  for (xs_ipc_mapping *m = ipc != NULL ? ipc->mappings : NULL; m != NULL;
       m = m->next)
    if (m->ptr == ptr) return *table = m->peer->table, *id = m->id, true;
  const xs_ipc_export *e = ticket_export(ipc, ptr);
  if (e != NULL) *table = ipc->table, *id = e->id;
  return e != NULL;
}

xseg_status xseg_ipc_ticket_take(xseg_allocator *a, void *ptr,
                                 uint64_t *ticket) {
  if (a == NULL || ticket == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_ticket_take(%p): "
                    "%s is NULL", ptr, a == NULL ? "allocator" : "ticket");
  xs_alloc_enter(a);
  size_t where, slot = 0;
  uint64_t addr = (uint64_t)(uintptr_t)ptr, id = 0;
  xs_ipc_table *t = NULL;
  /* A block exported here must still be live (not a free held by
     others); one opened here is held by this very process. */
  bool found = ticket_block_locked(a->ipc, addr, &t, &id) &&
               (t != a->ipc->table ||
                xs_alloc_find_live_locked(a, addr, &where) != NULL);
  xseg_status st =
      found ? xs_ipc_table_hold_as(t, id, t->producer_pid, t->producer_start,
                                   "xseg_ipc_ticket_take", &slot)
            : xs_error(XSEG_ERR_UNKNOWN_POINTER,
                       "xseg_ipc_ticket_take(%p): neither a live block of "
                       "device %d exported with xseg_ipc_export nor one "
                       "opened with xseg_ipc_open", ptr, a->vmm.device);
  if (st == XSEG_OK) {
    /* Never 0: that is the tag of every hold that is no ticket's. */
    do *ticket = ticket_serial() * XS_IPC_HOLDERS + slot;
    while (*ticket == 0);
    atomic_store(&t->holders[slot].tag, *ticket);
  }
  xs_alloc_leave(a);
  return st;
}

/* Frees slot `ticket` names if it still is that ticket's hold on id.
   Ticket 0 is none: every hold that is no ticket's (an open's, in this
   very process perhaps, whose word a ticket's shares) has tag 0. The tag
   goes first, by compare-and-swap: only this ticket's own give can clear
   it (a new claim of the slot clears it only after the slot is free), so
   two gives of one ticket, at once or one after the other, free at most
   one hold, and never a later claim's. */
static bool ticket_release(xs_ipc_table *t, uint64_t id, uint64_t ticket) {
  if (ticket == 0) return false;
  xs_ipc_holder *h = &t->holders[ticket % XS_IPC_HOLDERS];
  uint64_t held = xs_ipc_holder_word(XS_IPC_HOLDER_HELD, t->producer_pid,
                                     t->producer_start);
  uint64_t tag = ticket;
  if (atomic_load(&h->word) != held || atomic_load(&h->id) != id ||
      !atomic_compare_exchange_strong(&h->tag, &tag, 0))
    return false;
  atomic_store(&h->word, XS_IPC_HOLDER_FREE);
  return true;
}

xseg_status xseg_ipc_ticket_give(xseg_allocator *a, void *ptr,
                                 uint64_t ticket) {
  if (a == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_ticket_give(%p): "
                    "allocator is NULL", ptr);
  xs_alloc_enter(a);
  xs_ipc_table *table = NULL;
  uint64_t id = 0;
  xseg_status st = XSEG_OK;
  if (!ticket_block_locked(a->ipc, (uint64_t)(uintptr_t)ptr, &table, &id))
    st = xs_error(XSEG_ERR_UNKNOWN_POINTER,
                  "xseg_ipc_ticket_give(%p): neither a block opened with "
                  "xseg_ipc_open nor one exported by the allocator of "
                  "device %d", ptr, a->vmm.device);
  else if (!ticket_release(table, id, ticket))
    st = xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "xseg_ipc_ticket_give(%p): ticket %llu is no hold on this "
                  "block (given back already, of another block, or forged)",
                  ptr, (unsigned long long)ticket);
  xs_alloc_leave(a);
  return st;
}

xseg_status xseg_ipc_ticket_give_unopened(const xseg_ipc_handle *h,
                                          uint64_t ticket) {
  if (h == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                    "xseg_ipc_ticket_give_unopened: handle is NULL");
  /* The table is shared memory: its holders are atomics, and no lock of
     any allocator guards them. */
  xs_ipc_table *t = NULL;
  xseg_status st = xs_ipc_table_map(h->table_fd, &h->wire, &t, NULL);
  if (st != XSEG_OK) return st;
  if (!ticket_release(t, h->wire.block_id, ticket))
    st = xs_error(XSEG_ERR_INVALID_ARGUMENT,
                  "xseg_ipc_ticket_give_unopened: ticket %llu is no hold on "
                  "block %llu (given back already, of another block, or "
                  "forged)", (unsigned long long)ticket,
                  (unsigned long long)h->wire.block_id);
  xs_ipc_table_unmap(t);
  return st;
}
