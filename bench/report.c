/* report.c: results as a table for people and as JSON for scripts.
 *
 * The JSON object holds docs/DESIGN.md section 7's fields (mode, events,
 * peak_allocated_bytes, peak_reserved_bytes, fragmentation, ooms,
 * driver_calls, ns_per_op) and the rest of what a replay measures. Counts
 * are exact integers; driver_calls lists every function of vmm's driver
 * table, zeros included, so its keys do not depend on the run.
 */
#include <math.h>
#include <stdio.h>

#include "bench.h"

void xb_report_table_header(FILE *out) {
  fprintf(out, "%-22s %-18s %7s %14s %14s %7s %10s %9s %9s %5s %10s\n",
          "trace", "mode", "lag us", "peak alloc", "peak reserved", "frag",
          "VMM calls", "malloc ns", "free ns", "OOMs", "host waits");
}

void xb_report_legend(FILE *out) {
  fputs("lag us         how far the device runs behind the host, in trace "
        "microseconds (0: not at all)\n"
        "peak alloc     most bytes live at once (requests rounded up to "
        "512 B)\n"
        "peak reserved  most physical bytes mapped at once\n"
        "frag           peak reserved / peak alloc (1.000: nothing wasted)\n"
        "VMM calls      cuMemAddressReserve/Free, cuMemCreate/Release, "
        "cuMemMap/Unmap, cuMemSetAccess\n"
        "malloc/free ns median host time per call, on this machine\n"
        "OOMs           allocations that failed (the replay goes on)\n"
        "host waits     cuStreamSynchronize, cuCtxSynchronize and "
        "cuEventSynchronize calls\n"
        "modes          xseg: this allocator; pytorch-expandable: PyTorch's "
        "caching allocator with\n"
        "               expandable_segments:True; pytorch-native: PyTorch's "
        "default (xseg's classic\n"
        "               mode, which reproduces it); exact: a mapping per "
        "request, nothing cached\n", out);
}

static const char *mib(uint64_t n, char *buf, size_t size) {
  snprintf(buf, size, "%.1f MiB", (double)n / (1024.0 * 1024.0));
  return buf;
}

/* ns/op columns are medians; a mode with no calls of a kind shows "-". */
static const char *ns_cell(uint64_t ns, uint64_t calls, char *buf, size_t n) {
  if (calls == 0) return "-";
  snprintf(buf, n, "%llu", (unsigned long long)ns);
  return buf;
}

void xb_report_table_row(FILE *out, const xb_result *r) {
  char a[32], b[32], m[32], f[32];
  fprintf(out, "%-22s %-18s %7llu %14s %14s %7.3f %10llu %9s %9s %5llu %10llu\n",
          r->trace, r->mode, (unsigned long long)r->gpu_lag_us,
          mib(r->peak_allocated, a, sizeof a),
          mib(r->peak_reserved, b, sizeof b), r->fragmentation,
          (unsigned long long)r->vmm_calls,
          ns_cell(r->malloc_ns.median, r->allocs, m, sizeof m),
          ns_cell(r->free_ns.median, r->frees, f, sizeof f),
          (unsigned long long)r->ooms, (unsigned long long)r->host_waits);
}

const char *xb_result_label(const xb_result *r, char *buf, size_t size) {
  snprintf(buf, size, "%s, lag %llu us", r->mode,
           (unsigned long long)r->gpu_lag_us);
  return buf;
}

void xb_json_string(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c < 0x20)
      fprintf(out, "\\u%04x", c);
    else
      fputc(c, out);
  }
  fputc('"', out);
}

static void json_u64(FILE *out, const char *key, uint64_t v, bool comma) {
  fprintf(out, "  \"%s\": %llu%s\n", key, (unsigned long long)v,
          comma ? "," : "");
}

static void json_latency(FILE *out, const char *key, const xb_latency *l) {
  fprintf(out, "  \"%s\": {\"median\": %llu, \"p99\": %llu, \"mean\": %llu},\n",
          key, (unsigned long long)l->median, (unsigned long long)l->p99,
          (unsigned long long)l->mean);
}

static void json_calls(FILE *out, const xb_result *r) {
  fprintf(out, "  \"driver_calls\": {");
  for (int f = 0; f < XS_DRIVER_FN_COUNT; f++)
    fprintf(out, "%s\"%s\": %llu", f ? ", " : "",
            xs_driver_fn_name((xs_driver_fn)f),
            (unsigned long long)r->calls[f]);
  fprintf(out, "},\n");
}

static void json_strings(FILE *out, const xb_result *r) {
  fprintf(out, "  \"mode\": ");
  xb_json_string(out, r->mode);
  fprintf(out, ",\n  \"trace\": ");
  xb_json_string(out, r->trace);
  fprintf(out, ",\n  \"driver\": ");
  xb_json_string(out, r->driver);
  fprintf(out, ",\n");
}

static void json_object(FILE *out, const xb_result *r) {
  fprintf(out, "{\n");
  json_strings(out, r);
  json_u64(out, "events", r->events, true);
  json_u64(out, "allocations", r->allocs, true);
  json_u64(out, "frees", r->frees, true);
  json_u64(out, "peak_allocated_bytes", r->peak_allocated, true);
  json_u64(out, "peak_reserved_bytes", r->peak_reserved, true);
  /* JSON has no NaN: an empty workload's ratio is written as 0. */
  fprintf(out, "  \"fragmentation\": %.6f,\n",
          isfinite(r->fragmentation) ? r->fragmentation : 0.0);
  json_u64(out, "allocated_end_bytes", r->allocated_end, true);
  json_u64(out, "reserved_end_bytes", r->reserved_end, true);
  json_u64(out, "ooms", r->ooms, true);
  json_u64(out, "gpu_lag_us", r->gpu_lag_us, true);
  json_u64(out, "host_waits", r->host_waits, true);
  json_calls(out, r);
  json_u64(out, "vmm_calls", r->vmm_calls, true);
  json_latency(out, "malloc_ns", &r->malloc_ns);
  json_latency(out, "free_ns", &r->free_ns);
  fprintf(out, "  \"wall_seconds\": %.6f,\n", r->wall_s);
  json_u64(out, "ns_per_op", r->ns_per_op, false);
  fprintf(out, "}");
}

void xb_report_json(FILE *out, const xb_result *r, size_t n) {
  fprintf(out, "{\"runs\": [\n");
  for (size_t i = 0; i < n; i++) {
    json_object(out, &r[i]);
    fprintf(out, "%s\n", i + 1 < n ? "," : "");
  }
  fprintf(out, "]}\n");
}
