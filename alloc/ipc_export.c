/* ipc_export.c: the producer's side of sharing a block: xseg_ipc_export,
 * and the block's lifetime while other processes hold it (the hooks of
 * xseg_free and of pending frees).
 *
 * A block is exported over the physical handles it touches, whole (the
 * driver maps whole handles only), so a consumer maps these handles and
 * sees the block at `offset` in them:
 *
 *     segment:  | A (2 granules) | B (1) | C (3 granules)       |
 *     block:              [=============]
 *     handles:  A, B    offset = block - start of A
 *
 * Exported blocks are kept in a small array (a->ipc->exports): the free
 * path looks there only while the allocator has exported something.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/account.h"
#include "alloc/deferred.h"
#include "alloc/enter.h"
#include "alloc/ipc.h"
#include "alloc/pairs.h"
#include "vmm/array.h"
#include "vmm/error.h"
#include "vmm/ipc.h"

xs_ipc *xs_ipc_get_locked(xseg_allocator *a) {
  XS_ASSERT_LOCKED(a);
  if (a->ipc == NULL) {
    a->ipc = calloc(1, sizeof *a->ipc);
    if (a->ipc == NULL)
      xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory for IPC state");
    else
      a->ipc->table_fd = -1;
  }
  return a->ipc;
}

static size_t export_find_locked(const xs_ipc *ipc, const xs_block *b) {
  for (size_t i = 0; i < ipc->n_exports; i++)
    if (ipc->exports[i].block == b) return i;
  return SIZE_MAX;
}

static void export_drop_locked(xs_ipc *ipc, size_t i) {
  ipc->exports[i] = ipc->exports[--ipc->n_exports];
}

/* Empties record i's table slot and drops it. */
static void export_forget_locked(xs_ipc *ipc, size_t i) {
  xs_ipc_export_slot *s =
      &ipc->table->exports[ipc->exports[i].id % XS_IPC_EXPORTS];
  atomic_store(&s->id, 0);
  atomic_store(&s->state, XS_IPC_EMPTY);
  export_drop_locked(ipc, i);
}

/* The export record of b, made (with a table slot) if it has none:
   *fresh says so. */
static xseg_status export_record_locked(xs_ipc *ipc, xs_block *b,
                                        xs_ipc_export **out, bool *fresh) {
  size_t i = export_find_locked(ipc, b);
  *fresh = i == SIZE_MAX;
  if (i != SIZE_MAX) return *out = &ipc->exports[i], XSEG_OK;
  if (ipc->table == NULL) {
    xseg_status st = xs_ipc_table_create(&ipc->table, &ipc->table_fd);
    if (st != XSEG_OK) return st;
  }
  if (!XS_ARRAY_RESERVE(ipc->exports, ipc->cap_exports, ipc->n_exports + 1,
                        16))
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory exporting %p",
                    (void *)(uintptr_t)b->addr);
  size_t slot = 0;
  while (slot < XS_IPC_EXPORTS &&
         atomic_load(&ipc->table->exports[slot].state) != XS_IPC_EMPTY)
    slot++;
  if (slot == XS_IPC_EXPORTS)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                    "xseg_ipc_export(%p): %d blocks are exported already "
                    "(the reference table's limit)",
                    (void *)(uintptr_t)b->addr, XS_IPC_EXPORTS);
  uint64_t id = ++ipc->generation * XS_IPC_EXPORTS + slot;
  atomic_store(&ipc->table->exports[slot].id, id);
  atomic_store(&ipc->table->exports[slot].state, XS_IPC_LIVE);
  ipc->exports[ipc->n_exports] = (xs_ipc_export){.block = b, .id = id};
  *out = &ipc->exports[ipc->n_exports++];
  ipc->exported_total++;
  return XSEG_OK;
}

/* The handles b touches, their sizes and b's offset in them, into the
   wire message. */
static xseg_status export_handles(const xs_block *b, xs_ipc_wire *w,
                                  uint64_t *handles) {
  const xs_segment *s = b->seg;
  size_t g = xs_segment_handle_head(s, xs_segment_granule_of(s, b->addr));
  size_t last = xs_segment_granule_of(s, xs_block_end(b) - 1);
  w->offset = b->addr - (s->base + g * s->granule);
  w->n_handles = 0;
  for (; g <= last; g += s->hlen[g]) {
    assert(s->mapped[g] && "a live block's granules are mapped");
    if (w->n_handles == XS_IPC_MAX_HANDLES)
      return xs_error(XSEG_ERR_UNSUPPORTED,
                      "xseg_ipc_export(%p): the block spans more than %d "
                      "physical handles (one message carries at most that "
                      "many fds)", (void *)(uintptr_t)b->addr,
                      XS_IPC_MAX_HANDLES);
    handles[w->n_handles] = s->handle[g];
    w->handle_size[w->n_handles++] = (uint64_t)s->hlen[g] * s->granule;
  }
  return XSEG_OK;
}

