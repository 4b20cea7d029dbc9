/* error.c: status names and the thread-local last-error message.
 *
 * Every failing path of xseg ends in xs_error(), which formats the message
 * that xseg_last_error() returns and passes the status through, so a failure
 * is reported in one line: `return xs_error(XSEG_ERR_..., "...", ...);`.
 */
#include <stdarg.h>
#include <stdio.h>

#include "vmm/error.h"

static _Thread_local char last_error[1024];

const char *xseg_status_name(xseg_status s) {
  switch (s) {
    case XSEG_OK: return "XSEG_OK";
    case XSEG_ERR_INVALID_ARGUMENT: return "XSEG_ERR_INVALID_ARGUMENT";
    case XSEG_ERR_OUT_OF_MEMORY: return "XSEG_ERR_OUT_OF_MEMORY";
    case XSEG_ERR_UNKNOWN_POINTER: return "XSEG_ERR_UNKNOWN_POINTER";
    case XSEG_ERR_DRIVER: return "XSEG_ERR_DRIVER";
    case XSEG_ERR_NO_DRIVER: return "XSEG_ERR_NO_DRIVER";
    case XSEG_ERR_UNSUPPORTED: return "XSEG_ERR_UNSUPPORTED";
    case XSEG_ERR_CAPTURE: return "XSEG_ERR_CAPTURE";
  }
  return "XSEG_ERR_(unknown status)";
}

const char *xseg_last_error(void) { return last_error; }

xseg_status xs_error(xseg_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return s;
}

const char *xs_format_bytes(size_t bytes, char *buf, size_t size) {
  static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  if (u == 0)
    snprintf(buf, size, "%zu bytes", bytes);
  else
    snprintf(buf, size, "%.2f %s", v, units[u]);
  return buf;
}
