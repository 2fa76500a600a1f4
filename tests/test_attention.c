/* Tests of the fused attention (src/attention.c, cl/attention.cl) against the float64
 * reference: scores q.k in float64, the reference softmax with the design's mask, then p v. */
#include "harness.h"
#include "internal.h"
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct at_spec {
    int64_t B, Hq, Hkv, Sq, Sk, D, Dv;
    clattn_dtype dt;
    float scale; /* 0: 1/sqrt(D) */
    int causal, bottom_right, window, lse;
    int bshd; /* 0: [B,H,S,D]; 1: stored [B,S,H,D]; 2: stored [B,H,D,S] */
    int64_t left, right, global_stride;
    const int32_t *klen;
    int alibi;
    float softcap;
    uint64_t seed;
} at_spec;

typedef struct at_data {
    float *q, *k, *v;      /* dense [B,H,S,D] host values (exactly representable in dt) */
    double *ref, *ref_lse; /* [B,Hq,Sq,Dv], [B,Hq,Sq] */
    ref_mask rm;
    clattn_mask mask;
    clattn_tensor klen_t, alibi_t;
    double alibi[16];
} at_data;

static size_t at4(int64_t H, int64_t S, int64_t D, int64_t b, int64_t h, int64_t s, int64_t d) {
    return (size_t)(((b * H + h) * S + s) * D + d);
}

static void fill(float *x, size_t n, clattn_dtype dt, uint64_t *rng) {
    for (size_t i = 0; i < n; ++i) {
        uint16_t bits[2];
        ref_store(bits, dt, 0, test_rand_uniform(rng, -2.0f, 2.0f));
        x[i] = ref_load(bits, dt, 0);
    }
}

/* The float64 reference of the whole op. */
static void reference(const at_spec *s, at_data *d) {
    size_t scores = (size_t)(s->B * s->Hq * s->Sq * s->Sk);
    double *x = malloc(scores * sizeof(double)), *p = malloc(scores * sizeof(double));
    int64_t group = s->Hq / s->Hkv;
    for (int64_t b = 0; b < s->B; ++b)
        for (int64_t h = 0; h < s->Hq; ++h)
            for (int64_t i = 0; i < s->Sq; ++i)
                for (int64_t j = 0; j < s->Sk; ++j) {
                    double dot = 0;
                    for (int64_t e = 0; e < s->D; ++e)
                        dot += (double)d->q[at4(s->Hq, s->Sq, s->D, b, h, i, e)] *
                               d->k[at4(s->Hkv, s->Sk, s->D, b, h / group, j, e)];
                    x[at4(s->Hq, s->Sq, s->Sk, b, h, i, j)] = dot;
                }
    double scale = s->scale != 0.0f ? s->scale : 1.0 / sqrt((double)s->D);
    ref_softmax(x, s->B, s->Hq, s->Sq, s->Sk, scale, &d->rm, p, d->ref_lse, NULL);
    for (int64_t b = 0; b < s->B; ++b)
        for (int64_t h = 0; h < s->Hq; ++h)
            for (int64_t i = 0; i < s->Sq; ++i)
                for (int64_t e = 0; e < s->Dv; ++e) {
                    double sum = 0;
                    for (int64_t j = 0; j < s->Sk; ++j)
                        sum += p[at4(s->Hq, s->Sq, s->Sk, b, h, i, j)] *
                               d->v[at4(s->Hkv, s->Sk, s->Dv, b, h / group, j, e)];
                    d->ref[at4(s->Hq, s->Sq, s->Dv, b, h, i, e)] = sum;
                }
    free(x);
    free(p);
}

/* A device tensor [B,H,S,D] holding `host` in dtype dt; stored as [B,S,H,D] when bshd. */
static clattn_tensor upload_bhsd(test_ctx *t, const float *host, int64_t B, int64_t H, int64_t S,
                                 int64_t D, clattn_dtype dt, int bshd) {
    static const int swap[4] = {0, 2, 1, 3}, transpose[4] = {0, 1, 3, 2};
    clattn_tensor v =
        bshd == 1   ? clattn_tensor_permute(clattn_tensor_4d(NULL, dt, B, S, H, D), swap)
        : bshd == 2 ? clattn_tensor_permute(clattn_tensor_4d(NULL, dt, B, H, D, S), transpose)
                    : clattn_tensor_4d(NULL, dt, B, H, S, D);
    size_t n = (size_t)(B * H * S * D);
    void *stored = malloc(n * 4);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t s = 0; s < S; ++s)
                for (int64_t d = 0; d < D; ++d)
                    ref_store(stored, dt,
                              (uint64_t)(b * v.strides[0] + h * v.strides[1] + s * v.strides[2] +
                                         d * v.strides[3]),
                              host[at4(H, S, D, b, h, s, d)]);
    v.buffer = test_buffer(t, n * clattn_dtype_size(dt));
    if (v.buffer) test_write(t, v.buffer, stored, n * clattn_dtype_size(dt));
    free(stored);
    return v;
}

