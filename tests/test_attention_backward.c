/* Tests of the gradients of attention and linear attention. First the float64 references
 * themselves (tests/ref.c: ref_attention_backward, ref_linear_attention_backward), against
 * central finite differences of the forward references on small shapes with every mask part:
 * the kernels' tests will trust them. */
#include "harness.h"
#include "ops/attention.h"
#include "ref.h"
#include "runtime/program_cache.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"

#include <stdio.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, HQ = 4, HKV = 2, SQ = 3, SK = 5, D = 4, DV = 3 };
enum { NQ = B * HQ * SQ * D, NK = B * HKV * SK * D, NV = B * HKV * SK * DV, NO = B * HQ * SQ * DV };
enum { NBIAS = B * HQ * SQ * SK }; /* the largest bias extent a case uses */

/* Inputs on a grid of 2^-6 in [-1.5, 1.5], so that x +- 2^-15 is exact in float. */
static void fill_grid(float *x, int n, uint64_t *rng) {
    for (int i = 0; i < n; ++i) x[i] = (float)((int)(test_rand_u64(rng) % 193) - 96) / 64.0f;
}

/* The inputs of one finite-difference check: the forward's, and its mask or linear parameters. */
typedef struct problem {
    float *q, *k, *v, *dout;
    double scale;
    const ref_mask *mask;     /* softmax attention */
    const ref_linear *linear; /* or linear attention */
} problem;

/* sum(out o dout) of the problem's forward: the scalar whose gradients the references give. */
static double objective(const problem *f) {
    static double out[NO], p[B * HQ * SQ * SK];
    if (f->linear)
        ref_linear_attention(f->linear, f->q, f->k, f->v, out, NULL);
    else if (!ref_attention(f->q, f->k, f->v, B, HQ, HKV, SQ, SK, D, DV, f->scale, f->mask, out, p,
                            NULL))
        return NAN;
    double sum = 0;
    for (int i = 0; i < NO; ++i) sum += out[i] * f->dout[i];
    return sum;
}

/* The central difference of the objective in each element of x (a float input) or xd (a double
 * one, the bias), against `want`; returns the worst |fd - want| / (1 + |want|) and counts the
 * gradients that are not near 0. */
static double check_input(const problem *f, float *x, double *xd, int n, const double *want,
                          int *nonzero) {
    const double step = 1.0 / 32768; /* exact on the grid; truncation ~1e-7 */
    double worst = 0;
    for (int at = 0; at < n; ++at) {
        double up, down;
        if (x) {
            const float saved = x[at];
            x[at] = saved + (float)step, up = objective(f);
            x[at] = saved - (float)step, down = objective(f);
            x[at] = saved;
        } else {
            const double saved = xd[at];
            xd[at] = saved + step, up = objective(f);
            xd[at] = saved - step, down = objective(f);
            xd[at] = saved;
        }
        const double fd = (up - down) / (2 * step);
        const double err = fabs(fd - want[at]) / (1 + fabs(want[at]));
        if (!(err <= worst)) worst = err; /* NaN counts */
        *nonzero += fabs(want[at]) > 1e-3;
    }
    return worst;
}

/* The worst relative difference over q, k and v. */
static double check_qkv(const problem *f, const double *dq, const double *dk, const double *dv,
                        int *nonzero) {
    double worst = check_input(f, f->q, NULL, NQ, dq, nonzero);
    worst = fmax(worst, check_input(f, f->k, NULL, NK, dk, nonzero));
    return fmax(worst, check_input(f, f->v, NULL, NV, dv, nonzero));
}

typedef struct fd_case {
    const char *name;
    ref_mask mask;
    int bias_n; /* elements of the bias extent, 0 without a bias */
} fd_case;

static void reference_matches_finite_differences(test_ctx *t) {
    static const int32_t key_lengths[B] = {4, 2}, no_keys[B] = {0, 5};
    static double alibi[HQ] = {0.5, 0.25, 0.125, 0.0625};
    static uint8_t keep[B * SK] = {1, 0, 1, 1, 1, 1, 1, 0, 1, 1};
    static double bias[NBIAS];
    const fd_case cases[] = {
        {"no mask", {0}, 0},
        {"causal bottom-right, key lengths",
         {.causal = 1, .bottom_right = 1, .key_lengths = key_lengths},
         0},
        {"softcap, a per-head bias, ALiBi",
         {.softcap = 2.0, .bias = bias, .bias_strides = {0, SQ * SK, SK, 1}, .alibi = alibi},
         HQ * SQ * SK},
        {"window, global keys, keep mask, a key-padding bias",
         {.window = 1,
          .left = 1,
          .right = 0,
          .global_stride = 4,
          .keep = keep,
          .keep_strides = {SK, 0, 0, 1},
          .bias = bias,
          .bias_strides = {SK, 0, 0, 1}},
         B * SK},
        {"a batch with no keys (empty rows)", {.key_lengths = no_keys}, 0},
    };
    static float q[NQ], k[NK], v[NV], dout[NO];
    static double dq[NQ], dk[NK], dv[NV], dbias[NBIAS];
    uint64_t rng = 29;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        fill_grid(q, NQ, &rng), fill_grid(k, NK, &rng), fill_grid(v, NV, &rng);
        fill_grid(dout, NO, &rng);
        for (int i = 0; i < NBIAS; ++i) bias[i] = (double)(test_rand_u64(&rng) % 97) / 32.0 - 1.5;
        const ref_mask *m = &cases[c].mask;
        const double scale = 0.7;
        memset(dbias, 0, sizeof dbias);
        CHECK(t,
              ref_attention_backward(q, k, v, dout, B, HQ, HKV, SQ, SK, D, DV, scale, m, dq, dk, dv,
                                     cases[c].bias_n ? dbias : NULL),
              "out of host memory");
        const problem f = {q, k, v, dout, scale, m, NULL};
        int nonzero = 0;
        double worst = check_qkv(&f, dq, dk, dv, &nonzero);
        if (cases[c].bias_n)
            worst = fmax(worst, check_input(&f, NULL, bias, cases[c].bias_n, dbias, &nonzero));
        CHECK(t, worst < 1e-6, "%s: finite differences differ by %.3g (relative)", cases[c].name,
              worst);
        CHECK(t, nonzero > NQ / 2, "%s: only %d gradients are nonzero", cases[c].name, nonzero);
        if (m->key_lengths != no_keys) continue;
        /* batch 0 sees no key: its gradients are exactly 0, and the same when its outputs are
         * NaN (empty_nan), which the finite differences cannot follow */
        for (int i = 0; i < NQ / B; ++i)
            CHECK(t, dq[i] == 0, "%s: dq[%d] = %g in a row with no key", cases[c].name, i, dq[i]);
        static double dq_nan[NQ], dk_nan[NK], dv_nan[NV];
        ref_mask nan_rows = *m;
        nan_rows.empty_nan = 1;
        CHECK(t,
              ref_attention_backward(q, k, v, dout, B, HQ, HKV, SQ, SK, D, DV, scale, &nan_rows,
                                     dq_nan, dk_nan, dv_nan, NULL),
              "out of host memory");
        CHECK(t,
              memcmp(dq, dq_nan, sizeof dq) == 0 && memcmp(dk, dk_nan, sizeof dk) == 0 &&
                  memcmp(dv, dv_nan, sizeof dv) == 0,
              "empty_nan changed the gradients");
    }
}

/* Linear attention's reference gradients, for the three feature maps, non-causal and causal
 * (bottom-right) with key lengths: inputs off the grid's zeros (relu has no derivative at 0). */
static void linear_reference_matches_finite_differences(test_ctx *t) {
    static const int32_t key_lengths[B] = {5, 2};
    static float q[NQ], k[NK], v[NV], dout[NO];
    static double dq[NQ], dk[NK], dv[NV];
    uint64_t rng = 31;
    for (int feature_map = 0; feature_map < 3; ++feature_map)
        for (int causal = 0; causal < 2; ++causal) {
            fill_grid(q, NQ, &rng), fill_grid(k, NK, &rng), fill_grid(v, NV, &rng);
            fill_grid(dout, NO, &rng);
            /* relu: mostly positive, so that a row's weights do not all vanish (den = eps
             * there, where the differences cannot follow); identity: all positive, so that den
             * stays far from 0 */
            const float shift = feature_map == CLATTN_FEATURE_RELU ? 0.5f : 0.0f;
            for (int i = 0; i < NQ; ++i) q[i] += 1.0f / 128 + shift;
            for (int i = 0; i < NK; ++i) k[i] += 1.0f / 128 + shift;
            if (feature_map == CLATTN_FEATURE_IDENTITY)
                for (int i = 0; i < NK; ++i) q[i % NQ] = fabsf(q[i % NQ]), k[i] = fabsf(k[i]);
            const ref_mask mask = {.causal = causal, .bottom_right = 1, .key_lengths = key_lengths};
            const ref_linear p = {B, HQ, HKV, SQ, SK, D, DV, feature_map, 1e-6, &mask};
            CHECK(t, ref_linear_attention_backward(&p, q, k, v, dout, dq, dk, dv),
                  "out of host memory");
            const problem f = {q, k, v, dout, 1.0, NULL, &p};
            int nonzero = 0;
            const double worst = check_qkv(&f, dq, dk, dv, &nonzero);
            CHECK(t, worst < 1e-6, "feature map %d, causal %d: finite differences differ by %.3g",
                  feature_map, causal, worst);
            CHECK(t, nonzero > NQ / 2, "feature map %d, causal %d: only %d gradients are nonzero",
                  feature_map, causal, nonzero);
        }
}

/* ---- the kernels (src/ops/attention_backward.c) against the float64 reference ---- */

/* [B,Hq,Sq,Sk], [1,Hq,Sq,Sk], [B,1,1,Sk], [1,1,Sq,Sk], [1,Hq,1,Sk], then the two one value along
 * the keys: [B,1,Sq,1], [1,Hq,1,1] */
enum {
    BIAS_NONE,
    BIAS_FULL,
    BIAS_HEADS,
    BIAS_KEYS,
    BIAS_SHARED,
    BIAS_HEAD_KEYS,
    BIAS_ROWS,
    BIAS_PER_HEAD
};

typedef struct bw_spec {
    int64_t B, Hq, Hkv, Sq, Sk, D, Dv;
    clattn_dtype dt;
    float scale;                              /* 0: 1/sqrt(D) */
    int causal, bottom_right, window, layout; /* layout: test_upload_bhsd's bshd */
    int64_t left, right, global_stride;
    const int32_t *klen, *qlen;
    int keep; /* a [B,1,Sq,Sk] keep mask that hides about a fifth of the scores */
    int bias; /* BIAS_* */
    int alibi;
    float softcap;
    uint64_t seed;
} bw_spec;

/* One case's host data and device tensors. */
typedef struct bw_case {
    bw_spec s;
    float *q, *k, *v, *dout, *bias_f; /* dense host values */
    double *bias;                     /* the same bias, for the reference */
    uint8_t *keep;
    double alibi[16];
    ref_mask rm;
    clattn_mask mask;
    clattn_tensor klen_t, qlen_t, keep_t, bias_t, alibi_t;
    int64_t bias_shape[4];
} bw_case;

/* The gradients of one run, dense f32 (dbias in the bias's shape). */
typedef struct bw_grads {
    float *dq, *dk, *dv, *dbias;
} bw_grads;

static size_t count4(const int64_t n[4]) {
    return (size_t)(n[0] * n[1] * n[2] * n[3]);
}

static cl_mem upload(test_ctx *t, const void *host, size_t bytes) {
    cl_mem m = test_buffer(t, bytes);
    if (m && !test_write(t, m, host, bytes)) return NULL;
    return m;
}

static void bias_shape(const bw_spec *s, int64_t n[4]) {
    const int64_t full[4] = {s->B, s->Hq, s->Sq, s->Sk};
    for (int i = 0; i < 4; ++i) n[i] = full[i];
    if (s->bias == BIAS_HEADS) n[0] = 1;
    if (s->bias == BIAS_KEYS) n[1] = n[2] = 1;
    if (s->bias == BIAS_SHARED) n[0] = n[1] = 1;
    if (s->bias == BIAS_HEAD_KEYS) n[0] = n[2] = 1;
    if (s->bias == BIAS_ROWS) n[1] = n[3] = 1;
    if (s->bias == BIAS_PER_HEAD) n[0] = n[2] = n[3] = 1;
}

