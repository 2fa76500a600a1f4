/*
 * Multi-head attention forward: torch.nn.MultiheadAttention(batch_first=True) in eval mode
 * (include/clattn.h). This file validates, lays out the scratch, and enqueues the steps:
 *
 * Everything between the inputs and out is in one inner dtype: f32, or with f16 (bf16) storage
 * throughout on a device whose matrix units the GEMMs take, that dtype (inner_dtype), so that
 * the projections and the attention run on the units.
 *
 *   1. images (in the inner dtype) of the inputs and weights the GEMMs cannot read in place;
 *      the merged mask
 *   2. each GEMM's output started from its broadcast bias (so the GEMM adds onto it, beta = 1);
 *      where every GEMM takes the units (16-bit, or f32 on the tf32 unit) matmul_mma adds the
 *      bias itself instead
 *   3. the input projections: one GEMM when query, key and value are one view and the weights
 *      are packed (self-attention), else one per input (key and value share one when they are
 *      one view)
 *   4. the attention (ops/attention.h: planned with MHA's plan, checked, enqueued) on
 *      [B,H,S,D] views of the projections (a head is D columns of a row), writing [B,Sq,E]
 *      rows straight away: no head is ever split or merged by a copy
 *   5. the output projection, and the heads' mean of the weights when it is asked for
 *   6. out converted from its image when it is not rows of the inner dtype itself
 *
 * The workspace starts with the attention's own scratch, which the attention call gets as a
 * sub-buffer at origin 0 (always aligned); the rest follows it.
 */
#include "attention.h"
#include "gemm.h"
#include "heads.h"

#include <stdio.h>
#include <string.h>

#define NONE SIZE_MAX

enum { MASK_NONE = 0, MASK_KEEP = 1, MASK_ADD = 2 };
enum { IN_QUERY = 0, IN_KEY = 1, IN_VALUE = 2 };
enum { W_PACKED = 0, W_Q = 1, W_K = 2, W_V = 3, W_OUT = 4, W_COUNT = 5 };

typedef struct mha_args {
    const clattn_tensor *in[3]; /* query, key, value */
    const clattn_tensor *out;
    const clattn_mha_params *p;
    clattn_mha_options o; /* the caller's, or all zero */
    int64_t B, Sq, Sk, E, H, D;
    bool self;      /* query, key and value are one view */
    bool shared_kv; /* key and value are one view */
    int kpm_kind, attn_kind;
} mha_args;

/* One input projection GEMM: rows of `input` times rows first_row.. of weight `slot`, `n`
 * columns out, into the workspace at `at` with row stride `ld`. */
typedef struct proj_job {
    int input, slot;
    int64_t first_row, n;
    size_t at, ld;
} proj_job;

/* Where everything lives in the workspace (NONE: not there). The images (inputs and projection
 * weights), the projections and the attention's output are in `inner`, their offsets in its
 * elements; the merged mask and the per-head attention weights (probs) are f32, their offsets
 * in floats. `floats` counts 4-byte units throughout. */
typedef struct mha_plan {
    clattn__attention_schedule attn; /* its scratch (attn.bytes): the workspace's first bytes */
    clattn_dtype inner; /* f32, or the call's 16-bit dtype on the matrix units (inner_dtype) */
    bool units;         /* every GEMM runs matmul_mma, which adds the bias rows itself */
    size_t in_at[3];    /* images of query, key, value */
    size_t w_at[W_COUNT];
    proj_job jobs[3];
    int njobs;
    size_t head_at[3], head_ld[3]; /* the projected q, k, v */
    size_t ctx_at;                 /* the attention output, B*Sq rows of E */
    size_t out_at;                 /* out's image */
    size_t mask_at;                /* the merged mask */
    size_t probs_at;               /* per-head weights before their mean */
    size_t floats;                 /* the whole workspace, the attention's scratch included */
} mha_plan;

/* ---- validation ---- */

/* Field by field: the struct's padding may differ between two copies of one view. */
static bool same_view(const clattn_tensor *a, const clattn_tensor *b) {
    bool same = a->buffer == b->buffer && a->offset == b->offset && a->dtype == b->dtype;
    for (int i = 0; i < 4 && same; ++i)
        same = a->shape[i] == b->shape[i] && a->strides[i] == b->strides[i];
    return same;
}

