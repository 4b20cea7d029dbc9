/* driver_sim.c: where `xseg_driver:sim` finds the emulator.
 *
 * No path is compiled in, so a build tree or an install prefix can move.
 * In order:
 *   1. the XSEG_SIM_LIBRARY environment variable;
 *   2. an emulator the process has loaded already (a program or a test that
 *      links it as its libcuda.so.1): its control API xsim_call_count is
 *      visible, and dladdr names its file; loading another copy would give
 *      two drivers whose handles do not mix;
 *   3. beside the file that holds this code (libxseg.so, or the program that
 *      libxseg.a is linked into), for folder D of that file:
 *        D/xseg/libcuda.so.1          installed libxseg.so in lib/
 *        D/../lib/xseg/libcuda.so.1   installed program in bin/
 *        D/sim/libcuda.so.1           libxseg.so in the build tree
 *        D/../sim/libcuda.so.1        a program in build/<folder>/
 */
#define _GNU_SOURCE   /* Dl_info, dladdr1 */
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmm/driver.h"
#include "vmm/error.h"

static const char *const sim_candidates[] = {
    "xseg/libcuda.so.1", "../lib/xseg/libcuda.so.1", "sim/libcuda.so.1",
    "../sim/libcuda.so.1"};
enum { XS_SIM_CANDIDATES = sizeof sim_candidates / sizeof *sim_candidates };

/* A loaded object's file name made absolute where it still resolves. The
   loader keeps the name it was given or found (relative when it came from
   a relative LD_LIBRARY_PATH, RUNPATH or dlopen); that same string also
   finds the loaded object again, so it is the answer when the working
   folder has changed since. */
static bool sim_file_name(const char *name, char *out, size_t n) {
  char abs[PATH_MAX];
  if (realpath(name, abs) != NULL) name = abs;
  return (size_t)snprintf(out, n, "%s", name) < n;
}

/* The emulator already loaded in this process, if any. */
static bool sim_loaded_path(char *out, size_t n) {
  void *sym = dlsym(RTLD_DEFAULT, "xsim_call_count");
  Dl_info info;
  if (sym == NULL || dladdr(sym, &info) == 0 || info.dli_fname == NULL ||
      info.dli_fname[0] == '\0')
    return false;
  return sim_file_name(info.dli_fname, out, n);
}

/* The folder of the file this function was loaded from. The main program's
   link map has an empty name (dladdr would give argv[0]), so it is read
   from /proc/self/exe; a shared object's may be relative. */
static bool sim_self_dir(char *out, size_t n) {
  Dl_info info;
  struct link_map *map = NULL;
  if (dladdr1((void *)sim_self_dir, &info, (void **)&map,
              RTLD_DL_LINKMAP) == 0)
    return false;
  if (map != NULL && map->l_name != NULL && map->l_name[0] != '\0') {
    if (!sim_file_name(map->l_name, out, n)) return false;
  } else {
    ssize_t len = readlink("/proc/self/exe", out, n - 1);
    if (len <= 0) return false;
    out[len] = '\0';
  }
  char *slash = strrchr(out, '/');
  if (slash == NULL) return false;
  *slash = '\0';
  return true;
}

xseg_status xs_driver_sim_path(char *out, size_t n) {
  const char *env = getenv("XSEG_SIM_LIBRARY");
  if (env != NULL && env[0] != '\0') {
    if ((size_t)snprintf(out, n, "%s", env) >= n)
      return xs_error(XSEG_ERR_INVALID_ARGUMENT,
                      "XSEG_SIM_LIBRARY is longer than %zu bytes", n - 1);
    return XSEG_OK;
  }
  if (sim_loaded_path(out, n)) return XSEG_OK;
  char dir[PATH_MAX];
  if (!sim_self_dir(dir, sizeof dir))
    return xs_error(XSEG_ERR_NO_DRIVER,
                    "xseg_driver:sim: cannot tell where libxseg was loaded "
                    "from; set XSEG_SIM_LIBRARY to the emulator's "
                    "libcuda.so.1");
  for (int i = 0; i < XS_SIM_CANDIDATES; i++)
    if ((size_t)snprintf(out, n, "%s/%s", dir, sim_candidates[i]) < n &&
        access(out, R_OK) == 0)
      return XSEG_OK;
  return xs_error(XSEG_ERR_NO_DRIVER,
                  "xseg_driver:sim: no emulator beside %s (looked for "
                  "xseg/libcuda.so.1, ../lib/xseg/libcuda.so.1, "
                  "sim/libcuda.so.1 and ../sim/libcuda.so.1 there); set "
                  "XSEG_SIM_LIBRARY to its path",
                  dir);
}