/* The mask's tensors on the device and in the reference's form. */
static bool prepare_mask(test_ctx *t, bw_case *c, uint64_t *rng) {
    const bw_spec *s = &c->s;
    c->rm = (ref_mask){.causal = s->causal,
                       .bottom_right = s->bottom_right,
                       .window = s->window,
                       .left = s->left,
                       .right = s->right,
                       .global_stride = s->global_stride,
                       .softcap = s->softcap,
                       .key_lengths = s->klen,
                       .query_lengths = s->qlen};
    c->mask =
        (clattn_mask){.causal = s->causal,
                      .align = s->bottom_right ? CLATTN_ALIGN_BOTTOM_RIGHT : CLATTN_ALIGN_TOP_LEFT,
                      .window = s->window,
                      .window_left = s->left,
                      .window_right = s->right,
                      .global_stride = s->global_stride,
                      .softcap = s->softcap};
    bool ok = true;
    if (s->klen) {
        c->klen_t =
            clattn_tensor_4d(upload(t, s->klen, 4 * (size_t)s->B), CLATTN_I32, 1, 1, 1, s->B);
        c->mask.key_lengths = &c->klen_t;
        ok = ok && c->klen_t.buffer;
    }
    if (s->qlen) {
        c->qlen_t =
            clattn_tensor_4d(upload(t, s->qlen, 4 * (size_t)s->B), CLATTN_I32, 1, 1, 1, s->B);
        c->mask.query_lengths = &c->qlen_t;
        ok = ok && c->qlen_t.buffer;
    }
    if (s->keep) {
        const size_t n = (size_t)(s->B * s->Sq * s->Sk);
        c->keep = malloc(n);
        for (size_t i = 0; c->keep && i < n; ++i) c->keep[i] = test_rand_u64(rng) % 5 != 0;
        c->keep_t = clattn_tensor_4d(c->keep ? upload(t, c->keep, n) : NULL, CLATTN_U8, s->B, 1,
                                     s->Sq, s->Sk);
        c->keep_t.strides[1] = 0;
        c->rm.keep = c->keep;
        memcpy(c->rm.keep_strides, c->keep_t.strides, sizeof c->rm.keep_strides);
        c->mask.keep = &c->keep_t;
        ok = ok && c->keep_t.buffer;
    }
    if (s->bias != BIAS_NONE) {
        bias_shape(s, c->bias_shape);
        const size_t n = count4(c->bias_shape);
        c->bias = malloc(n * sizeof(double));
        c->bias_f = malloc(n * sizeof(float));
        if (c->bias && c->bias_f) test_fill_exact(c->bias_f, n, s->dt, rng);
        for (size_t i = 0; c->bias && c->bias_f && i < n; ++i) c->bias[i] = c->bias_f[i];
        c->bias_t = clattn_tensor_4d(NULL, s->dt, c->bias_shape[0], c->bias_shape[1],
                                     c->bias_shape[2], c->bias_shape[3]);
        void *stored = malloc(n * 4);
        for (size_t i = 0; stored && c->bias_f && i < n; ++i)
            ref_store(stored, s->dt, i, c->bias_f[i]);
        c->bias_t.buffer = stored ? upload(t, stored, n * clattn_dtype_size(s->dt)) : NULL;
        free(stored);
        c->rm.bias = c->bias;
        for (int i = 0; i < 4; ++i)
            c->rm.bias_strides[i] = c->bias_shape[i] == 1 ? 0 : c->bias_t.strides[i];
        c->mask.bias = &c->bias_t;
        ok = ok && c->bias_t.buffer;
    }
    if (s->alibi) {
        float slopes[16];
        for (int64_t h = 0; h < s->Hq; ++h) c->alibi[h] = slopes[h] = 1.0f / (float)(2 << h);
        c->alibi_t =
            clattn_tensor_4d(upload(t, slopes, 4 * (size_t)s->Hq), CLATTN_F32, 1, 1, 1, s->Hq);
        c->rm.alibi = c->alibi;
        c->mask.alibi_slopes = &c->alibi_t;
        ok = ok && c->alibi_t.buffer;
    }
    return ok;
}

static bool prepare_case(test_ctx *t, const bw_spec *s, bw_case *c) {
    memset(c, 0, sizeof *c);
    c->s = *s;
    uint64_t rng = s->seed * 31 + 11;
    const size_t nq = (size_t)(s->B * s->Hq * s->Sq * s->D),
                 nk = (size_t)(s->B * s->Hkv * s->Sk * s->D);
    const size_t nv = (size_t)(s->B * s->Hkv * s->Sk * s->Dv),
                 no = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
    c->q = malloc(nq * 4), c->k = malloc(nk * 4), c->v = malloc(nv * 4), c->dout = malloc(no * 4);
    if (!c->q || !c->k || !c->v || !c->dout) return false;
    test_fill_exact(c->q, nq, s->dt, &rng);
    test_fill_exact(c->k, nk, s->dt, &rng);
    test_fill_exact(c->v, nv, s->dt, &rng);
    test_fill_exact(c->dout, no, s->dt, &rng);
    return prepare_mask(t, c, &rng);
}

static void free_case(bw_case *c) {
    clattn_tensor *ts[5] = {&c->klen_t, &c->qlen_t, &c->keep_t, &c->bias_t, &c->alibi_t};
    for (int i = 0; i < 5; ++i)
        if (ts[i]->buffer) clReleaseMemObject(ts[i]->buffer);
    free(c->q), free(c->k), free(c->v), free(c->dout), free(c->bias_f), free(c->bias),
        free(c->keep);
}

static void free_grads(bw_grads *g) {
    free(g->dq), free(g->dk), free(g->dv), free(g->dbias);
    memset(g, 0, sizeof *g);
}

/* A view's elements, dense in its logical [n0,n1,n2,n3] order, as f32. */
static float *download(test_ctx *t, const clattn_tensor *view) {
    const size_t n = count4(view->shape);
    void *raw = malloc(n * 4);
    float *dense = malloc(n * 4);
    bool ok = raw && dense && test_read(t, view->buffer, raw, n * clattn_dtype_size(view->dtype));
    size_t at = 0;
    for (int64_t a = 0; ok && a < view->shape[0]; ++a)
        for (int64_t b = 0; b < view->shape[1]; ++b)
            for (int64_t c = 0; c < view->shape[2]; ++c)
                for (int64_t d = 0; d < view->shape[3]; ++d)
                    dense[at++] = ref_load(raw, view->dtype,
                                           (uint64_t)(a * view->strides[0] + b * view->strides[1] +
                                                      c * view->strides[2] + d * view->strides[3]));
    free(raw);
    if (!ok) free(dense);
    return ok ? dense : NULL;
}

/* n NaNs, malloc'ed (NULL when memory runs out): what an output holds before the call, so
 * that an element the call never writes cannot pass. */
static float *nan_floats(size_t n) {
    float *nan = malloc(n * 4);
    for (size_t i = 0; nan && i < n; ++i) nan[i] = NAN;
    return nan;
}

/* A [B,H,S,D] output of the case's dtype and layout, every element NaN (no buffer when memory
 * runs out). */
static clattn_tensor nan_output(test_ctx *t, const bw_spec *s, int64_t H, int64_t S, int64_t D) {
    float *nan = nan_floats((size_t)(s->B * H * S * D));
    clattn_tensor v = nan ? test_upload_bhsd(t, nan, s->B, H, S, D, s->dt, s->layout)
                          : clattn_tensor_4d(NULL, s->dt, s->B, H, S, D);
    free(nan);
    return v;
}

/* The forward (out in the case's dtype, lse in f32), then the backward into NaN-filled outputs;
 * the gradients come back dense. `options` may carry a workspace; its dbias is the case's.
 * *workspace_bytes (when not NULL) receives the size the call asks for. */
static int run_backward(test_ctx *t, const bw_case *c, clattn_attention_backward_options *options,
                        bw_grads *g, size_t *workspace_bytes) {
    const bw_spec *s = &c->s;
    memset(g, 0, sizeof *g);
    clattn_tensor q = test_upload_bhsd(t, c->q, s->B, s->Hq, s->Sq, s->D, s->dt, s->layout);
    clattn_tensor k = test_upload_bhsd(t, c->k, s->B, s->Hkv, s->Sk, s->D, s->dt, s->layout);
    clattn_tensor v = test_upload_bhsd(t, c->v, s->B, s->Hkv, s->Sk, s->Dv, s->dt, s->layout);
    clattn_tensor dout = test_upload_bhsd(t, c->dout, s->B, s->Hq, s->Sq, s->Dv, s->dt, s->layout);
    clattn_tensor out = nan_output(t, s, s->Hq, s->Sq, s->Dv);
    const size_t rows = (size_t)(s->B * s->Hq * s->Sq);
    float *nan_rows = nan_floats(rows);
    clattn_tensor lse = clattn_tensor_4d(nan_rows ? upload(t, nan_rows, rows * 4) : NULL,
                                         CLATTN_F32, 1, s->B, s->Hq, s->Sq);
    free(nan_rows);
    clattn_tensor dq = nan_output(t, s, s->Hq, s->Sq, s->D);
    clattn_tensor dk = nan_output(t, s, s->Hkv, s->Sk, s->D);
    clattn_tensor dv = nan_output(t, s, s->Hkv, s->Sk, s->Dv);
    clattn_tensor db = c->bias_t;
    if (s->bias != BIAS_NONE) {
        const size_t n = count4(c->bias_shape);
        float *nan = nan_floats(n);
        db = clattn_tensor_4d(nan ? upload(t, nan, n * 4) : NULL, CLATTN_F32, c->bias_shape[0],
                              c->bias_shape[1], c->bias_shape[2], c->bias_shape[3]);
        free(nan);
    }
    clattn_attention_backward_options plain = {0};
    if (!options) options = &plain;
    /* the composed path has no dbias */
    options->dbias = s->bias != BIAS_NONE && options->path != CLATTN_PATH_COMPOSED ? &db : NULL;
    clattn_tensor *all[10] = {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv, &db};
    int status = CLATTN_ERR_OUT_OF_HOST_MEMORY;
    bool ok = true;
    for (int i = 0; i < 10; ++i) ok = ok && (all[i]->buffer || (i == 9 && !options->dbias));
    cl_command_queue queue = clattn_env_queue(t->env);
    if (ok)
        status = clattn_attention(&q, &k, &v, s->scale, &c->mask, &out, &lse, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && workspace_bytes)
        status =
            clattn_attention_backward_workspace_size(&q, &k, &v, &out, &dout, &lse, &c->mask, &dq,
                                                     &dk, &dv, options, queue, workspace_bytes);
    if (status == CLATTN_SUCCESS)
        status = clattn_attention_backward(&q, &k, &v, &out, &dout, &lse, s->scale, &c->mask, &dq,
                                           &dk, &dv, options, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS) {
        g->dq = download(t, &dq), g->dk = download(t, &dk), g->dv = download(t, &dv);
        if (options->dbias) g->dbias = download(t, &db);
    }
    for (int i = 0; i < 10; ++i)
        if (all[i]->buffer && (i < 9 || s->bias != BIAS_NONE)) clReleaseMemObject(all[i]->buffer);
    options->dbias = NULL;
    return status;
}

/* got against want over n elements: |got - want| <= tol * (1 + |want| + the largest |want|).
 * The inputs lie in [-2, 2], so the terms of every sum are of order 1: the 1 covers gradients
 * that cancel to 0 (one visible key: dS = P (dP - D) is 0 up to the rounding of dP and D). */
static void check_close(test_ctx *t, const char *what, const char *name, const float *got,
                        const double *want, size_t n, double tol) {
    double largest = 0;
    for (size_t i = 0; i < n; ++i) largest = fmax(largest, fabs(want[i]));
    for (size_t i = 0; i < n; ++i)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]) + largest))) {
            test_fail_at(t, __FILE__, __LINE__, "%s: %s[%zu] = %.9g, expected %.9g (largest %.3g)",
                         what, name, i, got[i], want[i], largest);
            return;
        }
}

static void check_against_reference(test_ctx *t, const bw_case *c, const bw_grads *g,
                                    const char *what) {
    const bw_spec *s = &c->s;
    const size_t nq = (size_t)(s->B * s->Hq * s->Sq * s->D),
                 nk = (size_t)(s->B * s->Hkv * s->Sk * s->D);
    const size_t nv = (size_t)(s->B * s->Hkv * s->Sk * s->Dv);
    const size_t nb = s->bias != BIAS_NONE ? count4(c->bias_shape) : 0;
    double *dq = malloc(nq * 8), *dk = malloc(nk * 8), *dv = malloc(nv * 8);
    double *db = calloc(nb + 1, 8);
    const double scale = s->scale != 0.0f ? s->scale : 1.0 / sqrt((double)s->D);
    bool ok = dq && dk && dv && db &&
              ref_attention_backward(c->q, c->k, c->v, c->dout, s->B, s->Hq, s->Hkv, s->Sq, s->Sk,
                                     s->D, s->Dv, scale, &c->rm, dq, dk, dv, nb ? db : NULL);
    /* f32: rounding of sums over the keys; 16-bit: of out and the gradients' storage */
    const double tol = s->dt == CLATTN_F32 ? 2e-5 : s->dt == CLATTN_F16 ? 4e-3 : 3e-2;
    if (!ok) test_fail_at(t, __FILE__, __LINE__, "%s: out of host memory", what);
    if (ok) check_close(t, what, "dq", g->dq, dq, nq, tol);
    if (ok && !t->failed) check_close(t, what, "dk", g->dk, dk, nk, tol);
    if (ok && !t->failed) check_close(t, what, "dv", g->dv, dv, nv, tol);
    if (ok && !t->failed && nb && g->dbias) check_close(t, what, "dbias", g->dbias, db, nb, tol);
    free(dq), free(dk), free(dv), free(db);
}

static void check_spec(test_ctx *t, const bw_spec *s, const char *what) {
    if (t->failed) return;
    bw_case c;
    bw_grads g = {0};
    if (!prepare_case(t, s, &c)) {
        test_fail_at(t, __FILE__, __LINE__, "%s: could not prepare the case", what);
    } else {
        const int status = run_backward(t, &c, NULL, &g, NULL);
        if (status != CLATTN_SUCCESS)
            test_fail_at(t, __FILE__, __LINE__, "%s: %s: %s", what, clattn_status_name(status),
                         clattn_last_error());
        else
            check_against_reference(t, &c, &g, what);
    }
    free_grads(&g);
    free_case(&c);
}

/* Oclgrind's uninitialized-value checker misreads what the backward's first kernels write to
 * its scratch (K and V packed, the rows' D_i; linear attention's states and terms) and the
 * forward's lse before it, as it misreads the forward's packed K and linear attention's states
 * (tests/harness.h, README): with that checker these tests skip, and the oclgrind-attention
 * lane runs them under Oclgrind without it. */
static bool skipped_under_uninit_checker(test_ctx *t) {
    if (test_under_uninit_checker())
        test_skip(t, "Oclgrind's uninitialized-value checker misreads the backward's scratch");
    return test_under_uninit_checker();
}

static bw_spec spec(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D) {
    bw_spec s;
    memset(&s, 0, sizeof s);
    s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Sq = Sq, s.Sk = Sk, s.D = s.Dv = D;
    s.dt = CLATTN_F32;
    s.seed = (uint64_t)(B * 7 + Hq * 11 + Sq * 13 + Sk * 17 + D);
    return s;
}