static bool prepare(test_ctx *t, const at_spec *s, at_data *d) {
    memset(d, 0, sizeof *d);
    uint64_t rng = s->seed * 31 + 7;
    d->q = malloc(sizeof(float) * (size_t)(s->B * s->Hq * s->Sq * s->D));
    d->k = malloc(sizeof(float) * (size_t)(s->B * s->Hkv * s->Sk * s->D));
    d->v = malloc(sizeof(float) * (size_t)(s->B * s->Hkv * s->Sk * s->Dv));
    d->ref = malloc(sizeof(double) * (size_t)(s->B * s->Hq * s->Sq * s->Dv));
    d->ref_lse = malloc(sizeof(double) * (size_t)(s->B * s->Hq * s->Sq));
    fill(d->q, (size_t)(s->B * s->Hq * s->Sq * s->D), s->dt, &rng);
    fill(d->k, (size_t)(s->B * s->Hkv * s->Sk * s->D), s->dt, &rng);
    fill(d->v, (size_t)(s->B * s->Hkv * s->Sk * s->Dv), s->dt, &rng);
    d->rm = (ref_mask){
        s->causal,  s->bottom_right, s->window, 0,    s->left, s->right, s->global_stride,
        s->softcap, s->klen,         NULL,      NULL, {0},     NULL,     {0},
        NULL};
    d->mask = (clattn_mask){
        s->causal,  s->bottom_right ? CLATTN_ALIGN_BOTTOM_RIGHT : CLATTN_ALIGN_TOP_LEFT,
        s->window,  s->left,
        s->right,   s->global_stride,
        s->softcap, 0,
        NULL,       NULL,
        NULL,       NULL,
        NULL};
    if (s->klen) {
        d->klen_t = clattn_tensor_4d(test_buffer(t, 4 * (size_t)s->B), CLATTN_I32, 1, 1, 1, s->B);
        if (!d->klen_t.buffer || !test_write(t, d->klen_t.buffer, s->klen, 4 * (size_t)s->B))
            return false;
        d->mask.key_lengths = &d->klen_t;
    }
    if (s->alibi) {
        float slopes[16];
        for (int64_t h = 0; h < s->Hq; ++h) d->alibi[h] = slopes[h] = 1.0f / (float)(2 << h);
        d->alibi_t =
            clattn_tensor_4d(test_buffer(t, 4 * (size_t)s->Hq), CLATTN_F32, 1, 1, 1, s->Hq);
        if (!d->alibi_t.buffer || !test_write(t, d->alibi_t.buffer, slopes, 4 * (size_t)s->Hq))
            return false;
        d->mask.alibi_slopes = &d->alibi_t;
        d->rm.alibi = d->alibi;
    }
    reference(s, d);
    return true;
}

static void free_data(at_data *d) {
    if (d->klen_t.buffer) clReleaseMemObject(d->klen_t.buffer);
    if (d->alibi_t.buffer) clReleaseMemObject(d->alibi_t.buffer);
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->ref);
    free(d->ref_lse);
}

