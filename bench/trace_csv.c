/* trace_csv.c: RAPIDS RMM's replay-log CSV, plain or gzip-compressed.
 *
 *   Thread,Time,Action,Pointer,Size,Stream
 *   0,0.000,allocate,0x2459e740,16384000,0
 *   0,29326.098,free,0x2459e740,16384000,0
 *
 * Read line by line with zlib (gzgets reads plain files unchanged), so a
 * trace never sits in memory as text. Every field is checked: the first bad
 * one stops the load with the file, the line number and what is wrong.
 * Time is in microseconds (the bundled traces' unit, with ns decimals); it
 * is kept in ns, and only a replay under --gpu-lag looks at it.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "bench.h"

/* XB_LINE_MAX: bytes in a line, its newline not counted. */
enum { XB_COLUMNS = 6, XB_LINE_MAX = 1022 };
static const char xb_header[] = "Thread,Time,Action,Pointer,Size,Stream";

typedef struct xb_row {
  int action;                       /* XB_EV_ALLOC, XB_EV_FREE, -1 = skip */
  uint64_t pointer, size;
  int64_t stream;
  uint64_t time_ns;
} xb_row;

static char *field_trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

/* Splits line at commas into exactly XB_COLUMNS trimmed fields. */
static bool row_split(char *line, char **f, xb_error *err) {
  int n = 0;
  for (char *p = line;; n++) {
    char *comma = strchr(p, ',');
    if (n < XB_COLUMNS) f[n] = p;
    if (comma == NULL) break;
    *comma = '\0';
    p = comma + 1;
  }
  n++;
  if (n < XB_COLUMNS)
    return xb_fail(err, "missing column: %d of %d (%s)", n, XB_COLUMNS,
                   xb_header);
  if (n > XB_COLUMNS)
    return xb_fail(err, "extra column: %d fields, expected %d (%s)", n,
                   XB_COLUMNS, xb_header);
  for (int i = 0; i < XB_COLUMNS; i++) f[i] = field_trim(f[i]);
  return true;
}

/* A whole field as a number in `base`; false if anything is left over. */
static bool parse_i64(const char *s, int base, int64_t *out) {
  if (*s == '\0') return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, base);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

static bool parse_hex(const char *s, uint64_t *out) {
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
  size_t n = strlen(s);
  if (n == 0 || n > 16 || strspn(s, "0123456789abcdefABCDEF") != n)
    return false;
  *out = strtoull(s, NULL, 16);
  return true;
}

static bool parse_size(const char *s, uint64_t *out, xb_error *err) {
  if (s[0] == '-') return xb_fail(err, "negative size '%s'", s);
  size_t n = strlen(s);
  if (n == 0 || strspn(s, "0123456789") != n)
    return xb_fail(err, "bad size '%s' (expected decimal bytes)", s);
  errno = 0;
  *out = strtoull(s, NULL, 10);
  if (errno != 0 || *out > XB_MAX_SIZE)
    return xb_fail(err, "size '%s' out of range (at most 2^62, xseg's "
                   "largest request)", s);
  return true;
}

/* RMM writes the stream as a number or, for a handle, in hex. */
static bool parse_stream(const char *s, int64_t *out) {
  uint64_t u;
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
    return parse_hex(s, &u) && (*out = (int64_t)u, true);
  return parse_i64(s, 10, out);
}

static bool parse_action(const char *s, int *out, xb_error *err) {
  if (strcmp(s, "allocate") == 0) return *out = XB_EV_ALLOC, true;
  if (strcmp(s, "free") == 0) return *out = XB_EV_FREE, true;
  if (strcmp(s, "allocate failure") == 0) return *out = -1, true;
  return xb_fail(err, "bad action '%s' (expected allocate or free)", s);
}

