/* flow.c: the physical-memory policy — which memory serves a growth.
 *
 * One budget across streams: a growth of n granules takes, in this order,
 * and creates device memory only when none of it can serve:
 *   1. its own stream's free memory (both pools of the pair): whole free
 *      handles the guard has passed are unmapped and mapped again here;
 *      the others are lent — mapped here at once while the old mapping
 *      stays until the guard passes (map before unmap: work on one stream
 *      runs in order, so the new user is queued after the old ones). A
 *      private pool (graph capture) lends nothing: a graph may replay on
 *      any stream;
 *   2. other streams' free memory their guards have passed (an idle
 *      stream proves all of its frees with one cuStreamQuery), the least
 *      recently used stream first: no wait of any kind;
 *      but never from a stream that itself took other streams' memory
 *      within the last XS_FLOW_QUIET frees (steps 2 and 3): memory that
 *      just moved does not bounce straight back, so streams cannot
 *      ping-pong handles, and a repeated request mix steadies with each
 *      stream holding what it needs (no driver call per request; on
 *      varbatch with 4 streams and one repeated request the quiet period
 *      takes its calls from ~30 per request to 0, and fragmentation from
 *      1.136 to 1.129);
 *   3. the steal rule, for busy streams (below);
 *   4. fresh handles (cuMemCreate), within the memory-fraction cap.
 * Nothing moves while a graph capture is under way (no unmap, no event),
 * and nothing here waits on the host.
 *
 * The steal rule. A donor's free memory that its stream may still use is
 * mapped here at once and this stream waits on an event recorded on the
 * donor's stream (cuStreamWaitEvent, as cudaMallocAsync's internal
 * dependencies): the device waits, never the host; the donor's old mapping
 * retires when its guard passes. Only
 *   - while no capture is under way on any stream with pools;
 *   - behind an event recorded on the donor's stream at the steal (it
 *     covers every free so far; the guard's own event, recorded earlier,
 *     may not);
 *   - memory the donor freed after its own last growth: its surplus, not
 *     memory it cycles through;
 *   - from a quiet donor (as in 2): memory that moved with a wait cannot
 *     bounce straight back, so two busy streams cannot make each other
 *     wait in turn; the donor's next growth creates memory instead.
 * At the device limit, the out-of-memory path's last try before a host
 * wait drops the surplus and quiet conditions (a->flow_at_limit): a wait
 * on the device beats a wait on the host or a failure.
 *
 * Handle sizes: a fresh handle spans as many granules as the handle policy
 * allows (xseg_handle_policy, xseg_handle_max_mb, xseg_handle_max_part):
 * one create and one map for many granules, but a live block pins its
 * whole handle.
 */
#include <assert.h>

#include "alloc/account.h"
#include "alloc/capture.h"
#include "alloc/deferred.h"
#include "alloc/flow.h"
#include "alloc/frees.h"
#include "alloc/pairs.h"
#include "alloc/reclaim.h"
#include "alloc/types.h"
#include "vmm/error.h"

bool xs_flow_within_cap(const xseg_allocator *a, size_t bytes) {
  int64_t reserved = xs_alloc_current(a, XS_GAUGE_reserved_bytes);
  return (size_t)reserved + bytes <= a->cap;
}

xseg_status xs_flow_cap_error(const xseg_allocator *a, size_t bytes) {
  return xs_error(XSEG_ERR_OUT_OF_MEMORY,
                  "mapping %zu more bytes would pass the memory fraction's "
                  "cap of %zu bytes", bytes, a->cap);
}

/* Fresh growth at least xseg_grow_min_mb (where the hole has room): a
   segment that grows by a few granules at a time (weights loaded one by
   one) then makes one growth of many. */
xs_flow_plan xs_flow_plan_for(const xseg_allocator *a, const xs_place *pl) {
  xs_flow_plan plan = {.g = pl->seg->granule};
  plan.room = pl->hole->size / plan.g;
  size_t want = (a->cfg.grow_min + plan.g - 1) / plan.g;
  if (want > plan.room) want = plan.room;
  plan.fresh = want > pl->n ? want : pl->n;
  return plan;
}

/* Most granules of `g` bytes in one fresh handle: xseg_handle_max_mb, and
   1/xseg_handle_max_part of what is mapped. A handle can only be unmapped
   whole, so a large one that a live block pins strands its free granules;
   the second bound keeps that small beside a small footprint (on the
   bundled traces, 8 MiB handles lift cnn_infer's 106 MiB from 1.029 to
   1.048 times its peak, and bounding them by 1/32 of what is mapped keeps
   it at 1.029 while bert_infer still maps 8 MiB handles). */
static size_t flow_handle_most_locked(const xseg_allocator *a, size_t g) {
  size_t most = a->cfg.handle_max != 0 ? a->cfg.handle_max / g : SIZE_MAX;
  if (a->cfg.handle_max_part != 0) {
    size_t reserved =
        (size_t)xs_alloc_current(a, XS_GAUGE_reserved_bytes);
    size_t part = reserved / a->cfg.handle_max_part / g;
    if (part < most) most = part;
  }
  return most > 0 ? most : 1;
}

/* The size in granules of the next fresh handle for `left` granules of
   `g` bytes: the handle policy's, within flow_handle_most_locked. */
static size_t flow_handle_size_locked(const xseg_allocator *a, size_t g,
                                      size_t left) {
  size_t most = flow_handle_most_locked(a, g);
  if (left > most) left = most;
  switch (a->cfg.handle_policy) {
    case XS_HANDLES_GRANULE: return 1;
    case XS_HANDLES_SINGLE: return left;
    case XS_HANDLES_POW2: break;
  }
  size_t k = 1;
  while (k <= left / 2) k *= 2;
  return k;
}

