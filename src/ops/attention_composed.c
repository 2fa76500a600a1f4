/*
 * The composed attention path: scores = q k^T by CLBlast's strided-batched SGEMM with the heads
 * as the batch, the softmax in place (every mask part, lse), out = p v by SGEMM. It costs
 * B*Hq*Sq*Sk floats of scratch and the full quadratic work, so it serves what the fused kernel
 * cannot give: the attention weights, and a cross-check of the fused kernel in the tests. Its
 * backward recomputes p the same way, dS by the softmax's backward, and the four products by
 * GEMMs (the transposed ones through a transposed copy of p or dS).
 *
 * CLBlast reads row-major f32 matrices, so an input that is f16/bf16, or whose head dim is not
 * contiguous, is first converted into f32 scratch by the copy kernel; an output that CLBlast cannot
 * write directly is produced in scratch and converted into place the same way.
 */
#include "attention.h"
#include "gemm.h"
#include "heads.h"
#include "softmax.h"

/* Where each operand lives in the workspace (offsets in floats; SIZE_MAX: used in place). */
typedef struct composed_plan {
    size_t q_at, k_at, v_at, p_at, o_at;
    size_t floats;
} composed_plan;

/* CLBlast can read or write the view as it is: f32 rows of `cols` contiguous elements. */
static bool gemm_ready(const clattn_tensor *t, int64_t cols) {
    return t->dtype == CLATTN_F32 && t->strides[3] == 1 && t->strides[2] >= cols;
}

static size_t place(size_t *floats, bool needed, const int64_t dims[4]) {
    if (!needed) return SIZE_MAX;
    size_t at = *floats;
    *floats += (size_t)(dims[0] * dims[1] * dims[2] * dims[3]);
    return at;
}

static composed_plan plan_composed(const clattn__attention_args *a) {
    const int64_t *q = a->q->shape, *k = a->k->shape, *v = a->v->shape;
    const int64_t scores[4] = {q[0], q[1], q[2], k[2]};
    composed_plan p;
    p.floats = 0;
    p.q_at = place(&p.floats, !gemm_ready(a->q, q[3]), q);
    p.k_at = place(&p.floats, !gemm_ready(a->k, k[3]), k);
    p.v_at = place(&p.floats, !gemm_ready(a->v, v[3]), v);
    p.p_at = place(&p.floats, !(a->weights && gemm_ready(a->weights, k[2])), scores);
    p.o_at = place(&p.floats, !gemm_ready(a->out, v[3]), a->out->shape);
    return p;
}

size_t clattn__attention_composed_workspace(const clattn__attention_args *a) {
    return plan_composed(a).floats * sizeof(float);
}

/* The tensor itself, or its dense f32 image at `at` in the workspace. */
static clattn_tensor operand(const clattn_tensor *t, size_t at, cl_mem workspace) {
    if (at == SIZE_MAX) return *t;
    clattn_tensor dense =
        clattn_tensor_4d(workspace, CLATTN_F32, t->shape[0], t->shape[1], t->shape[2], t->shape[3]);
    dense.offset = at;
    return dense;
}

/* c[b, h] = a[b, h] op(w[b, h / ratio]) for every batch and query head, as few CLBlast calls as
 * the strides allow: the batch folds into CLBlast's batch when every operand's batch stride is
 * its head stride times its heads, and the `ratio` query heads that share a kv head become one
 * taller matrix when their rows follow each other in a and c. */
