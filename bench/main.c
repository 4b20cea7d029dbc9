/* main.c: xseg-bench's command line.
 *
 *   xseg-bench [options]                  every bundled trace, every mode,
 *                                         without and with device lag, and
 *                                         varbatch at 1, 2 and 4 streams
 *   xseg-bench replay --trace FILE [--mode M] [--gpu-lag US]
 *   xseg-bench varbatch [options]         synthetic inference server
 *   xseg-bench micro [options]            cached-path and growth-path cost
 *
 * Options shared by all: --driver sim|cuda|PATH (default sim, the emulator),
 * --device-memory SIZE (the emulator's capacity), --conf STR (allocator
 * settings, PYTORCH_CUDA_ALLOC_CONF syntax), --json OUT, --quiet; by the
 * replays (not micro): --svg OUT, --points N, --gpu-lag US. A command
 * refuses one it would ignore. Modes: xseg, pytorch-expandable,
 * pytorch-native, exact (policy.c).
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: xseg-bench [replay|varbatch|micro] [options]\n"
          "  (no command)       replay every trace in the trace folder in "
          "every mode\n"
          "  replay --trace F   replay one RMM replay-log CSV (.csv, .csv.gz; "
          "--help)\n"
          "  varbatch           synthetic variable-batch inference server "
          "(--help)\n"
          "  micro              cached-path and growth-path latency (--help)\n"
          "common options:\n"
          "  --driver D         sim (default), cuda, or a libcuda path\n"
          "  --device-memory S  emulated device memory, e.g. 80G\n"
          "  --conf STR         allocator settings (key:value,...); default\n"
          "                     $XSEG_ALLOC_CONF\n"
          "  --mode M           xseg, pytorch-expandable, pytorch-native, "
          "exact or all\n"
          "                     (expandable and classic: xseg, "
          "pytorch-native)\n"
          "  --traces DIR       traces for the default run (instead of the "
          "bundled ones\n"
          "                     and the varbatch rows)\n"
          "  --gpu-lag US       the device runs US microseconds of trace time "
          "behind\n"
          "                     (default run: without lag and with %d)\n"
          "%s", XB_DEFAULT_GPU_LAG_US, xb_cli_output_help);
}

int main(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "--help") == 0 ||
                   strcmp(argv[1], "-h") == 0 ||
                   strcmp(argv[1], "help") == 0)) {
    usage(stdout);
    return 0;
  }
  if (argc > 1 && argv[1][0] != '-') {
    const char *cmd = argv[1];
    if (strcmp(cmd, "replay") == 0) return xb_cmd_replay(argc - 1, argv + 1);
    if (strcmp(cmd, "varbatch") == 0)
      return xb_cmd_varbatch(argc - 1, argv + 1);
    if (strcmp(cmd, "micro") == 0) return xb_cmd_micro(argc - 1, argv + 1);
    fprintf(stderr, "xseg-bench: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
  }
  return xb_cmd_default(argc, argv);
}