/* Runs the op; returns out (dense f32 values) and lse through malloc'ed arrays. */
static bool run_variant(test_ctx *t, const at_spec *s, const at_data *d, int variant, float **out,
                        float **lse) {
    clattn_tensor q = upload_bhsd(t, d->q, s->B, s->Hq, s->Sq, s->D, s->dt, s->bshd);
    clattn_tensor k = upload_bhsd(t, d->k, s->B, s->Hkv, s->Sk, s->D, s->dt, s->bshd);
    clattn_tensor v = upload_bhsd(t, d->v, s->B, s->Hkv, s->Sk, s->Dv, s->dt, s->bshd);
    size_t n_out = (size_t)(s->B * s->Hq * s->Sq * s->Dv), n_lse = (size_t)(s->B * s->Hq * s->Sq);
    clattn_tensor o = clattn_tensor_4d(test_buffer(t, n_out * clattn_dtype_size(s->dt)), s->dt,
                                       s->B, s->Hq, s->Sq, s->Dv);
    clattn_tensor l =
        clattn_tensor_4d(test_buffer(t, n_lse * 4), CLATTN_F32, 1, s->B, s->Hq, s->Sq);
    bool ok = q.buffer && k.buffer && v.buffer && o.buffer && l.buffer;
    clattn__attention_variant_override = variant;
    int status = ok ? clattn_attention(&q, &k, &v, s->scale, &d->mask, &o, s->lse ? &l : NULL,
                                       clattn_env_queue(t->env), 0, NULL, NULL)
                    : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    clattn__attention_variant_override = -1;
    void *raw = malloc(n_out * 4);
    *out = malloc(n_out * sizeof(float));
    *lse = malloc(n_lse * sizeof(float));
    if (status != CLATTN_SUCCESS) {
        test_fail_at(t, __FILE__, __LINE__, "clattn_attention -> %s: %s",
                     clattn_status_name(status), clattn_last_error());
        ok = false;
    }
    ok = ok && test_read(t, o.buffer, raw, n_out * clattn_dtype_size(s->dt)) &&
         (!s->lse || test_read(t, l.buffer, *lse, n_lse * 4));
    for (size_t i = 0; ok && i < n_out; ++i) (*out)[i] = ref_load(raw, s->dt, i);
    free(raw);
    clattn_tensor *all[5] = {&q, &k, &v, &o, &l};
    for (int i = 0; i < 5; ++i)
        if (all[i]->buffer) clReleaseMemObject(all[i]->buffer);
    return ok;
}

/* Every kernel variant runs every case, whichever the device would pick. */
static const int variants[] = {CLATTN__ATTENTION_BLOCKS, CLATTN__ATTENTION_TILES};
static const char *const variant_names[] = {"blocks", "tiles"};
#define VARIANTS (int)(sizeof variants / sizeof variants[0])

static void check_variant(test_ctx *t, const at_spec *s, const at_data *d, int variant,
                          const char *what_case) {
    float *out = NULL, *lse = NULL;
    char what[160];
    snprintf(what, sizeof what, "%s [%s]", what_case, variant_names[variant]);
    if (run_variant(t, s, d, variants[variant], &out, &lse)) {
        double rtol = s->dt == CLATTN_F32 ? 2e-5 : s->dt == CLATTN_F16 ? 2e-3 : 1.6e-2;
        size_t n = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
        for (size_t i = 0; i < n; ++i)
            if (!(fabs(out[i] - d->ref[i]) <= 1e-5 + rtol * fabs(d->ref[i]))) {
                test_fail_at(t, __FILE__, __LINE__, "%s: out[%zu] = %.9g, expected %.9g", what, i,
                             out[i], d->ref[i]);
                break;
            }
        for (size_t i = 0; s->lse && !t->failed && i < n / (size_t)s->Dv; ++i) {
            bool same = isinf(d->ref_lse[i])
                            ? lse[i] == d->ref_lse[i]
                            : fabs(lse[i] - d->ref_lse[i]) <= 1e-4 * (1 + fabs(d->ref_lse[i]));
            if (!same) {
                test_fail_at(t, __FILE__, __LINE__, "%s: lse[%zu] = %.9g, expected %.9g", what, i,
                             lse[i], d->ref_lse[i]);
                break;
            }
        }
    }
    free(out);
    free(lse);
}

static void check_case(test_ctx *t, const at_spec *s, const char *what) {
    if (t->failed) return;
    at_data d;
    if (prepare(t, s, &d))
        for (int variant = 0; variant < VARIANTS && !t->failed; ++variant)
            check_variant(t, s, &d, variant, what);
    free_data(&d);
}

static at_spec base(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D) {
    at_spec s;
    memset(&s, 0, sizeof s);
    s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Sq = Sq, s.Sk = Sk, s.D = s.Dv = D;
    s.dt = CLATTN_F32;
    s.seed = (uint64_t)(B * 7 + Hq * 11 + Sq * 13 + Sk * 17 + D);
    return s;
}

