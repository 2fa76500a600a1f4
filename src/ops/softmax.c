/*
 * Masked softmax, forward and backward (cl/softmax.cl). This file validates, picks the kernel
 * variant for the device, and enqueues.
 */
#include "softmax.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* VARIANT is CLATTN__SOFTMAX_ROWS or CLATTN__SOFTMAX_GROUP; GROUP is the group size the kernel
 * is built and run with. */
typedef clattn__softmax_tuning softmax_params;

int clattn__softmax_plan(cl_device_id device, clattn_dtype dtype, softmax_params *p) {
    int status = clattn__softmax_tuning_get(device, dtype, p);
    if (status != CLATTN_SUCCESS) return status;
    /* a default row too large for this device's local memory recomputes the exponentials */
    if ((cl_ulong)p->GROUP * (cl_ulong)p->SCRATCH * 4 * 2 > clattn__device_local_bytes(device))
        p->SCRATCH = 0;
    /* the device's conversion rounds to nearest even only on a full profile */
    if (!clattn__device_full_profile(device)) p->HALF_CVT = 0;
    const int forced = clattn__hook_value(CLATTN__HOOK_SOFTMAX_VARIANT);
    if (forced >= 0) p->VARIANT = forced;
    return CLATTN_SUCCESS;
}

/* The VEC-key chunks each work-item of softmax_group keeps in registers (cl/softmax.cl HELD)
 * for a row of `aligned_keys` keys (0: the rows are not aligned): the power of two that covers
 * the row, at most HOLD; 0 (three passes) for a row longer than GROUP * HOLD chunks. Powers of
 * two keep the programs a device builds to a few. */
static long held_chunks(const softmax_params *p, int64_t aligned_keys) {
    if (p->VARIANT != CLATTN__SOFTMAX_GROUP || aligned_keys <= 0 || p->HOLD <= 0) return 0;
    const int64_t per_chunk_row = (int64_t)p->GROUP * p->VEC;
    const int64_t need = (aligned_keys + per_chunk_row - 1) / per_chunk_row;
    if (need > p->HOLD) return 0;
    long held = 1;
    while (held < need) held *= 2;
    return held < p->HOLD ? held : p->HOLD;
}

/* Builds the variant's kernel. A group variant whose GROUP the built kernel cannot run (its
 * CL_KERNEL_WORK_GROUP_SIZE is smaller: registers, local memory) is rebuilt without holding its
 * row in registers, and if that does not fit either, with the largest power of two it can (and
 * HOLD again). */
static int build_kernel(const clattn__call *call, const char *base_options, int64_t aligned_keys,
                        softmax_params *params, const char *name, cl_kernel *kernel) {
    const long hold = params->HOLD;
    for (;;) {
        char options[1024];
        const long held = held_chunks(params, aligned_keys);
        /* a group of the rows variant holds GROUP rows */
        snprintf(options, sizeof options, "%s -DROWS=%ld -DHELD=%ld", base_options, params->GROUP,
                 held);
        clattn__softmax_tuning_options(params, options, sizeof options);
        int status =
            clattn__create_kernel(call->context, call->device, "softmax.cl", options, name, kernel);
        size_t max_group = 1;
        if (status == CLATTN_SUCCESS)
            status = clattn__kernel_max_group(*kernel, call->device, &max_group);
        if (status != CLATTN_SUCCESS || params->VARIANT == CLATTN__SOFTMAX_ROWS ||
            max_group >= (size_t)params->GROUP)
            return status;
        clattn__release_kernel(*kernel);
        *kernel = NULL;
        if (held > 0) {
            clattn__warn("softmax: GROUP %ld exceeds the work-group limit %zu of the kernel that "
                         "holds rows in registers; streaming them",
                         params->GROUP, max_group);
            params->HOLD = 0;
            continue;
        }
        size_t smaller = 1;
        while (smaller * 2 <= max_group) smaller *= 2;
        clattn__warn("softmax: GROUP %ld exceeds this kernel's work-group limit %zu; using %zu",
                     params->GROUP, max_group, smaller);
        params->GROUP = (long)smaller;
        params->HOLD = hold;
    }
}

/* Enqueues one row-wise kernel over `rows` rows. */
static int enqueue_rows(const clattn__call *call, cl_kernel kernel, const softmax_params *params,
                        size_t rows) {
    size_t max_group = 1;
    int status = clattn__kernel_max_group(kernel, call->device, &max_group);
    if (status != CLATTN_SUCCESS) return status;
    if (params->VARIANT == CLATTN__SOFTMAX_GROUP) {
        const size_t group = (size_t)params->GROUP, global = rows * group;
        return clattn__enqueue(call, kernel, 1, &global, &group);
    }
    size_t local = (size_t)params->GROUP < max_group ? (size_t)params->GROUP : max_group;
    size_t global = clattn__round_up(rows, local);
    return clattn__enqueue(call, kernel, 1, &global, &local);
}

