/* Kernels from the program cache, built on first use. Not installed. */
#ifndef CLATTN_RUNTIME_KERNEL_H
#define CLATTN_RUNTIME_KERNEL_H

#include "status.h"

/* A kernel ready for arguments, from the cached program of `op_file` ("heads.cl") built with
 * `options` for `device`. The caller releases the kernel (it is never shared, so setting its
 * arguments is thread-safe). */
int clattn__create_kernel(cl_context context, cl_device_id device, const char *op_file,
                          const char *options, const char *kernel_name, cl_kernel *kernel);

/* The widest group each of the `count` kernels `names` of that program takes on `device` (the
 * least of their clattn__kernel_max_group), built now: a plan asks the program it will launch,
 * whose compiler may take fewer work-items than the device (registers), and the program cache
 * keeps it for the enqueue. On a failure *most is 0; with no kernel, SIZE_MAX. */
int clattn__kernels_group_limit(cl_context context, cl_device_id device, const char *op_file,
                                const char *options, const char *const *names, int count,
                                size_t *most);

#endif
