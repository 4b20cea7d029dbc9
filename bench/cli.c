/* cli.c: options every xseg-bench command shares, and their effects. */
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

_Static_assert(XB_DEFAULT_POINTS == 400, "xb_cli_output_help says 400");
const char xb_cli_output_help[] =
    "  --json OUT         results as JSON, always {\"runs\": [one object per "
    "replay]};\n"
    "                     - for stdout (the table then goes to stderr); the "
    "file is\n"
    "                     opened before the run, and replaced only by a "
    "complete one\n"
    "  --svg OUT          allocated/reserved chart as SVG\n"
    "  --points N         chart samples per replay (default 400)\n"
    "  --quiet            no progress on stderr, no legend after the table\n";

void xb_cli_defaults(xb_cli *c) {
  memset(c, 0, sizeof *c);
  c->driver = "sim";
  c->points = XB_DEFAULT_POINTS;
  /* As xseg_create does for a NULL conf; --conf replaces it. */
  c->conf = getenv("XSEG_ALLOC_CONF");
}

FILE *xb_cli_table_out(const xb_cli *c) {
  return c->json != NULL && strcmp(c->json, "-") == 0 ? stderr : stdout;
}

/* Digits only: strtoull would skip leading white space and take a sign,
   and " -1" would be 2^64 - 1. */
bool xb_cli_u64(const char *opt, const char *arg, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(arg, &end, 10);
  if (!isdigit((unsigned char)arg[0]) || *end != '\0' || errno != 0) {
    fprintf(stderr, "xseg-bench: %s wants a whole number, not '%s'\n", opt,
            arg);
    return false;
  }
  *out = v;
  return true;
}

/* A shared option's value (parsed into c); as xb_cli_option. */
static int cli_value(xb_cli *c, int opt, const char *arg) {
  uint64_t n;
  switch (opt) {
    case XB_OPT_DRIVER: c->driver = arg; return 1;
    case XB_OPT_CONF: c->conf = arg; return 1;
    case XB_OPT_MODE: c->mode = arg; return 1;
    case XB_OPT_JSON: c->json = arg; return 1;
    case XB_OPT_SVG: c->svg = arg; return 1;
    case XB_OPT_TRACES: c->traces = arg; return 1;
    case XB_OPT_TRACE: c->trace = arg; return 1;
    case XB_OPT_QUIET: c->quiet = true; return 1;
    case XB_OPT_POINTS:
      if (!xb_cli_u64("--points", arg, &n)) return -1;
      if (n > XB_MAX_POINTS) {
        fprintf(stderr, "xseg-bench: --points %llu is out of range (at most "
                "%d)\n", (unsigned long long)n, XB_MAX_POINTS);
        return -1;
      }
      c->points = (size_t)n;
      return 1;
    case XB_OPT_GPU_LAG:
      if (!xb_cli_u64("--gpu-lag", arg, &c->gpu_lag_us)) return -1;
      c->gpu_lag_set = true;
      return 1;
    case XB_OPT_DEVICE_MEMORY:
      if (xb_parse_size(arg, &c->device_memory) && c->device_memory > 0)
        return 1;
      fprintf(stderr, "xseg-bench: --device-memory wants a size such as 80G, "
              "not '%s'\n", arg);
      return -1;
    default:
      return 0;
  }
}

int xb_cli_option(xb_cli *c, int opt, const char *arg) {
  int taken = cli_value(c, opt, arg);
  if (taken == 1) c->given |= XB_OPT_BIT(opt);
  return taken;
}

bool xb_cli_refuse(const xb_cli *c, const char *command, uint32_t ignored) {
  static const struct option shared[] = {XB_CLI_LONG_OPTIONS};
  for (size_t i = 0; i < sizeof shared / sizeof *shared; i++) {
    if (!(c->given & ignored & XB_OPT_BIT(shared[i].val))) continue;
    fprintf(stderr, "xseg-bench: --%s does not apply to %s (see --help)\n",
            shared[i].name, command);
    return false;
  }
  return true;
}

