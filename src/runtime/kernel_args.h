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

/* What a kernel with a record carries besides its arguments: their count, its largest
 * work-group size, and the scalar values it holds, so that a call does not set again a scalar
 * the kernel holds (the setters skip it) nor ask the driver again. A kept kernel's memo goes
 * from call to call: the program cache's slot owns it between calls (under the cache's lock),
 * the borrowing thread's record during one (the pointer is handed over, never shared). */
typedef struct clattn__kernel_memo clattn__kernel_memo;
void clattn__kernel_memo_free(clattn__kernel_memo *memo); /* NULL does nothing */

/* A kernel the program cache keeps carries the last call's arguments, so while a call holds it
 * this thread records which arguments the call set and which were buffers:
 *   clattn__args_begin     a fresh record for the kernel, which takes `memo` (NULL: none yet,
 *                          and the record makes one); false: this thread holds 16 kernels
 *                          already, the memo stays the caller's, and the kernel must be a
 *                          new one, never kept;
 *   clattn__args_complete  before an enqueue: every argument set by this call, else
 *                          CL_INVALID_KERNEL_ARGS, as a new kernel would give (a kernel with
 *                          no record is new, and its driver checks);
 *   clattn__args_end       the buffer arguments set to NULL and the record freed; *cleared is
 *                          false when the driver refused a NULL, and then the kernel must not
 *                          be kept. Returns the kernel's memo, the caller's now (or NULL).
 * Why NULL: some drivers (Mesa's rusticl) retain the buffers a kernel's arguments name, which
 * would keep the caller's released tensors and the call's scratch alive. */
bool clattn__args_begin(cl_kernel kernel, clattn__kernel_memo *memo);
int clattn__args_complete(cl_kernel kernel);
clattn__kernel_memo *clattn__args_end(cl_kernel kernel, bool *cleared);
/* The largest work-group size the memo of a kernel this thread holds keeps: stores `max_group`
 * when it is not 0; returns what is kept (0: nothing yet, or the kernel has no memo). */
size_t clattn__memo_max_group(cl_kernel kernel, size_t max_group);

#endif
