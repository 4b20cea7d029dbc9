/* error.h: the one place where failures become messages. */
#ifndef XS_VMM_ERROR_H
#define XS_VMM_ERROR_H

#include <stddef.h>

#include "xseg.h"

/* Sets the calling thread's last-error message and returns s. */
xseg_status xs_error(xseg_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Formats bytes as PyTorch does ("20.00 MiB") into buf, for messages. */
const char *xs_format_bytes(size_t bytes, char *buf, size_t size);

#endif
