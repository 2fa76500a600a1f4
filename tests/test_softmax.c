/* Tests of the masked softmax (src/ops/softmax.c, cl/softmax.cl, cl/mask.cl) against the float64
 * reference, on both kernel variants (a work-item per row, a work-group per row) whatever the
 * device, since a test run on a CPU must also prove the GPU path. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BCAST_NONE = 0, BCAST_FULL, BCAST_PER_KEY, BCAST_PER_QUERY_KEY };
enum { LAYOUT_DENSE = 0, LAYOUT_PERMUTED, LAYOUT_STRIDED };

typedef struct sm_spec {
    int64_t B, H, Sq, Sk;
    clattn_dtype xt, yt;
    float scale;
    int causal, bottom_right, window;
    int64_t left, right, global_stride;
    float softcap;
    int empty_nan;
    const int32_t *klen, *qlen; /* [B] */
    int keep, bias;             /* BCAST_* */
    clattn_dtype bias_t;
    int alibi, lse, layout, in_place;
    uint64_t seed;
    /* row r of x starts with the 3 values row_values[3r..3r+2] (the rest random), for edge
     * rows */
    const float *row_values;
    int row_count;
} sm_spec;

/* The shape of a broadcast mask tensor of kind `kind` for scores [B,H,Sq,Sk]. */
static void bcast_shape(int kind, const sm_spec *s, int64_t shape[4]) {
    const int64_t full[4] = {s->B, s->H, s->Sq, s->Sk};
    for (int i = 0; i < 4; ++i) shape[i] = full[i];
    if (kind == BCAST_PER_KEY) shape[1] = shape[2] = 1;
    if (kind == BCAST_PER_QUERY_KEY) shape[0] = shape[1] = 1;
}

/* Host and device copies of everything one case needs. */
typedef struct sm_data {
    size_t n;      /* B*H*Sq*Sk */
    void *x_store; /* x as stored (dtype xt), in the layout's buffer */
    size_t x_bytes;
    clattn_tensor x, y, lse, klen, qlen, keep, bias, alibi;
    double *xd, *ref, *ref_lse; /* dense float64 */
    uint8_t *visible;
    uint8_t *keep_host;
    double *bias_d, *alibi_d;
    ref_mask rm;
    clattn_mask mask;
} sm_data;

static size_t dense_index(const sm_spec *s, int64_t b, int64_t h, int64_t i, int64_t j) {
    return (size_t)(((b * s->H + h) * s->Sq + i) * s->Sk + j);
}

/* The x view of the layout: dense, [B,Sq,H,Sk] storage read as [B,H,Sq,Sk] at an offset, or
 * every key two elements apart. */
static clattn_tensor x_layout(const sm_spec *s, size_t *elements) {
    clattn_tensor v = clattn_tensor_4d(NULL, s->xt, s->B, s->H, s->Sq, s->Sk);
    if (s->layout == LAYOUT_PERMUTED) {
        static const int swap[4] = {0, 2, 1, 3};
        v = clattn_tensor_permute(clattn_tensor_4d(NULL, s->xt, s->B, s->Sq, s->H, s->Sk), swap);
        v.offset = 3;
    } else if (s->layout == LAYOUT_STRIDED) {
        for (int i = 0; i < 4; ++i) v.strides[i] *= 2;
        v.offset = 1;
    }
    *elements = v.offset +
                (size_t)(s->B * s->H * s->Sq * s->Sk) * (s->layout == LAYOUT_STRIDED ? 2 : 1) + 1;
    return v;
}

static uint64_t view_index(const clattn_tensor *v, int64_t b, int64_t h, int64_t i, int64_t j) {
    return v->offset + (uint64_t)(b * v->strides[0] + h * v->strides[1] + i * v->strides[2] +
                                  j * v->strides[3]);
}

static cl_mem upload(test_ctx *t, const void *host, size_t bytes) {
    cl_mem m = test_buffer(t, bytes);
    if (m && !test_write(t, m, host, bytes)) {
        clReleaseMemObject(m);
        return NULL;
    }
    return m;
}

/* A broadcast mask tensor: host values (dense over its own shape) and its device view. */
static bool make_mask_tensor(test_ctx *t, const sm_spec *s, int kind, clattn_dtype dtype,
                             const void *host, clattn_tensor *view, int64_t strides[4]) {
    int64_t shape[4];
    bcast_shape(kind, s, shape);
    *view = clattn_tensor_4d(NULL, dtype, shape[0], shape[1], shape[2], shape[3]);
    for (int i = 0; i < 4; ++i) strides[i] = shape[i] == 1 ? 0 : view->strides[i];
    size_t count = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
    view->buffer = upload(t, host, count * clattn_dtype_size(dtype));
    return view->buffer != NULL;
}

static void free_data(sm_data *d) {
    clattn_tensor *views[] = {&d->x,    &d->y,    &d->lse,  &d->klen,
                              &d->qlen, &d->keep, &d->bias, &d->alibi};
    for (size_t i = 0; i < sizeof views / sizeof views[0]; ++i)
        if (views[i]->buffer && (views[i] != &d->y || d->y.buffer != d->x.buffer))
            clReleaseMemObject(views[i]->buffer);
    free(d->x_store);
    free(d->xd);
    free(d->ref);
    free(d->ref_lse);
    free(d->visible);
    free(d->keep_host);
    free(d->bias_d);
    free(d->alibi_d);
    memset(d, 0, sizeof *d);
}

