/* micro_deferred.c: the host-side cost of a deferred (cross-stream) free in
 * `xseg-bench micro`.
 *
 * The loop PyTorch runs when a tensor was used on a side stream: malloc on
 * the default stream, record_stream on a second stream, free. The free
 * records a pooled event on the second stream and makes the block pending;
 * the next malloc polls the stream's queue and gives back what fired. Timed
 * against the plain malloc+free pair of the same size in the same
 * allocator, round for round, median over --rounds: the difference is what
 * deferral costs on the host per free (an event record and, amortised, its
 * query). The events the loop created show that the pool reuses them.
 *
 * When the next malloc finds the last free's event fired depends on the
 * device (on the emulator, on when its stream thread runs). --fired takes
 * that out: the loop waits for the side stream after each deferred free,
 * outside the allocator's calls, so every malloc reuses the block just
 * freed (bench/callgrind.sh counts that way; its timings include the
 * wait).
 */

#include "micro.h"

enum { XB_DEFERRED_SIZE = 4096 };

static bool deferred_loop(xb_micro *m, xseg_allocator *a,
                          struct CUstream_st *side, uint64_t n, bool record,
                          double *ns) {
  bool wait = record && m->fired;
  uint64_t t0 = xb_now_ns();
  for (uint64_t i = 0; i < n; i++) {
    void *p;
    if (xseg_malloc(a, XB_DEFERRED_SIZE, NULL, &p) != XSEG_OK ||
        (record && xseg_record_stream(a, p, side) != XSEG_OK) ||
        xseg_free(a, p) != XSEG_OK ||
        (wait && xb_env_stream_sync(&m->env, side) != XSEG_OK))
      return false;
  }
  *ns = (double)(xb_now_ns() - t0) / (double)n;
  return true;
}

static bool deferred_rounds(xb_micro *m, xseg_allocator *a,
                            struct CUstream_st *side, xb_deferred_row *row) {
  double plain[64], deferred[64];
  xb_env *e = &m->env;
  uint64_t created = xb_env_call_count(e, XS_DRIVER_FN_cuEventCreate);
  uint64_t records = xb_env_call_count(e, XS_DRIVER_FN_cuEventRecord);
  uint64_t queries = xb_env_call_count(e, XS_DRIVER_FN_cuEventQuery);
  for (size_t r = 0; r < m->rounds; r++)
    if (!deferred_loop(m, a, side, m->pairs, false, &plain[r]) ||
        !deferred_loop(m, a, side, m->pairs, true, &deferred[r]))
      return false;
  double frees = (double)(m->pairs * m->rounds);
  *row = (xb_deferred_row){
      .frees = m->pairs * m->rounds,
      .plain_ns = xb_micro_median(plain, m->rounds),
      .deferred_ns = xb_micro_median(deferred, m->rounds),
      .events_created = xb_env_call_count(e, XS_DRIVER_FN_cuEventCreate) -
                        created,
      .records_per_free =
          (double)(xb_env_call_count(e, XS_DRIVER_FN_cuEventRecord) -
                   records) / frees,
      .queries_per_free =
          (double)(xb_env_call_count(e, XS_DRIVER_FN_cuEventQuery) -
                   queries) / frees};
  return true;
}

bool xb_micro_deferred(xb_micro *m, xb_deferred_row *row) {
  xseg_allocator *a;
  struct CUstream_st *side = NULL;
  if (!xb_micro_allocator(m, &a)) return false;
  bool ok = xb_env_stream_create(&m->env, &side) == XSEG_OK &&
            deferred_rounds(m, a, side, row);
  if (!ok)
    fprintf(stderr, "xseg-bench micro: deferred frees failed: %s\n",
            xseg_last_error());
  xseg_destroy(a);    /* waits for the last frees' events */
  xb_env_stream_destroy(&m->env, side);
  return ok;
}