static int check_shape(const char *name, const clattn_tensor *t, int64_t d0, int64_t d1, int64_t d2,
                       int64_t d3) {
    const int64_t want[4] = {d0, d1, d2, d3};
    for (int i = 0; i < 4; ++i)
        if (t->shape[i] != want[i])
            return clattn__fail(
                CLATTN_ERR_SHAPE_MISMATCH,
                "%s is {%lld,%lld,%lld,%lld}; this call needs {%lld,%lld,%lld,%lld}", name,
                (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                (long long)t->shape[3], (long long)d0, (long long)d1, (long long)d2, (long long)d3);
    return CLATTN_SUCCESS;
}

static const clattn_tensor *weight_of(const mha_args *a, int slot) {
    const clattn_tensor *w[W_COUNT] = {a->p->in_proj_weight, a->p->q_proj_weight,
                                       a->p->k_proj_weight, a->p->v_proj_weight,
                                       a->p->out_proj_weight};
    return w[slot];
}

static int check_inputs(mha_args *a, cl_context context) {
    const char *names[3] = {"query", "key", "value"};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_tensor(names[i], a->in[i], context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor("out", a->out, context, CLATTN__FLOAT_DTYPES, true);
    if (status != CLATTN_SUCCESS) return status;
    const int64_t *q = a->in[IN_QUERY]->shape, *k = a->in[IN_KEY]->shape;
    a->B = q[1], a->Sq = q[2], a->E = q[3], a->Sk = k[2];
    status = check_shape("query", a->in[IN_QUERY], 1, a->B, a->Sq, a->E);
    if (status == CLATTN_SUCCESS) status = check_shape("key", a->in[IN_KEY], 1, a->B, a->Sk, k[3]);
    if (status == CLATTN_SUCCESS)
        status = check_shape("value", a->in[IN_VALUE], 1, a->B, a->Sk, a->in[IN_VALUE]->shape[3]);
    if (status == CLATTN_SUCCESS) status = check_shape("out", a->out, 1, a->B, a->Sq, a->E);
    a->self =
        same_view(a->in[IN_QUERY], a->in[IN_KEY]) && same_view(a->in[IN_KEY], a->in[IN_VALUE]);
    a->shared_kv = same_view(a->in[IN_KEY], a->in[IN_VALUE]);
    return status;
}

static int check_heads(mha_args *a) {
    const int heads = a->p->num_heads;
    if (heads <= 0 || a->E % heads != 0)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "num_heads = %d must be positive and divide embed_dim %lld", heads,
                            (long long)a->E);
    a->H = heads, a->D = a->E / heads;
    if (a->D > 256)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "the head dim E/H = %lld is over 256",
                            (long long)a->D);
    if (a->B * a->H * a->Sq > 0x7fffffff)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "B*H*Sq exceeds INT_MAX");
    return CLATTN_SUCCESS;
}

/* A weight or bias: an input tensor of the given shape (NULL allowed when optional). */
static int check_param(const char *name, const clattn_tensor *t, bool optional, int64_t rows,
                       int64_t cols, cl_context context) {
    if (!t && optional) return CLATTN_SUCCESS;
    if (!t) return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "%s is NULL", name);
    int status = clattn__check_tensor(name, t, context, CLATTN__FLOAT_DTYPES, false);
    return status == CLATTN_SUCCESS ? check_shape(name, t, 1, 1, rows, cols) : status;
}

static int check_weights(const mha_args *a, cl_context context) {
    const clattn_mha_params *p = a->p;
    const bool packed = p->in_proj_weight != NULL;
    const bool separate = p->q_proj_weight || p->k_proj_weight || p->v_proj_weight;
    if (packed == separate)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "give in_proj_weight or q/k/v_proj_weight: %s",
                            packed ? "both are given" : "neither is given");
    const int64_t E = a->E, kdim = a->in[IN_KEY]->shape[3], vdim = a->in[IN_VALUE]->shape[3];
    int status = CLATTN_SUCCESS;
    if (packed && (kdim != E || vdim != E))
        status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                              "in_proj_weight needs kdim = vdim = E = %lld (key has %lld, value "
                              "%lld columns); pass q/k/v_proj_weight instead",
                              (long long)E, (long long)kdim, (long long)vdim);
    if (status == CLATTN_SUCCESS && packed)
        status = check_param("in_proj_weight", p->in_proj_weight, false, 3 * E, E, context);
    if (status == CLATTN_SUCCESS && !packed)
        status = check_param("q_proj_weight", p->q_proj_weight, false, E, E, context);
    if (status == CLATTN_SUCCESS && !packed)
        status = check_param("k_proj_weight", p->k_proj_weight, false, E, kdim, context);
    if (status == CLATTN_SUCCESS && !packed)
        status = check_param("v_proj_weight", p->v_proj_weight, false, E, vdim, context);
    if (status == CLATTN_SUCCESS)
        status = check_param("in_proj_bias", p->in_proj_bias, true, 1, 3 * E, context);
    if (status == CLATTN_SUCCESS)
        status = check_param("out_proj_weight", p->out_proj_weight, false, E, E, context);
    if (status == CLATTN_SUCCESS)
        status = check_param("out_proj_bias", p->out_proj_bias, true, 1, E, context);
    return status;
}

/* A mask: u8 (MASK_KEEP) or float (MASK_ADD), each dim equal to the scores' or 1. */
static int check_mask(const char *name, const clattn_tensor *t, const int64_t dims[4],
                      bool broadcast, cl_context context, int *kind) {
    *kind = MASK_NONE;
    if (!t) return CLATTN_SUCCESS;
    int status =
        clattn__check_tensor(name, t, context, CLATTN__FLOAT_DTYPES | (1u << CLATTN_U8), false);
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        if (t->shape[i] != dims[i] && !(broadcast && t->shape[i] == 1))
            status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH, "%s dim %d is %lld; it must be %lld%s",
                                  name, i, (long long)t->shape[i], (long long)dims[i],
                                  broadcast ? " or 1" : "");
    *kind = t->dtype == CLATTN_U8 ? MASK_KEEP : MASK_ADD;
    return status;
}

