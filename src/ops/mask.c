/*
 * The host side of the shared attention mask (cl/mask.cl): validation against the scores'
 * shape, PyTorch-style broadcasting of its tensors, its build options and its kernel arguments.
 */
#include "mask.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A tensor broadcast to `target`: each dim equal to the target's, or 1 (its stride becomes 0). */
static int broadcast_view(const char *name, const clattn_tensor *t, const int64_t target[4],
                          unsigned dtype_mask, cl_context context, clattn_tensor *out) {
    int status = clattn__check_tensor(name, t, context, dtype_mask, false);
    if (status != CLATTN_SUCCESS) return status;
    *out = *t;
    for (int i = 0; i < 4; ++i) {
        if (t->shape[i] == target[i]) continue;
        if (t->shape[i] != 1)
            return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                                "%s: shape[%d] = %lld does not broadcast to %lld (scores "
                                "[%lld,%lld,%lld,%lld])",
                                name, i, (long long)t->shape[i], (long long)target[i],
                                (long long)target[0], (long long)target[1], (long long)target[2],
                                (long long)target[3]);
        out->shape[i] = target[i];
        out->strides[i] = 0;
    }
    return CLATTN_SUCCESS;
}

/* A per-batch or per-head vector: shape {1,1,1,n}. */
static int vector_view(const char *name, const clattn_tensor *t, int64_t n, unsigned dtype_mask,
                       cl_context context, clattn_tensor *out) {
    const int64_t target[4] = {1, 1, 1, n};
    int status = clattn__check_tensor(name, t, context, dtype_mask, false);
    if (status == CLATTN_SUCCESS && (t->shape[0] != 1 || t->shape[1] != 1 || t->shape[2] != 1))
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH, "%s: shape must be {1,1,1,%lld}", name,
                            (long long)n);
    if (status == CLATTN_SUCCESS)
        status = broadcast_view(name, t, target, dtype_mask, context, out);
    return status;
}

static int check_scalars(const clattn_mask *m) {
    if (m->align != CLATTN_ALIGN_TOP_LEFT && m->align != CLATTN_ALIGN_BOTTOM_RIGHT)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "mask.align = %d is not a clattn_align",
                            (int)m->align);
    if (m->window && (m->window_left < -1 || m->window_right < -1))
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "mask window (%lld, %lld): each side must be >= 0, or -1 (unbounded)",
                            (long long)m->window_left, (long long)m->window_right);
    if (m->global_stride < 0)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "mask.global_stride = %lld, must be >= 0",
                            (long long)m->global_stride);
    if (!(m->softcap >= 0.0f) || isinf(m->softcap))
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "mask.softcap = %g, must be 0 (off) or positive and finite",
                            (double)m->softcap);
    return CLATTN_SUCCESS;
}

static int clamp_to_int(int64_t v) {
    return v > 0x7fffffff ? 0x7fffffff : (int)v;
}

int clattn__mask_prepare(const clattn_mask *mask, const int64_t scores[4], cl_context context,
                         clattn__mask_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->win_left = plan->win_right = -1;
    /* Kernels index keys and positions with int: pos = i + off and loops that step past the
     * end by a vector or a group must not overflow, so each score dim stays below 2^30. */
    for (int i = 0; i < 4; ++i)
        if (scores[i] > ((int64_t)1 << 30))
            return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "score dim %d = %lld exceeds 2^30", i,
                                (long long)scores[i]);
    if (!mask) return CLATTN_SUCCESS;
    int status = check_scalars(mask);
    const unsigned i32 = 1u << CLATTN_I32, u8 = 1u << CLATTN_U8;
    if (status == CLATTN_SUCCESS && mask->key_lengths)
        status = vector_view("mask.key_lengths", mask->key_lengths, scores[0], i32, context,
                             &plan->key_lengths);
    if (status == CLATTN_SUCCESS && mask->query_lengths)
        status = vector_view("mask.query_lengths", mask->query_lengths, scores[0], i32, context,
                             &plan->query_lengths);
    if (status == CLATTN_SUCCESS && mask->keep)
        status = broadcast_view("mask.keep", mask->keep, scores, u8, context, &plan->keep);
    if (status == CLATTN_SUCCESS && mask->bias)
        status = broadcast_view("mask.bias", mask->bias, scores, CLATTN__FLOAT_DTYPES, context,
                                &plan->bias);
    if (status == CLATTN_SUCCESS && mask->alibi_slopes)
        status = vector_view("mask.alibi_slopes", mask->alibi_slopes, scores[1],
                             CLATTN__FLOAT_DTYPES, context, &plan->alibi_slopes);
    if (status != CLATTN_SUCCESS) return status;

    plan->has_key_lengths = mask->key_lengths != NULL;
    plan->has_query_lengths = mask->query_lengths != NULL;
    plan->has_keep = mask->keep != NULL;
    plan->has_bias = mask->bias != NULL;
    plan->has_alibi = mask->alibi_slopes != NULL;
    plan->causal = mask->causal != 0;
    plan->align_bottom = mask->align == CLATTN_ALIGN_BOTTOM_RIGHT;
    if (mask->window) {
        plan->win_left = mask->window_left < 0 ? -1 : clamp_to_int(mask->window_left);
        plan->win_right = mask->window_right < 0 ? -1 : clamp_to_int(mask->window_right);
    }
    /* global positions only widen a window; without one every key is in the window already */
    bool bounded = plan->win_left >= 0 || plan->win_right >= 0;
    plan->global_stride = bounded ? clamp_to_int(mask->global_stride) : 0;
    plan->softcap = mask->softcap;
    plan->empty_rows_nan = mask->empty_rows_nan != 0;
    return CLATTN_SUCCESS;
}