static bool make_lengths(test_ctx *t, const sm_spec *s, sm_data *d) {
    if (s->klen) {
        d->klen = clattn_tensor_4d(upload(t, s->klen, sizeof(int32_t) * (size_t)s->B), CLATTN_I32,
                                   1, 1, 1, s->B);
        if (!d->klen.buffer) return false;
        d->mask.key_lengths = &d->klen;
        d->rm.key_lengths = s->klen;
    }
    if (s->qlen) {
        d->qlen = clattn_tensor_4d(upload(t, s->qlen, sizeof(int32_t) * (size_t)s->B), CLATTN_I32,
                                   1, 1, 1, s->B);
        if (!d->qlen.buffer) return false;
        d->mask.query_lengths = &d->qlen;
        d->rm.query_lengths = s->qlen;
    }
    return true;
}

static bool make_keep_bias_alibi(test_ctx *t, const sm_spec *s, sm_data *d, uint64_t *rng) {
    size_t n = d->n;
    if (s->keep) {
        d->keep_host = malloc(n);
        for (size_t i = 0; i < n; ++i) d->keep_host[i] = test_rand_u64(rng) % 4 != 0; /* 3/4 kept */
        if (!make_mask_tensor(t, s, s->keep, CLATTN_U8, d->keep_host, &d->keep, d->rm.keep_strides))
            return false;
        d->mask.keep = &d->keep;
        d->rm.keep = d->keep_host;
    }
    if (s->bias) {
        d->bias_d = malloc(n * sizeof(double));
        void *stored = malloc(n * 4);
        for (size_t i = 0; i < n; ++i) {
            ref_store(stored, s->bias_t, i, test_rand_uniform(rng, -3.0f, 3.0f));
            d->bias_d[i] = ref_load(stored, s->bias_t, i);
        }
        bool ok = make_mask_tensor(t, s, s->bias, s->bias_t, stored, &d->bias, d->rm.bias_strides);
        free(stored);
        if (!ok) return false;
        d->mask.bias = &d->bias;
        d->rm.bias = d->bias_d;
    }
    if (s->alibi) {
        float slopes[64];
        d->alibi_d = malloc(sizeof(double) * (size_t)s->H);
        for (int64_t h = 0; h < s->H; ++h)
            d->alibi_d[h] = slopes[h] = exp2f(-(float)(h + 1) / 2.0f);
        d->alibi = clattn_tensor_4d(upload(t, slopes, sizeof(float) * (size_t)s->H), CLATTN_F32, 1,
                                    1, 1, s->H);
        if (!d->alibi.buffer) return false;
        d->mask.alibi_slopes = &d->alibi;
        d->rm.alibi = d->alibi_d;
    }
    return true;
}

/* Fills x (random, then the spec's edge rows), the mask, and the float64 reference. */
static bool prepare(test_ctx *t, const sm_spec *s, sm_data *d) {
    memset(d, 0, sizeof *d);
    uint64_t rng = s->seed * 7919 + 17;
    d->n = (size_t)(s->B * s->H * s->Sq * s->Sk);
    size_t elements;
    d->x = x_layout(s, &elements);
    d->x_bytes = elements * clattn_dtype_size(s->xt);
    d->x_store = calloc(elements, clattn_dtype_size(s->xt));
    d->xd = malloc(d->n * sizeof(double));
    d->ref = malloc(d->n * sizeof(double));
    d->ref_lse = malloc((size_t)(s->B * s->H * s->Sq) * sizeof(double));
    d->visible = malloc(d->n);
    for (int64_t b = 0; b < s->B; ++b)
        for (int64_t h = 0; h < s->H; ++h)
            for (int64_t i = 0; i < s->Sq; ++i)
                for (int64_t j = 0; j < s->Sk; ++j) {
                    size_t k = dense_index(s, b, h, i, j);
                    float v = test_rand_uniform(&rng, -4.0f, 4.0f);
                    if (s->row_values && (int64_t)k / s->Sk < s->row_count && j < 3)
                        v = s->row_values[(int64_t)k / s->Sk * 3 + j];
                    uint64_t at = view_index(&d->x, b, h, i, j);
                    ref_store(d->x_store, s->xt, at, v);
                    d->xd[k] = ref_load(d->x_store, s->xt, at);
                }
    d->rm = (ref_mask){s->causal,
                       s->bottom_right,
                       s->window,
                       s->empty_nan,
                       s->left,
                       s->right,
                       s->global_stride,
                       s->softcap,
                       NULL,
                       NULL,
                       NULL,
                       {0},
                       NULL,
                       {0},
                       NULL};
    d->mask = (clattn_mask){
        s->causal,  s->bottom_right ? CLATTN_ALIGN_BOTTOM_RIGHT : CLATTN_ALIGN_TOP_LEFT,
        s->window,  s->left,
        s->right,   s->global_stride,
        s->softcap, s->empty_nan,
        NULL,       NULL,
        NULL,       NULL,
        NULL};
    if (!make_lengths(t, s, d) || !make_keep_bias_alibi(t, s, d, &rng)) return false;
    ref_softmax(d->xd, s->B, s->H, s->Sq, s->Sk, s->scale, &d->rm, d->ref, d->ref_lse, d->visible);
    return true;
}

/* Tolerances: float32 math (exp within a few ulps, a float sum over Sk terms), then the
 * rounding of the output dtype (half an ulp: 2^-11 for f16, 2^-8 for bf16). */
static double rel_tolerance(clattn_dtype dt, int64_t Sk) {
    double f32 = 2e-5 + 4e-7 * sqrt((double)Sk);
    return f32 + (dt == CLATTN_F16 ? 4.9e-4 : dt == CLATTN_BF16 ? 3.9e-3 : 0.0);
}

static bool close_enough(double got, double want, double rtol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= 3e-8 + rtol * fabs(want);
}