static int check_options(mha_args *a, cl_context context) {
    const clattn_mha_options *o = &a->o;
    const int64_t kpm[4] = {1, 1, a->B, a->Sk}, scores[4] = {a->B, a->H, a->Sq, a->Sk};
    int status =
        check_mask("key_padding_mask", o->key_padding_mask, kpm, false, context, &a->kpm_kind);
    if (status == CLATTN_SUCCESS)
        status = check_mask("attn_mask", o->attn_mask, scores, true, context, &a->attn_kind);
    if (status != CLATTN_SUCCESS || !o->weights) return status;
    status = clattn__check_tensor("weights", o->weights, context, CLATTN__FLOAT_DTYPES, true);
    if (status == CLATTN_SUCCESS && o->average_attn_weights)
        status = check_shape("weights", o->weights, 1, a->B, a->Sq, a->Sk);
    else if (status == CLATTN_SUCCESS)
        status = check_shape("weights", o->weights, a->B, a->H, a->Sq, a->Sk);
    return status;
}

/* Every tensor of the call, outputs first (out, weights), then the inputs. */
static void tensors_of(const mha_args *a, clattn__tensor_list *list) {
    const clattn_mha_params *p = a->p;
    const struct {
        const char *name;
        const clattn_tensor *t;
    } all[] = {{"out", a->out},
               {"weights", a->o.weights},
               {"query", a->in[0]},
               {"key", a->in[1]},
               {"value", a->in[2]},
               {"in_proj_weight", p->in_proj_weight},
               {"q_proj_weight", p->q_proj_weight},
               {"k_proj_weight", p->k_proj_weight},
               {"v_proj_weight", p->v_proj_weight},
               {"in_proj_bias", p->in_proj_bias},
               {"out_proj_weight", p->out_proj_weight},
               {"out_proj_bias", p->out_proj_bias},
               {"key_padding_mask", a->o.key_padding_mask},
               {"attn_mask", a->o.attn_mask}};
    *list = (clattn__tensor_list){0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        clattn__tensor_list_add(list, all[i].name, all[i].t);
}

/* The outputs (out, weights) overlap no input and not each other. */
static int check_aliasing(const mha_args *a) {
    clattn__tensor_list tensors;
    tensors_of(a, &tensors);
    int status = clattn__check_apart("out", a->out, &tensors);
    if (status == CLATTN_SUCCESS && a->o.weights)
        status = clattn__check_apart("weights", a->o.weights, &tensors);
    return status;
}

static int check_mha(mha_args *a, cl_context context) {
    if (!a->p) return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "params is NULL");
    for (int i = 0; i < 3; ++i)
        if (!a->in[i]) return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "an input is NULL");
    int status = check_inputs(a, context);
    if (status == CLATTN_SUCCESS) status = check_heads(a);
    if (status == CLATTN_SUCCESS) status = check_weights(a, context);
    if (status == CLATTN_SUCCESS) status = check_options(a, context);
    if (status == CLATTN_SUCCESS) status = check_aliasing(a);
    return status;
}

/* ---- the workspace layout ---- */

/* The GEMMs read (or write) the {1,R,S,C} view in place as one matrix of R*S rows: rows of C
 * contiguous elements in the plan's inner dtype, one row stride throughout. */
static bool rows_ready(const clattn_tensor *t, clattn_dtype inner) {
    const int64_t *n = t->shape, *s = t->strides;
    return t->dtype == inner && (s[3] == 1 || n[3] == 1) && s[2] >= n[3] &&
           (n[1] == 1 || s[1] == n[2] * s[2]);
}

/* The product of four dims; *overflow is set when it does not fit (broadcast views can carry
 * dims no buffer holds). */
static int64_t product(int64_t a, int64_t b, int64_t c, int64_t d, bool *overflow) {
    int64_t ab = 0, abc = 0, all = 0;
    *overflow = *overflow || __builtin_mul_overflow(a, b, &ab) ||
                __builtin_mul_overflow(ab, c, &abc) || __builtin_mul_overflow(abc, d, &all);
    return all;
}

/* `count` floats at the end of the layout (NONE when not needed); *overflow as above. */
static size_t take(size_t *floats, bool needed, int64_t count, bool *overflow) {
    if (!needed) return NONE;
    size_t at = *floats;
    *overflow = *overflow || __builtin_add_overflow(*floats, (size_t)count, floats);
    return at;
}

/* `count` elements of `inner` at the end of the layout, their offset in those elements (a
 * float is 4 bytes: 2 16-bit elements). The region starts on 16 bytes, so that rows of 8
 * 16-bit elements can be 16-byte loads (matmul_mma's, attention_mma's ALIGNED). */
static size_t take_inner(size_t *floats, bool needed, int64_t count, clattn_dtype inner,
                         bool *overflow) {
    *overflow = *overflow || *floats > SIZE_MAX - 3;
    if (needed && !*overflow) *floats = (*floats + 3) / 4 * 4;
    const size_t per_float = 4 / clattn_dtype_size(inner);
    const size_t at =
        take(floats, needed, (count + (int64_t)per_float - 1) / (int64_t)per_float, overflow);
    return at == NONE ? NONE : at * per_float;
}

static void plan_jobs(const mha_args *a, mha_plan *plan) {
    const int64_t E = a->E;
    const bool packed = a->p->in_proj_weight != NULL;
    if (packed && a->self) {
        plan->jobs[0] = (proj_job){IN_QUERY, W_PACKED, 0, 3 * E, 0, 0};
        plan->njobs = 1;
    } else if (packed && a->shared_kv) {
        plan->jobs[0] = (proj_job){IN_QUERY, W_PACKED, 0, E, 0, 0};
        plan->jobs[1] = (proj_job){IN_KEY, W_PACKED, E, 2 * E, 0, 0};
        plan->njobs = 2;
    } else {
        for (int i = 0; i < 3; ++i)
            plan->jobs[i] = (proj_job){i, packed ? W_PACKED : W_Q + i, packed ? i * E : 0, E, 0, 0};
        plan->njobs = 3;
    }
    for (int j = 0; j < plan->njobs; ++j) plan->jobs[j].ld = (size_t)plan->jobs[j].n;
    /* head slot i of each job: columns (i - first input) * E onwards */
    for (int j = 0; j < plan->njobs; ++j)
        for (int i = plan->jobs[j].input; i < 3 && (i - plan->jobs[j].input) * E < plan->jobs[j].n;
             ++i)
            plan->head_ld[i] = plan->jobs[j].ld;
}

