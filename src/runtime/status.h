/* Failure detail for clattn_last_error() and the log callback: how every layer reports. Not
 * installed. */
#ifndef CLATTN_RUNTIME_STATUS_H
#define CLATTN_RUNTIME_STATUS_H

#include "clattn.h"

#include <stdarg.h>
#include <stdbool.h>

#if defined(__GNUC__)
#define CLATTN_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define CLATTN_PRINTF(fmt, args)
#endif

/* Records `status` with a formatted detail for this thread, sends it to the log callback, and
 * returns `status`, so that a check reads `return clattn__fail(CLATTN_ERR_..., "...", ...)`. */
int clattn__fail(int status, const char *fmt, ...) CLATTN_PRINTF(2, 3);
/* Records an OpenCL error from `what` ("clEnqueueNDRangeKernel"); returns it unchanged. */
int clattn__cl_fail(cl_int err, const char *what);
/* Sends a warning to the log callback (status CLATTN_SUCCESS); does not touch the last error. */
void clattn__warn(const char *fmt, ...) CLATTN_PRINTF(1, 2);
/* Clears this thread's last error; each public entry point calls it first. */
void clattn__clear_error(void);

#endif