static bool same_view(const clattn_tensor *a, const clattn_tensor *b) {
    return a->buffer == b->buffer && a->offset == b->offset && a->dtype == b->dtype &&
           memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
           memcmp(a->strides, b->strides, sizeof a->strides) == 0;
}

/* In place means the identical view; any other overlap is refused. */
static int check_in_place(const char *out_name, const clattn_tensor *out, const char *in_name,
                          const clattn_tensor *in) {
    if (same_view(out, in)) return CLATTN_SUCCESS;
    return clattn__check_no_alias(out_name, out, in_name, in);
}

static int check_rows_limit(const clattn_tensor *x) {
    int64_t rows = x->shape[0] * x->shape[1] * x->shape[2];
    if (rows > 0x7fffffff || x->shape[3] > 0x7fffffff)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT,
                            "%lld rows of %lld: the kernels index rows and keys with int",
                            (long long)rows, (long long)x->shape[3]);
    return CLATTN_SUCCESS;
}

/* ---- forward ---- */

typedef clattn__softmax_args softmax_args;

int clattn__softmax_check(softmax_args *a, const clattn_mask *mask, cl_context context) {
    int status = isfinite(a->scale) ? CLATTN_SUCCESS
                                    : clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                                                   "scale = %g is not finite", (double)a->scale);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor("x", a->x, context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor("y", a->y, context, CLATTN__FLOAT_DTYPES, true);
    if (status == CLATTN_SUCCESS) status = clattn__check_same_shape("x", a->x, "y", a->y);
    if (status == CLATTN_SUCCESS) status = check_rows_limit(a->x);
    if (status == CLATTN_SUCCESS) status = check_in_place("y", a->y, "x", a->x);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_prepare(mask, a->x->shape, context, &a->mask);
    if (status == CLATTN_SUCCESS) status = clattn__mask_check_output(&a->mask, "y", a->y);
    if (status == CLATTN_SUCCESS && a->lse) {
        clattn__tensor_list inputs = {0};
        clattn__tensor_list_add(&inputs, "x", a->x);
        clattn__tensor_list_add(&inputs, "y", a->y);
        status = clattn__mask_check_lse(&a->mask, a->lse, a->x->shape, &inputs, context);
    }
    return status;
}

static bool softmax_needs_wide_index(const softmax_args *a) {
    const clattn_tensor *views[3] = {a->x, a->y, a->lse};
    return clattn__needs_wide_index(views, 3) || clattn__mask_needs_wide_index(&a->mask);
}

static int set_softmax_args(cl_kernel kernel, const softmax_args *a, bool wide) {
    cl_uint arg = 0;
    int status = clattn__set_view_args(kernel, &arg, a->x, 0, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, a->y, 0, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, a->x->shape, 4);
    if (status == CLATTN_SUCCESS && a->lse)
        status = clattn__set_view_args(kernel, &arg, a->lse, 1, wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->mask, a->scale, wide);
    return status;
}

/* The group variant moves whole VEC-key chunks when every row of its `n` tensors starts
 * VEC-aligned and the rows are whole chunks (cl/softmax.cl, ALIGNED). */
static bool group_rows_aligned(const softmax_params *params, cl_device_id device,
                               const clattn_tensor *const *views, int n) {
    if (params->VARIANT != CLATTN__SOFTMAX_GROUP || params->VEC < 4 ||
        views[0]->shape[3] % params->VEC != 0)
        return false;
    for (int i = 0; i < n; ++i)
        if (!clattn__rows_vector_aligned(views[i], views[i], params->VEC, device)) return false;
    return true;
}

int clattn__softmax_enqueue(const softmax_args *a, const softmax_params *plan,
                            const clattn__call *call) {
    softmax_params params = *plan; /* build_kernel may narrow its group */
    bool wide = softmax_needs_wide_index(a);
    const clattn_tensor *views[2] = {a->x, a->y};
    const bool aligned = group_rows_aligned(&params, call->device, views, 2);
    char options[768];
    snprintf(options, sizeof options,
             "-cl-std=CL1.2 -DX_T=%s -DY_T=%s -DHAS_LSE=%d -DLSE_T=%s -DCONTIG=%d -DALIGNED=%d "
             "-DIDX=%s -DEMPTY_NAN=%d",
             clattn_dtype_name(a->x->dtype), clattn_dtype_name(a->y->dtype), a->lse != NULL,
             clattn_dtype_name(a->lse ? a->lse->dtype : CLATTN_F32),
             a->x->strides[3] == 1 && a->y->strides[3] == 1, aligned, wide ? "ulong" : "uint",
             a->mask.empty_rows_nan);
    clattn__mask_options(&a->mask, options, sizeof options);
    const char *name = params.VARIANT == CLATTN__SOFTMAX_GROUP ? "softmax_group" : "softmax_rows";
    cl_kernel kernel = NULL;
    int status = build_kernel(call, options, aligned ? a->x->shape[3] : 0, &params, name, &kernel);
    if (status == CLATTN_SUCCESS) status = set_softmax_args(kernel, a, wide);
    if (status == CLATTN_SUCCESS)
        status = enqueue_rows(call, kernel, &params,
                              (size_t)(a->x->shape[0] * a->x->shape[1] * a->x->shape[2]));
    clattn__release_kernel(kernel);
    return status;
}