/* The attention's views of the projections (offsets from the plan; the buffer may be NULL). */
static void head_views(const mha_args *a, const mha_plan *plan, cl_mem ws, clattn_tensor heads[4]) {
    const int64_t S[4] = {a->Sq, a->Sk, a->Sk, a->Sq};
    for (int i = 0; i < 4; ++i) {
        const int64_t ld = i < 3 ? (int64_t)plan->head_ld[i] : a->E;
        heads[i] = clattn_tensor_4d(ws, plan->inner, a->B, a->H, S[i], a->D);
        heads[i].strides[0] = S[i] * ld, heads[i].strides[1] = a->D, heads[i].strides[2] = ld;
        heads[i].offset = i < 3 ? plan->head_at[i] : plan->ctx_at;
    }
}

static clattn_tensor probs_view(const mha_args *a, const mha_plan *plan, cl_mem ws) {
    clattn_tensor t = clattn_tensor_4d(ws, CLATTN_F32, a->B, a->H, a->Sq, a->Sk);
    t.offset = plan->probs_at;
    return t;
}

/* Floats of the merged mask: u8 + u8 turns the padding mask into an additive [B,Sk]; float +
 * float adds both into [B, attn dims 1 and 2, Sk]. */
static int64_t merged_mask_floats(const mha_args *a, bool *overflow) {
    if (a->kpm_kind == MASK_KEEP && a->attn_kind == MASK_KEEP)
        return product(a->B, a->Sk, 1, 1, overflow);
    if (a->kpm_kind != MASK_ADD || a->attn_kind != MASK_ADD) return 0;
    const int64_t *m = a->o.attn_mask->shape;
    return product(a->B, m[1], m[2], a->Sk, overflow);
}

/* The regions of the projections and everything after them, from float `f` on. */
static size_t plan_regions(const mha_args *a, mha_plan *plan, size_t f, bool *over) {
    const bool averaged = a->o.weights && a->o.average_attn_weights;
    const clattn_dtype inner = plan->inner;
    for (int i = 0; i < 3; ++i) {
        const clattn_tensor *t = a->in[i];
        const bool reused = i > 0 && same_view(t, a->in[i - 1]);
        plan->in_at[i] =
            reused ? plan->in_at[i - 1]
                   : take_inner(&f, !rows_ready(t, inner),
                                product(a->B, t->shape[2], t->shape[3], 1, over), inner, over);
    }
    for (int s = 0; s < W_COUNT; ++s) {
        const clattn_tensor *w = weight_of(a, s);
        plan->w_at[s] = take_inner(&f, w && !rows_ready(w, inner),
                                   w ? w->shape[2] * w->shape[3] : 0, inner, over);
    }
    for (int j = 0; j < plan->njobs; ++j) {
        proj_job *job = &plan->jobs[j];
        const int64_t rows = job->input == IN_QUERY ? a->Sq : a->Sk;
        job->at = take_inner(&f, true, product(a->B, rows, job->n, 1, over), inner, over);
        for (int i = job->input; i < 3 && (i - job->input) * a->E < job->n; ++i)
            plan->head_at[i] = job->at + (size_t)((i - job->input) * a->E);
    }
    const int64_t rows_out = product(a->B, a->Sq, a->E, 1, over);
    plan->ctx_at = take_inner(&f, true, rows_out, inner, over);
    plan->out_at = take_inner(&f, !rows_ready(a->out, inner), rows_out, inner, over);
    const int64_t mask = merged_mask_floats(a, over);
    plan->mask_at = take(&f, mask > 0, mask, over);
    plan->probs_at = take(&f, averaged, product(a->B, a->H, a->Sq, a->Sk, over), over);
    return f;
}

/* Whether matmul_mma takes every GEMM of the call with products of `dt`: it takes the largest
 * (rows of the longer input, 3 E columns, the deepest input), so it takes the others. */
static int gemms_on_units(const mha_args *a, const clattn__call *call, clattn_dtype dt,
                          bool *takes) {
    const int64_t kdim = a->in[IN_KEY]->shape[3], vdim = a->in[IN_VALUE]->shape[3];
    const int64_t rows = a->B * (a->Sq > a->Sk ? a->Sq : a->Sk);
    const int64_t deep = a->E > kdim ? (a->E > vdim ? a->E : vdim) : (kdim > vdim ? kdim : vdim);
    return clattn__gemm_units_available(call, dt, (size_t)rows, (size_t)(3 * a->E), (size_t)deep, 1,
                                        takes);
}

/* The storage of the images, projections and the attention's views: the call's 16-bit dtype
 * when query, key, value, the weights and out all have it and its GEMMs take the matrix units
 * (clattn__gemm_units: the matmul row's UNITS and the probe), so that the attention can take
 * them too, as torch's f16 MHA keeps its projections in f16; f32 otherwise. */