static void head_dims_and_lengths(test_ctx *t) {
    static const int64_t dims[] = {16, 40, 64, 80, 128};
    static const int64_t lengths[][2] = {{1, 1}, {7, 7}, {33, 7}, {7, 33}, {33, 33}};
    for (size_t i = 0; i < 5; ++i) {
        at_spec s = base(1, 2, 2, lengths[i][0], lengths[i][1], dims[i]);
        s.lse = 1;
        char what[64];
        snprintf(what, sizeof what, "D=%lld Sq=%lld Sk=%lld", (long long)dims[i],
                 (long long)lengths[i][0], (long long)lengths[i][1]);
        check_case(t, &s, what);
    }
    at_spec s = base(1, 1, 1, 5, 9, 32);
    s.Dv = 24; /* Dv != D */
    check_case(t, &s, "Dv != D");
    if (test_large_shapes(t)) {
        s = base(1, 1, 1, 3, 127, 256);
        check_case(t, &s, "D=256");
    }
}

static void gqa_and_mqa(test_ctx *t) {
    static const int64_t ratios[][2] = {{4, 4}, {4, 2}, {8, 2}, {8, 1}};
    for (size_t i = 0; i < 4; ++i) {
        at_spec s = base(2, ratios[i][0], ratios[i][1], 7, 13, 16);
        char what[32];
        snprintf(what, sizeof what, "Hq=%lld Hkv=%lld", (long long)ratios[i][0],
                 (long long)ratios[i][1]);
        check_case(t, &s, what);
    }
}

static void masks(test_ctx *t) {
    static const int32_t klen[2] = {21, 0};
    at_spec s = base(2, 2, 1, 9, 21, 16);
    s.causal = 1;
    check_case(t, &s, "causal");
    s.bottom_right = 1;
    s.Sq = 5;
    check_case(t, &s, "causal bottom-right (KV cache)");
    s.Sq = 30;
    check_case(t, &s, "causal bottom-right, Sq > Sk");
    s = base(2, 2, 2, 9, 21, 16);
    s.klen = klen;
    s.lse = 1;
    check_case(t, &s, "key lengths (0: empty rows)");
    s.window = 1;
    s.left = 2;
    s.right = 1;
    s.global_stride = 5;
    s.alibi = 1;
    s.softcap = 4.0f;
    s.scale = 0.5f;
    check_case(t, &s, "window + global + alibi + softcap");
}

static void storage_and_layouts(test_ctx *t) {
    at_spec s = base(2, 2, 2, 7, 19, 40);
    s.dt = CLATTN_F16;
    s.causal = 1;
    check_case(t, &s, "f16");
    s.dt = CLATTN_BF16;
    check_case(t, &s, "bf16");
    s.dt = CLATTN_F32;
    s.bshd = 1;
    check_case(t, &s, "[B,S,H,D] storage");
    s.bshd = 2;
    check_case(t, &s, "[B,H,D,S] storage (head dim strided)");
    s = base(1, 2, 2, 6, 11, 20);
    check_case(t, &s, "D=20 (4 lanes)");
    s = base(1, 2, 2, 6, 11, 18);
    s.Dv = 7;
    check_case(t, &s, "D=18 Dv=7 (scalar)");
}

/* Runs the spec twice, the second time after `change` edits d's K and V, and compares the first
 * `rows` query rows of every (b, h) bit for bit. */
typedef void (*kv_change)(const at_spec *s, at_data *d);

static void same_rows_after_variant(test_ctx *t, const at_spec *s, kv_change change, int64_t rows,
                                    int variant, const char *what) {
    at_data d;
    float *before = NULL, *after = NULL, *lse = NULL;
    if (prepare(t, s, &d) && run_variant(t, s, &d, variants[variant], &before, &lse)) {
        free(lse);
        lse = NULL;
        change(s, &d);
        if (run_variant(t, s, &d, variants[variant], &after, &lse))
            for (int64_t bh = 0; bh < s->B * s->Hq && !t->failed; ++bh)
                for (int64_t i = 0; i < rows; ++i) {
                    size_t at = (size_t)((bh * s->Sq + i) * s->Dv);
                    if (memcmp(before + at, after + at, sizeof(float) * (size_t)s->Dv) != 0) {
                        test_fail_at(t, __FILE__, __LINE__,
                                     "%s [%s]: row %lld of head %lld changed", what,
                                     variant_names[variant], (long long)i, (long long)bh);
                        break;
                    }
                }
    }
    free(before);
    free(after);
    free(lse);
    free_data(&d);
}

static void same_rows_after(test_ctx *t, const at_spec *s, kv_change change, int64_t rows,
                            const char *what) {
    for (int variant = 0; variant < VARIANTS && !t->failed; ++variant)
        same_rows_after_variant(t, s, change, rows, variant, what);
}

