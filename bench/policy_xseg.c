/* policy_xseg.c: the allocator through its public API (docs/DESIGN.md section 3).
 *
 * Two modes: "xseg" (expandable_segments:True, the allocator as designed)
 * and "pytorch-native" (expandable_segments:False: one physical allocation
 * per segment, the policy of PyTorch's caching allocator without expandable
 * segments, whose reserved bytes it reproduces). Both are one
 * xseg_allocator per replay, created with the bench's
 * driver and expandable_segments set, then the user's --conf, parsed after
 * them (a key given twice takes its last value); a --conf that sets
 * expandable_segments against the mode is refused, naming the mode that
 * runs it. Reserved bytes are the allocator's own reserved_bytes gauge
 * (mapped physical bytes); its peak is reset at each sample so that the
 * replay sees the peak of every window.
 */
#include <stdlib.h>

#include "alloc/config.h"
#include "bench.h"
#include "vmm/error.h"

typedef struct xb_xseg {
  xseg_allocator *a;
} xb_xseg;

static const char *mode_name(bool expandable) {
  return expandable ? "xseg" : "pytorch-native";
}

/* A conf that sets expandable_segments the other way would run the other
   mode's allocator under this mode's name: refused, naming the key and the
   mode that runs it (as pytorch-expandable refuses what it does not
   model). Called once the conf is known to fit in a full conf. */
static xseg_status conf_check(const char *conf, bool expandable) {
  if (conf == NULL || conf[0] == '\0') return XSEG_OK;
  char full[2048];
  snprintf(full, sizeof full, "expandable_segments:%s,%s",
           expandable ? "True" : "False", conf);
  xs_config cfg;
  if (xs_config_parse(full, &cfg) != XSEG_OK ||
      cfg.expandable_segments == expandable)
    return XSEG_OK;                 /* a bad conf: xseg_create says why */
  return xs_error(XSEG_ERR_INVALID_ARGUMENT, "mode %s does not take "
                  "expandable_segments:%s (--conf or XSEG_ALLOC_CONF): that "
                  "is --mode %s", mode_name(expandable),
                  expandable ? "False" : "True", mode_name(!expandable));
}

xseg_status xb_xseg_create(xb_env *env, const char *conf, bool expandable,
                           xseg_allocator **out) {
  char full[2048];
  int n = snprintf(full, sizeof full,
                   "xseg_driver:%s,expandable_segments:%s%s%s",
                   xb_env_driver_path(env), expandable ? "True" : "False",
                   conf != NULL && conf[0] ? "," : "", conf ? conf : "");
  if (n < 0 || (size_t)n >= sizeof full)
    return xs_error(XSEG_ERR_INVALID_ARGUMENT, "--conf too long (%d bytes)", n);
  xseg_status st = conf_check(conf, expandable);
  return st != XSEG_OK ? st : xseg_create(env->vmm.device, full, out);
}

static xseg_status xseg_open_mode(xb_env *env, const char *conf,
                                  bool expandable, void **self) {
  xb_xseg *x = calloc(1, sizeof *x);
  if (x == NULL) return xs_error(XSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  xseg_status st = xb_xseg_create(env, conf, expandable, &x->a);
  if (st != XSEG_OK) {
    free(x);
    return st;
  }
  *self = x;
  return XSEG_OK;
}

static xseg_status expandable_open(xb_env *env, const char *conf,
                                   uint32_t n_slots, void **self) {
  (void)n_slots;
  return xseg_open_mode(env, conf, true, self);
}

static xseg_status classic_open(xb_env *env, const char *conf,
                                uint32_t n_slots, void **self) {
  (void)n_slots;
  return xseg_open_mode(env, conf, false, self);
}

static xseg_status xseg_policy_malloc(void *self, uint32_t slot, size_t size,
                                      struct CUstream_st *stream, void **ptr) {
  (void)slot;
  return xseg_malloc(((xb_xseg *)self)->a, size, stream, ptr);
}

static xseg_status xseg_policy_free(void *self, uint32_t slot, void *ptr) {
  (void)slot;
  return xseg_free(((xb_xseg *)self)->a, ptr);
}

static void xseg_policy_usage(void *self, xb_usage *u) {
  xb_xseg *x = self;
  xseg_stats s;
  u->reserved = u->reserved_peak = 0;
  if (xseg_get_stats(x->a, &s) != XSEG_OK) return;
  u->reserved = (uint64_t)s.reserved_bytes.current;
  u->reserved_peak = (uint64_t)s.reserved_bytes.peak;
  xseg_reset_peak_stats(x->a);
}

static xseg_status xseg_policy_snapshot(void *self, FILE *out) {
  return xseg_snapshot_json(((xb_xseg *)self)->a, out);
}

static bool xseg_policy_check(void *self, xb_error *err) {
  if (xseg_check(((xb_xseg *)self)->a) == XSEG_OK) return true;
  return xb_fail(err, "%s", xseg_last_error());
}

static void xseg_policy_close(void *self) {
  xb_xseg *x = self;
  xseg_destroy(x->a);
  free(x);
}

const xb_policy xb_policy_xseg = {
    .name = "xseg",
    .open = expandable_open,
    .malloc = xseg_policy_malloc,
    .free = xseg_policy_free,
    .usage = xseg_policy_usage,
    .snapshot = xseg_policy_snapshot,
    .check = xseg_policy_check,
    .close = xseg_policy_close,
};

const xb_policy xb_policy_pytorch_native = {
    .name = "pytorch-native",
    .open = classic_open,
    .malloc = xseg_policy_malloc,
    .free = xseg_policy_free,
    .usage = xseg_policy_usage,
    .snapshot = xseg_policy_snapshot,
    .check = xseg_policy_check,
    .close = xseg_policy_close,
};