static void gradients_of_shapes(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const int64_t shapes[][3] = {
        {1, 1, 16}, {7, 7, 16}, {33, 9, 40}, {9, 33, 64}, {17, 20, 17}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        bw_spec s = spec(1, 2, 2, shapes[i][0], shapes[i][1], shapes[i][2]);
        char what[64];
        snprintf(what, sizeof what, "Sq=%lld Sk=%lld D=%lld", (long long)s.Sq, (long long)s.Sk,
                 (long long)s.D);
        check_spec(t, &s, what);
    }
    bw_spec s = spec(2, 2, 1, 6, 11, 32);
    s.Dv = 24;
    check_spec(t, &s, "Dv != D");
    CHECK_OK(t, clattn_tuning_override("attention", "BWD_TILES=1"));
    if (test_large_shapes(t)) {
        s = spec(1, 1, 1, 5, 37, 256);
        s.Dv = 128;
        check_spec(t, &s, "D=256 Dv=128");
    }
}

static void gradients_of_gqa_and_mqa(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const int64_t ratios[][2] = {{4, 2}, {4, 1}};
    for (size_t i = 0; i < 2; ++i) {
        bw_spec s = spec(2, ratios[i][0], ratios[i][1], 7, 13, 16);
        s.causal = (int)i;
        check_spec(t, &s, i ? "MQA, causal" : "GQA");
    }
}

static void gradients_of_masks(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const int32_t klen[2] = {21, 0}, qlen[2] = {5, 9};
    bw_spec s = spec(2, 2, 1, 9, 21, 16);
    s.causal = 1;
    check_spec(t, &s, "causal");
    s.bottom_right = 1, s.Sq = 5;
    check_spec(t, &s, "causal bottom-right (KV cache)");
    s.Sq = 30;
    check_spec(t, &s, "causal bottom-right, Sq > Sk");
    s = spec(2, 2, 2, 9, 21, 16);
    s.klen = klen, s.qlen = qlen, s.bottom_right = 1, s.causal = 1;
    check_spec(t, &s, "key and query lengths (0: empty rows)");
    /* the window, global keys, ALiBi and the softcap: invisible_garbage_changes_nothing */
    s = spec(2, 2, 1, 9, 21, 16);
    s.keep = 1;
    check_spec(t, &s, "keep mask");
}

static void gradients_of_biases(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const char *const names[] = {"",
                                        "dense bias",
                                        "per-head bias",
                                        "key-padding bias",
                                        "bias shared by batches and heads",
                                        "per-head key bias",
                                        "per-query bias",
                                        "a scalar per head"};
    for (int bias = BIAS_FULL; bias <= BIAS_PER_HEAD; ++bias) {
        bw_spec s = spec(2, 2, 1, 7, 19, 16);
        s.bias = bias, s.causal = bias == BIAS_HEADS, s.keep = bias == BIAS_KEYS;
        check_spec(t, &s, names[bias]);
    }
    /* one value along the keys: the softmax ignores it, its gradient is exactly 0 (the
     * reference's is 0 up to rounding) */
    for (int bias = BIAS_ROWS; bias <= BIAS_PER_HEAD && !t->failed; ++bias) {
        bw_spec s = spec(2, 2, 1, 7, 19, 16);
        s.bias = bias, s.causal = 1;
        bw_case c;
        bw_grads g = {0};
        if (prepare_case(t, &s, &c)) {
            CHECK_OK(t, run_backward(t, &c, NULL, &g, NULL));
            for (size_t i = 0; i < count4(c.bias_shape); ++i)
                CHECK(t, g.dbias[i] == 0.0f, "%s: dbias[%zu] = %g", names[bias], i, g.dbias[i]);
        }
        free_grads(&g);
        free_case(&c);
    }
}

static void gradients_of_storage_and_layouts(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const clattn_dtype dtypes[] = {CLATTN_F16, CLATTN_BF16};
    for (int i = 0; i < 2; ++i) {
        bw_spec s = spec(1, 2, 2, 9, 21, 32);
        s.dt = dtypes[i], s.causal = 1;
        check_spec(t, &s, clattn_dtype_name(dtypes[i]));
    }
    for (int layout = 1; layout <= 2; ++layout) {
        bw_spec s = spec(2, 2, 1, 9, 21, 16);
        s.layout = layout, s.bias = BIAS_HEADS;
        check_spec(t, &s, layout == 1 ? "[B,S,H,D] storage" : "[B,H,D,S] storage");
    }
}

/* Other key tiles and query blocks than the device's row: 4 lanes, 1 (scalar code, which odd
 * head dims take), 3 queries a work-item (8 lanes: the D=40 case of gradients_of_shapes). */
static void gradients_of_other_launches(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const char *const rows[] = {"LANES=4,BM=3", "LANES=1,BM=2"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0] && !t->failed; ++i) {
        CHECK_OK(t, clattn_tuning_override("attention", rows[i]));
        bw_spec s = spec(2, 2, 1, 11, 23, 16);
        s.causal = 1, s.bottom_right = 1, s.keep = 1;
        check_spec(t, &s, rows[i]);
    }
    clattn_tuning_override("attention", NULL);
}

/* The queries pass with the keys split (the forced split: chunks of whole key tiles), which a
 * device takes for few queries against many keys: the partial dQ and their merge. */
static void gradients_with_split_keys(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const int splits[] = {2, 5};
    static const int32_t klen[2] = {61, 17};
    for (size_t i = 0; i < 2 && !t->failed; ++i) {
        clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, splits[i]);
        bw_spec s = spec(2, 4, 2, 3, 61, 16);
        s.klen = klen, s.causal = 1, s.bottom_right = 1, s.bias = BIAS_KEYS;
        char what[32];
        snprintf(what, sizeof what, "%d splits", splits[i]);
        check_spec(t, &s, what);
    }
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, -1);
}

/* Whether `kernel` (and `also`, unless NULL) ran since clattn__trace_kernels(true), whose trace
 * this stops and takes. */
static bool traced(const char *kernel, const char *also) {
    clattn__trace_kernels(false);
    clattn__traced_kernel ran[16];
    const size_t n = clattn__trace_take(ran, 16);
    bool found = false, found_also = also == NULL;
    for (size_t i = 0; i < n; ++i) {
        found = found || strcmp(ran[i].name, kernel) == 0;
        found_also = found_also || strcmp(ran[i].name, also) == 0;
        clReleaseEvent(ran[i].event);
    }
    return found && found_also;
}

/* check_spec, and that the backward ran `kernel` among its kernels (a launch that fell back to
 * another variant would pass the reference check alone). */
static void check_spec_ran(test_ctx *t, const bw_spec *s, const char *what, const char *kernel) {
    clattn__trace_kernels(true);
    check_spec(t, s, what);
    CHECK(t, traced(kernel, NULL) || t->failed, "%s: %s did not run", what, kernel);
}

/* Whether a backward program with 64-bit indices (IDX=ulong) is cached. */
static bool wide_backward_built(test_ctx *t) {
    clattn__cached_program *programs = NULL;
    size_t count = 0;
    bool wide = false;
    if (clattn__cache_snapshot(clattn_env_context(t->env), clattn_env_device(t->env), &programs,
                               &count) != CLATTN_SUCCESS)
        return false;
    for (size_t i = 0; i < count; ++i)
        wide = wide || (strcmp(programs[i].op_file, "attention_backward.cl") == 0 &&
                        strstr(programs[i].options, "-DIDX=ulong") != NULL);
    clattn__cache_snapshot_free(programs, count);
    return wide;
}

/* Both kernel families with 64-bit indices (IDX=ulong), which a tensor, the scratch or dbias of
 * 2^31 elements or more takes: forced here at small sizes (the narrow-index limit at 0), with
 * each way of putting dbias together: replicas a batch (the lanes kernels; then a key bias with
 * the queries pass's keys and the keys pass's rows in 2 splits, a replica a row split), stored
 * straight (the tiles kernels in 3 row splits), and a key bias's replicas a row split. The wide
 * build's index math, not past 2^31 itself: that takes gigabytes (a_key_bias_past_2_31_pairs
 * walks 2^31 pairs on 32-bit indices). */
static void gradients_with_64_bit_indices(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    clattn_cache_clear(clattn_env_context(t->env));
    clattn__narrow_index_limit_set(0);
    bw_spec s = spec(2, 4, 2, 11, 23, 16);
    s.causal = 1, s.bottom_right = 1, s.keep = 1, s.bias = BIAS_HEADS;
    check_spec(t, &s, "lanes kernels, a bias shared by the batches");
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, 2);
    clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, 2);
    s = spec(2, 4, 2, 3, 61, 16);
    s.causal = 1, s.bias = BIAS_KEYS;
    check_spec_ran(t, &s, "lanes kernels, 2 key splits, 2 row splits, a key bias",
                   "backward_keys_merge");
    CHECK_OK(
        t, clattn_tuning_override("attention", "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3"));
    clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, 3);
    s = spec(2, 4, 2, 11, 23, 16);
    s.Dv = 8, s.causal = 1, s.keep = 1, s.bias = BIAS_FULL;
    check_spec_ran(t, &s, "tiles kernels, 3 row splits, 2 key splits, a dense bias",
                   "backward_keys_merge");
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, -1);
    s.bias = BIAS_KEYS;
    check_spec_ran(t, &s, "tiles kernels, 3 row splits, a key bias", "backward_bias_merge");
    clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, -1);
    clattn_tuning_override("attention", NULL);
    CHECK(t, wide_backward_built(t), "no backward program was built with 64-bit indices");
}

/* A dense f32 tensor of `n` values (NULL: NaN) on a buffer of its own, {1,1,rows,n/rows}. */
static clattn_tensor dense_tensor(test_ctx *t, const float *host, size_t n, int64_t rows) {
    float *nan = host ? NULL : nan_floats(n);
    const float *values = host ? host : nan;
    cl_mem m = values ? upload(t, values, n * 4) : NULL;
    free(nan);
    return clattn_tensor_4d(m, CLATTN_F32, 1, 1, rows, (int64_t)n / rows);
}

/* A key bias over more than 2^31 pairs (65536 queries, 32769 keys), whose gradient the library
 * refused until its keys pass put dbias together: with q = 0 every row's weights are
 * p = softmax(bias), and with dout 0 but in the last row only that row has a dS, so the
 * gradients have closed forms (lse and out are uploaded: the forward's 2^31 pairs would double
 * the time). Large shapes only. */
static void a_key_bias_past_2_31_pairs(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    if (!test_large_shapes(t)) return test_skip(t, "large shapes only");
    enum { D = 4 };
    const int64_t Sq = 65536, Sk = 32769;
    const double scale = 0.5, c[D] = {0.5, -1.0, 0.25, 2.0};
    float *bias = malloc(Sk * 4), *kv = malloc(2 * Sk * D * 4), *q = calloc(Sq * D, 4);
    float *dout = calloc(Sq * D, 4), *out = malloc(Sq * D * 4), *lse = malloc(Sq * 4);
    double *p = malloc(Sk * 8), *want = calloc(2 * Sk * D + Sk + D, 8);
    if (!(bias && kv && q && dout && out && lse && p && want)) {
        free(bias), free(kv), free(q), free(dout), free(out), free(lse), free(p), free(want);
        return test_fail_at(t, __FILE__, __LINE__, "out of host memory");
    }
    uint64_t rng = 17;
    for (int64_t j = 0; j < Sk; ++j) bias[j] = test_rand_uniform(&rng, -2.0f, 2.0f);
    for (int64_t i = 0; i < 2 * Sk * D; ++i) kv[i] = test_rand_uniform(&rng, -2.0f, 2.0f);
    const float *k = kv, *v = kv + Sk * D;
    double most = -INFINITY, sum = 0.0, o[D] = {0}, delta = 0.0;
    for (int64_t j = 0; j < Sk; ++j) most = fmax(most, bias[j]);
    for (int64_t j = 0; j < Sk; ++j) sum += p[j] = exp(bias[j] - most);
    for (int64_t j = 0; j < Sk; ++j) {
        p[j] /= sum;
        for (int d = 0; d < D; ++d) o[d] += p[j] * v[j * D + d];
    }
    for (int d = 0; d < D; ++d) delta += c[d] * o[d];
    const float row_lse = (float)(most + log(sum));
    for (int64_t i = 0; i < Sq; ++i) {
        lse[i] = row_lse;
        for (int d = 0; d < D; ++d) out[i * D + d] = (float)o[d];
    }
    for (int d = 0; d < D; ++d) dout[(Sq - 1) * D + d] = (float)c[d];
    /* want: dv (Sk x D), dk (0), dbias (Sk), the last row of dq (D) */
    double *dv = want, *db = want + 2 * Sk * D, *dq = db + Sk;
    for (int64_t j = 0; j < Sk; ++j) {
        double dp = 0.0;
        for (int d = 0; d < D; ++d) dp += c[d] * v[j * D + d], dv[j * D + d] = p[j] * c[d];
        db[j] = p[j] * (dp - delta);
        for (int d = 0; d < D; ++d) dq[d] += scale * db[j] * k[j * D + d];
    }
    clattn_tensor tq = dense_tensor(t, q, Sq * D, Sq), tk = dense_tensor(t, k, Sk * D, Sk);
    clattn_tensor tv = dense_tensor(t, v, Sk * D, Sk), to = dense_tensor(t, out, Sq * D, Sq);
    clattn_tensor tdo = dense_tensor(t, dout, Sq * D, Sq), tl = dense_tensor(t, lse, Sq, 1);
    clattn_tensor tb = dense_tensor(t, bias, Sk, 1), tdq = dense_tensor(t, NULL, Sq * D, Sq);
    clattn_tensor tdk = dense_tensor(t, NULL, Sk * D, Sk), tdv = dense_tensor(t, NULL, Sk * D, Sk);
    clattn_tensor tdb = dense_tensor(t, NULL, Sk, 1);
    free(bias), free(kv), free(q), free(dout), free(out), free(lse), free(p);
    clattn_mask mask;
    memset(&mask, 0, sizeof mask);
    mask.bias = &tb;
    clattn_attention_backward_options options = {.dbias = &tdb};
    const clattn_tensor *all[11] = {&tq, &tk, &tv, &to, &tdo, &tl, &tb, &tdq, &tdk, &tdv, &tdb};
    bool made = true;
    for (int i = 0; i < 11; ++i) made = made && all[i]->buffer;
    const int status = made ? clattn_attention_backward(&tq, &tk, &tv, &to, &tdo, &tl, (float)scale,
                                                        &mask, &tdq, &tdk, &tdv, &options,
                                                        clattn_env_queue(t->env), 0, NULL, NULL)
                            : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    float *gq = status == CLATTN_SUCCESS ? download(t, &tdq) : NULL;
    float *gk = status == CLATTN_SUCCESS ? download(t, &tdk) : NULL;
    float *gv = status == CLATTN_SUCCESS ? download(t, &tdv) : NULL;
    float *gb = status == CLATTN_SUCCESS ? download(t, &tdb) : NULL;
    for (int i = 0; i < 11; ++i)
        if (all[i]->buffer) clReleaseMemObject(all[i]->buffer);
    bool zeros = gq && gk;
    for (int64_t i = 0; zeros && i < (Sq - 1) * D; ++i) zeros = gq[i] == 0.0f;
    for (int64_t i = 0; zeros && i < Sk * D; ++i) zeros = gk[i] == 0.0f;
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "%s: %s", clattn_status_name(status),
                     clattn_last_error());
    else if (!gq || !gk || !gv || !gb)
        test_fail_at(t, __FILE__, __LINE__, "reading the gradients back failed");
    else if (!zeros)
        test_fail_at(t, __FILE__, __LINE__, "dq of the rows without dout, or dk, is not 0");
    /* dv and dbias are p_j-sized, about 1/Sk: scaled by Sk, the tolerance is relative */
    for (int64_t i = 0; gv && gb && i < Sk * D; ++i) gv[i] *= (float)Sk, dv[i] *= (double)Sk;
    for (int64_t j = 0; gv && gb && j < Sk; ++j) gb[j] *= (float)Sk, db[j] *= (double)Sk;
    if (!t->failed) check_close(t, "2^31 pairs", "Sk dv", gv, dv, Sk * D, 2e-5);
    if (!t->failed) check_close(t, "2^31 pairs", "Sk dbias", gb, db, Sk, 2e-5);
    if (!t->failed) check_close(t, "2^31 pairs", "dq", gq + (Sq - 1) * D, dq, D, 2e-5);
    free(gq), free(gk), free(gv), free(gb), free(want);
}