/* One fd per handle into h->fd; on failure the ones made are closed. */
static xseg_status export_fds(xseg_allocator *a, const uint64_t *handles,
                              xseg_ipc_handle *h) {
  CUcontext saved;
  xseg_status st = xs_vmm_ctx_enter(&a->vmm, &saved);
  if (st != XSEG_OK) return st;
  uint32_t made = 0;
  for (; made < h->wire.n_handles && st == XSEG_OK; made++)
    st = xs_vmm_handle_export(&a->vmm, handles[made], &h->fd[made]);
  xs_vmm_ctx_leave(&a->vmm, saved);
  if (st != XSEG_OK)
    for (uint32_t i = 0; i + 1 < made; i++) close(h->fd[i]);
  return st;
}

static xseg_status export_locked(xseg_allocator *a, void *ptr,
                                 xseg_ipc_handle *h) {
  size_t slot;
  xs_block *b = xs_alloc_find_live_locked(a, (uint64_t)(uintptr_t)ptr, &slot);
  if (b == NULL)
    return xs_error(XSEG_ERR_UNKNOWN_POINTER,
                    "xseg_ipc_export(%p): not the start of a live block of "
                    "the allocator of device %d", ptr, a->vmm.device);
  xs_ipc *ipc = xs_ipc_get_locked(a);
  if (ipc == NULL) return XSEG_ERR_OUT_OF_MEMORY;
  uint64_t handles[XS_IPC_MAX_HANDLES];
  xseg_status st = export_handles(b, &h->wire, handles);
  xs_ipc_export *rec = NULL;
  bool fresh = false;
  if (st == XSEG_OK) st = export_record_locked(ipc, b, &rec, &fresh);
  if (st != XSEG_OK) return st;
  h->table_fd = fcntl(ipc->table_fd, F_DUPFD_CLOEXEC, 0);
  if (h->table_fd < 0)
    st = xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_ipc_export(%p): out of "
                  "file descriptors", ptr);
  if (st == XSEG_OK) st = export_fds(a, handles, h);
  if (st != XSEG_OK) {
    if (h->table_fd >= 0) close(h->table_fd);
    /* A first export that failed leaves no trace: nobody can hold it. */
    if (fresh) export_forget_locked(ipc, (size_t)(rec - ipc->exports));
    return st;
  }
  memcpy(h->wire.magic, XS_IPC_MAGIC, sizeof h->wire.magic);
  h->wire.version = XS_IPC_VERSION;
  h->wire.producer_pid = ipc->table->producer_pid;
  h->wire.producer_start = ipc->table->producer_start;
  h->wire.table_id = ipc->table->table_id;
  h->wire.pid_ns = xs_ipc_self_pid_ns();
  h->wire.device = a->vmm.device;
  h->wire.block_id = rec->id;
  h->wire.block_size = b->size;
  return XSEG_OK;
}

xseg_status xseg_ipc_export(xseg_allocator *a, void *ptr,
                            xseg_ipc_handle **out) {
  if (a == NULL || out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_export(%p): %s is "
                    "NULL", ptr, a == NULL ? "allocator" : "out");
  *out = NULL;
  xseg_ipc_handle *h = calloc(1, sizeof *h);
  if (h == NULL)
    return xs_error(XSEG_ERR_OUT_OF_MEMORY, "xseg_ipc_export(%p): out of "
                    "host memory", ptr);
  xs_alloc_enter(a);
  xseg_status st = export_locked(a, ptr, h);
  xs_alloc_leave(a);
  if (st != XSEG_OK) {
    free(h);
    return st;
  }
  *out = h;
  return XSEG_OK;
}

/* ---- lifetime ----------------------------------------------------------- */

