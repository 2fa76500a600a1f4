/*
 * Launch helpers every op uses: kernel arguments, work-group sizes, enqueueing one kernel or a
 * call of several steps.
 */
#include "launch.h"
#include "config.h"
#include "hooks.h"
#include "status.h"

int clattn__begin_call(clattn__call *call, cl_command_queue queue, cl_uint num_wait,
                       const cl_event *wait_list, cl_event *event) {
    clattn__clear_error();
    *call = (clattn__call){queue, NULL, NULL, num_wait, wait_list, event};
    if (event) *event = NULL;
    if ((num_wait > 0) != (wait_list != NULL))
        return clattn__fail(CL_INVALID_EVENT_WAIT_LIST, "num_wait = %u does not match wait_list %s",
                            num_wait, wait_list ? "(non-NULL)" : "(NULL)");
    for (cl_uint i = 0; i < num_wait; ++i)
        if (!wait_list[i])
            return clattn__fail(CL_INVALID_EVENT_WAIT_LIST, "wait_list[%u] is NULL", i);
    if (!queue) return clattn__fail(CL_INVALID_COMMAND_QUEUE, "queue is NULL");
    cl_int err =
        clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof call->context, &call->context, NULL);
    if (err == CL_SUCCESS)
        err =
            clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof call->device, &call->device, NULL);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "clGetCommandQueueInfo(queue)");
    /* a malformed CLATTN_MAX_WORK_GROUP or CLATTN_MAX_LOCAL_MEMORY fails here, before a call of
     * several steps enqueues its first (each launch reads them again) */
    size_t cap;
    cl_ulong local_cap;
    int status = clattn__group_cap(&cap);
    return status == CLATTN_SUCCESS ? clattn__local_memory_cap(&local_cap) : status;
}

size_t clattn__pow2_at_least(size_t n, size_t cap) {
    size_t p = 1;
    while (p < n && p < cap) p <<= 1;
    return p < cap ? p : cap;
}

size_t clattn__round_up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

int clattn__set_idx_arg(cl_kernel kernel, cl_uint index, uint64_t value, bool wide) {
    return wide ? clattn__set_ulong_arg(kernel, index, value)
                : clattn__set_uint_arg(kernel, index, (cl_uint)value);
}

int clattn__set_view_args(cl_kernel kernel, cl_uint *arg, const clattn_tensor *t, int first,
                          bool wide) {
    int status = clattn__set_buffer_arg(kernel, (*arg)++, t->buffer);
    if (status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, (*arg)++, t->offset, wide);
    for (int i = first; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_idx_arg(kernel, (*arg)++, (uint64_t)t->strides[i], wide);
    return status;
}

int clattn__set_int_args(cl_kernel kernel, cl_uint *arg, const int64_t *values, int count) {
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_int_arg(kernel, (*arg)++, (cl_int)values[i]);
    return status;
}

int clattn__set_views_args(cl_kernel kernel, cl_uint *arg, const clattn_tensor *const *views,
                           int count, bool wide) {
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_view_args(kernel, arg, views[i], 0, wide);
    return status;
}

/* The kernel's largest group on the device, before the cap: kept in the kernel's memo (three
 * driver queries a call otherwise, for a kernel the program cache keeps). */
static int uncapped_max_group(cl_kernel kernel, cl_device_id device, size_t *size) {
    *size = clattn__memo_max_group(kernel, 0);
    if (*size) return CLATTN_SUCCESS;
    size_t wg = 0, dims[16] = {0};
    cl_uint num_dims = 0;
    cl_int err =
        clGetKernelWorkGroupInfo(kernel, device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, sizeof num_dims,
                              &num_dims, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_SIZES,
                              sizeof(size_t) * (num_dims < 16 ? num_dims : 16), dims, NULL);
    if (err != CL_SUCCESS) return clattn__cl_fail(err, "querying the kernel's work-group size");
    *size = wg < dims[0] ? wg : dims[0];
    clattn__memo_max_group(kernel, *size);
    return CLATTN_SUCCESS;
}

int clattn__kernel_max_group(cl_kernel kernel, cl_device_id device, size_t *size) {
    size_t cap;
    int status = clattn__group_cap(&cap);
    if (status == CLATTN_SUCCESS) status = uncapped_max_group(kernel, device, size);
    if (status != CLATTN_SUCCESS) return status;
    if (*size > cap) *size = cap;
    if (*size == 0) *size = 1;
    return CLATTN_SUCCESS;
}

int clattn__enqueue(const clattn__call *call, cl_kernel kernel, cl_uint dims, const size_t *global,
                    const size_t *local) {
    const bool traced = clattn__tracing();
    cl_event own = NULL; /* the trace's, where the call asks for no event */
    cl_event *event = call->event || !traced ? call->event : &own;
    int status = clattn__args_complete(kernel);
    if (status != CLATTN_SUCCESS) {
        if (call->event) *call->event = NULL;
        return status;
    }
    cl_int err = clEnqueueNDRangeKernel(call->queue, kernel, dims, NULL, global, local,
                                        call->num_wait, call->wait_list, event);
    if (err != CL_SUCCESS) {
        if (call->event) *call->event = NULL;
        return clattn__cl_fail(err, "clEnqueueNDRangeKernel");
    }
    if (traced) {
        char name[64] = "";
        clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, NULL);
        clattn__trace_record(name, *event);
    }
    if (own) clReleaseEvent(own);
    return CLATTN_SUCCESS;
}