/* The GPU kernels (BWD_TILES=1), forced at the row's sizes: D=64 (two slices of a key, 64 keys
 * or queries a group) over three key groups and two query blocks, causal from the bottom with
 * a keep mask; in groups of 16 and 1 KiB of local memory, blocks of one row (D=64) and the lanes
 * kernels where not one row fits (D=96); on large shapes D=256, Dv=128 (eight slices); an odd
 * head dim (one slice) in groups of 40. */
static void tiles_kernels_give_the_gradients(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    CHECK_OK(t, clattn_tuning_override("attention", "BWD_TILES=1"));
    bw_spec s = spec(1, 2, 1, 70, 140, 64);
    s.causal = 1, s.bottom_right = 1, s.keep = 1;
    check_spec_ran(t, &s, "the row's sizes, D=64", "backward_keys_tiles");
    /* groups of 16 (every lane's cap allows them): a block of b rows takes (4 (D + Dv + 32) + 96)
     * b + 64 bytes, 800 at D = 64 with one row, 1056 at D = 96 */
    CHECK_OK(t, clattn_tuning_override("attention", "BWD_TILES=1,BWD_GROUP=16"));
    s = spec(1, 2, 2, 9, 21, 64);
    test_saved_env cap = test_env_set("CLATTN_MAX_LOCAL_MEMORY", "1024");
    check_spec_ran(t, &s, "blocks of one row in 1 KiB", "backward_queries_tiles");
    test_env_restore(&cap);
    s = spec(1, 2, 2, 9, 21, 96);
    cap = test_env_set("CLATTN_MAX_LOCAL_MEMORY", "1024");
    check_spec_ran(t, &s, "the lanes kernels in 1 KiB at D=96", "backward_keys");
    test_env_restore(&cap);
    CHECK_OK(t, clattn_tuning_override("attention", "BWD_TILES=1"));
    if (test_large_shapes(t)) {
        s = spec(1, 1, 1, 5, 37, 256);
        s.Dv = 128;
        check_spec_ran(t, &s, "D=256 Dv=128", "backward_keys_tiles");
    }
    CHECK_OK(t, clattn_tuning_override("attention", "BWD_TILES=1,BWD_GROUP=40"));
    s = spec(1, 2, 2, 9, 21, 17);
    check_spec_ran(t, &s, "D=17, groups of 40", "backward_keys_tiles");
    clattn_tuning_override("attention", NULL);
}

/* The tiles kernels in groups of 24 (4 slices of 4 and 2 dims: D=16, Dv=8; 6 keys a group, Sk=23
 * leaving 5 in the last) with blocks of 3 rows (11 queries leaving 2), under GQA, causality from
 * the bottom and every length part (a batch of no keys, rows past the query lengths); then the
 * key split. */
static void tiles_kernels_in_small_groups(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const int32_t klen[2] = {23, 0}, qlen[2] = {7, 11}, split_klen[2] = {61, 17};
    CHECK_OK(
        t, clattn_tuning_override("attention", "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3"));
    bw_spec s = spec(2, 4, 2, 11, 23, 16);
    s.Dv = 8, s.klen = klen, s.qlen = qlen, s.causal = 1, s.bottom_right = 1, s.keep = 1;
    check_spec_ran(t, &s, "groups of 24, blocks of 3, lengths", "backward_queries_tiles");
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, 2);
    s = spec(2, 4, 2, 3, 61, 16);
    s.klen = split_klen, s.causal = 1, s.bottom_right = 1, s.bias = BIAS_KEYS;
    check_spec_ran(t, &s, "groups of 24, 2 splits", "backward_queries_tiles");
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, -1);
    clattn_tuning_override("attention", NULL);
}

/* One forced row split of the keys pass: the splits, the queries pass's key splits (-1: the
 * plan's), the storage and the bias whose gradient is put together across the splits. */
typedef struct split_rows_case {
    int row_splits, key_splits;
    clattn_dtype dt;
    int bias;
} split_rows_case;

/* Runs each case under the family's `params` (B=2, Hq=4, Hkv=2, 11 and 5 query rows, Sk=23,
 * D=16, Dv=8; causal from the bottom, a keep mask), checking that the keys merge ran. */
static void check_split_rows(test_ctx *t, const char *params, const split_rows_case *cases,
                             size_t count) {
    static const int32_t qlen[2] = {11, 5};
    CHECK_OK(t, clattn_tuning_override("attention", params));
    for (size_t i = 0; i < count && !t->failed; ++i) {
        clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, cases[i].row_splits);
        clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, cases[i].key_splits);
        bw_spec s = spec(2, 4, 2, 11, 23, 16);
        s.Dv = 8, s.dt = cases[i].dt, s.qlen = qlen, s.bias = cases[i].bias;
        s.causal = 1, s.bottom_right = 1, s.keep = 1;
        char what[96];
        snprintf(what, sizeof what, "%s: %d row splits, %d key splits, %s", params,
                 cases[i].row_splits, cases[i].key_splits, clattn_dtype_name(cases[i].dt));
        check_spec_ran(t, &s, what, "backward_keys_merge");
    }
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, -1);
    clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, -1);
    clattn_tuning_override("attention", NULL);
}

/* The keys pass with its rows split (forced: runs of whole blocks), which a GPU takes for few
 * keys against many queries: groups of 24 (6 keys, Sk=23 leaving 5), blocks of 3 rows, two
 * query heads a kv head of 11 rows each (4 blocks, so 8 runs a group): 3 splits (runs of 3, 3
 * and 2 blocks) in f32, and 8 (a block each) in f16 storage (the merge rounds each sum once)
 * with the queries pass's keys split too (both partials in one region of the workspace, one
 * after the other). Each puts a dbias together across the splits: shared by the batches (a
 * replica a batch, each of its elements in one split), a key bias (a replica a split too), and
 * one of the scores' shape (stored straight into dbias, zeros where a split skips a block) in 4
 * splits. A smoke test: it builds every GPU kernel of the backward (the rusticl lane's only run
 * of them). */
#define TILES_SPLIT_PARAMS "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3"
static void tiles_kernels_with_split_rows(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const split_rows_case cases[] = {{3, -1, CLATTN_F32, BIAS_HEADS},
                                            {8, 2, CLATTN_F16, BIAS_KEYS},
                                            {4, -1, CLATTN_F32, BIAS_FULL}};
    check_split_rows(t, TILES_SPLIT_PARAMS, cases, sizeof cases / sizeof cases[0]);
}

/* The lanes kernels' keys pass with its rows split (forced), which a CPU of many cores takes for
 * few key tiles against many queries: blocks of BM=4 rows, so 3 a query head and 6 runs a kv
 * head: 4 splits (runs of 2, 2, 2 and 0 blocks: a split with no rows writes zeros) in f32, and
 * 6 (a block each) in f16 storage with the queries pass's keys split too, each putting a dbias
 * together across the splits as above. */
#define LANES_SPLIT_PARAMS "BWD_TILES=0,BM=4"
static void lanes_kernels_with_split_rows(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const split_rows_case cases[] = {{4, -1, CLATTN_F32, BIAS_HEADS},
                                            {6, 2, CLATTN_F16, BIAS_KEYS},
                                            {3, -1, CLATTN_F32, BIAS_FULL}};
    check_split_rows(t, LANES_SPLIT_PARAMS, cases, sizeof cases / sizeof cases[0]);
}

/* Every count of splits shares one program (the counts are kernel arguments): lengths that vary
 * from step to step change the counts, and each count once built a program of its own. The f16
 * key-bias case of each family above, (row splits, key splits) forced to (2, 2), (3, 6) and
 * (5, 3), which the key tiles (lanes: 8 keys; tiles: blocks of 3) make 2, 3 and 3 key splits in
 * the lanes kernels and 2, 4 and 3 in the tiles kernels, each against the reference; after the
 * first, nothing built (in the whole suite, not even the first: the tests above built it). */
static void split_counts_share_one_program(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const char *const families[2] = {LANES_SPLIT_PARAMS, TILES_SPLIT_PARAMS};
    static const int counts[3][2] = {{2, 2}, {3, 6}, {5, 3}};
    for (int f = 0; f < 2 && !t->failed; ++f) {
        size_t first = 0, builds = 0;
        for (int i = 0; i < 3 && !t->failed; ++i) {
            const split_rows_case c = {counts[i][0], counts[i][1], CLATTN_F16, BIAS_KEYS};
            check_split_rows(t, families[f], &c, 1);
            clattn_cache_stats(NULL, &builds, NULL);
            if (i == 0) first = builds;
        }
        CHECK(t, builds == first, "%s: %zu programs built for the split counts after the first",
              families[f], builds - first);
    }
}

/* Garbage (NaN, Inf, 1e30) wherever no query looks (q and dout past the query lengths, k and v
 * past the key lengths, the bias where the mask hides it) leaves every gradient bit for bit as it
 * was; those rows get exact zeros; and two runs give the same bits. */
static size_t grads_bytes(const bw_case *c, int which) {
    const bw_spec *s = &c->s;
    const size_t n[4] = {(size_t)(s->B * s->Hq * s->Sq * s->D),
                         (size_t)(s->B * s->Hkv * s->Sk * s->D),
                         (size_t)(s->B * s->Hkv * s->Sk * s->Dv), count4(c->bias_shape)};
    return n[which] * sizeof(float);
}

static bool same_grads(const bw_case *c, const bw_grads *a, const bw_grads *b) {
    const float *x[4] = {a->dq, a->dk, a->dv, a->dbias}, *y[4] = {b->dq, b->dk, b->dv, b->dbias};
    for (int i = 0; i < 4; ++i) /* no dbias: both NULL */
        if ((x[i] || y[i]) && (!x[i] || !y[i] || memcmp(x[i], y[i], grads_bytes(c, i)) != 0))
            return false;
    return true;
}

/* Whether any query of any head of kv head hk sees key j of batch b. */
static bool key_seen(const bw_case *c, int64_t b, int64_t hk, int64_t j) {
    const bw_spec *s = &c->s;
    const int64_t group = s->Hq / s->Hkv;
    for (int64_t h = hk * group; h < hk * group + group; ++h)
        for (int64_t i = 0; i < s->Sq; ++i)
            if (ref_visible(&c->rm, b, h, i, j, s->Sq, s->Sk)) return true;
    return false;
}

/* Whether query row i of (b, h) sees any key. */
static bool row_sees(const bw_case *c, int64_t b, int64_t h, int64_t i) {
    for (int64_t j = 0; j < c->s.Sk; ++j)
        if (ref_visible(&c->rm, b, h, i, j, c->s.Sq, c->s.Sk)) return true;
    return false;
}

static void fill_row(float *row, int64_t n, int shift) {
    static const float garbage[3] = {NAN, INFINITY, 1e30f};
    for (int64_t d = 0; d < n; ++d) row[d] = garbage[(d + shift) % 3];
}

/* Garbage in the rows of q and dout that see no key, the rows of k and v no query sees, and the
 * bias wherever the mask hides it (uploaded again). */
