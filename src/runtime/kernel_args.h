/* Kernel arguments: a setter per kind, and, for a kernel the program cache lends to a call
 * (kernel.c), a record of what the call set. Not installed. */
#ifndef CLATTN_RUNTIME_KERNEL_ARGS_H
#define CLATTN_RUNTIME_KERNEL_ARGS_H

#include "status.h"

/* clSetKernelArg of one kind of value, the failure recorded. Buffers go through
 * clattn__set_buffer_arg alone (the record clears them when the call gives the kernel back). */
int clattn__set_int_arg(cl_kernel kernel, cl_uint index, cl_int value);
int clattn__set_uint_arg(cl_kernel kernel, cl_uint index, cl_uint value);
int clattn__set_ulong_arg(cl_kernel kernel, cl_uint index, cl_ulong value);
int clattn__set_float_arg(cl_kernel kernel, cl_uint index, float value);
int clattn__set_buffer_arg(cl_kernel kernel, cl_uint index, cl_mem buffer); /* NULL allowed */

/* A kernel the program cache keeps carries the last call's arguments, so while a call holds it
 * this thread records which arguments the call set and which were buffers:
 *   clattn__args_begin     a fresh record for the kernel (false: this thread holds 16 kernels
 *                          already; the kernel must then be a new one, never kept);
 *   clattn__args_complete  before an enqueue: every argument set by this call, else
 *                          CL_INVALID_KERNEL_ARGS, as a new kernel would give (a kernel with
 *                          no record is new, and its driver checks);
 *   clattn__args_end       the buffer arguments set to NULL and the record freed: false when
 *                          the driver refused a NULL, and then the kernel must not be kept.
 * Why NULL: some drivers (Mesa's rusticl) retain the buffers a kernel's arguments name, which
 * would keep the caller's released tensors and the call's scratch alive. */
bool clattn__args_begin(cl_kernel kernel);
int clattn__args_complete(cl_kernel kernel);
bool clattn__args_end(cl_kernel kernel);

#endif