int clattn_softmax(const clattn_tensor *x, float scale, const clattn_mask *mask,
                   const clattn_tensor *y, const clattn_tensor *lse, cl_command_queue queue,
                   cl_uint num_wait, const cl_event *wait_list, cl_event *event) {
    clattn__call call;
    softmax_args a = {x, y, lse, scale, {0}};
    softmax_params plan;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = clattn__softmax_check(&a, mask, call.context);
    if (status == CLATTN_SUCCESS) status = clattn__softmax_plan(call.device, x->dtype, &plan);
    if (status != CLATTN_SUCCESS) return status;
    return clattn__softmax_enqueue(&a, &plan, &call);
}

/* ---- backward ---- */

typedef struct backward_args {
    const clattn_tensor *y, *dy, *dz;
    float scale;
} backward_args;

static int check_backward(const backward_args *a, cl_context context) {
    int status = clattn__check_tensor("y", a->y, context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor("dy", a->dy, context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor("dz", a->dz, context, CLATTN__FLOAT_DTYPES, true);
    if (status == CLATTN_SUCCESS) status = clattn__check_same_shape("y", a->y, "dy", a->dy);
    if (status == CLATTN_SUCCESS) status = clattn__check_same_shape("y", a->y, "dz", a->dz);
    if (status == CLATTN_SUCCESS) status = check_rows_limit(a->y);
    if (status == CLATTN_SUCCESS) status = clattn__check_no_alias("dz", a->dz, "y", a->y);
    if (status == CLATTN_SUCCESS) status = check_in_place("dz", a->dz, "dy", a->dy);
    return status;
}

int clattn__softmax_backward_enqueue(const clattn_tensor *y, const clattn_tensor *dy, float scale,
                                     const clattn_tensor *dz, const clattn__call *call) {
    const backward_args b = {y, dy, dz, scale};
    const backward_args *a = &b;
    softmax_params params;
    int status = clattn__softmax_plan(call->device, a->y->dtype, &params);
    if (status != CLATTN_SUCCESS) return status;
    const clattn_tensor *views[3] = {a->y, a->dy, a->dz};
    bool wide = clattn__needs_wide_index(views, 3);
    const bool aligned = group_rows_aligned(&params, call->device, views, 3);
    char options[256];
    snprintf(options, sizeof options,
             "-cl-std=CL1.2 -DY_T=%s -DDY_T=%s -DDZ_T=%s -DIDX=%s -DALIGNED=%d",
             clattn_dtype_name(a->y->dtype), clattn_dtype_name(a->dy->dtype),
             clattn_dtype_name(a->dz->dtype), wide ? "ulong" : "uint", aligned);
    const char *name = params.VARIANT == CLATTN__SOFTMAX_GROUP ? "softmax_backward_group"
                                                               : "softmax_backward_rows";
    cl_kernel kernel = NULL;
    status = build_kernel(call, options, aligned ? a->y->shape[3] : 0, &params, name, &kernel);
    cl_uint arg = 0;
    for (int v = 0; v < 3 && status == CLATTN_SUCCESS; ++v)
        status = clattn__set_view_args(kernel, &arg, views[v], 0, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, a->y->shape, 4);
    if (status == CLATTN_SUCCESS) status = clattn__set_float_arg(kernel, arg++, a->scale);
    if (status == CLATTN_SUCCESS)
        status = enqueue_rows(call, kernel, &params,
                              (size_t)(a->y->shape[0] * a->y->shape[1] * a->y->shape[2]));
    clattn__release_kernel(kernel);
    return status;
}

int clattn_softmax_backward(const clattn_tensor *y, const clattn_tensor *dy, float scale,
                            const clattn_tensor *dz, cl_command_queue queue, cl_uint num_wait,
                            const cl_event *wait_list, cl_event *event) {
    clattn__call call;
    backward_args a = {y, dy, dz, scale};
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS && !isfinite(scale))
        status =
            clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "scale = %g is not finite", (double)scale);
    if (status == CLATTN_SUCCESS) status = check_backward(&a, call.context);
    if (status != CLATTN_SUCCESS) return status;
    return clattn__softmax_backward_enqueue(y, dy, scale, dz, &call);
}