bool xs_ipc_hold_free_locked(xseg_allocator *a, xs_block *b) {
  XS_ASSERT_LOCKED(a);
  xs_ipc *ipc = a->ipc;
  size_t i = export_find_locked(ipc, b);
  if (i == SIZE_MAX) return false;
  assert(!ipc->exports[i].free_held && "a held free is not live");
  if (xs_ipc_table_try_close(ipc->table, ipc->exports[i].id)) {
    export_drop_locked(ipc, i);
    return false;              /* nobody holds it: an ordinary free */
  }
  /* Pending, as a free waiting on recorded streams: not the caller's any
     more, still active, in no tree. Its streams (if any) are waited on
     once the last holder is gone (xs_alloc_defer_unrecorded_locked). */
  ipc->exports[i].free_held = true;
  xs_pool_forget_retake(b->seg->pool, b);
  b->pending = true;
  xs_alloc_pending_count(a, b, 1);
  a->ipc_held_frees++;
  xs_alloc_account_live(b, -1);
  return true;
}

/* The last holder of held free b is gone: it is freed as xseg_free
   would have, had nobody held it. False when it must stay (host OOM
   listing it for its streams): the next pass tries again. */
static bool export_release_locked(xseg_allocator *a, xs_block *b) {
  if (b->uses.n != 0)
    return xs_alloc_defer_unrecorded_locked(a, b) == XSEG_OK;
  b->pending = false;
  xs_alloc_pending_count(a, b, -1);
  xs_alloc_account_active(b, -1);
  xs_pair_give_block(a, b);
  return true;
}

void xs_ipc_reap_locked(xseg_allocator *a) {
  XS_ASSERT_LOCKED(a);
  xs_ipc *ipc = a->ipc;
  for (size_t i = 0; i < ipc->n_exports;) {
    xs_ipc_export *e = &ipc->exports[i];
    if (!e->free_held) {
      i++;
      continue;
    }
    ipc->reclaimed +=
        (int64_t)xs_ipc_table_reap(ipc->table, e->id, &ipc->alive);
    /* A slot already closed (export_release_locked failed before)
       stays EMPTY. */
    bool closed = atomic_load(&ipc->table->exports[e->id % XS_IPC_EXPORTS]
                                   .id) != e->id ||
                  xs_ipc_table_try_close(ipc->table, e->id);
    if (!closed || !export_release_locked(a, e->block)) {
      i++;
      continue;
    }
    a->ipc_held_frees--;
    export_drop_locked(ipc, i);
  }
}

const char *xs_ipc_block_mark_locked(xseg_allocator *a, const xs_block *b) {
  xs_ipc *ipc = a->ipc;
  if (ipc == NULL || ipc->n_exports == 0) return NULL;
  size_t i = export_find_locked(ipc, b);
  if (i == SIZE_MAX) return NULL;
  return xs_ipc_table_holders(ipc->table, ipc->exports[i].id) != 0
             ? "open_by_others"
             : "exported";
}

void xs_ipc_stats_locked(xseg_allocator *a, xseg_ipc_stats *out) {
  memset(out, 0, sizeof *out);
  xs_ipc *ipc = a->ipc;
  if (ipc == NULL) return;
  out->exported_blocks = (int64_t)ipc->n_exports;
  out->exported_total = ipc->exported_total;
  for (size_t i = 0; i < ipc->n_exports; i++) {
    out->open_by_others +=
        xs_ipc_table_holders(ipc->table, ipc->exports[i].id) != 0;
    out->pending_on_others += ipc->exports[i].free_held;
  }
  out->reclaimed = ipc->reclaimed;
  for (const xs_ipc_mapping *m = ipc->mappings; m != NULL; m = m->next)
    out->opened_blocks++;
  out->opened_total = ipc->opened_total;
}

xseg_status xseg_ipc_get_stats(xseg_allocator *a, xseg_ipc_stats *out) {
  if (a == NULL || out == NULL)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "xseg_ipc_get_stats: %s is "
                    "NULL", a == NULL ? "allocator" : "out");
  xs_alloc_enter(a);
  xs_ipc_stats_locked(a, out);
  xs_alloc_leave(a);
  return XSEG_OK;
}

/* Withdraws every export: a late xseg_ipc_open finds the slot empty. */
void xs_ipc_withdraw_locked(xs_ipc *ipc) {
  xs_ipc_alive_clear(&ipc->alive);
  if (ipc->table == NULL) return;
  while (ipc->n_exports != 0) export_forget_locked(ipc, ipc->n_exports - 1);
  free(ipc->exports);
  ipc->exports = NULL;
  xs_ipc_table_unmap(ipc->table);
  close(ipc->table_fd);
  ipc->table = NULL;
}