static int gemm_over_heads(const clattn__call *call, bool trans_w, const clattn_tensor *a,
                           const clattn_tensor *w, const clattn_tensor *c, size_t n, size_t k) {
    const int64_t B = a->shape[0], Hq = a->shape[1], Sq = a->shape[2], Hkv = w->shape[1];
    const int64_t ratio = Hq / Hkv, *as = a->strides, *ws = w->strides, *cs = c->strides;
    const bool stack = ratio > 1 && as[1] == Sq * as[2] && cs[1] == Sq * cs[2];
    const bool fold = as[0] == Hq * as[1] && ws[0] == Hkv * ws[1] && cs[0] == Hq * cs[1];
    const int64_t batches = fold ? 1 : B, rounds = stack ? 1 : ratio;
    const size_t m = (size_t)(stack ? ratio * Sq : Sq), count = (size_t)(fold ? B * Hkv : Hkv);
    int status = CLATTN_SUCCESS;
    for (int64_t b = 0; b < batches && status == CLATTN_SUCCESS; ++b)
        for (int64_t r = 0; r < rounds && status == CLATTN_SUCCESS; ++r) {
            const clattn__matrices am = {a->buffer, a->offset + (size_t)(b * as[0] + r * as[1]),
                                         (size_t)as[2], (size_t)(ratio * as[1])};
            const clattn__matrices wm = {w->buffer, w->offset + (size_t)(b * ws[0]), (size_t)ws[2],
                                         (size_t)ws[1]};
            const clattn__matrices cm = {c->buffer, c->offset + (size_t)(b * cs[0] + r * cs[1]),
                                         (size_t)cs[2], (size_t)(ratio * cs[1])};
            status = clattn__gemm_batched(call, trans_w, m, n, k, &am, &wm, 0.0f, &cm, count);
        }
    return status;
}

/* Copies `src` into `dst` unless they are the same view. */
static int convert(const clattn__call *call, const clattn_tensor *src, const clattn_tensor *dst) {
    if (src->buffer == dst->buffer && src->offset == dst->offset && src->dtype == dst->dtype)
        return CLATTN_SUCCESS;
    const clattn__call step = clattn__step_call(call);
    return clattn__copy_enqueue(src, NULL, dst, &step);
}

/* The softmax over the scores p in place, with the attention's checked mask and scale. */
static int normalize(const clattn__attention_args *a, const clattn__softmax_tuning *softmax,
                     const clattn__call *call, const clattn_tensor *p) {
    const clattn__softmax_args s = {p, p, a->lse, a->scale, a->mask};
    const clattn__call step = clattn__step_call(call);
    return clattn__softmax_enqueue(&s, softmax, &step);
}

int clattn__attention_composed(const clattn__attention_args *a,
                               const clattn__softmax_tuning *softmax, const clattn__call *call,
                               cl_mem workspace) {
    const composed_plan plan = plan_composed(a);
    const bool ooo = clattn__queue_out_of_order(call->queue);
    const clattn_tensor q = operand(a->q, plan.q_at, workspace),
                        k = operand(a->k, plan.k_at, workspace),
                        v = operand(a->v, plan.v_at, workspace),
                        o = operand(a->out, plan.o_at, workspace);
    const int64_t scores[4] = {a->q->shape[0], a->q->shape[1], a->q->shape[2], a->k->shape[2]};
    clattn_tensor p = plan.p_at == SIZE_MAX ? *a->weights
                                            : clattn_tensor_4d(workspace, CLATTN_F32, scores[0],
                                                               scores[1], scores[2], scores[3]);
    if (plan.p_at != SIZE_MAX) p.offset = plan.p_at;
    const size_t d = (size_t)a->q->shape[3], dv = (size_t)a->v->shape[3],
                 sk = (size_t)a->k->shape[2];

    /* the gemm row is read (and given to CLBlast) before the first enqueue: a bad override
     * fails the call with nothing enqueued */
    int status = clattn__gemm_prepare(call);
    if (status == CLATTN_SUCCESS) status = clattn__steps_begin(call);
    if (status == CLATTN_SUCCESS) status = convert(call, a->q, &q);
    if (status == CLATTN_SUCCESS) status = convert(call, a->k, &k);
    if (status == CLATTN_SUCCESS) status = convert(call, a->v, &v);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = gemm_over_heads(call, true, &q, &k, &p, sk, d);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = normalize(a, softmax, call, &p);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = gemm_over_heads(call, false, &p, &v, &o, dv, sk);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = convert(call, &o, a->out);
    if (status == CLATTN_SUCCESS && a->weights) status = convert(call, &p, a->weights);
    if (status == CLATTN_SUCCESS) status = clattn__steps_end(call);
    return status;
}