/* Keys and values from position 6 on get new values. */
static void perturb_future(const at_spec *s, at_data *d) {
    for (int64_t b = 0; b < s->B; ++b)
        for (int64_t h = 0; h < s->Hkv; ++h)
            for (int64_t j = 6; j < s->Sk; ++j) {
                for (int64_t e = 0; e < s->D; ++e)
                    d->k[at4(s->Hkv, s->Sk, s->D, b, h, j, e)] += 1.0f;
                for (int64_t e = 0; e < s->Dv; ++e)
                    d->v[at4(s->Hkv, s->Sk, s->Dv, b, h, j, e)] -= 1.0f;
            }
}

/* NaN in every key and value past the batch's key length. */
static void poison_padding(const at_spec *s, at_data *d) {
    for (int64_t b = 0; b < s->B; ++b)
        for (int64_t h = 0; h < s->Hkv; ++h)
            for (int64_t j = s->klen[b]; j < s->Sk; ++j) {
                for (int64_t e = 0; e < s->D; ++e) d->k[at4(s->Hkv, s->Sk, s->D, b, h, j, e)] = NAN;
                for (int64_t e = 0; e < s->Dv; ++e)
                    d->v[at4(s->Hkv, s->Sk, s->Dv, b, h, j, e)] = INFINITY;
            }
}

static void causality_is_bit_exact(test_ctx *t) {
    at_spec s = base(1, 2, 2, 17, 17, 16);
    s.causal = 1;
    same_rows_after(t, &s, perturb_future, 6, "perturbed keys 6..");
}

static void padded_keys_holding_nan_change_nothing(test_ctx *t) {
    static const int32_t klen[2] = {13, 5};
    at_spec s = base(2, 2, 1, 9, 19, 16);
    s.klen = klen;
    same_rows_after(t, &s, poison_padding, s.Sq, "NaN/Inf past the key length");
}

static void bad_arguments_are_rejected(test_ctx *t) {
    cl_command_queue q = clattn_env_queue(t->env);
    cl_mem a = test_buffer(t, 4096), b = test_buffer(t, 4096);
    if (!a || !b) return;
    clattn_tensor qt = clattn_tensor_4d(a, CLATTN_F32, 1, 3, 4, 16),
                  kt = clattn_tensor_4d(a, CLATTN_F32, 1, 2, 4, 16);
    clattn_tensor ot = clattn_tensor_4d(b, CLATTN_F32, 1, 3, 4, 16);
    cl_event ev = (cl_event)(uintptr_t)1;
    int status = clattn_attention(&qt, &kt, &kt, 0.0f, NULL, &ot, NULL, q, 0, NULL, &ev);
    CHECK(t, status == CLATTN_ERR_SHAPE_MISMATCH && ev == NULL, "Hq %% Hkv -> %s",
          clattn_status_name(status));
    kt.shape[1] = 3;
    ot.buffer = a;
    status = clattn_attention(&qt, &kt, &kt, 0.0f, NULL, &ot, NULL, q, 0, NULL, &ev);
    CHECK(t, status == CLATTN_ERR_ALIASING, "out over q -> %s", clattn_status_name(status));
    ot.buffer = b;
    ot.shape[3] = 8;
    status = clattn_attention(&qt, &kt, &kt, 0.0f, NULL, &ot, NULL, q, 0, NULL, &ev);
    CHECK(t, status == CLATTN_ERR_SHAPE_MISMATCH, "Dv mismatch -> %s", clattn_status_name(status));
    ot.shape[3] = 16;
    status = clattn_attention(&qt, &kt, &kt, INFINITY, NULL, &ot, NULL, q, 0, NULL, &ev);
    CHECK(t, status == CLATTN_ERR_INVALID_ARGUMENT, "infinite scale -> %s",
          clattn_status_name(status));
    clReleaseMemObject(a);
    clReleaseMemObject(b);
}

static const test_case cases[] = {
    {"head_dims_and_lengths", head_dims_and_lengths},
    {"gqa_and_mqa", gqa_and_mqa},
    {"masks", masks},
    {"storage_and_layouts", storage_and_layouts},
    {"causality_is_bit_exact", causality_is_bit_exact},
    {"padded_keys_holding_nan_change_nothing", padded_keys_holding_nan_change_nothing},
    {"bad_arguments_are_rejected", bad_arguments_are_rejected},
};
SUITE(attention_suite, "attention", cases);