static bool row_parse(char *line, xb_row *r, xb_error *err) {
  char *f[XB_COLUMNS];
  if (!row_split(line, f, err)) return false;
  int64_t thread;
  if (!parse_i64(f[0], 10, &thread) || thread < 0)
    return xb_fail(err, "bad thread id '%s'", f[0]);
  char *end;
  double time = strtod(f[1], &end);
  if (f[1][0] == '\0' || *end != '\0' || !isfinite(time))
    return xb_fail(err, "bad time '%s'", f[1]);
  if (time < 0 || time > 1.8e13)
    return xb_fail(err, "time '%s' out of range (0 to 1.8e13 us)", f[1]);
  r->time_ns = (uint64_t)llround(time * 1000.0);
  if (!parse_action(f[2], &r->action, err)) return false;
  if (!parse_hex(f[3], &r->pointer))
    return xb_fail(err, "bad hex pointer '%s'", f[3]);
  if (!parse_size(f[4], &r->size, err)) return false;
  if (!parse_stream(f[5], &r->stream))
    return xb_fail(err, "bad stream '%s'", f[5]);
  return true;
}

static bool row_apply(xb_trace *t, const xb_row *r, xb_error *err) {
  xb_trace_at(t, r->time_ns);
  if (r->action == XB_EV_ALLOC)
    return xb_trace_alloc(t, r->pointer, r->size, r->stream, err);
  if (r->action == XB_EV_FREE)
    return xb_trace_free(t, r->pointer, r->size, r->stream, err);
  return true;
}

static bool line_blank(const char *s) {
  return s[strspn(s, " \t\r\n")] == '\0';
}

/* One line of a trace, without its newline. */
typedef struct xb_line {
  char text[XB_LINE_MAX + 1];
  bool too_long;                    /* text holds its first XB_LINE_MAX */
  bool nul;                         /* a NUL byte: not text */
  bool newline;                     /* ended by one, not by the file */
} xb_line;

/* Reads one line byte by byte (gzgets would end the text at a NUL byte
   and hide the rest); false at end of file. A line longer than the buffer
   is an error, not two lines: it is not read further. */
static bool line_read(gzFile f, xb_line *l) {
  size_t n = 0;
  int c;
  l->too_long = l->nul = false;
  while (!l->too_long && (c = gzgetc(f)) != -1 && c != '\n') {
    l->nul = l->nul || c == '\0';
    l->too_long = n == XB_LINE_MAX;
    if (!l->too_long) l->text[n++] = (char)c;
  }
  l->text[n] = '\0';
  l->newline = c == '\n';
  return n > 0 || c != -1;
}

/* True, with why in err, when zlib stopped at an error: a gzip file cut
   short ends in a line cut short, which is no bad row. */
static bool read_failed(gzFile f, const char *path, long line,
                        xb_error *err) {
  int zerr = Z_OK;
  const char *msg = gzerror(f, &zerr);
  if (zerr == Z_OK || zerr == Z_STREAM_END) return false;
  size_t named = strlen(path);      /* zlib's message starts "path: " */
  if (strncmp(msg, path, named) == 0 && strncmp(msg + named, ": ", 2) == 0)
    msg += named + 2;
  if (zerr == Z_BUF_ERROR)
    xb_fail(err, "%s:%ld: the file is truncated (%s)", path, line, msg);
  else
    xb_fail(err, "%s:%ld: read error: %s", path, line, msg);
  return true;
}

/* A UTF-8 byte-order mark before the header (some editors write one) is
   no part of it. */
static bool header_check(char *line, xb_error *err) {
  static const char bom[] = "\xEF\xBB\xBF";
  if (strncmp(line, bom, sizeof bom - 1) == 0) line += sizeof bom - 1;
  char *h = field_trim(line);
  if (strcmp(h, xb_header) != 0)
    return xb_fail(err, "expected the header '%s', got '%.60s'", xb_header, h);
  return true;
}