static int inner_dtype(const mha_args *a, const clattn__call *call, clattn_dtype *inner) {
    *inner = CLATTN_F32;
    const clattn_dtype dt = a->out->dtype;
    if (dt != CLATTN_F16 && dt != CLATTN_BF16) return CLATTN_SUCCESS;
    for (int i = 0; i < 3; ++i)
        if (a->in[i]->dtype != dt) return CLATTN_SUCCESS;
    for (int s = 0; s < W_COUNT; ++s)
        if (weight_of(a, s) && weight_of(a, s)->dtype != dt) return CLATTN_SUCCESS;
    bool takes = false;
    const int status = gemms_on_units(a, call, dt, &takes);
    if (status == CLATTN_SUCCESS && takes) *inner = dt;
    return status;
}

static int plan_mha(const mha_args *a, const clattn__call *call, mha_plan *plan) {
    memset(plan, 0, sizeof *plan);
    int status = inner_dtype(a, call, &plan->inner);
    /* a 16-bit inner dtype is on the units; f32 is where the tf32 unit takes every GEMM */
    plan->units = plan->inner != CLATTN_F32;
    if (status == CLATTN_SUCCESS && !plan->units)
        status = gemms_on_units(a, call, CLATTN_F32, &plan->units);
    if (status != CLATTN_SUCCESS) return status;
    plan_jobs(a, plan);
    /* the attention's plan, from its views before they have a buffer (they live in the
     * workspace it sizes): the path, launch and scratch it enqueues with later */
    const bool averaged = a->o.weights && a->o.average_attn_weights;
    clattn_tensor heads[4], probs = probs_view(a, plan, NULL);
    head_views(a, plan, NULL, heads);
    const clattn_tensor *weights = averaged ? &probs : a->o.weights;
    const clattn__attention_args attn = {&heads[0], &heads[1], &heads[2], &heads[3], NULL,
                                         weights,   NULL,      1.0f,      {0}};
    status = clattn__attention_plan(&attn, weights ? CLATTN_PATH_COMPOSED : CLATTN_PATH_FUSED, call,
                                    &plan->attn);
    if (status != CLATTN_SUCCESS) return status;
    bool overflow = false;
    const size_t attn_floats = (plan->attn.bytes + sizeof(float) - 1) / sizeof(float);
    plan->floats = plan_regions(a, plan, attn_floats, &overflow);
    if (overflow || plan->floats > SIZE_MAX / sizeof(float))
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT,
                            "the scratch this call needs does not fit in a size_t");
    return CLATTN_SUCCESS;
}

/* ---- the steps ---- */

/* The {1,R,S,C} view as a GEMM's matrix: in place, or its dense image at `at`. */
static clattn__matrices matrix_of(const clattn_tensor *t, size_t at, cl_mem ws) {
    if (at != NONE) return (clattn__matrices){ws, at, (size_t)t->shape[3], 0};
    return (clattn__matrices){t->buffer, t->offset, (size_t)t->strides[2], 0};
}

/* The dense image of a {1,R,S,C} view at `at` in the workspace, in the plan's inner dtype. */
static clattn_tensor image_of(const clattn_tensor *t, size_t at, clattn_dtype inner, cl_mem ws) {
    clattn_tensor image = clattn_tensor_4d(ws, inner, 1, t->shape[1], t->shape[2], t->shape[3]);
    image.offset = at;
    return image;
}

static int copy_into(const clattn__call *call, const clattn_tensor *src, const clattn_tensor *bias,
                     const clattn_tensor *dst) {
    const clattn__call step = clattn__step_call(call);
    return clattn__copy_enqueue(src, bias, dst, &step);
}

/* Step 1: the images of inputs and weights (in the inner dtype). */
static int make_images(const mha_args *a, const mha_plan *plan, const clattn__call *call,
                       cl_mem ws) {
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        if (plan->in_at[i] != NONE && (i == 0 || plan->in_at[i] != plan->in_at[i - 1])) {
            const clattn_tensor image = image_of(a->in[i], plan->in_at[i], plan->inner, ws);
            status = copy_into(call, a->in[i], NULL, &image);
        }
    for (int s = 0; s < W_COUNT && status == CLATTN_SUCCESS; ++s)
        if (plan->w_at[s] != NONE) {
            const clattn_tensor image = image_of(weight_of(a, s), plan->w_at[s], plan->inner, ws);
            status = copy_into(call, weight_of(a, s), NULL, &image);
        }
    return status;
}

/* c's rows (m of them, n wide, row stride ld, in `dtype`) all set to bias columns first..
 * first+n-1. */
static int fill_with_bias(const clattn__call *call, const clattn_tensor *bias, int64_t first,
                          int64_t m, int64_t n, clattn_dtype dtype, cl_mem buffer, size_t at,
                          size_t ld) {
    clattn_tensor src = clattn_tensor_4d(bias->buffer, bias->dtype, 1, 1, m, n);
    src.offset = bias->offset + (size_t)(first * bias->strides[3]);
    src.strides[0] = src.strides[1] = src.strides[2] = 0, src.strides[3] = bias->strides[3];
    clattn_tensor dst = clattn_tensor_4d(buffer, dtype, 1, 1, m, n);
    dst.offset = at, dst.strides[2] = (int64_t)ld;
    dst.strides[0] = dst.strides[1] = m * (int64_t)ld;
    return copy_into(call, &src, NULL, &dst);
}

