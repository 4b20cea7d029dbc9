/* bench_helpers.h: what the bench's tests share (test_bench*.c): the
 * small hand-computed trace, temporary files, the driver the tests run on,
 * reading a file back, counting a string, running a command with its
 * output captured.
 */
#ifndef XSEG_TESTS_BENCH_HELPERS_H
#define XSEG_TESTS_BENCH_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "bench.h"
#include "xseg_test.h"

/* Hand-computed (sizes round to 512 B; the emulator's granule is 2 MiB):
     event                    live (512 B rounded)    live in granules
     0 alloc a 1000           1024                    2 MiB
     1 alloc b 3000000        1024 + 3000320          2 + 4 MiB
     2 alloc c 512            3001856                 8 MiB
     3 free a                 3000832                 6 MiB
     4 alloc a' 2097152 (a's address reused)
                              5097984  <- peak        8 MiB  <- peak
     5 free b                 2097664                 4 MiB
     6 alloc d 4096 on stream 7
                              2101760                 6 MiB
     7 free c                 2101248                 4 MiB  (end) */
static const char small_trace[] =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "0,0.000,allocate,0xa000,1000,0\n"
    "0,1.000,allocate,0xb000,3000000,0\n"
    "0,2.000,allocate,0xc000,512,0\n"
    "0,3.000,free,0xa000,1000,0\n"
    "0,4.000,allocate,0xa000,2097152,0\n"
    "0,5.000,free,0xb000,3000000,0\n"
    "0,6.000,allocate,0xd000,4096,7\n"
    "0,7.000,free,0xc000,512,0\n";
enum { SMALL_PEAK = 5097984, SMALL_END = 2101248 };
#define MIB (1024ull * 1024ull)

/* A temporary file holding `text`, gzip-compressed if asked. */
static inline bool temp_write(char *path, size_t size, const char *suffix,
                       const char *text, bool gzip) {
  const char *dir = getenv("TMPDIR");
  snprintf(path, size, "%s/xseg_bench_XXXXXX%s",
           dir != NULL && dir[0] ? dir : "/tmp", suffix);
  int fd = mkstemps(path, (int)strlen(suffix));
  if (fd < 0) return false;
  if (!gzip) {
    size_t n = strlen(text);
    bool ok = write(fd, text, n) == (ssize_t)n;
    return close(fd) == 0 && ok;
  }
  gzFile f = gzdopen(fd, "wb");
  if (f == NULL) return close(fd), false;
  bool ok = gzputs(f, text) == (int)strlen(text);
  return gzclose(f) == Z_OK && ok;
}

static const char *test_driver(void) {
  const char *d = getenv("XSEG_TEST_DRIVER");
  return d != NULL && strcmp(d, "system") == 0 ? "cuda" : "sim";
}

/* Loads the small trace through a temporary file; false (reported) when
   it cannot be written or read back. */
static inline bool load_small_trace(xb_trace *t) {
  char path[256];
  if (!temp_write(path, sizeof path, ".csv", small_trace, false))
    return XSEG_FAIL("cannot write the small trace to a temporary file");
  xb_error err;
  bool ok = xb_trace_load(path, t, &err);
  unlink(path);
  if (!ok) XSEG_FAIL("%s", err.text);
  return ok;
}

static char *file_read(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char *buf = calloc(1, 1 << 20);
  size_t n = buf != NULL ? fread(buf, 1, (1 << 20) - 1, f) : 0;
  fclose(f);
  if (buf != NULL) buf[n] = '\0';
  return buf;
}

static inline size_t count_of(const char *text, const char *what) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, what)) != NULL; p++) n++;
  return n;
}

/* What a command printed: stdout, stderr and its exit code. */
typedef struct captured {
  char *out, *err;
  int rc;
} captured;

/* Runs cmd with stdout and stderr sent to temporary files. */
static inline captured run_captured(int (*cmd)(int, char **), int argc,
                                    char **argv) {
  captured c = {NULL, NULL, -1};
  char out[256], err[256];
  if (!temp_write(out, sizeof out, ".out", "", false) ||
      !temp_write(err, sizeof err, ".err", "", false))
    return c;
  fflush(stdout);
  fflush(stderr);
  int saved_out = dup(1), saved_err = dup(2);
  FILE *fo = fopen(out, "w"), *fe = fopen(err, "w");
  if (fo != NULL && fe != NULL && saved_out >= 0 && saved_err >= 0) {
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    c.rc = cmd(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
  }
  if (fo != NULL) fclose(fo);
  if (fe != NULL) fclose(fe);
  if (saved_out >= 0) close(saved_out);
  if (saved_err >= 0) close(saved_err);
  c.out = file_read(out);
  c.err = file_read(err);
  unlink(out);
  unlink(err);
  return c;
}

static inline void captured_release(captured *c) {
  free(c->out);
  free(c->err);
}

#endif /* XSEG_TESTS_BENCH_HELPERS_H */