int clattn__mask_check_output(const clattn__mask_plan *plan, const char *name,
                              const clattn_tensor *out) {
    const struct {
        const char *name;
        bool present;
        const clattn_tensor *t;
    } inputs[] = {{"mask.key_lengths", plan->has_key_lengths, &plan->key_lengths},
                  {"mask.query_lengths", plan->has_query_lengths, &plan->query_lengths},
                  {"mask.keep", plan->has_keep, &plan->keep},
                  {"mask.bias", plan->has_bias, &plan->bias},
                  {"mask.alibi_slopes", plan->has_alibi, &plan->alibi_slopes}};
    int status = CLATTN_SUCCESS;
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0] && status == CLATTN_SUCCESS; ++i)
        if (inputs[i].present)
            status = clattn__check_no_alias(name, out, inputs[i].name, inputs[i].t);
    return status;
}

int clattn__mask_check_lse(const clattn__mask_plan *plan, const clattn_tensor *lse,
                           const int64_t scores[4], const char *const *names,
                           const clattn_tensor *const *views, int count, cl_context context) {
    int status = clattn__check_tensor("lse", lse, context, CLATTN__FLOAT_DTYPES, true);
    if (status == CLATTN_SUCCESS && (lse->shape[0] != 1 || lse->shape[1] != scores[0] ||
                                     lse->shape[2] != scores[1] || lse->shape[3] != scores[2]))
        status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH, "lse: shape must be {1,%lld,%lld,%lld}",
                              (long long)scores[0], (long long)scores[1], (long long)scores[2]);
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_no_alias("lse", lse, names[i], views[i]);
    if (status == CLATTN_SUCCESS) status = clattn__mask_check_output(plan, "lse", lse);
    return status;
}

bool clattn__mask_needs_wide_index(const clattn__mask_plan *plan) {
    const clattn_tensor *views[] = {
        plan->has_key_lengths ? &plan->key_lengths : NULL,
        plan->has_query_lengths ? &plan->query_lengths : NULL, plan->has_keep ? &plan->keep : NULL,
        plan->has_bias ? &plan->bias : NULL, plan->has_alibi ? &plan->alibi_slopes : NULL};
    return clattn__needs_wide_index(views, sizeof views / sizeof views[0]);
}

void clattn__mask_options(const clattn__mask_plan *plan, char *out, size_t capacity) {
    size_t used = strlen(out);
    snprintf(out + used, capacity - used,
             " -DHAS_KLEN=%d -DHAS_QLEN=%d -DHAS_KEEP=%d -DHAS_BIAS=%d -DBIAS_T=%s -DHAS_ALIBI=%d "
             "-DALIBI_T=%s -DHAS_SOFTCAP=%d -DHAS_GLOBAL=%d",
             plan->has_key_lengths, plan->has_query_lengths, plan->has_keep, plan->has_bias,
             clattn_dtype_name(plan->has_bias ? plan->bias.dtype : CLATTN_F32), plan->has_alibi,
             clattn_dtype_name(plan->has_alibi ? plan->alibi_slopes.dtype : CLATTN_F32),
             plan->softcap > 0.0f, plan->global_stride > 0);
}

int clattn__mask_set_args(cl_kernel kernel, cl_uint *arg, const clattn__mask_plan *plan,
                          float scale, bool wide) {
    const cl_int ints[5] = {plan->causal, plan->align_bottom, plan->win_left, plan->win_right,
                            plan->global_stride};
    int status = clattn__set_arg(kernel, (*arg)++, sizeof scale, &scale);
    if (status == CLATTN_SUCCESS)
        status = clattn__set_arg(kernel, (*arg)++, sizeof plan->softcap, &plan->softcap);
    for (int i = 0; i < 5 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_arg(kernel, (*arg)++, sizeof ints[i], &ints[i]);
    /* the optional tensors in MASK_PARAMS order; vectors pass only their last stride */
    if (status == CLATTN_SUCCESS && plan->has_key_lengths)
        status = clattn__set_view_args(kernel, arg, &plan->key_lengths, 3, wide);
    if (status == CLATTN_SUCCESS && plan->has_query_lengths)
        status = clattn__set_view_args(kernel, arg, &plan->query_lengths, 3, wide);
    if (status == CLATTN_SUCCESS && plan->has_keep)
        status = clattn__set_view_args(kernel, arg, &plan->keep, 0, wide);
    if (status == CLATTN_SUCCESS && plan->has_bias)
        status = clattn__set_view_args(kernel, arg, &plan->bias, 0, wide);
    if (status == CLATTN_SUCCESS && plan->has_alibi)
        status = clattn__set_view_args(kernel, arg, &plan->alibi_slopes, 3, wide);
    return status;
}
