/*
 * Fused scaled-dot-product attention (cl/attention.cl). This file validates, picks the launch
 * for the device, and enqueues.
 */
#include "mask.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Head dims are compile-time sizes of the kernel's private arrays. */
#define CLATTN_MAX_HEAD_DIM 256

int clattn__attention_variant_override = -1;

/* The launch of the fused kernel for a device class; these rows move to the tuning table when it
 * lands. The choice is by device type, never by vendor name:
 *  - CPUs (PoCL): attention_blocks, BM = 4 queries per work-item against BN = 16-key tiles, head
 *    dims in vectors of the preferred float width; 16 work-items per group.
 *  - GPUs and the rest: attention_tiles, a query per work-item in groups of 64 sharing K/V tiles
 *    of TK keys in local memory (TK as large as half the device's local memory allows, up to 32),
 *    head dims in float4 when they divide by 4. */
#define ATTENTION_BM          4
#define ATTENTION_BN          16
#define ATTENTION_BLOCKS_SIZE 16
#define ATTENTION_TILES_SIZE  64
#define ATTENTION_MAX_TK      32

typedef struct attention_launch {
    int variant; /* CLATTN__ATTENTION_BLOCKS or CLATTN__ATTENTION_TILES */
    int lanes;   /* head-dim vector width */
    int tk;      /* tiles: keys per local tile */
    size_t group;
} attention_launch;

typedef struct attention_args {
    const clattn_tensor *q, *k, *v, *out, *lse;
    float scale;
    clattn__mask_plan mask;
} attention_args;

static int check_dims(const attention_args *a) {
    const int64_t *q = a->q->shape, *k = a->k->shape, *v = a->v->shape, *o = a->out->shape;
    if (k[0] != q[0] || v[0] != q[0] || o[0] != q[0] || v[1] != k[1] || v[2] != k[2] ||
        k[3] != q[3] || o[1] != q[1] || o[2] != q[2] || o[3] != v[3])
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                            "expected q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv], out "
                            "[B,Hq,Sq,Dv]; got q [%lld,%lld,%lld,%lld] k [%lld,%lld,%lld,%lld] v "
                            "[%lld,%lld,%lld,%lld] out [%lld,%lld,%lld,%lld]",
                            (long long)q[0], (long long)q[1], (long long)q[2], (long long)q[3],
                            (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3],
                            (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3],
                            (long long)o[0], (long long)o[1], (long long)o[2], (long long)o[3]);
    if (q[1] % k[1] != 0)
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                            "Hq = %lld is not a multiple of Hkv = %lld (GQA groups query heads)",
                            (long long)q[1], (long long)k[1]);
    if (q[3] > CLATTN_MAX_HEAD_DIM || v[3] > CLATTN_MAX_HEAD_DIM)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "head dims D = %lld, Dv = %lld: at most %d",
                            (long long)q[3], (long long)v[3], CLATTN_MAX_HEAD_DIM);
    if (q[0] * q[1] * q[2] > 0x7fffffff)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "B*Hq*Sq exceeds INT_MAX");
    return CLATTN_SUCCESS;
}

static int check_attention(attention_args *a, const clattn_mask *mask, cl_context context) {
    const char *names[4] = {"q", "k", "v", "out"};
    const clattn_tensor *views[4] = {a->q, a->k, a->v, a->out};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_tensor(names[i], views[i], context, CLATTN__FLOAT_DTYPES, i == 3);
    if (status == CLATTN_SUCCESS) status = check_dims(a);
    const int64_t scores[4] = {a->q->shape[0], a->q->shape[1], a->q->shape[2], a->k->shape[2]};
    if (status == CLATTN_SUCCESS) status = clattn__mask_prepare(mask, scores, context, &a->mask);
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_no_alias("out", a->out, names[i], views[i]);
    if (status == CLATTN_SUCCESS) status = clattn__mask_check_output(&a->mask, "out", a->out);
    if (status == CLATTN_SUCCESS && a->lse)
        status = clattn__mask_check_lse(&a->mask, a->lse, scores, names, views, 4, context);
    return status;
}

static bool attention_needs_wide_index(const attention_args *a) {
    const clattn_tensor *views[5] = {a->q, a->k, a->v, a->out, a->lse};
    return clattn__needs_wide_index(views, 5) || clattn__mask_needs_wide_index(&a->mask);
}