static bool poison(test_ctx *t, bw_case *c) {
    const bw_spec *s = &c->s;
    for (int64_t b = 0; b < s->B; ++b) {
        for (int64_t h = 0; h < s->Hq; ++h)
            for (int64_t i = 0; i < s->Sq; ++i)
                if (!row_sees(c, b, h, i)) {
                    fill_row(c->q + ((b * s->Hq + h) * s->Sq + i) * s->D, s->D, 0);
                    fill_row(c->dout + ((b * s->Hq + h) * s->Sq + i) * s->Dv, s->Dv, 1);
                }
        for (int64_t h = 0; h < s->Hkv; ++h)
            for (int64_t j = 0; j < s->Sk; ++j)
                if (!key_seen(c, b, h, j)) {
                    fill_row(c->k + ((b * s->Hkv + h) * s->Sk + j) * s->D, s->D, 0);
                    fill_row(c->v + ((b * s->Hkv + h) * s->Sk + j) * s->Dv, s->Dv, 2);
                }
        for (int64_t h = 0; h < s->Hq; ++h)
            for (int64_t i = 0; i < s->Sq; ++i)
                for (int64_t j = 0; j < s->Sk; ++j)
                    if (!ref_visible(&c->rm, b, h, i, j, s->Sq, s->Sk))
                        c->bias_f[((b * s->Hq + h) * s->Sq + i) * s->Sk + j] = NAN;
    }
    return test_write(t, c->bias_t.buffer, c->bias_f, count4(c->bias_shape) * 4);
}

/* The keep mask with one key hidden from every query of batch 0 and one query of batch 1 that
 * sees nothing, uploaded again. */
static bool hide_a_key_and_a_row(test_ctx *t, bw_case *c) {
    const bw_spec *s = &c->s;
    for (int64_t i = 0; i < s->Sq; ++i) c->keep[i * s->Sk + 3] = 0;
    for (int64_t j = 0; j < s->Sk; ++j) c->keep[(s->Sq + 1) * s->Sk + j] = 0;
    return test_write(t, c->keep_t.buffer, c->keep, (size_t)(s->B * s->Sq * s->Sk));
}

static void garbage_changes_nothing(test_ctx *t) {
    static const int32_t klen[2] = {13, 6}, qlen[2] = {7, 3};
    bw_spec s = spec(2, 2, 1, 9, 19, 16);
    s.klen = klen, s.qlen = qlen, s.keep = 1, s.bias = BIAS_FULL, s.causal = 1, s.bottom_right = 1;
    /* and every other mask part, so that this one test (a smoke test) builds them all */
    s.window = 1, s.left = 4, s.right = 1, s.global_stride = 5, s.alibi = 1, s.softcap = 3.0f;
    s.scale = 0.7f;
    bw_case c;
    bw_grads clean = {0}, again = {0}, dirty = {0};
    if (prepare_case(t, &s, &c)) {
        CHECK(t, hide_a_key_and_a_row(t, &c), "could not upload the keep mask");
        CHECK_OK(t, run_backward(t, &c, NULL, &clean, NULL));
        CHECK_OK(t, run_backward(t, &c, NULL, &again, NULL));
        CHECK(t, same_grads(&c, &clean, &again), "two runs gave different bits");
        CHECK(t, poison(t, &c), "could not upload the bias");
        CHECK_OK(t, run_backward(t, &c, NULL, &dirty, NULL));
        CHECK(t, same_grads(&c, &clean, &dirty),
              "garbage at invisible positions changed a gradient");
        for (int64_t i = 0; i < s.B * s.Hq * s.Sq; ++i)
            for (int64_t d = 0;
                 d < s.D && !row_sees(&c, i / (s.Hq * s.Sq), i / s.Sq % s.Hq, i % s.Sq); ++d)
                CHECK(t, clean.dq[i * s.D + d] == 0.0f, "dq of row %lld (no key) is not 0",
                      (long long)i);
        for (int64_t j = 0; j < s.B * s.Hkv * s.Sk; ++j)
            for (int64_t d = 0;
                 d < s.D && !key_seen(&c, j / (s.Hkv * s.Sk), j / s.Sk % s.Hkv, j % s.Sk); ++d)
                CHECK(t, clean.dk[j * s.D + d] == 0.0f && clean.dv[j * s.Dv + d] == 0.0f,
                      "dk or dv of key %lld (no query) is not 0", (long long)j);
        check_against_reference(t, &c, &clean, "before the garbage");
    }
    free_grads(&clean), free_grads(&again), free_grads(&dirty);
    free_case(&c);
}

/* On both kernel families: the lanes kernels, and the tiles in groups of 24, 4 slices a key. */
static void invisible_garbage_changes_nothing(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const char *const rows[2] = {"BWD_TILES=0",
                                        "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3"};
    for (int i = 0; i < 2 && !t->failed; ++i) {
        CHECK_OK(t, clattn_tuning_override("attention", rows[i]));
        garbage_changes_nothing(t);
    }
    clattn_tuning_override("attention", NULL);
}

/* The queries tiles in the forward's longest-first order (cl/mask.cl's unit_place, hooked: 3
 * heads a section, the last taking the 2 left of 5; causal from the bottom, 4 query blocks a
 * head) give the bits of a head's blocks in turn, unsplit and in 2 key splits (a split's groups
 * beside each other), and the reference's gradients. */
static void tiles_kernels_in_longest_first_order(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    CHECK_OK(
        t, clattn_tuning_override("attention", "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3"));
    bw_spec s = spec(1, 5, 1, 20, 23, 16); /* 6 queries a group */
    s.Dv = 8, s.causal = 1, s.bottom_right = 1;
    bw_case c;
    if (!prepare_case(t, &s, &c)) test_fail_at(t, __FILE__, __LINE__, "could not prepare the case");
    for (int splits = 1; splits <= 2 && !t->failed; ++splits) {
        bw_grads in_turn = {0}, longest = {0};
        clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, splits);
        clattn__hook_set(CLATTN__HOOK_ATTENTION_ORDER, 0);
        CHECK_OK(t, run_backward(t, &c, NULL, &in_turn, NULL));
        clattn__hook_set(CLATTN__HOOK_ATTENTION_ORDER, 3);
        clattn__trace_kernels(true);
        const int status = run_backward(t, &c, NULL, &longest, NULL);
        const bool ran = traced("backward_queries_tiles", splits > 1 ? "backward_merge" : NULL);
        CHECK_OK(t, status);
        CHECK(t, ran, "%d split(s): backward_queries_tiles (and the merge) did not run", splits);
        CHECK(t, t->failed || same_grads(&c, &in_turn, &longest),
              "%d split(s): 3 heads a section changed a gradient", splits);
        if (!t->failed) check_against_reference(t, &c, &longest, "longest first");
        free_grads(&in_turn), free_grads(&longest);
    }
    free_case(&c);
    clattn__hook_set(CLATTN__HOOK_ATTENTION_ORDER, -1);
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, -1);
    clattn_tuning_override("attention", NULL);
}

/* The backward's plan for f32 q [B,Hq,Sq,D], k [B,Hkv,Sk,D] and v [B,Hkv,Sk,Dv] (dims in that
 * order) under `mask`, and (bias_shape not NULL) with the mask's bias of that shape and its
 * gradient: buffers of their sizes, never written. */
static int plan_for(test_ctx *t, const int64_t dims[7], const clattn_mask *mask,
                    const int64_t *bias_shape, clattn__backward_plan *plan) {
    const int64_t B = dims[0], Hq = dims[1], Hkv = dims[2], Sq = dims[3], Sk = dims[4];
    const int64_t D = dims[5], Dv = dims[6];
    clattn_tensor q = clattn_tensor_4d(NULL, CLATTN_F32, B, Hq, Sq, D), dq = q, dout, out, lse;
    clattn_tensor k = clattn_tensor_4d(NULL, CLATTN_F32, B, Hkv, Sk, D), dk = k;
    clattn_tensor v = clattn_tensor_4d(NULL, CLATTN_F32, B, Hkv, Sk, Dv), dv = v;
    out = dout = clattn_tensor_4d(NULL, CLATTN_F32, B, Hq, Sq, Dv);
    lse = clattn_tensor_4d(NULL, CLATTN_F32, 1, B, Hq, Sq);
    const int64_t *n = bias_shape ? bias_shape : dims; /* (no bias: unused) */
    clattn_tensor bias = clattn_tensor_4d(NULL, CLATTN_F32, n[0], n[1], n[2], n[3]), dbias = bias;
    clattn_mask with_bias = mask ? *mask : (clattn_mask){0};
    with_bias.bias = bias_shape ? &bias : NULL;
    clattn_tensor *all[11] = {&q, &dq, &out, &dout, &lse, &k, &dk, &v, &dv, &bias, &dbias};
    const int count = bias_shape ? 11 : 9;
    bool ready = true;
    for (int i = 0; i < count; ++i) {
        all[i]->buffer = test_buffer_whole(t, (size_t)clattn_tensor_numel(all[i]) * 4);
        ready = ready && all[i]->buffer;
    }
    const int status = ready ? clattn__attention_backward_plan(
                                   &q, &k, &v, &out, &dout, &lse, &with_bias, &dq, &dk, &dv,
                                   bias_shape ? &dbias : NULL, clattn_env_queue(t->env), plan)
                             : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    for (int i = 0; i < count; ++i)
        if (all[i]->buffer) clReleaseMemObject(all[i]->buffer);
    return status;
}

/* The order the backward plans for its queries tiles (clattn__attention_order, as the forward):
 * longest first only under a causal mask with LPT; a section holds the heads whose keys and
 * values fit LPT_MB (2 query heads a key head counted together), at least one; a hooked order at
 * most the heads; none where the lanes kernels run. 4096 queries in groups of 6 give a head 683
 * blocks, so the least section, a wave of 4 groups a compute unit, is one head on any device of
 * up to 170 units. Planned only: the buffers are never written. */
static void tiles_kernels_plan_longest_first(test_ctx *t) {
    static const char tiles[] = "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3,";
    static const struct {
        const char *params;
        int causal, long_keys, hooked, tiled, order;
    } cases[] = {
        {"LPT=1,LPT_MB=1", 1, 0, -1, 1, 4},   /* 2 key heads of 384 KiB a MiB: 4 query heads */
        {"LPT=1,LPT_MB=1", 1, 1, -1, 1, 1},   /* 1.5 MiB: none fits, one head */
        {"LPT=1,LPT_MB=64", 1, 0, -1, 1, 8},  /* every head */
        {"LPT=1,LPT_MB=64", 0, 0, -1, 1, 0},  /* not causal */
        {"LPT=0", 1, 0, -1, 1, 0},            /* asked not to */
        {"LPT=1,LPT_MB=1", 0, 0, 100, 1, 8},  /* hooked, at most the heads */
        {"LPT=1,BWD_TILES=0", 1, 0, 3, 0, 0}, /* the lanes kernels: no order */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !t->failed; ++i) {
        /* (D + Dv) * 4 bytes a key */
        const int64_t dims[7] = {2, 4, 2, 4096, cases[i].long_keys ? 16384 : 4096, 16, 8};
        clattn_mask mask = {0};
        mask.causal = cases[i].causal;
        char params[128];
        snprintf(params, sizeof params, "%s%s", cases[i].tiled ? tiles : "", cases[i].params);
        clattn__backward_plan plan = {0};
        int status = clattn_tuning_override("attention", params);
        clattn__hook_set(CLATTN__HOOK_ATTENTION_ORDER, cases[i].hooked);
        if (status == CLATTN_SUCCESS) status = plan_for(t, dims, &mask, NULL, &plan);
        if (status != CLATTN_SUCCESS)
            test_fail_at(t, __FILE__, __LINE__, "case %zu: %s: %s", i, clattn_status_name(status),
                         clattn_last_error());
        else if (plan.tiled != cases[i].tiled || plan.order != cases[i].order)
            test_fail_at(t, __FILE__, __LINE__,
                         "case %zu (%s, causal %d): tiled %d order %d, not %d and %d", i, params,
                         cases[i].causal, plan.tiled, plan.order, cases[i].tiled, cases[i].order);
    }
    clattn_tuning_override("attention", NULL);
}

/* The row splits the backward plans for its keys pass: a launch of fewer key groups (lanes: key
 * tiles) than SPLIT_TARGET a compute unit splits its rows into as many runs as make up for that,
 * of at least SPLIT_MIN rows and at most 128; a hooked split at most a run a block; none where
 * the key groups fill the device or the rows are too few. Groups of 24 take 6 keys (4 slices of
 * D=16, Dv=8; 4 in the small-groups lane's groups of 16), so 16 keys are 3 (4) groups a kv head,
 * and 65536 keys over 10000; 8 query heads of 4096 rows are 256 runs of 128 rows, 16 of 2048;
 * the lanes kernels' tiles hold 4 or 16 keys, so 4 keys are one. Planned only. */