bool xb_same_file(const char *a, const char *b) {
  struct stat as, bs;
  return stat(a, &as) == 0 && stat(b, &bs) == 0 && as.st_dev == bs.st_dev &&
         as.st_ino == bs.st_ino;
}

bool xb_cli_env_open(const xb_cli *c, xb_env *env) {
  if (xb_env_open(env, c->driver) != XSEG_OK) {
    fprintf(stderr, "xseg-bench: driver '%s': %s\n", c->driver,
            xseg_last_error());
    return false;
  }
  if (c->device_memory > 0 &&
      !xb_env_set_device_memory(env, c->device_memory)) {
    fprintf(stderr, "xseg-bench: --device-memory needs the emulator; driver "
            "'%s' has no xsim_set_device_memory\n", c->driver);
    xb_env_close(env);
    return false;
  }
  return true;
}

size_t xb_cli_policies(const char *mode, const xb_policy **out) {
  if (strcmp(mode, "all") == 0) {
    for (size_t i = 0; i < XB_N_MODES; i++) out[i] = xb_policy_find(xb_modes[i]);
    return XB_N_MODES;
  }
  out[0] = xb_policy_find(mode);
  if (out[0] != NULL) return 1;
  fprintf(stderr, "xseg-bench: unknown mode '%s' (xseg, pytorch-expandable, "
          "pytorch-native, exact or all; expandable and classic are xseg's "
          "and pytorch-native's old names)\n", mode);
  return 0;
}

/* Whether the file --json names can be written: the file itself, or, when
   it does not exist yet, the folder it would be made in. errno set when
   not. */
static bool json_writable(const char *path) {
  if (access(path, W_OK) == 0) return true;
  if (errno != ENOENT) return false;
  char *copy = strdup(path);
  if (copy == NULL) return errno = ENOMEM, false;
  bool ok = access(dirname(copy), W_OK | X_OK) == 0;
  free(copy);
  return ok;
}

bool xb_cli_json_open(const xb_cli *c, xb_json_out *json) {
  *json = (xb_json_out){.path = c->json};
  if (c->json == NULL) return true;
  if (strcmp(c->json, "-") == 0) {
    json->f = stdout;
    return true;
  }
  if (json_writable(c->json))
    json->f = open_memstream(&json->buf, &json->len);
  if (json->f != NULL) return true;
  fprintf(stderr, "xseg-bench: --json %s: %s\n", c->json, strerror(errno));
  xb_cli_json_close(json);
  return false;
}

void xb_cli_json_close(xb_json_out *json) {
  if (json->f != NULL && json->f != stdout) fclose(json->f);
  free(json->buf);
  *json = (xb_json_out){.path = json->path};
}

bool xb_cli_json_commit(xb_json_out *json) {
  if (json->f == NULL) return true;
  bool ok = fflush(json->f) == 0 && !ferror(json->f);
  if (json->f != stdout) {
    ok = fclose(json->f) == 0 && ok;
    FILE *out = ok ? fopen(json->path, "w") : NULL;
    ok = out != NULL && fwrite(json->buf, 1, json->len, out) == json->len;
    if (out != NULL) ok = fclose(out) == 0 && ok;
  }
  json->f = NULL;
  if (!ok) fprintf(stderr, "xseg-bench: --json %s: write failed\n",
                   json->path);
  xb_cli_json_close(json);
  return ok;
}

bool xb_cli_outputs(const xb_cli *c, xb_json_out *json, const xb_result *r,
                    size_t n) {
  if (json->f != NULL) xb_report_json(json->f, r, n);
  bool ok = xb_cli_json_commit(json);
  if (c->svg != NULL) {
    xb_error err;
    if (!xb_svg_write(c->svg, r, n, &err)) {
      fprintf(stderr, "xseg-bench: --svg: %s\n", err.text);
      ok = false;
    }
  }
  return ok;
}
