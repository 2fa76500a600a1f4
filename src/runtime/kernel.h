/* Kernels from the program cache, built on first use. Not installed. */
#ifndef CLATTN_RUNTIME_KERNEL_H
#define CLATTN_RUNTIME_KERNEL_H

#include "status.h"

/* A kernel ready for arguments, from the cached program of `op_file` ("heads.cl") built with
 * `options` for `device`: one the cache keeps, when no other call holds it, else a new one. It
 * is the caller's alone until clattn__release_kernel (so setting its arguments is
 * thread-safe). A kept kernel carries its last call's scalar arguments, so the caller sets
 * every argument (kernel_args.h), which clattn__enqueue checks; the thread that takes a kernel
 * sets, enqueues and gives it back (the record of its arguments is that thread's). */
int clattn__create_kernel(cl_context context, cl_device_id device, const char *op_file,
                          const char *options, const char *kernel_name, cl_kernel *kernel);
/* Gives a kernel of clattn__create_kernel back once enqueued (the enqueue took its arguments),
 * its buffer arguments set to NULL (clattn__args_end; a kernel whose buffers could not
 * all be cleared is no longer kept), and drops the caller's reference: the one way to let go of
 * such a kernel (clReleaseKernel would leave its slot lent for good). NULL does nothing. */
void clattn__release_kernel(cl_kernel kernel);

/* The widest group each of the `count` kernels `names` of that program takes on `device` (the
 * least of their clattn__kernel_max_group), built now: a plan asks the program it will launch,
 * whose compiler may take fewer work-items than the device (registers), and the program cache
 * keeps it for the enqueue. On a failure *most is 0; with no kernel, SIZE_MAX. */
int clattn__kernels_group_limit(cl_context context, cl_device_id device, const char *op_file,
                                const char *options, const char *const *names, int count,
                                size_t *most);

#endif
