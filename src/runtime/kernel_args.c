/*
 * Kernel arguments, the per-thread record of a lent kernel's, and the memo a kept kernel
 * carries from one call to the next (kernel_args.h).
 */
#include "kernel_args.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A call holds at most nine kernels at once (linear attention's backward); a kernel takes at
 * most about a hundred arguments, twenty of them buffers. A kernel past these limits fails its
 * setter, loudly, rather than being kept with arguments nothing checks or clears. Records are
 * the thread's: a kernel is set, enqueued and given back on the thread that took it (one given
 * back elsewhere would leave its record, and its memo, here until a kernel at its address
 * takes the record, or the thread ends). */
enum { RECORDED_KERNELS = 16, RECORDED_ARGS = 256, RECORDED_BUFFERS = 32 };

/* A scalar the kernel holds: its bytes and size (0: not known, or a buffer's argument). */
typedef struct held_scalar {
    uint64_t bits;
    uint8_t size;
} held_scalar;

struct clattn__kernel_memo {
    size_t max_group; /* clattn__memo_max_group's, 0 until stored */
    cl_uint num_args; /* CL_KERNEL_NUM_ARGS */
    held_scalar held[];
};

typedef struct arg_record {
    cl_kernel kernel;                 /* NULL: a free record */
    clattn__kernel_memo *memo;        /* the record's while the call holds the kernel; or NULL */
    uint64_t set[RECORDED_ARGS / 64]; /* a bit an argument this call set */
    int buffers;
    cl_uint buffer[RECORDED_BUFFERS];
} arg_record;
static _Thread_local arg_record records[RECORDED_KERNELS];
static _Thread_local size_t driver_sets; /* clSetKernelArg calls, for the tests */

static arg_record *record_of(cl_kernel kernel) {
    for (int i = 0; i < RECORDED_KERNELS; ++i)
        if (records[i].kernel == kernel) return &records[i];
    return NULL;
}

/* A memo for a kernel that has none yet: nothing held (NULL when out of memory or the driver
 * will not say how many arguments the kernel takes: then every argument is set every call). */
static clattn__kernel_memo *new_memo(cl_kernel kernel) {
    cl_uint count = 0;
    if (clGetKernelInfo(kernel, CL_KERNEL_NUM_ARGS, sizeof count, &count, NULL) != CL_SUCCESS)
        return NULL;
    clattn__kernel_memo *memo = calloc(1, sizeof *memo + count * sizeof memo->held[0]);
    if (memo) memo->num_args = count;
    return memo;
}

void clattn__kernel_memo_free(clattn__kernel_memo *memo) {
    free(memo);
}

/* The scalar the memo says the kernel holds at `index`, for a scalar argument; else NULL. */
static held_scalar *held_at(const arg_record *r, cl_uint index, size_t size, bool buffer) {
    if (!r || !r->memo || index >= r->memo->num_args) return NULL;
    held_scalar *h = &r->memo->held[index];
    if (buffer) h->size = 0; /* (a buffer is set every call, and cleared at its end) */
    return buffer || size > sizeof h->bits ? NULL : h;
}

/* Sets one argument and records it (a buffer's index too, when `buffer`): a kernel past the
 * record's limits fails before its argument is set, so no kernel is ever kept naming a buffer
 * the record does not know. A scalar the kept kernel holds already is not set again: a
 * driver's clSetKernelArg can cost as much as the rest of a small call (rusticl: 3.6k
 * instructions an argument, a hundred thousand for an attention call's thirty). */
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
    held_scalar *held = held_at(r, index, size, buffer);
    uint64_t bits = 0;
    memcpy(&bits, value, held ? size : 0);
    const bool holds = held && held->size == size && held->bits == bits;
    driver_sets += !holds;
    cl_int err = holds ? CL_SUCCESS : clSetKernelArg(kernel, index, size, value);
    if (held) *held = (held_scalar){bits, err == CL_SUCCESS ? (uint8_t)size : 0};
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
/* (a NULL buffer is a scalar 0 to the record and the memo: nothing to clear, and set once) */
int clattn__set_buffer_arg(cl_kernel kernel, cl_uint index, cl_mem buffer) {
    return set_arg(kernel, index, sizeof buffer, &buffer, buffer != NULL);
}

bool clattn__args_begin(cl_kernel kernel, clattn__kernel_memo *memo) {
    arg_record *r = record_of(kernel); /* (a record left by a kernel freed at this address) */
    if (!r) r = record_of(NULL);
    if (r) {
        clattn__kernel_memo_free(r->memo);
        *r = (arg_record){.kernel = kernel, .memo = memo ? memo : new_memo(kernel)};
    }
    return r != NULL;
}

int clattn__args_complete(cl_kernel kernel) {
    const arg_record *r = record_of(kernel);
    cl_uint count = r && r->memo ? r->memo->num_args : 0;
    if (!r || (!r->memo && clGetKernelInfo(kernel, CL_KERNEL_NUM_ARGS, sizeof count, &count,
                                           NULL) != CL_SUCCESS))
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

size_t clattn__args_driver_sets(void) {
    return driver_sets;
}

size_t clattn__memo_max_group(cl_kernel kernel, size_t max_group) {
    arg_record *r = record_of(kernel);
    if (!r || !r->memo) return 0;
    if (max_group) r->memo->max_group = max_group;
    return r->memo->max_group;
}

clattn__kernel_memo *clattn__args_end(cl_kernel kernel, bool *cleared) {
    arg_record *r = record_of(kernel);
    const cl_mem none = NULL;
    *cleared = true;
    for (int i = 0; r && i < r->buffers; ++i)
        *cleared &= clSetKernelArg(kernel, r->buffer[i], sizeof none, &none) == CL_SUCCESS;
    clattn__kernel_memo *memo = r ? r->memo : NULL;
    if (r) *r = (arg_record){.kernel = NULL};
    return memo;
}