static int set_attention_args(cl_kernel kernel, const attention_args *a, bool wide) {
    cl_uint arg = 0;
    const clattn_tensor *views[4] = {a->q, a->k, a->v, a->out};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_view_args(kernel, &arg, views[i], 0, wide);
    const cl_int dims[5] = {(cl_int)a->q->shape[0], (cl_int)a->q->shape[1], (cl_int)a->k->shape[1],
                            (cl_int)a->q->shape[2], (cl_int)a->k->shape[2]};
    for (int i = 0; i < 5 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_arg(kernel, arg++, sizeof dims[i], &dims[i]);
    if (status == CLATTN_SUCCESS && a->lse)
        status = clattn__set_view_args(kernel, &arg, a->lse, 1, wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->mask, a->scale, wide);
    return status;
}

/* Head-dim vector lanes: `width`, narrowed until it divides both head dims (1: scalar code, for
 * odd head dims). */
static int head_lanes(cl_uint width, int64_t d, int64_t dv) {
    int lanes = width >= 16 ? 16 : width >= 8 ? 8 : 4;
    while (lanes > 1 && (d % lanes || dv % lanes)) lanes /= 2;
    return lanes == 2 ? 1 : lanes;
}

static attention_launch pick_launch(cl_device_id device, const attention_args *a) {
    cl_device_type type = CL_DEVICE_TYPE_GPU;
    cl_uint width = 4;
    cl_ulong local_bytes = 32768;
    clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    clGetDeviceInfo(device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof width, &width, NULL);
    clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local_bytes, &local_bytes, NULL);
    int64_t d = a->q->shape[3], dv = a->v->shape[3];
    attention_launch l = {CLATTN__ATTENTION_TILES, head_lanes(4, d, dv), ATTENTION_MAX_TK,
                          ATTENTION_TILES_SIZE};
    if (type & CL_DEVICE_TYPE_CPU)
        l = (attention_launch){CLATTN__ATTENTION_BLOCKS, head_lanes(width, d, dv), 0,
                               ATTENTION_BLOCKS_SIZE};
    if (clattn__attention_variant_override >= 0) l.variant = clattn__attention_variant_override;
    if (l.variant == CLATTN__ATTENTION_TILES) {
        l.lanes = head_lanes(4, d, dv);
        l.tk = ATTENTION_MAX_TK;
        while (l.tk > 1 && (uint64_t)l.tk * (uint64_t)(d + dv) * 4 > local_bytes / 2) l.tk /= 2;
    }
    return l;
}

static void attention_options(const attention_args *a, const attention_launch *l, bool wide,
                              char *options, size_t size) {
    snprintf(options, size,
             "-cl-std=CL1.2 -DQ_T=%s -DK_T=%s -DV_T=%s -DO_T=%s -DHAS_LSE=%d -DLSE_T=%s "
             "-DHEAD_DIM=%lld -DVALUE_DIM=%lld -DVEC=%d -DBM=%d -DBN=%d -DTK=%d -DIDX=%s "
             "-DEMPTY_NAN=%d",
             clattn_dtype_name(a->q->dtype), clattn_dtype_name(a->k->dtype),
             clattn_dtype_name(a->v->dtype), clattn_dtype_name(a->out->dtype), a->lse != NULL,
             clattn_dtype_name(a->lse ? a->lse->dtype : CLATTN_F32), (long long)a->q->shape[3],
             (long long)a->v->shape[3], l->lanes, ATTENTION_BM, ATTENTION_BN, l->tk > 0 ? l->tk : 1,
             wide ? "ulong" : "uint", a->mask.empty_rows_nan);
    clattn__mask_options(&a->mask, options, size);
}

/* Work-items (rounded up to whole groups) the variant launches. The tiles variant's groups
 * each take `group` queries of one (batch, head); the kernel reads its group size back. */
static size_t attention_items(const attention_args *a, int variant, size_t group) {
    size_t rows = (size_t)(a->q->shape[0] * a->q->shape[1]);
    size_t per = variant == CLATTN__ATTENTION_TILES ? group : ATTENTION_BM;
    size_t blocks = ((size_t)a->q->shape[2] + per - 1) / per;
    return clattn__round_up(
        variant == CLATTN__ATTENTION_TILES ? rows * blocks * group : rows * blocks, group);
}

static int enqueue_attention(const attention_args *a, const clattn__call *call) {
    static const char *const kernels[] = {"attention_blocks", "attention_tiles"};
    bool wide = attention_needs_wide_index(a);
    attention_launch l = pick_launch(call->device, a);
    char options[1024];
    attention_options(a, &l, wide, options, sizeof options);
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(call->context, call->device, "attention.cl", options,
                                       kernels[l.variant], &kernel);
    size_t max_group = 1;
    if (status == CLATTN_SUCCESS) status = set_attention_args(kernel, a, wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__kernel_max_group(kernel, call->device, &max_group);
    if (status == CLATTN_SUCCESS) {
        size_t local = max_group < l.group ? max_group : l.group;
        size_t global = attention_items(a, l.variant, local);
        status = clattn__enqueue(call, kernel, 1, &global, &local);
    }
    if (kernel) clReleaseKernel(kernel);
    return status;
}

int clattn_attention(const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                     float scale, const clattn_mask *mask, const clattn_tensor *out,
                     const clattn_tensor *lse, cl_command_queue queue, cl_uint num_wait,
                     const cl_event *wait_list, cl_event *event) {
    clattn__call call;
    attention_args a = {q, k, v, out, lse, scale, {0}};
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS && !isfinite(scale))
        status =
            clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "scale = %g is not finite", (double)scale);
    if (status == CLATTN_SUCCESS) status = check_attention(&a, mask, call.context);
    if (status != CLATTN_SUCCESS) return status;
    if (a.scale == 0.0f) a.scale = 1.0f / sqrtf((float)q->shape[3]);
    return enqueue_attention(&a, &call);
}