/* Checks y (and lse) against the reference: values, exact zeros at invisible keys, row sums. */
static bool check_result(test_ctx *t, const sm_spec *s, const sm_data *d, const void *y_host,
                         const float *lse_host, const char *what) {
    double rtol = rel_tolerance(s->yt, s->Sk);
    for (size_t row = 0; row < d->n / (size_t)s->Sk; ++row) {
        double sum = 0;
        bool finite_row = true;
        for (int64_t j = 0; j < s->Sk; ++j) {
            size_t k = row * (size_t)s->Sk + (size_t)j;
            int64_t i = (int64_t)row % s->Sq, h = (int64_t)row / s->Sq % s->H,
                    b = (int64_t)row / s->Sq / s->H;
            double got = ref_load(y_host, s->yt, view_index(&d->y, b, h, i, j));
            if (!close_enough(got, d->ref[k], rtol)) {
                test_fail_at(t, __FILE__, __LINE__, "%s: row %zu key %lld: got %.9g, expected %.9g",
                             what, row, (long long)j, got, d->ref[k]);
                return false;
            }
            if (!d->visible[k] && !isnan(d->ref[k]) &&
                memcmp(&got, &(double){0.0}, sizeof got) != 0) {
                test_fail_at(t, __FILE__, __LINE__, "%s: row %zu key %lld is invisible but %.9g",
                             what, row, (long long)j, got);
                return false;
            }
            finite_row &= isfinite(got);
            sum += got;
        }
        double limit = 3.0 * (double)s->Sk * rel_tolerance(s->yt, 1) + 1e-6;
        if (finite_row && sum != 0.0 && fabs(sum - 1.0) > limit) {
            test_fail_at(t, __FILE__, __LINE__, "%s: row %zu sums to %.9g", what, row, sum);
            return false;
        }
        /* lse near 0 needs an absolute floor: its f32 error scales with the row's max, not it */
        if (lse_host && !close_enough(lse_host[row], d->ref_lse[row], 1e-5) &&
            !(fabs(lse_host[row] - d->ref_lse[row]) <= 1e-6)) {
            test_fail_at(t, __FILE__, __LINE__, "%s: lse of row %zu: got %.9g, expected %.9g", what,
                         row, lse_host[row], d->ref_lse[row]);
            return false;
        }
    }
    return true;
}

/* Runs the case on one variant; returns y's host image through *y_out (caller frees). */
static bool run_variant(test_ctx *t, const sm_spec *s, sm_data *d, int variant, void **y_out,
                        float **lse_out) {
    cl_command_queue q = clattn_env_queue(t->env);
    d->x.buffer = upload(t, d->x_store, d->x_bytes);
    if (!d->x.buffer) return false;
    size_t y_bytes = s->in_place ? d->x_bytes : d->n * clattn_dtype_size(s->yt);
    if (s->in_place) {
        d->y = d->x;
    } else {
        d->y = clattn_tensor_4d(test_buffer(t, y_bytes), s->yt, s->B, s->H, s->Sq, s->Sk);
        if (!d->y.buffer) return false;
    }
    float *lse = NULL;
    if (s->lse) {
        d->lse = clattn_tensor_4d(test_buffer(t, sizeof(float) * d->n / (size_t)s->Sk), CLATTN_F32,
                                  1, s->B, s->H, s->Sq);
        lse = malloc(sizeof(float) * d->n / (size_t)s->Sk);
    }
    clattn__hook_set(CLATTN__HOOK_SOFTMAX_VARIANT, variant);
    int status =
        clattn_softmax(&d->x, s->scale, &d->mask, &d->y, s->lse ? &d->lse : NULL, q, 0, NULL, NULL);
    clattn__hook_set(CLATTN__HOOK_SOFTMAX_VARIANT, -1);
    void *y = malloc(y_bytes);
    bool ok = status == CLATTN_SUCCESS;
    if (!ok)
        test_fail_at(t, __FILE__, __LINE__, "clattn_softmax -> %s: %s", clattn_status_name(status),
                     clattn_last_error());
    ok = ok && test_read(t, d->y.buffer, y, y_bytes);
    ok = ok && (!lse || test_read(t, d->lse.buffer, lse, sizeof(float) * d->n / (size_t)s->Sk));
    if (d->y.buffer != d->x.buffer) clReleaseMemObject(d->y.buffer);
    clReleaseMemObject(d->x.buffer);
    if (d->lse.buffer) clReleaseMemObject(d->lse.buffer);
    d->x.buffer = d->y.buffer = d->lse.buffer = NULL;
    *y_out = y;
    *lse_out = lse;
    return ok;
}

/* The whole case on both variants. */
static void check_case(test_ctx *t, const sm_spec *s, const char *what) {
    if (t->failed) return;
    sm_data d;
    if (!prepare(t, s, &d)) {
        free_data(&d);
        return;
    }
    for (int variant = 0; variant < 2 && !t->failed; ++variant) {
        void *y = NULL;
        float *lse = NULL;
        char label[160];
        snprintf(label, sizeof label, "%s [%s]", what, variant ? "group" : "rows");
        if (run_variant(t, s, &d, variant, &y, &lse)) check_result(t, s, &d, y, lse, label);
        free(y);
        free(lse);
    }
    free_data(&d);
}

static sm_spec base(int64_t B, int64_t H, int64_t Sq, int64_t Sk) {
    sm_spec s;
    memset(&s, 0, sizeof s);
    s.B = B, s.H = H, s.Sq = Sq, s.Sk = Sk;
    s.xt = s.yt = s.bias_t = CLATTN_F32;
    s.scale = 1.0f;
    s.seed = (uint64_t)(B * 1000003 + H * 1009 + Sq * 101 + Sk);
    return s;
}

/* ---- the cases ---- */

static void unmasked_rows_of_every_size(test_ctx *t) {
    static const int64_t sizes[] = {1, 2, 7, 33, 127, 129, 1000, 4097};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        sm_spec s = base(1, 2, 3, sizes[i]);
        s.scale = 0.7f;
        char what[32];
        snprintf(what, sizeof what, "Sk=%lld", (long long)sizes[i]);
        check_case(t, &s, what);
    }
}

