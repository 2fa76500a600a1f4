/* Kernels from the program cache, built on first use. Not installed. */
#ifndef CLATTN_RUNTIME_KERNEL_H
#define CLATTN_RUNTIME_KERNEL_H

#include "status.h"

/* A kernel ready for arguments, from the cached program of `op_file` ("heads.cl") built with
 * `options` for `device`. The caller releases the kernel (it is never shared, so setting its
 * arguments is thread-safe). */
int clattn__create_kernel(cl_context context, cl_device_id device, const char *op_file,
                          const char *options, const char *kernel_name, cl_kernel *kernel);

#endif