/* Where the output projection writes: out itself, or its image. */
static clattn__matrices out_matrix(const mha_args *a, const mha_plan *plan, cl_mem ws) {
    return matrix_of(a->out, plan->out_at, ws);
}

/* Step 2: every GEMM output that has a bias starts as it. */
static int fill_biases(const mha_args *a, const mha_plan *plan, const clattn__call *call,
                       cl_mem ws) {
    const clattn_tensor *in_bias = a->p->in_proj_bias, *out_bias = a->p->out_proj_bias;
    int status = CLATTN_SUCCESS;
    if (plan->units) return status; /* matmul_mma adds them (plan_gemm) */
    for (int j = 0; j < plan->njobs && status == CLATTN_SUCCESS && in_bias; ++j) {
        const proj_job *job = &plan->jobs[j];
        const int64_t rows = a->B * (job->input == IN_QUERY ? a->Sq : a->Sk);
        status = fill_with_bias(call, in_bias, job->input * a->E, rows, job->n, plan->inner, ws,
                                job->at, job->ld);
    }
    if (status == CLATTN_SUCCESS && out_bias) {
        const clattn__matrices c = out_matrix(a, plan, ws);
        status = fill_with_bias(call, out_bias, 0, a->B * a->Sq, a->E, plan->inner, c.buffer,
                                c.offset, c.ld);
    }
    return status;
}

/* One GEMM of the plan, c = a b^T + bias from its column `first` on (bias NULL: none): on the
 * matrix units, which add the bias row themselves, or else f32 on the device's GEMM onto c,
 * which fill_biases started as the bias (beta 1). */
static int plan_gemm(const mha_plan *plan, const clattn__call *call, size_t m, size_t n, size_t k,
                     const clattn__matrices *a, const clattn__matrices *b,
                     const clattn_tensor *bias, int64_t first, const clattn__matrices *c) {
    if (!plan->units)
        return clattn__gemm_batched(call, true, m, n, k, a, b, bias ? 1.0f : 0.0f, c, 1);
    const clattn__bias_row row = {
        bias ? bias->buffer : NULL, bias ? bias->offset + (size_t)(first * bias->strides[3]) : 0,
        bias ? (size_t)bias->strides[3] : 0, bias ? bias->dtype : CLATTN_F32};
    return clattn__gemm_units_batched(call, plan->inner, plan->inner, true, m, n, k, a, b,
                                      bias ? &row : NULL, 0.0f, c, 1);
}

/* Step 3: the input projections. */
static int project_inputs(const mha_args *a, const mha_plan *plan, const clattn__call *call,
                          cl_mem ws) {
    int status = CLATTN_SUCCESS;
    for (int j = 0; j < plan->njobs && status == CLATTN_SUCCESS; ++j) {
        const proj_job *job = &plan->jobs[j];
        const clattn_tensor *x = a->in[job->input];
        const clattn__matrices xm = matrix_of(x, plan->in_at[job->input], ws);
        clattn__matrices wm = matrix_of(weight_of(a, job->slot), plan->w_at[job->slot], ws);
        wm.offset += (size_t)job->first_row * wm.ld;
        const clattn__matrices cm = {ws, job->at, job->ld, 0};
        status =
            plan_gemm(plan, call, (size_t)(x->shape[1] * x->shape[2]), (size_t)job->n,
                      (size_t)x->shape[3], &xm, &wm, a->p->in_proj_bias, job->input * a->E, &cm);
    }
    return status;
}

/* Step 5: out = ctx Wo^T + the bias. */
static int project_output(const mha_args *a, const mha_plan *plan, const clattn__call *call,
                          cl_mem ws) {
    const clattn__matrices ctx = {ws, plan->ctx_at, (size_t)a->E, 0};
    const clattn__matrices wm = matrix_of(a->p->out_proj_weight, plan->w_at[W_OUT], ws);
    const clattn__matrices c = out_matrix(a, plan, ws);
    const size_t m = (size_t)(a->B * a->Sq), e = (size_t)a->E;
    return plan_gemm(plan, call, m, e, e, &ctx, &wm, a->p->out_proj_bias, 0, &c);
}

/* ---- the masks ---- */

/* The padding mask {1,1,B,Sk} seen as [B,1,1,Sk]. */
static clattn_tensor padding_view(const clattn_tensor *kpm) {
    clattn_tensor v = *kpm;
    v.shape[0] = kpm->shape[2], v.shape[1] = v.shape[2] = 1;
    v.strides[0] = kpm->strides[2], v.strides[1] = v.strides[2] = 0;
    return v;
}

/* The merged mask in the workspace, as the attention reads it. */
static clattn_tensor merged_view(const mha_args *a, const mha_plan *plan, cl_mem ws) {
    if (a->attn_kind == MASK_KEEP) { /* the padding mask as an additive [B,1,1,Sk] */
        clattn_tensor t = clattn_tensor_4d(ws, CLATTN_F32, a->B, 1, 1, a->Sk);
        t.offset = plan->mask_at;
        return t;
    }
    const int64_t *m = a->o.attn_mask->shape;
    clattn_tensor t = clattn_tensor_4d(ws, CLATTN_F32, a->B, m[1], m[2], a->Sk);
    t.offset = plan->mask_at;
    return t;
}

/* The attention's mask from the call's two masks (as torch combines them: both apply) and
 * is_causal. keep and bias receive the views the mask points at. */