static void a_row_of_65537_keys(test_ctx *t) {
    if (!test_large_shapes(t)) return test_skip(t, "small shapes only (CLATTN_TEST_SMALL)");
    sm_spec s = base(1, 1, 2, 65537);
    s.scale = 3.0f;
    check_case(t, &s, "65537");
}

static void causal_top_left_and_bottom_right(test_ctx *t) {
    static const int64_t shapes[][2] = {{7, 7}, {33, 7}, {7, 33}, {1, 129}};
    for (size_t i = 0; i < 4; ++i)
        for (int br = 0; br < 2; ++br) {
            sm_spec s = base(2, 2, shapes[i][0], shapes[i][1]);
            s.causal = 1;
            s.bottom_right = br;
            char what[64];
            snprintf(what, sizeof what, "causal %s Sq=%lld Sk=%lld",
                     br ? "bottom-right" : "top-left", (long long)shapes[i][0],
                     (long long)shapes[i][1]);
            check_case(t, &s, what);
        }
}

static void key_and_query_lengths(test_ctx *t) {
    static const int32_t klen[3] = {0, 33, 17}, qlen[3] = {7, 0, 4};
    sm_spec s = base(3, 2, 7, 33);
    s.klen = klen;
    check_case(t, &s, "key lengths 0, full, 17");
    s.qlen = qlen;
    check_case(t, &s, "key and query lengths");
    s.causal = 1;
    s.bottom_right = 1;
    check_case(t, &s, "lengths + bottom-right causal");
    static const int32_t out_of_range[3] = {-5, 1000, 9};
    s = base(3, 1, 5, 33);
    s.klen = out_of_range;
    check_case(t, &s, "lengths clamp to [0, Sk]");
}

static void sliding_windows_and_global_positions(test_ctx *t) {
    /* small shapes (Oclgrind, PoCL's other work-group methods) take the first three, whose
     * sides are each negative, zero and positive: the others widen or mirror them, and only the
     * paths, which they share, differ between those lanes and the pthread lane */
    static const int64_t sides[][2] = {{0, 0}, {-1, 2}, {4, -1}, {3, 0}, {40, 40}, {1, 1}, {0, 3}};
    const size_t n = test_large_shapes(t) ? sizeof sides / sizeof sides[0] : 3;
    for (size_t i = 0; i < n; ++i) {
        sm_spec s = base(1, 2, 33, 33);
        s.window = 1;
        s.left = sides[i][0];
        s.right = sides[i][1];
        char what[64];
        snprintf(what, sizeof what, "window (%lld,%lld)", (long long)s.left, (long long)s.right);
        check_case(t, &s, what);
        s.global_stride = 4;
        snprintf(what, sizeof what, "window (%lld,%lld) + global 4", (long long)s.left,
                 (long long)s.right);
        check_case(t, &s, what);
    }
    sm_spec s = base(2, 1, 9, 40); /* strided sparse: window (s,s) + global s, causal, KV cache */
    s.window = 1;
    s.left = s.right = 5;
    s.global_stride = 5;
    s.causal = 1;
    s.bottom_right = 1;
    check_case(t, &s, "sparse + causal bottom-right");
}

static void keep_masks_and_biases_broadcast(test_ctx *t) {
    for (int kind = BCAST_FULL; kind <= BCAST_PER_QUERY_KEY; ++kind) {
        sm_spec s = base(2, 3, 7, 37);
        s.keep = kind;
        char what[32];
        snprintf(what, sizeof what, "keep kind %d", kind);
        check_case(t, &s, what);
        s.keep = 0;
        s.bias = kind;
        s.bias_t = kind == BCAST_PER_KEY ? CLATTN_F16 : CLATTN_F32;
        snprintf(what, sizeof what, "bias kind %d", kind);
        check_case(t, &s, what);
    }
}

static void alibi_and_softcap(test_ctx *t) {
    sm_spec s = base(1, 4, 9, 33);
    s.alibi = 1;
    check_case(t, &s, "alibi");
    s.alibi = 0;
    s.softcap = 2.5f;
    s.scale = 4.0f;
    check_case(t, &s, "softcap");
}

static void every_part_at_once(test_ctx *t) {
    static const int32_t klen[2] = {30, 21}, qlen[2] = {9, 6};
    sm_spec s = base(2, 2, 9, 35);
    s.scale = 0.5f;
    s.causal = 1;
    s.bottom_right = 1;
    s.window = 1;
    s.left = 6;
    s.right = 1;
    s.global_stride = 8;
    s.klen = klen;
    s.qlen = qlen;
    s.keep = BCAST_PER_KEY;
    s.bias = BCAST_FULL;
    s.alibi = 1;
    s.softcap = 5.0f;
    s.lse = 1;
    check_case(t, &s, "all parts + lse");
    s.empty_nan = 1;
    check_case(t, &s, "all parts, empty rows NaN");
}