/* ---- the backward ---- */

/* Where each operand of the backward lives in the workspace (offsets in floats; SIZE_MAX: used
 * in place): the inputs and outputs CLBlast cannot use as they are, p, dS, and the transposed
 * copy that dV and dK multiply. */
typedef struct composed_grads_plan {
    size_t q_at, k_at, v_at, do_at, p_at, ds_at, t_at, dq_at, dk_at, dv_at;
    size_t floats;
} composed_grads_plan;

static composed_grads_plan plan_grads(const clattn__attention_grads *g) {
    const clattn__attention_args *a = g->a;
    const int64_t *q = a->q->shape, *k = a->k->shape, *v = a->v->shape;
    const int64_t scores[4] = {q[0], q[1], q[2], k[2]};
    composed_grads_plan p;
    p.floats = 0;
    p.q_at = place(&p.floats, !gemm_ready(a->q, q[3]), q);
    p.k_at = place(&p.floats, !gemm_ready(a->k, k[3]), k);
    p.v_at = place(&p.floats, !gemm_ready(a->v, v[3]), v);
    p.do_at = place(&p.floats, !gemm_ready(g->dout, v[3]), g->dout->shape);
    p.p_at = place(&p.floats, true, scores);
    p.ds_at = place(&p.floats, true, scores);
    p.t_at = place(&p.floats, true, scores);
    p.dq_at = place(&p.floats, !gemm_ready(g->dq, q[3]), q);
    p.dk_at = place(&p.floats, !gemm_ready(g->dk, k[3]), k);
    p.dv_at = place(&p.floats, !gemm_ready(g->dv, v[3]), v);
    return p;
}

size_t clattn__attention_composed_backward_workspace(const clattn__attention_grads *g) {
    return plan_grads(g).floats * sizeof(float);
}

/* c[b, hk] = sum over the query heads h of kv head hk of t[b, h] x[b, h]: t [B,Hq,Sk,Sq] (a
 * transposed p or dS), x [B,Hq,Sq,n], c [B,Hkv,Sk,n]; one CLBlast call per query head of a
 * group (the later ones add, beta 1), the batch folded into CLBlast's when the strides allow. */
static int gemm_sum_over_group(const clattn__call *call, const clattn_tensor *t,
                               const clattn_tensor *x, const clattn_tensor *c, size_t n) {
    const int64_t B = t->shape[0], Hq = t->shape[1], Sk = t->shape[2], Sq = t->shape[3];
    const int64_t Hkv = c->shape[1], ratio = Hq / Hkv;
    const int64_t *ts = t->strides, *xs = x->strides, *cs = c->strides;
    const bool fold = ts[0] == Hq * ts[1] && xs[0] == Hq * xs[1] && cs[0] == Hkv * cs[1];
    const int64_t batches = fold ? 1 : B;
    const size_t count = (size_t)(fold ? B * Hkv : Hkv);
    int status = CLATTN_SUCCESS;
    for (int64_t b = 0; b < batches && status == CLATTN_SUCCESS; ++b)
        for (int64_t r = 0; r < ratio && status == CLATTN_SUCCESS; ++r) {
            const clattn__matrices tm = {t->buffer, t->offset + (size_t)(b * ts[0] + r * ts[1]),
                                         (size_t)ts[2], (size_t)(ratio * ts[1])};
            const clattn__matrices xm = {x->buffer, x->offset + (size_t)(b * xs[0] + r * xs[1]),
                                         (size_t)xs[2], (size_t)(ratio * xs[1])};
            const clattn__matrices cm = {c->buffer, c->offset + (size_t)(b * cs[0]), (size_t)cs[2],
                                         (size_t)cs[1]};
            status = clattn__gemm_batched(call, false, (size_t)Sk, n, (size_t)Sq, &tm, &xm,
                                          r > 0 ? 1.0f : 0.0f, &cm, count);
        }
    return status;
}