static clattn_mask attention_mask(const mha_args *a, const mha_plan *plan, cl_mem ws,
                                  clattn_tensor *keep, clattn_tensor *bias) {
    clattn_mask m;
    memset(&m, 0, sizeof m);
    m.causal = a->o.is_causal != 0;
    const clattn_tensor *attn = a->o.attn_mask;
    if (plan->mask_at != NONE) {
        *bias = merged_view(a, plan, ws);
        m.bias = bias;
        if (a->attn_kind == MASK_KEEP) m.keep = attn;
        return m;
    }
    if (a->kpm_kind != MASK_NONE) {
        clattn_tensor *slot = a->kpm_kind == MASK_KEEP ? keep : bias;
        *slot = padding_view(a->o.key_padding_mask);
        if (a->kpm_kind == MASK_KEEP)
            m.keep = keep;
        else
            m.bias = bias;
    }
    if (a->attn_kind == MASK_KEEP) m.keep = attn;
    if (a->attn_kind == MASK_ADD) m.bias = attn;
    return m;
}

/* A 1-D launch of one of cl/mha.cl's kernels over `total` elements. */
static int launch_flat(const clattn__call *call, cl_kernel kernel, size_t total) {
    const clattn__call step = clattn__step_call(call);
    cl_event none = NULL; /* a step of its own: no wait, no event */
    return clattn__enqueue_items(&step, kernel, total, 256, &none, true);
}

/* One of cl/mha.cl's kernels, built for the call. */
static int mha_kernel(const clattn__call *call, clattn_dtype out_dtype, bool wide, const char *name,
                      cl_kernel *kernel) {
    char options[128];
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DOUT_T=%s -DIDX=%s",
             clattn_dtype_name(out_dtype), wide ? "ulong" : "uint");
    return clattn__create_kernel(call->context, call->device, "mha.cl", options, name, kernel);
}

/* Step 1: the merged mask, when both masks are u8 or both float. */
static int merge_masks(const mha_args *a, const mha_plan *plan, const clattn__call *call,
                       cl_mem ws) {
    if (plan->mask_at == NONE) return CLATTN_SUCCESS;
    const clattn_tensor *kpm = a->o.key_padding_mask, *attn = a->o.attn_mask;
    const clattn_tensor merged = merged_view(a, plan, ws);
    if (a->attn_kind == MASK_ADD) { /* merged = attn + padding, both broadcast to its shape */
        clattn_tensor src = *attn, pad = padding_view(kpm);
        for (int i = 0; i < 4; ++i) {
            if (src.shape[i] != merged.shape[i]) src.strides[i] = 0;
            src.shape[i] = pad.shape[i] = merged.shape[i];
        }
        return copy_into(call, &src, &pad, &merged);
    }
    const clattn_tensor *views[2] = {kpm, &merged};
    const bool wide = clattn__needs_wide_index(views, 2);
    cl_kernel kernel = NULL;
    int status = mha_kernel(call, CLATTN_F32, wide, "mha_keep_to_bias", &kernel);
    cl_uint arg = 0;
    const uint64_t sk = (uint64_t)a->Sk, total = (uint64_t)(a->B * a->Sk);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, kpm, 2, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, arg++, sk, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, &merged, 4, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, arg++, total, wide);
    if (status == CLATTN_SUCCESS) status = launch_flat(call, kernel, (size_t)total);
    clattn__release_kernel(kernel);
    return status;
}

