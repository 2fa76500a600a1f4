/*
 * The host side of the shared attention mask (cl/mask.cl): validation against the scores'
 * shape, PyTorch-style broadcasting of its tensors, its build options and its kernel arguments.
 */
#include "mask.h"

#include <math.h>
#include <stddef.h>
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

/* The table of mask tensors (mask.h) as data. */
enum { PER_BATCH, PER_HEAD, SCORES };
typedef struct mask_tensor {
    const char *name; /* "mask.bias" */
    size_t field;     /* offsetof(clattn_mask, bias) */
    int shape;
    unsigned dtypes;
    const char *has_macro, *type_macro; /* type_macro "FIXED": one dtype, no macro */
    int first_stride;
} mask_tensor;
#define MASK_TENSOR(FIELD, SHAPE, DTYPES, HAS, TYPE, FIRST)                                        \
    {"mask." #FIELD, offsetof(clattn_mask, FIELD), SHAPE, DTYPES, #HAS, #TYPE, FIRST},
static const mask_tensor mask_tensors[CLATTN__MASK_TENSOR_COUNT] = {
    CLATTN__MASK_TENSORS(MASK_TENSOR)};

static const clattn_tensor *given(const clattn_mask *mask, int i) {
    return *(const clattn_tensor *const *)((const char *)mask + mask_tensors[i].field);
}

/* One mask tensor validated and broadcast as its table row says. */
static int tensor_view(int i, const clattn_tensor *t, const int64_t scores[4], cl_context context,
                       clattn_tensor *out) {
    const mask_tensor *m = &mask_tensors[i];
    if (m->shape == SCORES) return broadcast_view(m->name, t, scores, m->dtypes, context, out);
    return vector_view(m->name, t, m->shape == PER_BATCH ? scores[0] : scores[1], m->dtypes,
                       context, out);
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
    for (int i = 0; i < CLATTN__MASK_TENSOR_COUNT && status == CLATTN_SUCCESS; ++i) {
        plan->has[i] = given(mask, i) != NULL;
        if (plan->has[i])
            status = tensor_view(i, given(mask, i), scores, context, &plan->tensors[i]);
    }
    if (status != CLATTN_SUCCESS) return status;

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

void clattn__mask_list_tensors(const clattn__mask_plan *plan, clattn__tensor_list *list) {
    for (int i = 0; i < CLATTN__MASK_TENSOR_COUNT; ++i)
        if (plan->has[i]) clattn__tensor_list_add(list, mask_tensors[i].name, &plan->tensors[i]);
}

int clattn__mask_check_output(const clattn__mask_plan *plan, const char *name,
                              const clattn_tensor *out) {
    clattn__tensor_list mask = {0};
    clattn__mask_list_tensors(plan, &mask);
    return clattn__check_apart(name, out, &mask);
}

int clattn__mask_check_lse(const clattn__mask_plan *plan, const clattn_tensor *lse,
                           const int64_t scores[4], const clattn__tensor_list *inputs,
                           cl_context context) {
    int status = clattn__check_tensor("lse", lse, context, CLATTN__FLOAT_DTYPES, true);
    if (status == CLATTN_SUCCESS && (lse->shape[0] != 1 || lse->shape[1] != scores[0] ||
                                     lse->shape[2] != scores[1] || lse->shape[3] != scores[2]))
        status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH, "lse: shape must be {1,%lld,%lld,%lld}",
                              (long long)scores[0], (long long)scores[1], (long long)scores[2]);
    if (status == CLATTN_SUCCESS) status = clattn__check_apart("lse", lse, inputs);
    if (status == CLATTN_SUCCESS) status = clattn__mask_check_output(plan, "lse", lse);
    return status;
}

bool clattn__mask_needs_wide_index(const clattn__mask_plan *plan) {
    const clattn_tensor *views[CLATTN__MASK_TENSOR_COUNT];
    for (int i = 0; i < CLATTN__MASK_TENSOR_COUNT; ++i)
        views[i] = plan->has[i] ? &plan->tensors[i] : NULL;
    return clattn__needs_wide_index(views, CLATTN__MASK_TENSOR_COUNT);
}

void clattn__mask_options(const clattn__mask_plan *plan, char *out, size_t capacity) {
    size_t used = strlen(out);
    for (int i = 0; i < CLATTN__MASK_TENSOR_COUNT; ++i) {
        const mask_tensor *m = &mask_tensors[i];
        clattn__define_int(out, capacity, &used, m->has_macro, plan->has[i]);
        /* an absent tensor's type macro still names a dtype, so that the option set (and the
         * program cache key) is the same shape for every call */
        const clattn_dtype dtype = plan->has[i] ? plan->tensors[i].dtype : CLATTN_F32;
        if (strcmp(m->type_macro, "FIXED") != 0)
            clattn__define_str(out, capacity, &used, m->type_macro, clattn_dtype_name(dtype));
    }
    clattn__define_int(out, capacity, &used, "HAS_SOFTCAP", plan->softcap > 0.0f);
    clattn__define_int(out, capacity, &used, "HAS_GLOBAL", plan->global_stride > 0);
}

int clattn__mask_set_args(cl_kernel kernel, cl_uint *arg, const clattn__mask_plan *plan,
                          float scale, bool wide) {
    const int64_t ints[5] = {plan->causal, plan->align_bottom, plan->win_left, plan->win_right,
                             plan->global_stride};
    int status = clattn__set_float_arg(kernel, (*arg)++, scale);
    if (status == CLATTN_SUCCESS) status = clattn__set_float_arg(kernel, (*arg)++, plan->softcap);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, arg, ints, 5);
    /* the optional tensors in MASK_PARAMS order */
    for (int i = 0; i < CLATTN__MASK_TENSOR_COUNT && status == CLATTN_SUCCESS; ++i)
        if (plan->has[i])
            status = clattn__set_view_args(kernel, arg, &plan->tensors[i],
                                           mask_tensors[i].first_stride, wide);
    return status;
}