bool clattn__queue_out_of_order(cl_command_queue queue) {
    cl_command_queue_properties props = 0;
    clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    return (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0;
}

int clattn__steps_begin(const clattn__call *call) {
    if (call->num_wait == 0) return CLATTN_SUCCESS;
    cl_int err = clEnqueueBarrierWithWaitList(call->queue, call->num_wait, call->wait_list, NULL);
    return err == CL_SUCCESS ? CLATTN_SUCCESS
                             : clattn__cl_fail(err, "clEnqueueBarrierWithWaitList");
}

int clattn__steps_boundary(const clattn__call *call, bool out_of_order) {
    if (!out_of_order) return CLATTN_SUCCESS;
    cl_int err = clEnqueueBarrierWithWaitList(call->queue, 0, NULL, NULL);
    return err == CL_SUCCESS ? CLATTN_SUCCESS
                             : clattn__cl_fail(err, "clEnqueueBarrierWithWaitList");
}

int clattn__steps_end(const clattn__call *call) {
    if (!call->event) return CLATTN_SUCCESS;
    cl_int err = clEnqueueMarkerWithWaitList(call->queue, 0, NULL, call->event);
    if (err == CL_SUCCESS) return CLATTN_SUCCESS;
    *call->event = NULL;
    return clattn__cl_fail(err, "clEnqueueMarkerWithWaitList");
}

clattn__call clattn__step_call(const clattn__call *call) {
    return (clattn__call){call->queue, call->context, call->device, 0, NULL, NULL};
}

int clattn__head_lanes(cl_uint width, int64_t d, int64_t dv) {
    int lanes = width >= 16 ? 16 : width >= 8 ? 8 : width >= 4 ? 4 : 1;
    while (lanes > 1 && (d % lanes || dv % lanes)) lanes /= 2;
    return lanes == 2 ? 1 : lanes;
}

int clattn__enqueue_link(const clattn__call *call, cl_kernel kernel, size_t global, size_t local,
                         cl_event *prev, bool last) {
    cl_event next = NULL;
    clattn__call link = *call;
    if (*prev) link.num_wait = 1, link.wait_list = prev;
    if (!last) link.event = &next;
    int status = clattn__enqueue(&link, kernel, 1, &global, &local);
    if (*prev) clReleaseEvent(*prev);
    *prev = next;
    return status;
}

int clattn__enqueue_items(const clattn__call *call, cl_kernel kernel, size_t items, size_t cap,
                          cl_event *prev, bool last) {
    size_t group = 1;
    int status = clattn__kernel_max_group(kernel, call->device, &group);
    if (status != CLATTN_SUCCESS) return status;
    const size_t local = group < cap ? group : cap;
    return clattn__enqueue_link(call, kernel, clattn__round_up(items, local), local, prev, last);
}