static void keys_pass_plans_row_splits(test_ctx *t) {
    static const char tiles[] = "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3,";
    static const char rows_min[] = "BWD_SPLIT_MIN=0,"; /* (the CPU rows' 1024: as SPLIT_MIN) */
    cl_uint units = 1;
    clGetDeviceInfo(clattn_env_device(t->env), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units,
                    NULL);
    const struct {
        const char *params;
        int64_t Hq, Sq, Sk;
        int hooked;
        int64_t splits; /* > 0: that many; else the runs that fill the device, at most -splits */
    } cases[] = {
        {"SPLIT_TARGET=8,SPLIT_MIN=128", 8, 4096, 16, -1, -128},
        {"SPLIT_TARGET=8,SPLIT_MIN=2048", 8, 4096, 16, -1, -16},
        {"SPLIT_TARGET=8,SPLIT_MIN=128", 1, 100, 16, -1, 1},     /* too few rows */
        {"SPLIT_TARGET=8,SPLIT_MIN=128", 8, 4096, 65536, -1, 1}, /* the key groups fill it */
        {"SPLIT_TARGET=8,SPLIT_MIN=128", 1, 100, 16, 1000, 34},  /* hooked: 34 blocks of 3 */
        {"SPLIT_TARGET=8,BWD_TILES=0", 8, 4096, 16, 4, 4},       /* the lanes kernels */
        {"SPLIT_TARGET=8,BWD_SPLIT_MIN=2048,BWD_TILES=0", 8, 4096, 4, -1, -16},
        {"SPLIT_TARGET=8,BWD_SPLIT_MIN=4096,SPLIT_MIN=32,BWD_TILES=0", 1, 2048, 4, -1, 1},
        {"SPLIT_TARGET=8,BWD_TILES=0", 8, 4096, 65536, -1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !t->failed; ++i) {
        if (cases[i].Sk > 16 && units * 8 > 10000) continue; /* (no such device yet) */
        const int64_t dims[7] = {1, cases[i].Hq, 1, cases[i].Sq, cases[i].Sk, 16, 8};
        const bool tiled = strstr(cases[i].params, "BWD_TILES=0") == NULL;
        char params[160];
        snprintf(params, sizeof params, "%s%s%s", tiled ? tiles : "",
                 strstr(cases[i].params, "BWD_SPLIT_MIN") ? "" : rows_min, cases[i].params);
        clattn__backward_plan plan = {0};
        int status = clattn_tuning_override("attention", params);
        clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, cases[i].hooked);
        if (status == CLATTN_SUCCESS) status = plan_for(t, dims, NULL, NULL, &plan);
        if (status != CLATTN_SUCCESS) {
            test_fail_at(t, __FILE__, __LINE__, "case %zu: %s: %s", i, clattn_status_name(status),
                         clattn_last_error());
            break;
        }
        int64_t want = cases[i].splits;
        if (want <= 0 && (!tiled || (plan.slices > 0 && plan.group >= plan.slices))) {
            const int64_t keys = tiled ? plan.group / plan.slices : cases[i].Sk;
            const int64_t groups = (cases[i].Sk + keys - 1) / keys;
            want = ((int64_t)units * 8 + groups - 1) / groups;
            if (want > -cases[i].splits) want = -cases[i].splits;
        }
        CHECK(t, plan.tiled == tiled && plan.row_splits == want,
              "case %zu (%s, Hq=%lld Sq=%lld Sk=%lld, %u units, groups of %d): tiled %d, %d row "
              "splits, not %d and %lld",
              i, params, (long long)cases[i].Hq, (long long)cases[i].Sq, (long long)cases[i].Sk,
              units, plan.group, plan.tiled, plan.row_splits, tiled, (long long)want);
    }
    clattn_tuning_override("attention", NULL);
}

/* How the keys pass puts dbias together (plan_bias): stored straight into dbias where each
 * element is one pair's, else added into f32 replicas, one per batch and kv head the bias is
 * broadcast over and per row split where an element's rows may fall in several; a bias whose
 * rows the query heads of a kv head share splits no rows (its replicas would be its size a
 * split); one value along the keys: nothing. B=2, Hq=4, Hkv=2, 11 rows in blocks of 3 (8 runs a
 * kv head; the lanes kernels' blocks of BM=4: 6), 3 row splits hooked. Planned only. */
static void keys_pass_plans_bias(test_ctx *t) {
    static const struct {
        int64_t n[4], Sq;
        int tiled, mode, replicas, row_splits;
    } cases[] = {
        {{2, 4, 11, 23}, 11, 1, 1, 0, 3}, /* the scores' shape */
        {{1, 4, 11, 23}, 11, 1, 2, 2, 3}, /* shared by the batches: one pair a replica's element */
        {{2, 1, 1, 23}, 11, 1, 2, 6, 3},  /* a key bias: kv heads, splits */
        {{1, 4, 1, 23}, 11, 1, 2, 6, 3},  /* per head, along the keys: batches, splits */
        {{1, 1, 11, 23}, 11, 1, 2, 4, 1}, /* rows shared by a kv head's query heads */
        {{2, 1, 11, 1}, 11, 1, 0, 0, 3},  /* one value along the keys */
        {{2, 4, 1, 23}, 1, 1, 1, 0, 2},   /* one row (a run a head): each element one pair's */
        {{2, 1, 1, 23}, 11, 0, 2, 6, 3},  /* the lanes kernels: a key bias, splits too */
        {{1, 1, 11, 23}, 11, 0, 2, 4, 1}, /* the lanes kernels: rows shared, no splits */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !t->failed; ++i) {
        const int64_t dims[7] = {2, 4, 2, cases[i].Sq, 23, 16, 8};
        clattn__backward_plan plan = {0};
        int status = clattn_tuning_override(
            "attention", cases[i].tiled ? "BWD_TILES=1,BWD_GROUP=24,BWD_SLICE=4,BWD_BLOCK=3"
                                        : "BWD_TILES=0,BM=4");
        clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, 3);
        if (status == CLATTN_SUCCESS) status = plan_for(t, dims, NULL, cases[i].n, &plan);
        CHECK_OK(t, status);
        CHECK(t,
              plan.tiled == cases[i].tiled && plan.bias_mode == cases[i].mode &&
                  plan.bias_replicas == cases[i].replicas && plan.row_splits == cases[i].row_splits,
              "case %zu: tiled %d, mode %d, %d replicas, %d row splits; not %d, %d, %d, %d", i,
              plan.tiled, plan.bias_mode, plan.bias_replicas, plan.row_splits, cases[i].tiled,
              cases[i].mode, cases[i].replicas, cases[i].row_splits);
    }
    clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, -1);
    clattn_tuning_override("attention", NULL);
}

/* Causal over 17 queries and keys, a key bias and its gradient (added into replicas, the rows
 * split 2 ways), key 6 hidden from every query (the keep mask) and holding garbage: with 3 tiles
 * of 4 keys a step, rows 4..7 see all of the first tile and not all of the second, so the step is
 * not dense and the queries pass skips key 6's zero weights (the gradients keep their bits); and
 * the reference's gradients. */
static void hidden_key_inside_a_step(test_ctx *t) {
    bw_spec s = spec(1, 1, 1, 17, 17, 16);
    s.causal = 1, s.keep = 1, s.bias = BIAS_KEYS;
    bw_case c;
    bw_grads clean = {0}, dirty = {0};
    if (prepare_case(t, &s, &c)) {
        for (int64_t i = 0; i < s.Sq * s.Sk; ++i) c.keep[i] = i % s.Sk != 6;
        CHECK(t, test_write(t, c.keep_t.buffer, c.keep, (size_t)(s.Sq * s.Sk)),
              "could not upload the keep mask");
        CHECK_OK(t, run_backward(t, &c, NULL, &clean, NULL));
        fill_row(c.k + 6 * s.D, s.D, 0);
        fill_row(c.v + 6 * s.Dv, s.Dv, 2);
        CHECK_OK(t, run_backward(t, &c, NULL, &dirty, NULL));
        CHECK(t, same_grads(&c, &clean, &dirty), "garbage in key 6 changed a gradient");
        check_against_reference(t, &c, &clean, "key 6 hidden, a key bias");
    }
    free_grads(&clean), free_grads(&dirty);
    free_case(&c);
}

/* The lanes kernels over several key tiles: the keys pass's tiles a work-item, BWD_KEY_TILES
 * where no dbias is asked, else one (planned); and run, the count hooked so that dbias takes
 * them too (3 tiles of 4 keys: over 19 keys, 5 tiles, the last work-item's third is past the
 * keys), with dbias stored (a dense bias) and as hidden_key_inside_a_step has it, the queries
 * pass 3 tiles a step (LANE_TILES) beside them. */
static void lanes_kernels_over_several_key_tiles(test_ctx *t) {
    static const int64_t dims[7] = {2, 2, 1, 7, 19, 16, 16}, key_bias[4] = {2, 1, 1, 19};
    clattn__backward_plan plain = {0}, biased = {0};
    CHECK_OK(
        t, clattn_tuning_override("attention", "BWD_TILES=0,LANES=4,BWD_KEY_TILES=3,LANE_TILES=3"));
    CHECK_OK(t, plan_for(t, dims, NULL, NULL, &plain));
    CHECK_OK(t, plan_for(t, dims, NULL, key_bias, &biased));
    CHECK(t, plain.key_tiles == 3 && biased.key_tiles == 1,
          "BWD_KEY_TILES=3: %d key tiles a work-item, %d with dbias; not 3 and 1", plain.key_tiles,
          biased.key_tiles);
    if (!skipped_under_uninit_checker(t)) {
        clattn__hook_set(CLATTN__HOOK_KEY_TILES, 3);
        bw_spec s = spec(2, 2, 1, 7, 19, 16);
        s.bias = BIAS_FULL, s.causal = 1;
        check_spec(t, &s, "3 key tiles, a dense bias");
        clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, 2);
        hidden_key_inside_a_step(t);
        clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, -1);
        clattn__hook_set(CLATTN__HOOK_KEY_TILES, -1);
    }
    clattn_tuning_override("attention", NULL);
}

/* One random case of the fused backward (random_cases): its shape, dtype, layout, mask parts
 * and launch from `rng`; the lengths into klen and qlen; the launch's override into params. */
static bw_spec random_spec(uint64_t *rng, bool large, int32_t klen[2], int32_t qlen[2],
                           char *params, size_t size) {
#define PICK(n) ((int64_t)(test_rand_u64(rng) % (uint64_t)(n)))
    /* (head dims up to 64: a tiles case of one slice, where the head dims share no divisor,
     * holds D + 2 Dv + D floats a work-item, and D=64 Dv=127 took PoCL 29 s to build) */
    const int64_t most_s = large ? 80 : 40, most_d = 64;
    bw_spec s =
        spec(1 + PICK(2), 1, 1 + PICK(2), 1 + PICK(most_s), 1 + PICK(most_s), 1 + PICK(most_d));
    s.Hq = s.Hkv * (1 + PICK(3));
    s.Dv = PICK(2) ? s.D : 1 + PICK(most_d);
    s.dt = PICK(5) < 3 ? CLATTN_F32 : PICK(2) ? CLATTN_F16 : CLATTN_BF16;
    s.layout = (int)PICK(2);
    s.scale = PICK(2) ? 0.0f : 0.25f * (float)(1 + PICK(6));
    s.causal = PICK(2) == 0;
    s.bottom_right = PICK(2) == 0;
    if (PICK(4) == 0) s.window = 1, s.left = PICK(s.Sk + 1), s.right = PICK(s.Sk + 1);
    if (PICK(6) == 0) s.global_stride = 2 + PICK(7);
    s.alibi = PICK(5) == 0;
    if (PICK(5) == 0) s.softcap = (float)(2 + PICK(9));
    s.keep = PICK(5) == 0;
    s.bias = PICK(5) < 2 ? BIAS_NONE : (int)(1 + PICK(BIAS_PER_HEAD));
    for (int b = 0; b < 2; ++b)
        klen[b] = (int32_t)PICK(s.Sk + 1), qlen[b] = (int32_t)PICK(s.Sq + 1);
    s.klen = PICK(4) == 0 ? klen : NULL;
    s.qlen = PICK(4) == 0 ? qlen : NULL;
    s.seed = test_rand_u64(rng);
    static const int lanes[] = {1, 4, 8, 16}, slices[] = {1, 2, 4, 8, 16, 32, 64};
    /* (LANES narrowed to divide the head dims, or the tiles' slices; BM up to 4, the rows':
     * PoCL took 34 s to build the lanes kernels at BM=8) */
    if (PICK(2))
        snprintf(params, size, "BWD_TILES=0,LANES=%d,BM=%d", lanes[PICK(4)], 1 << PICK(3));
    else
        snprintf(params, size, "BWD_TILES=1,LANES=%d,BWD_GROUP=%d,BWD_SLICE=%d,BWD_BLOCK=%d",
                 lanes[PICK(2)], (int)(1 + PICK(256)), slices[PICK(7)], (int)(1 + PICK(32)));
    return s;
#undef PICK
}

/* The keys tiles in blocks of one query row under a keep mask (found by the random cases).
 * PoCL 3.1 got every key's dK but the first of each group wrong here, with either of its
 * work-group methods, while -cl-opt-disable, Oclgrind and rusticl got it right, until the branch
 * that skips a block no row of which sees the group's keys crossed a barrier of its own
 * (cl/attention_backward.cl; docs/reliability.md). */
static void tiles_kernels_blocks_of_one_row_under_a_keep_mask(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    CHECK_OK(t, clattn_tuning_override("attention", "BWD_TILES=1,BWD_GROUP=8,BWD_BLOCK=1"));
    bw_spec s = spec(1, 1, 1, 8, 8, 4);
    s.bottom_right = 1, s.keep = 1, s.seed = 1234;
    check_spec_ran(t, &s, "8 keys a group, blocks of one row, a keep mask", "backward_keys_tiles");
    clattn_tuning_override("attention", NULL);
}

/* Randomized cases of the fused backward against the float64 reference: shapes (GQA groups, Sq
 * and Sk up to 40, 80 on large shapes, head dims from 1 to 64), dtypes, layouts, every
 * mask part, and the launch: the lanes kernels at random LANES and BM, or the tiles kernels in
 * random groups, slices and blocks, a third of them under a random local-memory cap, so that the
 * plan's every narrowing and fallback runs; a third with the keys split 2 to 4 ways, a third
 * with the keys pass's rows split 2 to 8 ways (either family). A seventh of
 * CLATTN_FUZZ_N cases (28, 10 with CLATTN_TEST_SMALL: 4 and 2; at least 2: each builds its own
 * programs, seconds on PoCL), from CLATTN_FUZZ_SEED (1); a failure names its case's seed and
 * launch. */