/* The base name less .gz and .csv: the trace's name in reports. */
static void trace_name(const char *path, char *out, size_t size) {
  const char *base = strrchr(path, '/');
  snprintf(out, size, "%s", base != NULL ? base + 1 : path);
  size_t n = strlen(out);
  if (n > 3 && strcmp(out + n - 3, ".gz") == 0) out[n -= 3] = '\0';
  if (n > 4 && strcmp(out + n - 4, ".csv") == 0) out[n - 4] = '\0';
}

static bool trace_read(gzFile f, const char *path, xb_trace *t,
                       xb_error *err) {
  xb_line line;
  long no = 1;
  for (; line_read(f, &line); no++) {
    xb_error why;
    xb_row row = {0};           /* -O3 cannot see row_parse fill it */
    bool ok;
    if (line.too_long)
      ok = xb_fail(&why, "line longer than %d bytes", XB_LINE_MAX);
    else if (line.nul)
      ok = xb_fail(&why, "NUL byte in line %ld", no);
    else if (no == 1)
      ok = header_check(line.text, &why);
    else
      ok = line_blank(line.text) ||
           (row_parse(line.text, &row, &why) && row_apply(t, &row, &why));
    if (!ok && !line.newline && read_failed(f, path, no, err)) return false;
    if (!ok) return xb_fail(err, "%s:%ld: %s", path, no, why.text);
  }
  if (read_failed(f, path, no, err)) return false;
  if (t->n_events == 0 && t->n_allocs == 0)
    return xb_fail(err, "%s: no events (empty file or header only)", path);
  return true;
}

bool xb_trace_load(const char *path, xb_trace *t, xb_error *err) {
  char name[128];
  trace_name(path, name, sizeof name);
  xb_trace_init(t, name);
  gzFile f = gzopen(path, "rb");
  if (f == NULL)
    return xb_fail(err, "%s: cannot open: %s", path,
                   errno ? strerror(errno) : "out of memory");
  gzbuffer(f, 1 << 17);
  bool ok = trace_read(f, path, t, err);
  gzclose(f);
  xb_trace_done(t);
  if (!ok) xb_trace_release(t);
  return ok;
}

/* ---- writing ------------------------------------------------------------ */

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && strcmp(s + n - k, tail) == 0;
}

/* A made-up device address per slot: 2 MiB apart, so no two live blocks
   share one and each looks like an allocation. */
static uint64_t slot_pointer(uint32_t slot) {
  return 0x7f0000000000ull + ((uint64_t)slot << 21);
}

static bool rows_write(gzFile f, const xb_trace *t) {
  if (gzprintf(f, "%s\n", xb_header) <= 0) return false;
  for (size_t i = 0; i < t->n_events; i++) {
    const xb_event *e = &t->events[i];
    if (gzprintf(f, "0,%llu.%03u,%s,0x%llx,%llu,%lld\n",
                 (unsigned long long)(e->time_ns / 1000),
                 (unsigned)(e->time_ns % 1000),
                 e->action == XB_EV_ALLOC ? "allocate" : "free",
                 (unsigned long long)slot_pointer(e->slot),
                 (unsigned long long)e->size,
                 (long long)t->stream_ids[e->stream]) <= 0)
      return false;
  }
  return true;
}

bool xb_trace_write(const char *path, const xb_trace *t, xb_error *err) {
  gzFile f = gzopen(path, ends_with(path, ".gz") ? "wb9" : "wT");
  if (f == NULL)
    return xb_fail(err, "%s: cannot create: %s", path,
                   errno ? strerror(errno) : "out of memory");
  bool ok = rows_write(f, t);
  int zerr = Z_OK;
  const char *msg = ok ? "" : gzerror(f, &zerr);
  char why[128];
  snprintf(why, sizeof why, "%s", msg);
  int rc = gzclose(f);
  if (!ok) return xb_fail(err, "%s: write failed: %s", path, why);
  if (rc != Z_OK) return xb_fail(err, "%s: write failed on close", path);
  return true;
}