/* Step 5: the averaged weights, the heads' mean of the per-head ones. */
static int average_weights(const mha_args *a, const mha_plan *plan, const clattn__call *call,
                           cl_mem ws) {
    const clattn_tensor probs = probs_view(a, plan, ws), *w = a->o.weights;
    const clattn_tensor *views[2] = {&probs, w};
    const bool wide = clattn__needs_wide_index(views, 2);
    cl_kernel kernel = NULL;
    int status = mha_kernel(call, w->dtype, wide, "mha_head_mean", &kernel);
    cl_uint arg = 0;
    const cl_int heads = (cl_int)a->H;
    const uint64_t total = (uint64_t)(a->B * a->Sq * a->Sk);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, &probs, 4, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_arg(kernel, arg++, heads);
    if (status == CLATTN_SUCCESS)
        status = clattn__set_idx_arg(kernel, arg++, (uint64_t)a->Sq, wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__set_idx_arg(kernel, arg++, (uint64_t)a->Sk, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, w, 1, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, arg++, total, wide);
    if (status == CLATTN_SUCCESS) status = launch_flat(call, kernel, (size_t)total);
    clattn__release_kernel(kernel);
    return status;
}

/* ---- the call ---- */

/* The attention step: its views in the workspace and its mask, checked by the attention's
 * own checks before anything is enqueued, then enqueued with the plan made with MHA's. */
typedef struct attention_step {
    clattn_tensor heads[4], probs, keep, bias;
    clattn_mask mask;
    clattn__attention_args args;
    cl_mem scratch; /* the attention's region of the workspace (NULL: it needs none) */
} attention_step;

static int prepare_attention(const mha_args *a, const mha_plan *plan, const clattn__call *call,
                             cl_mem ws, attention_step *s) {
    head_views(a, plan, ws, s->heads);
    s->probs = probs_view(a, plan, ws);
    s->mask = attention_mask(a, plan, ws, &s->keep, &s->bias);
    const clattn_tensor *weights =
        a->o.weights && a->o.average_attn_weights ? &s->probs : a->o.weights;
    s->args = (clattn__attention_args){&s->heads[0], &s->heads[1], &s->heads[2], &s->heads[3], NULL,
                                       weights,      &s->mask,     0.0f,         {0}};
    const clattn_attention_options options = {.weights = weights};
    int path = 0;
    int status = clattn__attention_check(&s->args, &options, call->context, &path);
    if (status != CLATTN_SUCCESS || plan->attn.bytes == 0) return status;
    /* OpenCL makes no sub-buffer of a sub-buffer: a caller's workspace that is one gives the
     * region of its parent at its own origin (aligned, since the caller's exists) */
    cl_mem parent = NULL;
    size_t origin = 0;
    clGetMemObjectInfo(ws, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL);
    if (parent) clGetMemObjectInfo(ws, CL_MEM_OFFSET, sizeof origin, &origin, NULL);
    const cl_buffer_region region = {origin, plan->attn.bytes};
    cl_int err;
    s->scratch =
        clCreateSubBuffer(parent ? parent : ws, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    return err == CL_SUCCESS ? CLATTN_SUCCESS : clattn__cl_fail(err, "clCreateSubBuffer");
}

static int run_attention(const mha_plan *plan, const attention_step *s, const clattn__call *call) {
    const clattn__call step = clattn__step_call(call);
    return clattn__attention_enqueue(&s->args, &plan->attn, &step, s->scratch);
}

static int enqueue_mha(const mha_args *a, const mha_plan *plan, const attention_step *s,
                       const clattn__call *call, cl_mem ws) {
    const bool ooo = clattn__queue_out_of_order(call->queue);
    int status = clattn__steps_begin(call);
    if (status == CLATTN_SUCCESS) status = make_images(a, plan, call, ws);
    if (status == CLATTN_SUCCESS) status = merge_masks(a, plan, call, ws);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = fill_biases(a, plan, call, ws);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = project_inputs(a, plan, call, ws);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = run_attention(plan, s, call);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = project_output(a, plan, call, ws);
    if (status == CLATTN_SUCCESS && a->o.weights && a->o.average_attn_weights)
        status = average_weights(a, plan, call, ws);
    if (status == CLATTN_SUCCESS && plan->out_at != NONE) {
        const clattn_tensor image = image_of(a->out, plan->out_at, plan->inner, ws);
        status = clattn__steps_boundary(call, ooo);
        if (status == CLATTN_SUCCESS) status = copy_into(call, &image, NULL, a->out);
    }
    if (status == CLATTN_SUCCESS) status = clattn__steps_end(call);
    return status;
}

/* Checks everything and lays out the scratch. */
static int plan_call(mha_args *a, const clattn__call *call, mha_plan *plan) {
    int status = check_mha(a, call->context);
    if (status == CLATTN_SUCCESS) status = plan_mha(a, call, plan);
    return status;
}

static mha_args make_args(const clattn_tensor *query, const clattn_tensor *key,
                          const clattn_tensor *value, const clattn_mha_params *params,
                          const clattn_tensor *out, const clattn_mha_options *options) {
    mha_args a;
    memset(&a, 0, sizeof a);
    a.in[IN_QUERY] = query, a.in[IN_KEY] = key, a.in[IN_VALUE] = value;
    a.out = out, a.p = params;
    if (options) a.o = *options;
    return a;
}

static int get_workspace(const mha_args *a, const mha_plan *plan, cl_context context, cl_mem *ws,
                         bool *owned) {
    clattn__tensor_list tensors;
    tensors_of(a, &tensors);
    return clattn__get_workspace(a->o.workspace, plan->floats * sizeof(float), context, &tensors,
                                 ws, owned);
}

int clattn_mha_forward(const clattn_tensor *query, const clattn_tensor *key,
                       const clattn_tensor *value, const clattn_mha_params *params,
                       const clattn_tensor *out, const clattn_mha_options *options,
                       cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                       cl_event *event) {
    clattn__call call;
    mha_args a = make_args(query, key, value, params, out, options);
    mha_plan plan;
    attention_step step;
    memset(&step, 0, sizeof step);
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = plan_call(&a, &call, &plan);
    cl_mem ws = NULL;
    bool owned = false;
    if (status == CLATTN_SUCCESS) status = get_workspace(&a, &plan, call.context, &ws, &owned);
    /* f32 GEMMs: the projections, or the composed attention's (weights) */
    if (status == CLATTN_SUCCESS) status = clattn__gemm_prepare(&call);
    if (status == CLATTN_SUCCESS) status = prepare_attention(&a, &plan, &call, ws, &step);
    if (status == CLATTN_SUCCESS) status = enqueue_mha(&a, &plan, &step, &call, ws);
    if (step.scratch) clReleaseMemObject(step.scratch);
    if (owned && ws) clReleaseMemObject(ws);
    return status;
}

int clattn_mha_workspace_size(const clattn_tensor *query, const clattn_tensor *key,
                              const clattn_tensor *value, const clattn_mha_params *params,
                              const clattn_tensor *out, const clattn_mha_options *options,
                              cl_command_queue queue, size_t *bytes) {
    clattn__call call;
    mha_args a = make_args(query, key, value, params, out, options);
    mha_plan plan;
    int status = clattn__begin_call(&call, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && !bytes)
        status = clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    if (status == CLATTN_SUCCESS) status = plan_call(&a, &call, &plan);
    if (status == CLATTN_SUCCESS) *bytes = plan.floats * sizeof(float);
    return status;
}