static void fused_gradients_of_random_cases(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    const char *n_text = getenv("CLATTN_FUZZ_N"), *seed_text = getenv("CLATTN_FUZZ_SEED");
    const int n = (n_text ? atoi(n_text) : test_large_shapes(t) ? 28 : 10) / 7;
    const uint64_t first = seed_text ? strtoull(seed_text, NULL, 10) : 1;
    for (int i = 0; i < (n > 2 ? n : 2) && !t->failed; ++i) {
        uint64_t rng = (first + (uint64_t)i) * 0x9E3779B97F4A7C15ull;
        int32_t klen[2], qlen[2];
        char params[160], what[512], cap[16];
        const bw_spec s =
            random_spec(&rng, test_large_shapes(t), klen, qlen, params, sizeof params);
        const int splits = test_rand_u64(&rng) % 3 == 0 ? 2 + (int)(test_rand_u64(&rng) % 3) : -1;
        const bool capped = test_rand_u64(&rng) % 3 == 0;
        snprintf(cap, sizeof cap, "%d", 1024 + (int)(test_rand_u64(&rng) % 47) * 1024);
        const int row_splits =
            test_rand_u64(&rng) % 3 == 0 ? 2 + (int)(test_rand_u64(&rng) % 7) : -1;
        snprintf(what, sizeof what,
                 "case %llu: B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld Dv=%lld %s layout %d, "
                 "causal %d bottom-right %d window %d (%lld, %lld) global %lld alibi %d softcap %g "
                 "keep %d bias %d klen %d qlen %d scale %g; %s, splits %d, row splits %d, "
                 "local memory %s",
                 (unsigned long long)(first + (uint64_t)i), (long long)s.B, (long long)s.Hq,
                 (long long)s.Hkv, (long long)s.Sq, (long long)s.Sk, (long long)s.D,
                 (long long)s.Dv, clattn_dtype_name(s.dt), s.layout, s.causal, s.bottom_right,
                 s.window, (long long)s.left, (long long)s.right, (long long)s.global_stride,
                 s.alibi, (double)s.softcap, s.keep, s.bias, s.klen != NULL, s.qlen != NULL,
                 (double)s.scale, params, splits, row_splits, capped ? cap : "the device's");
        CHECK_OK(t, clattn_tuning_override("attention", params));
        clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, splits);
        clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, row_splits);
        if (capped) { /* (below the lane's own cap: pocl-basic's 48 KiB) */
            test_saved_env saved = test_env_set("CLATTN_MAX_LOCAL_MEMORY", cap);
            check_spec(t, &s, what);
            test_env_restore(&saved);
        } else {
            check_spec(t, &s, what);
        }
    }
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, -1);
    clattn__hook_set(CLATTN__HOOK_ROW_SPLITS, -1);
    clattn_tuning_override("attention", NULL);
}

/* A caller's workspace of exactly the size asked gives the same bits as the library's own; one
 * byte less is refused before anything runs. */
static void caller_workspace(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    bw_spec s = spec(1, 2, 2, 9, 21, 16);
    s.causal = 1;
    bw_case c;
    bw_grads own = {0}, given = {0}, none = {0};
    size_t bytes = 0;
    clattn_attention_backward_options options = {CLATTN_PATH_AUTO, NULL, NULL};
    if (prepare_case(t, &s, &c)) {
        CHECK_OK(t, run_backward(t, &c, NULL, &own, &bytes));
        CHECK(t, bytes >= (size_t)(8 * s.B * s.Hq * s.Sq), "a workspace of %zu bytes", bytes);
        options.workspace = test_buffer(t, bytes);
        CHECK_OK(t, run_backward(t, &c, &options, &given, NULL));
        CHECK(t, same_grads(&c, &own, &given), "a caller's workspace changed the result");
        clReleaseMemObject(options.workspace);
        options.workspace = test_buffer(t, bytes - 1);
        CHECK_STATUS(t, run_backward(t, &c, &options, &none, NULL), CLATTN_ERR_BUFFER_TOO_SMALL);
        clReleaseMemObject(options.workspace);
    }
    free_grads(&own), free_grads(&given);
    free_case(&c);
}

/* Every invalid argument: its status, *event NULL. */
static void bad_arguments_are_rejected(test_ctx *t) {
    enum { Q, K, V, OUT, DOUT, DQ, DK, DV, DB, BIAS, LSE, N };
    cl_mem m[N];
    for (int i = 0; i < N; ++i) {
        m[i] = test_buffer(t, 512);
        CHECK(t, m[i] != NULL, "no buffer");
    }
    clattn_tensor x[N];
    for (int i = 0; i < N; ++i) x[i] = clattn_tensor_4d(m[i], CLATTN_F32, 1, 2, 4, 16);
    x[K].shape[1] = x[V].shape[1] = x[DK].shape[1] = x[DV].shape[1] = 1; /* GQA */
    x[LSE] = clattn_tensor_4d(m[LSE], CLATTN_F32, 1, 1, 2, 4);
    x[BIAS] = x[DB] = clattn_tensor_4d(m[BIAS], CLATTN_F32, 1, 2, 4, 4);
    x[DB].buffer = m[DB];
    clattn_mask bias = {0};
    bias.bias = &x[BIAS];
    clattn_attention_backward_options o = {CLATTN_PATH_AUTO, &x[DB], NULL};
    cl_command_queue queue = clattn_env_queue(t->env);
    typedef struct bad {
        const char *what;
        int tensor;           /* which x[] to change (-1: none) */
        clattn_tensor change; /* its new value */
        int status;
    } bad;
    clattn_tensor lse_f16 = x[LSE], lse_short = x[LSE], dq_short = x[DQ], dq_over_q = x[DQ];
    clattn_tensor dk_over_dv = x[DK], dout_short = x[DOUT], db_wide = x[DB], dq_null = x[DQ];
    lse_f16.dtype = CLATTN_F16, lse_short.shape[3] = 3, dq_short.shape[2] = 3;
    dq_over_q.buffer = m[Q], dk_over_dv.buffer = m[DV], dout_short.shape[3] = 8;
    db_wide.shape[0] = 2, dq_null.buffer = NULL;
    const bad cases[] = {
        {"valid", -1, x[0], CLATTN_SUCCESS},
        {"lse in f16", LSE, lse_f16, CLATTN_ERR_UNSUPPORTED_DTYPE},
        {"lse of another shape", LSE, lse_short, CLATTN_ERR_SHAPE_MISMATCH},
        {"dq of another shape", DQ, dq_short, CLATTN_ERR_SHAPE_MISMATCH},
        {"dout of another shape", DOUT, dout_short, CLATTN_ERR_SHAPE_MISMATCH},
        {"dq over q", DQ, dq_over_q, CLATTN_ERR_ALIASING},
        {"dk over dv", DK, dk_over_dv, CLATTN_ERR_ALIASING},
        {"dk the same descriptor as k", -2, x[0], CLATTN_ERR_ALIASING},
        {"dq the same descriptor as dout", -3, x[0], CLATTN_ERR_ALIASING},
        {"dbias of another shape", DB, db_wide, CLATTN_ERR_SHAPE_MISMATCH},
        {"dq without a buffer", DQ, dq_null, CLATTN_ERR_NULL_TENSOR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        clattn_tensor y[N];
        memcpy(y, x, sizeof y);
        if (cases[i].tensor >= 0) y[cases[i].tensor] = cases[i].change;
        o.dbias = &y[DB];
        bias.bias = &y[BIAS];
        /* -2, -3: one descriptor passed twice (the same address) */
        const clattn_tensor *dq = cases[i].tensor == -3 ? &y[DOUT] : &y[DQ];
        const clattn_tensor *dk = cases[i].tensor == -2 ? &y[K] : &y[DK];
        cl_event ev = (cl_event)(uintptr_t)1;
        size_t bytes = 0;
        /* the valid call is only sized (the same checks, no kernel: a host test) */
        const int status =
            cases[i].status == CLATTN_SUCCESS
                ? clattn_attention_backward_workspace_size(&y[Q], &y[K], &y[V], &y[OUT], &y[DOUT],
                                                           &y[LSE], &bias, dq, dk, &y[DV], &o,
                                                           queue, &bytes)
                : clattn_attention_backward(&y[Q], &y[K], &y[V], &y[OUT], &y[DOUT], &y[LSE], 0.0f,
                                            &bias, dq, dk, &y[DV], &o, queue, 0, NULL, &ev);
        CHECK(t, status == cases[i].status && (status == CLATTN_SUCCESS || ev == NULL),
              "%s -> %s, expected %s (%s)", cases[i].what, clattn_status_name(status),
              clattn_status_name(cases[i].status), clattn_last_error());
    }
    cl_event ev = (cl_event)(uintptr_t)1;
    o.dbias = &x[DB], bias.bias = &x[BIAS]; /* the loop's copies are gone */
    o.path = CLATTN_PATH_COMPOSED;          /* with dbias */
    CHECK_STATUS(t,
                 clattn_attention_backward(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT], &x[LSE], 0.0f,
                                           &bias, &x[DQ], &x[DK], &x[DV], &o, queue, 0, NULL, &ev),
                 CLATTN_ERR_INVALID_ARGUMENT);
    clattn_mask capped = {0};
    capped.softcap = 5.0f;
    clattn_attention_backward_options composed = {CLATTN_PATH_COMPOSED, NULL, NULL};
    CHECK_STATUS(t,
                 clattn_attention_backward(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT], &x[LSE], 0.0f,
                                           &capped, &x[DQ], &x[DK], &x[DV], &composed, queue, 0,
                                           NULL, &ev),
                 CLATTN_ERR_INVALID_ARGUMENT);
    composed.path = (clattn_attention_path)7;
    CHECK_STATUS(t,
                 clattn_attention_backward(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT], &x[LSE], 0.0f,
                                           NULL, &x[DQ], &x[DK], &x[DV], &composed, queue, 0, NULL,
                                           &ev),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK(t, ev == NULL, "a refused path left *event set");
    o.path = CLATTN_PATH_AUTO;
    CHECK_STATUS(t,
                 clattn_attention_backward(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT], &x[LSE], 0.0f,
                                           NULL, &x[DQ], &x[DK], &x[DV], &o, queue, 0, NULL, &ev),
                 CLATTN_ERR_INVALID_ARGUMENT); /* dbias without a bias */
    CHECK(t, ev == NULL, "dbias without a bias left *event set");
    CHECK_STATUS(t,
                 clattn_attention_backward(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT], &x[LSE],
                                           INFINITY, NULL, &x[DQ], &x[DK], &x[DV], NULL, queue, 0,
                                           NULL, &ev),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t,
                 clattn_attention_backward(NULL, &x[K], &x[V], &x[OUT], &x[DOUT], &x[LSE], 0.0f,
                                           NULL, &x[DQ], &x[DK], &x[DV], NULL, queue, 0, NULL, &ev),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t,
                 clattn_attention_backward(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT], NULL, 0.0f, NULL,
                                           &x[DQ], &x[DK], &x[DV], NULL, queue, 0, NULL, &ev),
                 CLATTN_ERR_INVALID_ARGUMENT);
    size_t bytes = 0;
    CHECK_STATUS(t,
                 clattn_attention_backward_workspace_size(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT],
                                                          &x[LSE], NULL, &x[DQ], &x[DK], &x[DV],
                                                          NULL, queue, NULL),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_OK(t, clattn_attention_backward_workspace_size(&x[Q], &x[K], &x[V], &x[OUT], &x[DOUT],
                                                         &x[LSE], NULL, &x[DQ], &x[DK], &x[DV],
                                                         NULL, queue, &bytes));
    CHECK(t, bytes >= 8 * 8, "a workspace of %zu bytes", bytes);
    for (int i = 0; i < N; ++i) clReleaseMemObject(m[i]);
}

/* The composed path (GEMMs, clattn_softmax, clattn_softmax_backward) against the reference and
 * the fused kernels, element-wise. */
static void composed_equals_fused(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const int32_t klen[2] = {21, 7}, qlen[2] = {9, 4};
    bw_spec specs[4];
    const char *names[4] = {"no mask, GQA", "causal bottom-right, lengths", "keep mask, a bias",
                            "f16, [B,S,H,D] storage, window"};
    specs[0] = spec(2, 4, 2, 9, 21, 16);
    specs[1] = spec(2, 2, 1, 9, 21, 24);
    specs[1].causal = 1, specs[1].bottom_right = 1, specs[1].klen = klen, specs[1].qlen = qlen;
    specs[2] = spec(2, 2, 2, 9, 21, 16);
    specs[2].keep = 1, specs[2].bias = BIAS_HEADS, specs[2].Dv = 8;
    specs[3] = spec(1, 2, 2, 9, 21, 32);
    specs[3].dt = CLATTN_F16, specs[3].layout = 1, specs[3].window = 1, specs[3].left = 3;
    specs[3].right = 0;
    for (int i = 0; i < 4 && !t->failed; ++i) {
        bw_case c;
        bw_grads fused = {0}, composed = {0};
        clattn_attention_backward_options options = {CLATTN_PATH_COMPOSED, NULL, NULL};
        if (prepare_case(t, &specs[i], &c)) {
            CHECK_OK(t, run_backward(t, &c, NULL, &fused, NULL));
            CHECK_OK(t, run_backward(t, &c, &options, &composed, NULL));
            check_against_reference(t, &c, &composed, names[i]);
            const bw_spec *s = &specs[i];
            const size_t n[3] = {(size_t)(s->B * s->Hq * s->Sq * s->D),
                                 (size_t)(s->B * s->Hkv * s->Sk * s->D),
                                 (size_t)(s->B * s->Hkv * s->Sk * s->Dv)};
            const float *f[3] = {fused.dq, fused.dk, fused.dv};
            const float *g[3] = {composed.dq, composed.dk, composed.dv};
            const double tol = s->dt == CLATTN_F32 ? 2e-5 : 4e-3;
            for (int k = 0; k < 3 && !t->failed; ++k)
                for (size_t e = 0; e < n[k]; ++e)
                    if (!(fabs(f[k][e] - g[k][e]) <= tol * (1 + fabs(f[k][e])))) {
                        test_fail_at(t, __FILE__, __LINE__,
                                     "%s: gradient %d [%zu]: fused %.9g, "
                                     "composed %.9g",
                                     names[i], k, e, f[k][e], g[k][e]);
                        break;
                    }
        }
        free_grads(&fused), free_grads(&composed);
        free_case(&c);
    }
}

/* ---- linear attention's backward (src/ops/linear_attention_backward.c) ---- */

typedef struct lin_spec {
    int64_t B, Hq, Hkv, Sq, Sk, D, Dv;
    clattn_dtype dt;
    int feature_map, causal, bottom_right, layout;
    const int32_t *klen, *qlen;
    uint64_t seed;
} lin_spec;