/* 4: fresh handles for handles[*have .. want), each handle's value
   repeated over its granules. */
static xseg_status flow_create_locked(xseg_allocator *a, size_t g, size_t want,
                                      uint64_t *handles, size_t *have) {
  while (*have < want) {
    size_t k = flow_handle_size_locked(a, g, want - *have);
    uint64_t h;
    xseg_status st = xs_phys_create_locked(a, k * g, &h);
    if (st != XSEG_OK) return st;
    for (size_t i = 0; i < k; i++) handles[(*have)++] = h;
  }
  return XSEG_OK;
}

/* 1: the stream's own free memory. keep is the block the new granules
   merge with; the hole itself is unmapped and so never a donor. */
static size_t flow_own_locked(xseg_allocator *a, xs_pool *p, const xs_place *pl,
                              size_t want, size_t max, uint64_t *handles) {
  xs_pair *pair = xs_pool_pair(p);
  if (want == 0 || xs_alloc_capturing(a)) return 0;
  xs_alloc_guard_advance_locked(a, pair, false);  /* failing: fewer handles */
  uint64_t lend_upto = pair->private_id == 0 ? UINT64_MAX : 0;
  return xs_phys_take_locked(a, pair, p, pl->seg->granule, want, max, pl->keep,
                             lend_upto, handles);
}

/* The pair used just less recently than `pair` (NULL: the least recently
   used one; the list is most recently used first). Quadratic in the
   streams, which are few. */
static xs_pair *flow_before_locked(const xseg_allocator *a,
                                   const xs_pair *pair) {
  if (a->streams == pair) return NULL;
  xs_pair *q = a->streams;
  while (q->next != pair) q = q->next;
  return q;
}

/* Whether donor took other streams' memory within the last
   XS_FLOW_QUIET frees (then it gives none: see the top). */
static bool flow_donor_quiet_locked(const xseg_allocator *a,
                                    const xs_pair *donor) {
  return a->flow_at_limit || donor->took_at == 0 ||
         xs_alloc_frees_locked(a) - donor->took_at >= XS_FLOW_QUIET;
}

/* The steal rule (top): the pools of donor thief may steal from, as a
   bit mask (0: none). */
static unsigned flow_may_steal_locked(const xseg_allocator *a,
                                      const xs_pair *thief,
                                      xs_pair *donor, size_t granule) {
  if (thief->private_id != 0) return 0;
  unsigned pools = 0;
  for (int k = 0; k < 2; k++) {
    uint64_t oldest = xs_pool_lendable_epoch(&donor->pool[k], granule);
    if (oldest != 0 && (a->flow_at_limit || oldest > donor->grew_at))
      pools |= 1u << k;
  }
  return pools;
}

/* 2 and 3: other streams' free memory. */
static size_t flow_others_locked(xseg_allocator *a, xs_pool *p, size_t granule,
                                 size_t want, size_t max, uint64_t *handles) {
  size_t got = 0;
  xs_pair *own = xs_pool_pair(p);
  if (want == 0 || (a->streams == own && own->next == NULL)) return 0;
  xseg_status st = xs_capture_sweep_locked(a);
  if (st != XSEG_OK || xs_alloc_capturing(a)) return 0;
  xs_alloc_complete_frees_locked(a, false);
  for (xs_pair *pair = flow_before_locked(a, NULL); pair != NULL && got < want;
       pair = flow_before_locked(a, pair)) {
    if (pair == own || !xs_pools_reclaimable(pair) ||
        !flow_donor_quiet_locked(a, pair))
      continue;
    /* An idle donor proves itself with one query; a busy one gets a guard
       event for a later pass and gives what was already safe. */
    xs_alloc_guard_advance_locked(a, pair, false);
    xs_alloc_retire_aliases_locked(a, pair);
    got += xs_phys_take_locked(a, pair, NULL, granule, want - got,
                               max - got, NULL, 0, handles + got);
  }
  for (xs_pair *pair = flow_before_locked(a, NULL); pair != NULL && got < want;
       pair = flow_before_locked(a, pair)) {
    if (pair == own || !xs_pools_reclaimable(pair) ||
        !flow_donor_quiet_locked(a, pair))
      continue;
    unsigned pools = flow_may_steal_locked(a, own, pair, granule);
    if (pools != 0)
      got += xs_phys_steal_locked(a, own, pair, pools, granule, want - got,
                                  max - got, handles + got);
  }
  if (got > 0) own->took_at = xs_alloc_frees_locked(a);
  return got;
}

xseg_status xs_flow_collect_locked(xseg_allocator *a, xs_pool *p,
                                   const xs_place *pl,
                                   const xs_flow_plan *plan, size_t max,
                                   uint64_t *handles, size_t *have) {
  XS_ASSERT_LOCKED(a);
  size_t n = pl->n, g = plan->g;
  *have = flow_own_locked(a, p, pl, n, max, handles);
  if (*have < n)
    *have +=
        flow_others_locked(a, p, g, n - *have, max - *have, handles + *have);
  if (*have >= n) return XSEG_OK;
  /* The handles in hand left reserved_bytes when they were taken (unmapped
     or lent) and come back with the map: the cap holds them with the new
     ones, i.e. all `fresh` granules. */
  size_t fresh = plan->fresh > *have ? plan->fresh : n;
  if (!xs_flow_within_cap(a, fresh * g)) fresh = n;
  if (!xs_flow_within_cap(a, n * g))
    return xs_flow_cap_error(a, (n - *have) * g);
  return flow_create_locked(a, g, fresh, handles, have);
}