static void storage_dtypes_layouts_and_in_place(test_ctx *t) {
    static const clattn_dtype dts[3] = {CLATTN_F32, CLATTN_F16, CLATTN_BF16};
    for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) {
            sm_spec s = base(1, 2, 5, 67);
            s.xt = dts[a];
            s.yt = dts[b];
            s.causal = 1;
            char what[32];
            snprintf(what, sizeof what, "%s -> %s", clattn_dtype_name(dts[a]),
                     clattn_dtype_name(dts[b]));
            check_case(t, &s, what);
        }
    if (test_large_shapes(t)) { /* 16-bit rows longer than the local scratch recompute the exp */
        sm_spec s = base(1, 1, 2, 4099);
        s.yt = CLATTN_F16;
        check_case(t, &s, "f32 -> f16, 4099 keys");
    }
    sm_spec s = base(2, 3, 5, 41);
    s.layout = LAYOUT_PERMUTED;
    s.lse = 1;
    check_case(t, &s, "[B,S,H,Sk] storage");
    s.layout = LAYOUT_STRIDED;
    check_case(t, &s, "keys 2 apart");
    s = base(2, 2, 6, 50);
    s.in_place = 1;
    s.causal = 1;
    check_case(t, &s, "in place f32");
    s.xt = s.yt = CLATTN_BF16;
    check_case(t, &s, "in place bf16");
    /* rows whose first visible key is not 0: the group variant reads a key with one work-item
     * and writes it with another (Oclgrind: a race unless a global fence parts the two) */
    s.xt = s.yt = CLATTN_F32;
    s.window = 1, s.left = 3, s.right = 1;
    check_case(t, &s, "in place, window (3, 1)");
}

/* Rows that start: huge equal values; a wide spread; a constant; a NaN; +inf; -inf keys only;
 * a NaN among -inf keys (a NaN row, not an empty one, though the maximum is -inf). */
static const float edge_row_values[7][3] = {
    {3e38f, 3e38f, 0.0f},       {1000.0f, -1000.0f, 0.0f}, {2.0f, 2.0f, 2.0f},
    {1.0f, NAN, 2.0f},          {1.0f, INFINITY, 2.0f},    {-INFINITY, -INFINITY, -INFINITY},
    {-INFINITY, NAN, -INFINITY}};

static void edge_rows(test_ctx *t) {
    sm_spec s = base(1, 1, 7, 3);
    s.row_values = &edge_row_values[0][0];
    s.row_count = 7;
    s.lse = 1;
    check_case(t, &s, "edge rows");
    s.empty_nan = 1;
    check_case(t, &s, "edge rows, empty NaN");
}

/* The group variant alone on one case (check_case runs both). */
static void check_group_case(test_ctx *t, const sm_spec *s, const char *what) {
    if (t->failed) return;
    sm_data d;
    void *y = NULL;
    float *lse = NULL;
    if (prepare(t, s, &d) && run_variant(t, s, &d, CLATTN__SOFTMAX_GROUP, &y, &lse))
        check_result(t, s, &d, y, lse, what);
    free(y);
    free(lse);
    free_data(&d);
}

/* The aligned cases that reach every branch of a row's statistics and store: chunks that
 * straddle the visible span's ends, every mask part, NaN and empty rows. */
static void aligned_edge_cases(test_ctx *t, const char *how) {
    static const int32_t klen[3] = {0, 48, 17}, qlen[3] = {9, 0, 4};
    char what[96];
    sm_spec s = base(3, 2, 9, 48);
    s.klen = klen;
    s.qlen = qlen;
    s.causal = 1;
    s.bottom_right = 1;
    snprintf(what, sizeof what, "aligned%s: lengths + bottom-right causal", how);
    check_group_case(t, &s, what);
    static const int32_t klen2[2] = {30, 21}, qlen2[2] = {9, 6};
    s = base(2, 2, 9, 32);
    s.scale = 0.5f, s.causal = 1, s.bottom_right = 1, s.window = 1, s.left = 6, s.right = 1;
    s.global_stride = 8, s.klen = klen2, s.qlen = qlen2, s.keep = BCAST_PER_KEY;
    s.bias = BCAST_FULL, s.alibi = 1, s.softcap = 5.0f, s.lse = 1, s.empty_nan = 1;
    snprintf(what, sizeof what, "aligned%s: all parts + lse, empty rows NaN", how);
    check_group_case(t, &s, what);
    static const int32_t three[1] = {3};
    s = base(1, 1, 7, 16); /* 3 visible keys: the edge values, in a chunk that straddles hi */
    s.klen = three;
    s.row_values = &edge_row_values[0][0];
    s.row_count = 7;
    s.lse = 1;
    snprintf(what, sizeof what, "aligned%s: edge rows", how);
    check_group_case(t, &s, what);
}

/* Rows of 16-key multiples at aligned offsets: the group variant's vector chunks (ALIGNED) at
 * every vector width (the rows variant has no aligned build), with every mask part, each dtype
 * as input and as output, in place, and the edge rows. Rows this short are held in registers
 * (HOLD) on the CI devices' rows; the edge cases run again with HOLD=0, three passes. */
static void aligned_rows_take_vector_chunks(test_ctx *t) {
    aligned_edge_cases(t, "");
    /* SCRATCH=0: an override must fit the device, and rusticl's 32 KiB of local memory do not
     * hold the CPU row's scratch (without an override that row is skipped) */
    CHECK_OK(t, clattn_tuning_override("softmax", "HOLD=0,SCRATCH=0"));
    aligned_edge_cases(t, ", three passes");
    /* 4-key chunks in groups of 4 hold the 48-key rows in 3 chunks a work-item (HOLD=3: not a
     * power of two, the CI rows hold 1 or 2) */
    CHECK_OK(t, clattn_tuning_override("softmax", "VEC=4,GROUP=4,HOLD=3,SCRATCH=0"));
    aligned_edge_cases(t, ", three chunks held");
    clattn_tuning_override("softmax", NULL);
    sm_spec s = base(1, test_large_shapes(t) ? 2 : 1, 64, 64); /* one head under small shapes */
    s.causal = 1;
    check_group_case(t, &s, "aligned: causal");
    s.causal = 0;
    s.window = 1, s.left = 3, s.right = 1, s.global_stride = 5;
    check_group_case(t, &s, "aligned: window (3, 1) + global 5");
    s.in_place = 1;
    s.global_stride = 0;
    check_group_case(t, &s, "aligned: in place, window (3, 1)");
    static const clattn_dtype dts[3] = {CLATTN_F32, CLATTN_F16, CLATTN_BF16};
    for (int a = 0; a < 3; ++a) {
        s = base(1, 2, 5, 80);
        s.xt = dts[a], s.yt = dts[(a + 1) % 3], s.causal = 1;
        check_group_case(t, &s, "aligned: dtypes");
    }
    s.xt = s.yt = CLATTN_F16, s.in_place = 1;
    check_group_case(t, &s, "aligned: f16 in place");
}