/* t = the [B,Hq,Sk,Sq] transpose of `m`, by the copy kernel. */
static int transpose(const clattn__call *call, const clattn_tensor *m, const clattn_tensor *t) {
    static const int swap[4] = {0, 1, 3, 2};
    const clattn_tensor view = clattn_tensor_permute(*m, swap);
    const clattn__call step = clattn__step_call(call);
    return clattn__copy_enqueue(&view, NULL, t, &step);
}

/* The scores' dense f32 buffer at `at` in the workspace, [B,Hq,Sq,Sk] or transposed. */
static clattn_tensor scores_at(const clattn__attention_args *a, cl_mem workspace, size_t at,
                               bool transposed) {
    const int64_t *q = a->q->shape, sk = a->k->shape[2];
    clattn_tensor t = transposed ? clattn_tensor_4d(workspace, CLATTN_F32, q[0], q[1], sk, q[2])
                                 : clattn_tensor_4d(workspace, CLATTN_F32, q[0], q[1], q[2], sk);
    t.offset = at;
    return t;
}

int clattn__attention_composed_backward(const clattn__attention_grads *g,
                                        const clattn__softmax_tuning *softmax,
                                        const clattn__call *call, cl_mem workspace) {
    const clattn__attention_args *a = g->a;
    const composed_grads_plan plan = plan_grads(g);
    const bool ooo = clattn__queue_out_of_order(call->queue);
    const clattn_tensor q = operand(a->q, plan.q_at, workspace),
                        k = operand(a->k, plan.k_at, workspace),
                        v = operand(a->v, plan.v_at, workspace),
                        dout = operand(g->dout, plan.do_at, workspace),
                        dq = operand(g->dq, plan.dq_at, workspace),
                        dk = operand(g->dk, plan.dk_at, workspace),
                        dv = operand(g->dv, plan.dv_at, workspace);
    const clattn_tensor p = scores_at(a, workspace, plan.p_at, false),
                        ds = scores_at(a, workspace, plan.ds_at, false),
                        t = scores_at(a, workspace, plan.t_at, true);
    const clattn__attention_args no_lse = {a->q, a->k,         a->v,     NULL,   NULL,
                                           NULL, a->mask_desc, a->scale, a->mask};
    const size_t d = (size_t)a->q->shape[3], dv_n = (size_t)a->v->shape[3],
                 sk = (size_t)a->k->shape[2];
    const clattn__call step = clattn__step_call(call);

    int status = clattn__gemm_prepare(call);
    if (status == CLATTN_SUCCESS) status = clattn__steps_begin(call);
    const clattn_tensor *inputs[4][2] = {{a->q, &q}, {a->k, &k}, {a->v, &v}, {g->dout, &dout}};
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = convert(call, inputs[i][0], inputs[i][1]);
    /* p = softmax(mask(scale q k^T)), dS = dO v^T, then dS = scale p (dS - rowsum(dS p)) */
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = gemm_over_heads(call, true, &q, &k, &p, sk, d);
    if (status == CLATTN_SUCCESS) status = gemm_over_heads(call, true, &dout, &v, &ds, sk, dv_n);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = normalize(&no_lse, softmax, call, &p);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS)
        status = clattn__softmax_backward_enqueue(&p, &ds, a->scale, &ds, &step);
    /* dq = dS k; dv = p^T dO and dk = dS^T q through the transposed copy */
    if (status == CLATTN_SUCCESS) status = transpose(call, &p, &t);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = gemm_over_heads(call, false, &ds, &k, &dq, d, sk);
    if (status == CLATTN_SUCCESS) status = gemm_sum_over_group(call, &t, &dout, &dv, dv_n);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = transpose(call, &ds, &t);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    if (status == CLATTN_SUCCESS) status = gemm_sum_over_group(call, &t, &q, &dk, d);
    if (status == CLATTN_SUCCESS) status = clattn__steps_boundary(call, ooo);
    const clattn_tensor *outputs[3][2] = {{&dq, g->dq}, {&dk, g->dk}, {&dv, g->dv}};
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        status = convert(call, outputs[i][0], outputs[i][1]);
    if (status == CLATTN_SUCCESS) status = clattn__steps_end(call);
    return status;
}
