/*
 * Kernel arguments and the per-thread record of a lent kernel's (kernel_args.h).
 */
#include "kernel_args.h"

#include <stdint.h>

/* A call holds at most nine kernels at once (linear attention's backward); a kernel takes at
 * most about a hundred arguments, twenty of them buffers. A kernel past these limits fails its
 * setter, loudly, rather than being kept with arguments nothing checks or clears. Records are
 * the thread's: a kernel is set, enqueued and given back on the thread that took it. */
enum { RECORDED_KERNELS = 16, RECORDED_ARGS = 256, RECORDED_BUFFERS = 32 };
typedef struct arg_record {
    cl_kernel kernel;                 /* NULL: a free record */
    uint64_t set[RECORDED_ARGS / 64]; /* a bit an argument this call set */
    int buffers;
    cl_uint buffer[RECORDED_BUFFERS];
} arg_record;
static _Thread_local arg_record records[RECORDED_KERNELS];

static arg_record *record_of(cl_kernel kernel) {
    for (int i = 0; i < RECORDED_KERNELS; ++i)
        if (records[i].kernel == kernel) return &records[i];
    return NULL;
}

/* Sets one argument and records it (a buffer's index too, when `buffer`): a kernel past the
 * record's limits fails before its argument is set, so no kernel is ever kept naming a buffer
 * the record does not know. */
static int set_arg(cl_kernel kernel, cl_uint index, size_t size, const void *value, bool buffer) {
    arg_record *r = record_of(kernel);
    bool known = false; /* a buffer index already recorded */
    for (int i = 0; r && buffer && i < r->buffers; ++i) known = known || r->buffer[i] == index;
    if (r && index >= RECORDED_ARGS)
        return clattn__fail(CL_INVALID_ARG_INDEX, "argument %u: clattn records %d a kernel", index,
                            RECORDED_ARGS);
    if (r && buffer && !known && r->buffers == RECORDED_BUFFERS)
        return clattn__fail(CL_INVALID_ARG_INDEX, "buffer argument %u: clattn records %d a kernel",
                            index, RECORDED_BUFFERS);
    cl_int err = clSetKernelArg(kernel, index, size, value);
    if (err != CL_SUCCESS)
        return clattn__fail(err, "clSetKernelArg(%u) failed: %s", index, clattn_status_name(err));
    if (!r) return CLATTN_SUCCESS;
    r->set[index / 64] |= (uint64_t)1 << (index % 64);
    if (buffer && !known) r->buffer[r->buffers++] = index;
    return CLATTN_SUCCESS;
}

int clattn__set_int_arg(cl_kernel kernel, cl_uint index, cl_int value) {
    return set_arg(kernel, index, sizeof value, &value, false);
}
int clattn__set_uint_arg(cl_kernel kernel, cl_uint index, cl_uint value) {
    return set_arg(kernel, index, sizeof value, &value, false);
}
int clattn__set_ulong_arg(cl_kernel kernel, cl_uint index, cl_ulong value) {
    return set_arg(kernel, index, sizeof value, &value, false);
}
int clattn__set_float_arg(cl_kernel kernel, cl_uint index, float value) {
    return set_arg(kernel, index, sizeof value, &value, false);
}
int clattn__set_buffer_arg(cl_kernel kernel, cl_uint index, cl_mem buffer) {
    return set_arg(kernel, index, sizeof buffer, &buffer, buffer != NULL);
}

bool clattn__args_begin(cl_kernel kernel) {
    arg_record *r = record_of(kernel); /* (a record left by a kernel freed at this address) */
    if (!r) r = record_of(NULL);
    if (r) *r = (arg_record){.kernel = kernel};
    return r != NULL;
}

int clattn__args_complete(cl_kernel kernel) {
    const arg_record *r = record_of(kernel);
    cl_uint count = 0;
    if (!r || clGetKernelInfo(kernel, CL_KERNEL_NUM_ARGS, sizeof count, &count, NULL) != CL_SUCCESS)
        return CLATTN_SUCCESS; /* (the driver checks a new kernel's arguments itself) */
    for (cl_uint i = 0; i < count; ++i)
        if (i >= RECORDED_ARGS || !(r->set[i / 64] >> (i % 64) & 1)) {
            char name[64] = "";
            clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, NULL);
            return clattn__fail(CL_INVALID_KERNEL_ARGS,
                                "argument %u of %s was not set by this call", i, name);
        }
    return CLATTN_SUCCESS;
}

bool clattn__args_end(cl_kernel kernel) {
    arg_record *r = record_of(kernel);
    bool cleared = true;
    const cl_mem none = NULL;
    for (int i = 0; r && i < r->buffers; ++i)
        cleared &= clSetKernelArg(kernel, r->buffer[i], sizeof none, &none) == CL_SUCCESS;
    if (r) *r = (arg_record){.kernel = NULL};
    return cleared;
}