/* Puts `value` in x and bias wherever a key is invisible (value 0: the original data back). */
static bool fill_invisible(test_ctx *t, const sm_spec *s, sm_data *d, const float *x_clean,
                           float value, bool restore) {
    size_t bytes = d->n * sizeof(float);
    float *bias = malloc(bytes);
    for (size_t k = 0; k < d->n; ++k) {
        bool keep = restore || d->visible[k];
        bias[k] = keep ? (float)d->bias_d[k] : value;
        ((float *)d->x_store)[k] = keep ? x_clean[k] : value;
    }
    (void)s;
    bool ok = test_write(t, d->bias.buffer, bias, bytes);
    free(bias);
    return ok;
}

/* NaN, Inf and 1e30 at invisible keys (in x and in the bias) give bit-identical outputs. */
static void invisible_garbage_changes_nothing(test_ctx *t) {
    static const int32_t klen[2] = {20, 9};
    sm_spec s = base(2, 2, 8, 32); /* 32 keys: the group variant's aligned chunks too */
    s.causal = 1;
    s.klen = klen;
    s.keep = BCAST_FULL;
    s.bias = BCAST_FULL;
    sm_data d;
    if (!prepare(t, &s, &d)) return free_data(&d);
    float *x_clean = malloc(d.n * sizeof(float));
    memcpy(x_clean, d.x_store, d.n * sizeof(float));
    static const float garbage[3] = {NAN, INFINITY, 1e30f};
    bool ok = true;
    for (int variant = 0; variant < 2 && ok; ++variant) {
        void *clean = NULL, *dirty = NULL;
        float *lse = NULL;
        ok = fill_invisible(t, &s, &d, x_clean, 0, true) &&
             run_variant(t, &s, &d, variant, &clean, &lse);
        free(lse);
        for (int g = 0; g < 3 && ok; ++g) {
            lse = NULL;
            ok = fill_invisible(t, &s, &d, x_clean, garbage[g], false) &&
                 run_variant(t, &s, &d, variant, &dirty, &lse);
            if (ok && memcmp(clean, dirty, d.n * sizeof(float)) != 0) {
                test_fail_at(t, __FILE__, __LINE__, "garbage %g at invisible keys changed y (%s)",
                             (double)garbage[g], variant ? "group" : "rows");
                ok = false;
            }
            free(dirty);
            free(lse);
        }
        free(clean);
    }
    free(x_clean);
    free_data(&d);
}

/* True when two f16 outputs are the same bits, or both NaN (the conversions may differ in a
 * NaN's payload). */
static bool same_half(uint16_t a, uint16_t b) {
    const bool a_nan = (a & 0x7c00u) == 0x7c00u && (a & 0x3ffu);
    const bool b_nan = (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu);
    return a == b || (a_nan && b_nan);
}

/* Runs both variants with f16 outputs rounded each way (HALF_CVT 0 and 1), each checked against
 * the reference; the two ways must give the same bits. */
static void check_half_conversions(test_ctx *t, const sm_spec *s, const char *what) {
    sm_data d;
    if (!prepare(t, s, &d)) return free_data(&d);
    for (int variant = 0; variant < 2 && !t->failed; ++variant) {
        uint16_t *y[2] = {NULL, NULL};
        for (int cvt = 0; cvt < 2 && !t->failed; ++cvt) {
            float *lse = NULL;
            char label[128];
            snprintf(label, sizeof label, "%s [%s, HALF_CVT=%d]", what, variant ? "group" : "rows",
                     cvt);
            /* SCRATCH=0 fits every device (see aligned_rows_take_vector_chunks) */
            int status = clattn_tuning_override("softmax", cvt ? "HALF_CVT=1,SCRATCH=0"
                                                               : "HALF_CVT=0,SCRATCH=0");
            if (status != CLATTN_SUCCESS)
                test_fail_at(t, __FILE__, __LINE__, "%s: %s", label, clattn_last_error());
            else if (run_variant(t, s, &d, variant, (void **)&y[cvt], &lse))
                check_result(t, s, &d, y[cvt], lse, label);
            clattn_tuning_override("softmax", NULL);
            free(lse);
        }
        for (size_t k = 0; y[0] && y[1] && k < d.n && !t->failed; ++k)
            if (!same_half(y[0][k], y[1][k]))
                test_fail_at(t, __FILE__, __LINE__, "%s [%s]: element %zu: 0x%04x, 0x%04x", what,
                             variant ? "group" : "rows", k, y[0][k], y[1][k]);
        free(y[0]);
        free(y[1]);
    }
    free_data(&d);
}

/* f16 outputs through the device's conversion (the GPU row's HALF_CVT=1, forced here) and
 * through integer rounding: subnormal probabilities (scores spread over 18 units), empty rows,
 * and NaN rows. */
static void half_conversions_agree(test_ctx *t) {
    static const int32_t klen[2] = {80, 0};
    sm_spec s = base(2, 1, 9, 80);
    s.yt = CLATTN_F16, s.scale = 9.0f, s.causal = 1, s.bottom_right = 1, s.klen = klen;
    s.lse = 1;
    check_half_conversions(t, &s, "f16 outputs, wide scores");
    s = base(1, 1, 7, 16);
    s.yt = CLATTN_F16;
    s.row_values = &edge_row_values[0][0];
    s.row_count = 7;
    s.empty_nan = 1;
    check_half_conversions(t, &s, "f16 outputs, edge rows");
}