/* Host values exact in dt; for relu and identity positive q and k (identity's denominator then
 * stays far from 0, and relu's slope is defined everywhere). */
static float *lin_values(const lin_spec *s, size_t n, bool positive, uint64_t *rng) {
    float *x = malloc(n * sizeof(float));
    if (!x) return NULL;
    test_fill_exact(x, n, s->dt, rng);
    for (size_t i = 0; positive && i < n; ++i) {
        uint16_t bits[2];
        ref_store(bits, s->dt, 0, fabsf(x[i]) * 0.5f + 0.125f);
        x[i] = ref_load(bits, s->dt, 0);
    }
    return x;
}

static bool lin_upload_lengths(test_ctx *t, const lin_spec *s, clattn_mask *mask,
                               clattn_tensor *klen, clattn_tensor *qlen) {
    if (s->klen) {
        *klen = clattn_tensor_4d(upload(t, s->klen, 4 * (size_t)s->B), CLATTN_I32, 1, 1, 1, s->B);
        mask->key_lengths = klen;
    }
    if (s->qlen) {
        *qlen = clattn_tensor_4d(upload(t, s->qlen, 4 * (size_t)s->B), CLATTN_I32, 1, 1, 1, s->B);
        mask->query_lengths = qlen;
    }
    return (!s->klen || klen->buffer) && (!s->qlen || qlen->buffer);
}

/* Runs the backward on host values q, k, v, dout into NaN-filled outputs; the gradients come
 * back dense. `workspace` may be NULL; *bytes (when not NULL) receives the size asked. */
static int run_linear_backward(test_ctx *t, const lin_spec *s, float *const in[4], cl_mem workspace,
                               bw_grads *g, size_t *bytes) {
    memset(g, 0, sizeof *g);
    const bw_spec shape = {
        s->B, s->Hq, s->Hkv, s->Sq, s->Sk, s->D, s->Dv, s->dt, .layout = s->layout};
    clattn_tensor q = test_upload_bhsd(t, in[0], s->B, s->Hq, s->Sq, s->D, s->dt, s->layout);
    clattn_tensor k = test_upload_bhsd(t, in[1], s->B, s->Hkv, s->Sk, s->D, s->dt, s->layout);
    clattn_tensor v = test_upload_bhsd(t, in[2], s->B, s->Hkv, s->Sk, s->Dv, s->dt, s->layout);
    clattn_tensor dout = test_upload_bhsd(t, in[3], s->B, s->Hq, s->Sq, s->Dv, s->dt, s->layout);
    clattn_tensor dq = nan_output(t, &shape, s->Hq, s->Sq, s->D);
    clattn_tensor dk = nan_output(t, &shape, s->Hkv, s->Sk, s->D);
    clattn_tensor dv = nan_output(t, &shape, s->Hkv, s->Sk, s->Dv);
    clattn_tensor klen = {0}, qlen = {0};
    clattn_mask mask = {.causal = s->causal,
                        .align =
                            s->bottom_right ? CLATTN_ALIGN_BOTTOM_RIGHT : CLATTN_ALIGN_TOP_LEFT};
    clattn_linear_options options = {(clattn_feature_map)s->feature_map, 1e-6f, workspace};
    clattn_tensor *all[9] = {&q, &k, &v, &dout, &dq, &dk, &dv, &klen, &qlen};
    bool ok = lin_upload_lengths(t, s, &mask, &klen, &qlen);
    for (int i = 0; i < 7; ++i) ok = ok && all[i]->buffer;
    cl_command_queue queue = clattn_env_queue(t->env);
    int status = ok ? CLATTN_SUCCESS : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    if (status == CLATTN_SUCCESS && bytes)
        status = clattn_linear_attention_backward_workspace_size(&q, &k, &v, &dout, &mask, &dq, &dk,
                                                                 &dv, &options, queue, bytes);
    if (status == CLATTN_SUCCESS)
        status = clattn_linear_attention_backward(&q, &k, &v, &dout, &mask, &dq, &dk, &dv, &options,
                                                  queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        g->dq = download(t, &dq), g->dk = download(t, &dk), g->dv = download(t, &dv);
    for (int i = 0; i < 9; ++i)
        if (all[i]->buffer) clReleaseMemObject(all[i]->buffer);
    return status;
}

static void check_linear(test_ctx *t, const lin_spec *s, const char *what) {
    if (t->failed) return;
    uint64_t rng = s->seed * 131 + 3;
    const bool positive = s->feature_map != CLATTN_FEATURE_ELU1;
    const size_t nq = (size_t)(s->B * s->Hq * s->Sq * s->D),
                 nk = (size_t)(s->B * s->Hkv * s->Sk * s->D);
    const size_t nv = (size_t)(s->B * s->Hkv * s->Sk * s->Dv),
                 no = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
    float *in[4] = {lin_values(s, nq, positive, &rng), lin_values(s, nk, positive, &rng),
                    lin_values(s, nv, false, &rng), lin_values(s, no, false, &rng)};
    double *dq = malloc(nq * 8), *dk = malloc(nk * 8), *dv = malloc(nv * 8);
    bw_grads g = {0};
    const ref_mask mask = {.causal = s->causal,
                           .bottom_right = s->bottom_right,
                           .key_lengths = s->klen,
                           .query_lengths = s->qlen};
    const ref_linear p = {s->B, s->Hq, s->Hkv,         s->Sq, s->Sk,
                          s->D, s->Dv, s->feature_map, 1e-6,  &mask};
    bool ok = in[0] && in[1] && in[2] && in[3] && dq && dk && dv &&
              ref_linear_attention_backward(&p, in[0], in[1], in[2], in[3], dq, dk, dv);
    if (!ok) test_fail_at(t, __FILE__, __LINE__, "%s: out of host memory", what);
    int status = ok ? run_linear_backward(t, s, in, NULL, &g, NULL) : CLATTN_SUCCESS;
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "%s: %s: %s", what, clattn_status_name(status),
                     clattn_last_error());
    /* f32: rounding of sums over up to Sk keys and Sq queries; 16-bit: of the gradients */
    const double tol = s->dt == CLATTN_F32 ? 4e-5 : s->dt == CLATTN_F16 ? 4e-3 : 3e-2;
    if (ok && !t->failed) check_close(t, what, "dq", g.dq, dq, nq, tol);
    if (ok && !t->failed) check_close(t, what, "dk", g.dk, dk, nk, tol);
    if (ok && !t->failed) check_close(t, what, "dv", g.dv, dv, nv, tol);
    for (int i = 0; i < 4; ++i) free(in[i]);
    free(dq), free(dk), free(dv);
    free_grads(&g);
}

static lin_spec lin(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D,
                    int64_t Dv) {
    lin_spec s;
    memset(&s, 0, sizeof s);
    s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Sq = Sq, s.Sk = Sk, s.D = D, s.Dv = Dv;
    s.dt = CLATTN_F32;
    s.seed = (uint64_t)(B + Hq * 3 + Sq * 5 + Sk * 7 + D * 11 + Dv);
    return s;
}

static void linear_gradients_of_feature_maps(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const char *const maps[] = {"elu1", "relu", "identity"};
    for (int map = 0; map < 3; ++map)
        for (int causal = 0; causal < 2; ++causal) {
            lin_spec s = lin(2, 2, 1, 37, 37, 16, 8);
            s.feature_map = map, s.causal = causal;
            char what[64];
            snprintf(what, sizeof what, "%s, causal %d", maps[map], causal);
            check_linear(t, &s, what);
        }
}

/* Lengths make some queries see nothing and some keys seen by none; bottom-right with Sq < Sk
 * is a KV cache; 150 keys are several chunks (the scans from both ends and the partial chunks). */
static void linear_gradients_of_masks_and_shapes(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    static const int32_t klen[2] = {150, 41}, qlen[2] = {70, 0};
    lin_spec s = lin(2, 4, 2, 70, 150, 32, 24);
    s.causal = 1, s.bottom_right = 1, s.klen = klen, s.qlen = qlen;
    check_linear(t, &s, "causal bottom-right, lengths, GQA, several chunks");
    s.causal = 0;
    check_linear(t, &s, "non-causal, lengths, GQA");
    s = lin(1, 2, 2, 150, 70, 20, 12);
    s.causal = 1;
    check_linear(t, &s, "causal top-left, Sq > Sk, head dims of 4-wide lanes");
    s = lin(1, 2, 2, 33, 33, 17, 5);
    s.causal = 1;
    check_linear(t, &s, "odd head dims (scalar lanes)");
    s = lin(2, 2, 1, 21, 29, 16, 16);
    s.causal = 1, s.dt = CLATTN_F16, s.layout = 1;
    check_linear(t, &s, "f16, [B,S,H,D] storage");
    s.dt = CLATTN_BF16, s.layout = 2, s.causal = 0;
    check_linear(t, &s, "bf16, [B,H,D,S] storage");
    /* the chunk states by the forward's tiles (the GPU row's TILES=1: groups of 6 here) */
    CHECK_OK(t, clattn_tuning_override("linear_attention", "TILES=1"));
    s = lin(1, 2, 2, 150, 70, 20, 12);
    s.causal = 1;
    check_linear(t, &s, "causal top-left, Sq > Sk, the tiles' states");
    clattn_tuning_override("linear_attention", NULL);
    if (test_large_shapes(t)) {
        s = lin(1, 2, 2, 300, 300, 128, 64);
        s.causal = 1;
        check_linear(t, &s, "D=128 Dv=64, 300 keys");
    }
}

/* A caller's workspace of exactly the size asked gives the same bits as the library's own; one
 * byte less is refused. Two runs agree bit for bit. */
static void linear_caller_workspace(test_ctx *t) {
    if (skipped_under_uninit_checker(t)) return;
    lin_spec s = lin(1, 2, 2, 70, 70, 16, 16);
    s.causal = 1;
    uint64_t rng = 5;
    const size_t nq = (size_t)(2 * 70 * 16);
    float *in[4] = {lin_values(&s, nq, false, &rng), lin_values(&s, nq, false, &rng),
                    lin_values(&s, nq, false, &rng), lin_values(&s, nq, false, &rng)};
    bw_grads own = {0}, again = {0}, given = {0}, none = {0};
    size_t bytes = 0;
    cl_mem workspace = NULL;
    bool ready = in[0] && in[1] && in[2] && in[3];
    if (ready) {
        CHECK_OK(t, run_linear_backward(t, &s, in, NULL, &own, &bytes));
        CHECK_OK(t, run_linear_backward(t, &s, in, NULL, &again, NULL));
        CHECK(t, memcmp(own.dk, again.dk, nq * 4) == 0 && memcmp(own.dq, again.dq, nq * 4) == 0,
              "two runs gave different bits");
        workspace = test_buffer(t, bytes);
        CHECK_OK(t, run_linear_backward(t, &s, in, workspace, &given, NULL));
        CHECK(t, memcmp(own.dv, given.dv, nq * 4) == 0, "a caller's workspace changed dv");
        clReleaseMemObject(workspace);
        workspace = test_buffer(t, bytes - 1);
        CHECK_STATUS(t, run_linear_backward(t, &s, in, workspace, &none, NULL),
                     CLATTN_ERR_BUFFER_TOO_SMALL);
        clReleaseMemObject(workspace);
    }
    for (int i = 0; i < 4; ++i) free(in[i]);
    free_grads(&own), free_grads(&again), free_grads(&given);
}

static const test_case cases[] = {
    {"reference_matches_finite_differences", reference_matches_finite_differences,
     TAG_HOST | TAG_SMOKE},
    {"linear_reference_matches_finite_differences", linear_reference_matches_finite_differences,
     TAG_HOST | TAG_SMOKE},
    {"gradients_of_shapes", gradients_of_shapes},
    {"gradients_of_gqa_and_mqa", gradients_of_gqa_and_mqa},
    {"gradients_of_masks", gradients_of_masks},
    {"gradients_of_biases", gradients_of_biases},
    {"gradients_of_storage_and_layouts", gradients_of_storage_and_layouts},
    {"gradients_of_other_launches", gradients_of_other_launches},
    {"lanes_kernels_over_several_key_tiles", lanes_kernels_over_several_key_tiles},
    {"gradients_with_split_keys", gradients_with_split_keys},
    {"gradients_with_64_bit_indices", gradients_with_64_bit_indices},
    {"a_key_bias_past_2_31_pairs", a_key_bias_past_2_31_pairs},
    {"tiles_kernels_give_the_gradients", tiles_kernels_give_the_gradients},
    {"tiles_kernels_in_small_groups", tiles_kernels_in_small_groups},
    {"tiles_kernels_with_split_rows", tiles_kernels_with_split_rows, TAG_SMOKE},
    {"lanes_kernels_with_split_rows", lanes_kernels_with_split_rows},
    {"split_counts_share_one_program", split_counts_share_one_program},
    {"tiles_kernels_in_longest_first_order", tiles_kernels_in_longest_first_order},
    {"tiles_kernels_plan_longest_first", tiles_kernels_plan_longest_first},
    {"keys_pass_plans_row_splits", keys_pass_plans_row_splits},
    {"keys_pass_plans_bias", keys_pass_plans_bias},
    {"tiles_kernels_blocks_of_one_row_under_a_keep_mask",
     tiles_kernels_blocks_of_one_row_under_a_keep_mask},
    {"fused_gradients_of_random_cases", fused_gradients_of_random_cases},
    {"invisible_garbage_changes_nothing", invisible_garbage_changes_nothing, TAG_SMOKE},
    {"caller_workspace", caller_workspace},
    {"bad_arguments_are_rejected", bad_arguments_are_rejected, TAG_HOST},
    {"composed_equals_fused", composed_equals_fused},
    {"linear_gradients_of_feature_maps", linear_gradients_of_feature_maps},
    {"linear_gradients_of_masks_and_shapes", linear_gradients_of_masks_and_shapes},
    {"linear_caller_workspace", linear_caller_workspace, TAG_SMOKE},
};
SUITE(attention_backward_suite, "attention_backward", cases);
