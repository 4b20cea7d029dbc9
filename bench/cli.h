/* cli.h: the command-line layer of xseg-bench: options every command shares
 * and the commands themselves (in the library, so tests can run them). */
#ifndef XB_CLI_H
#define XB_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench.h"

/* --points: chart samples per replay. More than the trace has events are
   never taken; the bound keeps a mistyped value from asking for terabytes. */
enum { XB_DEFAULT_POINTS = 400, XB_MAX_POINTS = 100000000 };

typedef struct xb_cli {
  const char *driver;               /* "sim" unless --driver */
  const char *conf, *mode, *json, *svg, *traces, *trace;
  uint64_t device_memory;           /* 0: leave the emulator's */
  size_t points;
  uint64_t gpu_lag_us;              /* --gpu-lag (trace microseconds) */
  bool gpu_lag_set;
  bool quiet;                       /* --quiet: no progress, no legend */
  uint32_t given;                   /* XB_OPT_BIT of each option given */
} xb_cli;

/* Option letters of the shared options, for getopt_long tables. */
enum {
  XB_OPT_DRIVER = 256, XB_OPT_DEVICE_MEMORY, XB_OPT_CONF, XB_OPT_MODE,
  XB_OPT_JSON, XB_OPT_SVG, XB_OPT_TRACES, XB_OPT_TRACE, XB_OPT_POINTS,
  XB_OPT_GPU_LAG, XB_OPT_QUIET,
  XB_OPT_FIRST_OWN                  /* commands number theirs from here */
};
/* A shared option's bit in xb_cli.given and in xb_cli_refuse's mask. */
#define XB_OPT_BIT(opt) (1u << ((opt) - XB_OPT_DRIVER))

#define XB_CLI_LONG_OPTIONS                                                  \
  {"driver", required_argument, 0, XB_OPT_DRIVER},                           \
  {"device-memory", required_argument, 0, XB_OPT_DEVICE_MEMORY},             \
  {"conf", required_argument, 0, XB_OPT_CONF},                               \
  {"mode", required_argument, 0, XB_OPT_MODE},                               \
  {"json", required_argument, 0, XB_OPT_JSON},                               \
  {"svg", required_argument, 0, XB_OPT_SVG},                                 \
  {"traces", required_argument, 0, XB_OPT_TRACES},                           \
  {"trace", required_argument, 0, XB_OPT_TRACE},                             \
  {"points", required_argument, 0, XB_OPT_POINTS},                           \
  {"gpu-lag", required_argument, 0, XB_OPT_GPU_LAG},                        \
  {"quiet", no_argument, 0, XB_OPT_QUIET}

/* --help's lines for --json, --svg, --points and --quiet. */
extern const char xb_cli_output_help[];

void xb_cli_defaults(xb_cli *c);
/* A shared option: 1 taken, 0 not a shared one, -1 bad value (printed). */
int xb_cli_option(xb_cli *c, int opt, const char *arg);
/* False (printed, naming the option and `command`) when c was given one
   of the shared options in `ignored` (XB_OPT_BITs), which the command
   would ignore. */
bool xb_cli_refuse(const xb_cli *c, const char *command, uint32_t ignored);
/* Whether both paths exist and are one file, whatever their names (an
   output that would replace an input). */
bool xb_same_file(const char *a, const char *b);
/* Opens the driver and applies --device-memory; prints why on failure. */
bool xb_cli_env_open(const xb_cli *c, xb_env *env);
/* The policies --mode names, in report order: every mode for "all".
   Prints why and returns 0 for an unknown mode. */
size_t xb_cli_policies(const char *mode, const xb_policy **out);
/* Where tables and summaries go: stderr when --json - takes stdout. */
FILE *xb_cli_table_out(const xb_cli *c);
/* --json's output while a run writes it: in memory, written to --json's
   path only once the run is complete, so that a run that fails (or is
   killed) leaves an earlier file as it was and nothing beside it; the file
   is written in place then, as fopen "w" writes it (its owner, links and
   mode kept, a symlink's target written). "-" is stdout. */
typedef struct xb_json_out {
  FILE *f;                          /* NULL without --json */
  const char *path;                 /* --json's, for messages */
  char *buf;                        /* f's memory (open_memstream) */
  size_t len;
} xb_json_out;

/* Checks before a run that --json's path can be written (the file, or the
   folder it would be made in), so that it fails at once instead of after
   the run; prints why and returns false. */
bool xb_cli_json_open(const xb_cli *c, xb_json_out *json);
/* Drops what json holds: the run failed, and --json's path keeps what it
   had. Nothing when committed. */
void xb_cli_json_close(xb_json_out *json);
/* Writes what json holds to --json's path; false, printed, on a write
   error. */
bool xb_cli_json_commit(xb_json_out *json);
/* Writes the results to `json` (committing it) and --svg, if given;
   prints why on failure. */
bool xb_cli_outputs(const xb_cli *c, xb_json_out *json, const xb_result *r,
                    size_t n);
/* Parses a whole number option; prints why on failure. */
bool xb_cli_u64(const char *opt, const char *arg, uint64_t *out);

/* The commands: argv[0] is the command's name; they return an exit code. */
int xb_cmd_default(int argc, char **argv);
int xb_cmd_replay(int argc, char **argv);
int xb_cmd_varbatch(int argc, char **argv);
int xb_cmd_micro(int argc, char **argv);
/* Replays a built workload in the modes of c at c's --gpu-lag (0 unless
   given). */
int xb_run_trace(const xb_cli *c, const xb_trace *t);

/* varbatch's workload with its default settings on `streams` streams,
   named "varbatch_<n>_stream(s)" (the default run's rows). */
bool xb_varbatch_default_trace(uint64_t streams, xb_trace *t, xb_error *err);

/* The default run's lag when --gpu-lag is not given: every trace is
   replayed without lag and with this much (bench/README.md says why). */
enum { XB_DEFAULT_GPU_LAG_US = 5000 };

#endif /* XB_CLI_H */