/* ---- backward ---- */

/* dz = scale * y * (dy - sum(dy * y)) for y (f32) from the case's masked forward pass, with NaN
 * in dy where y is 0, dy and dz stored as `dt`; on both variants, out of place and in place
 * (dz = dy). */
static void check_backward(test_ctx *t, const sm_spec *s, clattn_dtype dt, const char *what) {
    sm_data d;
    if (!prepare(t, s, &d)) return free_data(&d);
    const float scale = 0.125f;
    const size_t n = d.n, bytes = n * sizeof(float), dt_bytes = n * clattn_dtype_size(dt);
    float *y = malloc(bytes);
    void *dy = malloc(dt_bytes), *got = malloc(dt_bytes);
    double *want = malloc(n * sizeof(double));
    uint64_t rng = 99;
    for (size_t k = 0; k < n; ++k) {
        y[k] = (float)d.ref[k];
        ref_store(dy, dt, k, y[k] == 0.0f ? NAN : test_rand_uniform(&rng, -1.0f, 1.0f));
    }
    for (size_t row = 0; row < n / (size_t)s->Sk; ++row) {
        const size_t at = row * (size_t)s->Sk;
        double dot = 0;
        for (size_t k = at; k < at + (size_t)s->Sk; ++k)
            if (y[k] != 0.0f) dot += (double)y[k] * ref_load(dy, dt, k);
        for (size_t k = at; k < at + (size_t)s->Sk; ++k)
            want[k] = y[k] == 0.0f ? 0.0 : scale * (double)y[k] * (ref_load(dy, dt, k) - dot);
    }
    const double rtol = 1e-5 + (dt == CLATTN_F16 ? 4.9e-4 : dt == CLATTN_BF16 ? 3.9e-3 : 0.0);
    cl_command_queue q = clattn_env_queue(t->env);
    for (int variant = 0; variant < 2 && !t->failed; ++variant)
        for (int in_place = 0; in_place < 2 && !t->failed; ++in_place) {
            clattn_tensor yt =
                clattn_tensor_4d(upload(t, y, bytes), CLATTN_F32, s->B, s->H, s->Sq, s->Sk);
            clattn_tensor dyt =
                clattn_tensor_4d(upload(t, dy, dt_bytes), dt, s->B, s->H, s->Sq, s->Sk);
            clattn_tensor dzt =
                in_place ? dyt
                         : clattn_tensor_4d(test_buffer(t, dt_bytes), dt, s->B, s->H, s->Sq, s->Sk);
            clattn__hook_set(CLATTN__HOOK_SOFTMAX_VARIANT, variant);
            int status = clattn_softmax_backward(&yt, &dyt, scale, &dzt, q, 0, NULL, NULL);
            clattn__hook_set(CLATTN__HOOK_SOFTMAX_VARIANT, -1);
            bool ok = status == CLATTN_SUCCESS && test_read(t, dzt.buffer, got, dt_bytes);
            if (status != CLATTN_SUCCESS)
                test_fail_at(t, __FILE__, __LINE__, "%s: backward -> %s: %s", what,
                             clattn_status_name(status), clattn_last_error());
            for (size_t k = 0; ok && k < n; ++k) {
                const float g = ref_load(got, dt, k);
                if (!close_enough(g, want[k], rtol) || (want[k] == 0.0 && g != 0.0f)) {
                    test_fail_at(t, __FILE__, __LINE__, "%s [%s%s]: dz[%zu] = %.9g, expected %.9g",
                                 what, variant ? "group" : "rows", in_place ? ", in place" : "", k,
                                 g, want[k]);
                    ok = false;
                }
            }
            clReleaseMemObject(yt.buffer);
            clReleaseMemObject(dyt.buffer);
            if (!in_place) clReleaseMemObject(dzt.buffer);
        }
    free(y);
    free(dy);
    free(got);
    free(want);
    free_data(&d);
}

/* Rows of 33 keys (one key a step), of 48 (aligned: VEC-key chunks, held in registers on the CI
 * devices' rows, and with HOLD=0 streamed twice), and 16-bit gradients. */
static void backward_matches_reference(test_ctx *t) {
    static const int32_t klen[2] = {29, 13};
    sm_spec s = base(2, 2, 7, 33);
    s.causal = 1;
    s.klen = klen;
    check_backward(t, &s, CLATTN_F32, "33 keys");
    s.Sk = 48;
    check_backward(t, &s, CLATTN_F32, "48 keys");
    check_backward(t, &s, CLATTN_F16, "48 keys, f16 gradients");
    /* SCRATCH=0: an override must fit the device (see aligned_rows_take_vector_chunks) */
    CHECK_OK(t, clattn_tuning_override("softmax", "HOLD=0,SCRATCH=0"));
    check_backward(t, &s, CLATTN_BF16, "48 keys, bf16 gradients, two passes");
    clattn_tuning_override("softmax", NULL);
}

