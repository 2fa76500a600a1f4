/* Launch helpers every op uses: the call tail, kernel arguments, work-group sizes, enqueues. Not
 * installed. */
#ifndef CLATTN_RUNTIME_LAUNCH_H
#define CLATTN_RUNTIME_LAUNCH_H

#include "kernel_args.h"
#include "status.h"

/* The OpenCL tail of one enqueueing call, with the queue's context and device. */
typedef struct clattn__call {
    cl_command_queue queue;
    cl_context context;
    cl_device_id device;
    cl_uint num_wait;
    const cl_event *wait_list;
    cl_event *event; /* may be NULL */
} clattn__call;

/* The first step of every enqueueing entry point: clears this thread's last error, sets *event
 * to NULL (so every failure leaves it NULL), checks that the queue is valid and the wait list
 * consistent, and fills `call`. */
int clattn__begin_call(clattn__call *call, cl_command_queue queue, cl_uint num_wait,
                       const cl_event *wait_list, cl_event *event);

/* An index argument: cl_uint when `wide` is false, cl_ulong otherwise (the kernel's IDX). */
int clattn__set_idx_arg(cl_kernel kernel, cl_uint index, uint64_t value, bool wide);

/* The largest work-group size this kernel supports on this device (CL_KERNEL_WORK_GROUP_SIZE),
 * never more than the device's per-dimension limit for dimension 0. */
int clattn__kernel_max_group(cl_kernel kernel, cl_device_id device, size_t *size);

/* Head-dim vector lanes for the row kernels (cl/rows.cl): `width` (the tuning table's LANES)
 * as 16, 8, 4 or 1, narrowed until it divides both head dims; 1 (scalar code) for odd head dims
 * or a width below 4. */
int clattn__head_lanes(cl_uint width, int64_t d, int64_t dv);

/* A tensor argument as the kernels take it: buffer, offset, then the strides of dims first..3. */
int clattn__set_view_args(cl_kernel kernel, cl_uint *arg, const clattn_tensor *t, int first,
                          bool wide);

/* `count` int arguments (cl_int, from int64_t values the caller has bounded) from *arg on. */
int clattn__set_int_args(cl_kernel kernel, cl_uint *arg, const int64_t *values, int count);

/* clattn__set_view_args (every stride) for `count` views in order. */
int clattn__set_views_args(cl_kernel kernel, cl_uint *arg, const clattn_tensor *const *views,
                           int count, bool wide);

/* clEnqueueNDRangeKernel on the call's queue, after its wait list, into its event; the failure
 * recorded. */
int clattn__enqueue(const clattn__call *call, cl_kernel kernel, cl_uint dims, const size_t *global,
                    const size_t *local);

/* One kernel of a chain of dependent launches (1-D): it waits for *prev (the call's wait list
 * when *prev is NULL, as for the first), goes into the call's event when it is the last and
 * into *prev otherwise; the old *prev is released. An out-of-order queue runs the chain in
 * order. */
int clattn__enqueue_link(const clattn__call *call, cl_kernel kernel, size_t global, size_t local,
                         cl_event *prev, bool last);

/* clattn__enqueue_link over `items` work-items in groups of the kernel's largest size up to
 * `cap`, the global size rounded up to whole groups (the kernels check their own bounds). */
int clattn__enqueue_items(const clattn__call *call, cl_kernel kernel, size_t items, size_t cap,
                          cl_event *prev, bool last);

/* Calls that enqueue several steps (the composed attention path, MHA) wrap them so: a barrier
 * on the call's wait list first (nothing when it is empty), a barrier between dependent steps
 * on an out-of-order queue (an in-order one orders them already), and a marker into the call's
 * event last (nothing when event is NULL). Each records its failure. */
bool clattn__queue_out_of_order(cl_command_queue queue);
int clattn__steps_begin(const clattn__call *call);
int clattn__steps_boundary(const clattn__call *call, bool out_of_order);
int clattn__steps_end(const clattn__call *call);
/* One step of such a call: its queue, context and device, with no wait list (steps_begin waited
 * for it) and no event (steps_end gives the call's). */
clattn__call clattn__step_call(const clattn__call *call);

/* Smallest power of two >= n (n >= 1), capped at `cap`. */
size_t clattn__pow2_at_least(size_t n, size_t cap);
/* n rounded up to a multiple of m (m > 0). */
size_t clattn__round_up(size_t n, size_t m);

#endif