static void bad_arguments_are_rejected(test_ctx *t) {
    cl_command_queue q = clattn_env_queue(t->env);
    cl_mem xb = test_buffer(t, 4 * 2 * 3 * 4 * 5), yb = test_buffer(t, 4 * 2 * 3 * 4 * 5);
    if (!xb || !yb) return;
    clattn_tensor x = clattn_tensor_4d(xb, CLATTN_F32, 2, 3, 4, 5),
                  y = clattn_tensor_4d(yb, CLATTN_F32, 2, 3, 4, 5);
    cl_event ev = (cl_event)(uintptr_t)1;
    clattn_mask m;
    memset(&m, 0, sizeof m);
#define REJECT(call, expected)                                                                     \
    do {                                                                                           \
        ev = (cl_event)(uintptr_t)1;                                                               \
        int st_ = (call);                                                                          \
        if (st_ != (expected) || ev != NULL) {                                                     \
            test_fail_at(t, __FILE__, __LINE__, "%s -> %s (event %p), expected %s", #call,         \
                         clattn_status_name(st_), (void *)ev, clattn_status_name(expected));       \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
    clattn_tensor bad = y;
    bad.shape[3] = 4;
    REJECT(clattn_softmax(&x, 1.0f, NULL, &bad, NULL, q, 0, NULL, &ev), CLATTN_ERR_SHAPE_MISMATCH);
    REJECT(clattn_softmax(&x, NAN, NULL, &y, NULL, q, 0, NULL, &ev), CLATTN_ERR_INVALID_ARGUMENT);
    bad = y;
    bad.buffer = xb;
    bad.offset = 1; /* overlaps x without being x */
    bad.shape[0] = 1;
    clattn_tensor x1 = x;
    x1.shape[0] = 1;
    REJECT(clattn_softmax(&x1, 1.0f, NULL, &bad, NULL, q, 0, NULL, &ev), CLATTN_ERR_ALIASING);
    m.window = 1;
    m.window_left = -2;
    REJECT(clattn_softmax(&x, 1.0f, &m, &y, NULL, q, 0, NULL, &ev), CLATTN_ERR_INVALID_ARGUMENT);
    memset(&m, 0, sizeof m);
    m.softcap = -1.0f;
    REJECT(clattn_softmax(&x, 1.0f, &m, &y, NULL, q, 0, NULL, &ev), CLATTN_ERR_INVALID_ARGUMENT);
    memset(&m, 0, sizeof m);
    m.align = (clattn_align)5;
    REJECT(clattn_softmax(&x, 1.0f, &m, &y, NULL, q, 0, NULL, &ev), CLATTN_ERR_INVALID_ARGUMENT);
    memset(&m, 0, sizeof m);
    clattn_tensor lengths = clattn_tensor_4d(xb, CLATTN_F32, 1, 1, 1, 2);
    m.key_lengths = &lengths; /* f32, not i32 */
    REJECT(clattn_softmax(&x, 1.0f, &m, &y, NULL, q, 0, NULL, &ev), CLATTN_ERR_UNSUPPORTED_DTYPE);
    lengths.dtype = CLATTN_I32;
    lengths.shape[3] = 3; /* B is 2 */
    REJECT(clattn_softmax(&x, 1.0f, &m, &y, NULL, q, 0, NULL, &ev), CLATTN_ERR_SHAPE_MISMATCH);
    memset(&m, 0, sizeof m);
    clattn_tensor keep = clattn_tensor_4d(xb, CLATTN_U8, 2, 1, 4, 4); /* Sk is 5 */
    m.keep = &keep;
    REJECT(clattn_softmax(&x, 1.0f, &m, &y, NULL, q, 0, NULL, &ev), CLATTN_ERR_SHAPE_MISMATCH);
    m.keep = NULL;
    clattn_tensor bias = x;
    m.bias = &bias;
    REJECT(clattn_softmax(&x, 1.0f, &m, &x, NULL, q, 0, NULL, &ev), CLATTN_ERR_ALIASING);
    m.bias = NULL;
    clattn_tensor lse = clattn_tensor_4d(yb, CLATTN_F32, 1, 2, 3, 5);
    REJECT(clattn_softmax(&x, 1.0f, NULL, &x, &lse, q, 0, NULL, &ev), CLATTN_ERR_SHAPE_MISMATCH);
    lse.shape[3] = 4;
    REJECT(clattn_softmax(&x, 1.0f, NULL, &y, &lse, q, 0, NULL, &ev), CLATTN_ERR_ALIASING);
    REJECT(clattn_softmax(&x, 1.0f, NULL, NULL, NULL, q, 0, NULL, &ev),
           CLATTN_ERR_INVALID_ARGUMENT);
    REJECT(clattn_softmax_backward(&x, &y, 1.0f, &x, q, 0, NULL, &ev), CLATTN_ERR_ALIASING);
    REJECT(clattn_softmax_backward(&x, &y, INFINITY, &y, q, 0, NULL, &ev),
           CLATTN_ERR_INVALID_ARGUMENT);
    bad = y;
    bad.shape[1] = 2;
    REJECT(clattn_softmax_backward(&x, &bad, 1.0f, &y, q, 0, NULL, &ev), CLATTN_ERR_SHAPE_MISMATCH);
#undef REJECT
done:
    clReleaseMemObject(xb);
    clReleaseMemObject(yb);
}

static const test_case cases[] = {
    {"unmasked_rows_of_every_size", unmasked_rows_of_every_size},
    {"a_row_of_65537_keys", a_row_of_65537_keys},
    {"causal_top_left_and_bottom_right", causal_top_left_and_bottom_right},
    {"key_and_query_lengths", key_and_query_lengths},
    {"sliding_windows_and_global_positions", sliding_windows_and_global_positions},
    {"keep_masks_and_biases_broadcast", keep_masks_and_biases_broadcast},
    {"alibi_and_softcap", alibi_and_softcap},
    {"every_part_at_once", every_part_at_once},
    {"storage_dtypes_layouts_and_in_place", storage_dtypes_layouts_and_in_place},
    {"edge_rows", edge_rows},
    {"aligned_rows_take_vector_chunks", aligned_rows_take_vector_chunks},
    {"invisible_garbage_changes_nothing", invisible_garbage_changes_nothing},
    {"half_conversions_agree", half_conversions_agree},
    {"backward_matches_reference", backward_matches_reference},
    {"bad_arguments_are_rejected", bad_arguments_are_rejected, TAG_HOST},
};
SUITE_TAGGED(softmax_suite, "softmax", cases, TAG_SMOKE);
