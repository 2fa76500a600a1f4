/* Tests of linear attention (src/ops/linear_attention.c, cl/linear_attention.cl) against two
 * float64 references, the naive masked O(S^2) form and the cumsum form (tests/ref.c). Errors are
 * measured against each element's own scale, sum_j |w_ij v_j| / |den|: what the f32 sums can
 * get right, which a near-zero output of a cancelling sum is not a measure of. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"
#include "ops/linear_attention.h"
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct la_spec {
    int64_t B, Hq, Hkv, Sq, Sk, D, Dv;
    clattn_dtype dt;
    int causal, bottom_right, bshd;
    clattn_feature_map map;
    float eps;
    float lo, hi; /* inputs uniform in [lo, hi) */
    const int32_t *klen, *qlen;
    uint64_t seed;
    cl_mem workspace; /* the calls' (NULL: call_options') */
} la_spec;

typedef struct la_data {
    float *q, *k, *v;
    double *ref, *scale;
    ref_mask rm;
    clattn_mask mask;
    clattn_tensor klen_t, qlen_t;
} la_data;

static la_spec spec(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, int64_t Dv) {
    la_spec s;
    memset(&s, 0, sizeof s);
    s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Sq = s.Sk = S, s.D = D, s.Dv = Dv;
    s.dt = CLATTN_F32;
    s.eps = CLATTN_LINEAR_EPS;
    s.lo = -2.0f, s.hi = 2.0f;
    s.seed = (uint64_t)(B * 3 + Hq * 5 + S * 7 + D * 11 + Dv);
    return s;
}

/* The options of the calls under test. Under Oclgrind's uninitialized-value checker they carry
 * a workspace that lives for the whole run: with scratch the library allocates and releases
 * per call, that checker reports reads of phi(k) and of the running state that every device
 * computes right (the results match; not root-caused, see README, Known limits). */
static clattn_linear_options call_options(test_ctx *t, const la_spec *s) {
    static cl_mem persistent;
    clattn_linear_options options = {s->map, s->eps, s->workspace};
    if (s->workspace) return options;
    if (test_under_uninit_checker() && !persistent) persistent = test_buffer(t, 8 << 20);
    if (test_under_uninit_checker()) options.workspace = persistent;
    return options;
}

/* Values uniform in [lo, hi), exact in dt. */
static float *random_values(const la_spec *s, size_t n, uint64_t *rng) {
    float *x = malloc(n * sizeof(float));
    test_fill_exact(x, n, s->dt, rng);
    for (size_t i = 0; i < n; ++i) {
        uint16_t bits[2];
        ref_store(bits, s->dt, 0, s->lo + (x[i] + 2.0f) / 4.0f * (s->hi - s->lo));
        x[i] = ref_load(bits, s->dt, 0);
    }
    return x;
}

static ref_linear ref_params(const la_spec *s, const la_data *d) {
    return (ref_linear){s->B, s->Hq, s->Hkv,      s->Sq,  s->Sk,
                        s->D, s->Dv, (int)s->map, s->eps, &d->rm};
}

static bool upload_lengths(test_ctx *t, const la_spec *s, const int32_t *host, clattn_tensor *out) {
    *out = clattn_tensor_4d(test_buffer(t, 4 * (size_t)s->B), CLATTN_I32, 1, 1, 1, s->B);
    return out->buffer && test_write(t, out->buffer, host, 4 * (size_t)s->B);
}

static bool prepare(test_ctx *t, const la_spec *s, la_data *d) {
    memset(d, 0, sizeof *d);
    uint64_t rng = s->seed * 131 + 17;
    d->q = random_values(s, (size_t)(s->B * s->Hq * s->Sq * s->D), &rng);
    d->k = random_values(s, (size_t)(s->B * s->Hkv * s->Sk * s->D), &rng);
    d->v = random_values(s, (size_t)(s->B * s->Hkv * s->Sk * s->Dv), &rng);
    const size_t n_out = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
    d->ref = malloc(n_out * sizeof(double));
    d->scale = malloc(n_out * sizeof(double));
    d->rm.causal = s->causal, d->rm.bottom_right = s->bottom_right;
    d->rm.key_lengths = s->klen, d->rm.query_lengths = s->qlen;
    d->mask.causal = s->causal;
    d->mask.align = s->bottom_right ? CLATTN_ALIGN_BOTTOM_RIGHT : CLATTN_ALIGN_TOP_LEFT;
    if (s->klen && !upload_lengths(t, s, s->klen, &d->klen_t)) return false;
    if (s->qlen && !upload_lengths(t, s, s->qlen, &d->qlen_t)) return false;
    if (s->klen) d->mask.key_lengths = &d->klen_t;
    if (s->qlen) d->mask.query_lengths = &d->qlen_t;
    const ref_linear p = ref_params(s, d);
    ref_linear_attention(&p, d->q, d->k, d->v, d->ref, d->scale);
    return true;
}

static void free_data(la_data *d) {
    if (d->klen_t.buffer) clReleaseMemObject(d->klen_t.buffer);
    if (d->qlen_t.buffer) clReleaseMemObject(d->qlen_t.buffer);
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->ref);
    free(d->scale);
}

/* Uploads k and v (stored as the spec says); the caller releases them. */
static void upload_keys(test_ctx *t, const la_spec *s, const float *k, const float *v,
                        clattn_tensor *kt, clattn_tensor *vt) {
    *kt = test_upload_bhsd(t, k, s->B, s->Hkv, s->Sk, s->D, s->dt, s->bshd);
    *vt = test_upload_bhsd(t, v, s->B, s->Hkv, s->Sk, s->Dv, s->dt, s->bshd);
}

/* Runs the op on the given host inputs; returns out as dense f32 (malloc'ed), NULL on failure. */
static float *run_with(test_ctx *t, const la_spec *s, const la_data *d, const float *k,
                       const float *v) {
    clattn_tensor q = test_upload_bhsd(t, d->q, s->B, s->Hq, s->Sq, s->D, s->dt, s->bshd), kt, vt;
    upload_keys(t, s, k, v, &kt, &vt);
    const size_t n_out = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
    clattn_tensor o = clattn_tensor_4d(test_buffer(t, n_out * clattn_dtype_size(s->dt)), s->dt,
                                       s->B, s->Hq, s->Sq, s->Dv);
    const clattn_linear_options options = call_options(t, s);
    float *out = NULL;
    void *raw = malloc(n_out * 4);
    if (q.buffer && kt.buffer && vt.buffer && o.buffer) {
        int status = clattn_linear_attention(&q, &kt, &vt, &d->mask, &o, &options,
                                             clattn_env_queue(t->env), 0, NULL, NULL);
        if (status != CLATTN_SUCCESS)
            test_fail_at(t, __FILE__, __LINE__, "clattn_linear_attention -> %s: %s",
                         clattn_status_name(status), clattn_last_error());
        else if (test_read(t, o.buffer, raw, n_out * clattn_dtype_size(s->dt))) {
            out = malloc(n_out * sizeof(float));
            for (size_t i = 0; i < n_out; ++i) out[i] = ref_load(raw, s->dt, i);
        }
    }
    free(raw);
    clattn_tensor *all[4] = {&q, &kt, &vt, &o};
    for (int i = 0; i < 4; ++i)
        if (all[i]->buffer) clReleaseMemObject(all[i]->buffer);
    return out;
}

/* Element-wise: |out - ref| <= tol * scale + rtol * |ref| (storage rounding of the output). */
static bool matches(test_ctx *t, const la_spec *s, const double *ref, const double *scale,
                    const float *out, const char *what) {
    const double tol = 2e-5 * fmax(1.0, sqrt((double)s->Sk / 64.0));
    const double rtol = s->dt == CLATTN_F32 ? 0 : s->dt == CLATTN_F16 ? 1e-3 : 8e-3;
    const size_t n = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
    for (size_t i = 0; i < n; ++i)
        if (!(fabs(out[i] - ref[i]) <= tol * scale[i] + rtol * fabs(ref[i]) + 1e-30)) {
            test_fail_at(t, __FILE__, __LINE__, "%s: out[%zu] = %.9g, expected %.9g (scale %.3g)",
                         what, i, out[i], ref[i], scale[i]);
            return false;
        }
    return true;
}

/* The op against the naive form, and the naive form against the cumsum form. */
static void check_case(test_ctx *t, const la_spec *s, const char *what) {
    if (t->failed) return;
    la_data d;
    if (prepare(t, s, &d)) {
        const size_t n = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
        double *cumsum = malloc(n * sizeof(double));
        const ref_linear p = ref_params(s, &d);
        ref_linear_attention_cumsum(&p, d.q, d.k, d.v, cumsum);
        for (size_t i = 0; i < n && !t->failed; ++i)
            if (!(fabs(cumsum[i] - d.ref[i]) <= 1e-9 * (d.scale[i] + 1e-300)))
                test_fail_at(t, __FILE__, __LINE__,
                             "%s: the references disagree at %zu: %.17g %.17g", what, i, cumsum[i],
                             d.ref[i]);
        free(cumsum);
        float *out = t->failed ? NULL : run_with(t, s, &d, d.k, d.v);
        if (out) matches(t, s, d.ref, d.scale, out, what);
        free(out);
    }
    free_data(&d);
}

static void feature_maps(test_ctx *t) {
    static const char *const names[] = {"elu1", "relu", "identity"};
    for (int map = 0; map < 3; ++map)
        for (int causal = 0; causal < 2; ++causal) {
            la_spec s = spec(1, 2, 1, 37, 16, 24);
            s.map = (clattn_feature_map)map, s.causal = causal;
            if (s.map == CLATTN_FEATURE_IDENTITY) s.lo = 0.0f; /* positive denominators */
            char what[64];
            snprintf(what, sizeof what, "%s%s", names[map], causal ? " causal" : "");
            check_case(t, &s, what);
        }
}

/* Lengths at the chunk size (64) minus one, at it and past it, and at twice it; 1; and the
 * non-causal form's largest chunk (256) plus one. */
static void chunk_boundaries(test_ctx *t) {
    static const int64_t lengths[] = {1, 63, 64, 65, 127, 128, 129};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; ++i) {
        la_spec s = spec(1, 2, 1, lengths[i], 16, 24);
        s.causal = 1;
        char what[48];
        snprintf(what, sizeof what, "causal S=%lld", (long long)lengths[i]);
        check_case(t, &s, what);
    }
    la_spec s = spec(1, 2, 1, 257, 16, 24);
    check_case(t, &s, "non-causal S=257");
    s.Sq = 3;
    check_case(t, &s, "non-causal Sq=3 Sk=257");
}

static void long_sequence(test_ctx *t) {
    if (!test_large_shapes(t)) {
        test_skip(t, "large shapes are off (CLATTN_TEST_SMALL)");
        return;
    }
    la_spec s = spec(1, 1, 1, 4097, 16, 16);
    s.causal = 1;
    check_case(t, &s, "causal S=4097");
}

/* elu(x) + 1 of x <= -8 is below 3.4e-4: the denominators are small, and eps matters. */
static void very_negative_inputs(test_ctx *t) {
    la_spec s = spec(1, 2, 1, 70, 16, 24);
    s.lo = -12.0f, s.hi = -8.0f;
    s.causal = 1;
    check_case(t, &s, "inputs in [-12, -8) causal");
    s.causal = 0;
    s.eps = 1e-3f;
    check_case(t, &s, "inputs in [-12, -8), eps 1e-3");
}

static void lengths_and_alignment(test_ctx *t) {
    static const int32_t klen[3] = {37, 5, 0}, qlen[3] = {20, 37, 9};
    la_spec s = spec(3, 2, 1, 37, 16, 24);
    s.klen = klen;
    check_case(t, &s, "key lengths (0: empty rows)");
    s.causal = 1;
    check_case(t, &s, "causal + key lengths");
    s.qlen = qlen;
    check_case(t, &s, "causal + key and query lengths");
    s.bottom_right = 1;
    check_case(t, &s, "causal bottom-right + lengths");
    s = spec(2, 2, 2, 70, 16, 24);
    s.Sq = 9;
    s.causal = s.bottom_right = 1;
    check_case(t, &s, "causal bottom-right Sq=9 Sk=70 (a KV cache)");
    s.Sq = 90;
    check_case(t, &s, "causal bottom-right Sq=90 Sk=70");
}

static void storage_and_layouts(test_ctx *t) {
    static const clattn_dtype dtypes[] = {CLATTN_F16, CLATTN_BF16};
    for (int i = 0; i < 2; ++i) {
        la_spec s = spec(2, 4, 2, 45, 32, 32);
        s.dt = dtypes[i];
        s.causal = 1;
        char what[32];
        snprintf(what, sizeof what, "%s causal", clattn_dtype_name(dtypes[i]));
        check_case(t, &s, what);
    }
    la_spec s = spec(2, 4, 2, 45, 32, 32);
    s.bshd = 1;
    s.causal = 1;
    check_case(t, &s, "[B,S,H,D] views");
    s.bshd = 2;
    s.causal = 0;
    check_case(t, &s, "[B,H,D,S] views");
    s = spec(1, 1, 1, 20, 7, 5);
    s.causal = 1;
    check_case(t, &s, "odd head dims D=7 Dv=5");
    const uint64_t saved = clattn__narrow_index_limit_set(64);
    s = spec(1, 2, 1, 70, 16, 24);
    s.causal = 1;
    check_case(t, &s, "64-bit indices");
    clattn__narrow_index_limit_set(saved);
}

/* Changing keys and values from position p on, even to NaN and 1e30, changes no output row
 * before p, bit for bit; padded keys past a key length never reach any output either. */
static void causality_bit_exact(test_ctx *t) {
    la_spec s = spec(1, 2, 1, 150, 16, 24);
    s.causal = 1;
    la_data d;
    if (prepare(t, &s, &d)) {
        float *before = run_with(t, &s, &d, d.k, d.v);
        const int64_t p = 70;
        for (int64_t j = p; j < s.Sk; ++j) {
            for (int64_t e = 0; e < s.D; ++e) d.k[j * s.D + e] = j % 2 ? NAN : 1e30f;
            for (int64_t e = 0; e < s.Dv; ++e) d.v[j * s.Dv + e] = j % 3 ? -INFINITY : NAN;
        }
        float *after = before ? run_with(t, &s, &d, d.k, d.v) : NULL;
        for (int64_t h = 0; after && h < s.Hq && !t->failed; ++h)
            for (int64_t i = 0; i < p && !t->failed; ++i)
                CHECK(t,
                      memcmp(before + (h * s.Sq + i) * s.Dv, after + (h * s.Sq + i) * s.Dv,
                             sizeof(float) * (size_t)s.Dv) == 0,
                      "head %lld row %lld changed when keys >= %lld did", (long long)h,
                      (long long)i, (long long)p);
        free(before);
        free(after);
    }
    free_data(&d);
}

static void padded_keys_never_read(test_ctx *t) {
    static const int32_t klen[2] = {30, 11};
    for (int causal = 0; causal < 2 && !t->failed; ++causal) {
        la_spec s = spec(2, 2, 1, 40, 16, 24);
        s.klen = klen, s.causal = causal;
        la_data d;
        if (prepare(t, &s, &d)) {
            for (int64_t b = 0; b < s.B; ++b)
                for (int64_t j = klen[b]; j < s.Sk; ++j) {
                    for (int64_t e = 0; e < s.D; ++e) d.k[(b * s.Sk + j) * s.D + e] = NAN;
                    for (int64_t e = 0; e < s.Dv; ++e) d.v[(b * s.Sk + j) * s.Dv + e] = INFINITY;
                }
            float *out = run_with(t, &s, &d, d.k, d.v);
            if (out) matches(t, &s, d.ref, d.scale, out, causal ? "causal" : "non-causal");
            free(out);
        }
        free_data(&d);
    }
}

/* ---- the recurrent step ---- */

typedef struct step_state {
    clattn_tensor s, z;
} step_state;

static void free_state(step_state *st) {
    if (st->s.buffer) clReleaseMemObject(st->s.buffer);
    if (st->z.buffer) clReleaseMemObject(st->z.buffer);
}

static bool zero_state(test_ctx *t, const la_spec *sp, step_state *st) {
    const size_t ns = (size_t)(sp->B * sp->Hkv * sp->D * sp->Dv),
                 nz = (size_t)(sp->B * sp->Hkv * sp->D);
    float *zeros = calloc(ns, sizeof(float));
    st->s = clattn_tensor_4d(test_buffer(t, ns * 4), CLATTN_F32, sp->B, sp->Hkv, sp->D, sp->Dv);
    st->z = clattn_tensor_4d(test_buffer(t, nz * 4), CLATTN_F32, 1, sp->B, sp->Hkv, sp->D);
    bool ok = st->s.buffer && st->z.buffer && test_write(t, st->s.buffer, zeros, ns * 4) &&
              test_write(t, st->z.buffer, zeros, nz * 4);
    free(zeros);
    return ok;
}

/* Tokens [t0, t0 + n) of the dense [B,H,S,D] `host` as their own dense [B,H,n,D] array. */
static float *token_slice(const float *host, int64_t B, int64_t H, int64_t S, int64_t D, int64_t t0,
                          int64_t n) {
    float *out = malloc(sizeof(float) * (size_t)(B * H * n * D));
    for (int64_t bh = 0; bh < B * H; ++bh)
        memcpy(out + bh * n * D, host + (bh * S + t0) * D, sizeof(float) * (size_t)(n * D));
    return out;
}

/* One step over tokens [t0, t0 + n); their outputs land in `out` (dense [B,Hq,S,Dv]). */
static bool run_step(test_ctx *t, const la_spec *s, const la_data *d, step_state *st,
                     const clattn_tensor *lengths, int64_t t0, int64_t n, float *out) {
    float *hq = token_slice(d->q, s->B, s->Hq, s->Sq, s->D, t0, n);
    float *hk = token_slice(d->k, s->B, s->Hkv, s->Sk, s->D, t0, n);
    float *hv = token_slice(d->v, s->B, s->Hkv, s->Sk, s->Dv, t0, n);
    clattn_tensor q = test_upload_bhsd(t, hq, s->B, s->Hq, n, s->D, s->dt, s->bshd);
    clattn_tensor k = test_upload_bhsd(t, hk, s->B, s->Hkv, n, s->D, s->dt, s->bshd);
    clattn_tensor v = test_upload_bhsd(t, hv, s->B, s->Hkv, n, s->Dv, s->dt, s->bshd);
    const size_t n_out = (size_t)(s->B * s->Hq * n * s->Dv);
    clattn_tensor o =
        clattn_tensor_4d(test_buffer(t, n_out * 4), CLATTN_F32, s->B, s->Hq, n, s->Dv);
    float *host_out = malloc(n_out * sizeof(float));
    bool ok = q.buffer && k.buffer && v.buffer && o.buffer;
    if (ok) {
        const clattn_linear_options options = call_options(t, s);
        int status = clattn_linear_attention_step(&q, &k, &v, lengths, &st->s, &st->z, &o, &options,
                                                  clattn_env_queue(t->env), 0, NULL, NULL);
        if (status != CLATTN_SUCCESS)
            test_fail_at(t, __FILE__, __LINE__, "clattn_linear_attention_step -> %s: %s",
                         clattn_status_name(status), clattn_last_error());
        ok = status == CLATTN_SUCCESS && test_read(t, o.buffer, host_out, n_out * 4);
    }
    for (int64_t bh = 0; ok && bh < s->B * s->Hq; ++bh)
        memcpy(out + (bh * s->Sq + t0) * s->Dv, host_out + bh * n * s->Dv,
               sizeof(float) * (size_t)(n * s->Dv));
    clattn_tensor *all[4] = {&q, &k, &v, &o};
    for (int i = 0; i < 4; ++i)
        if (all[i]->buffer) clReleaseMemObject(all[i]->buffer);
    free(hq);
    free(hk);
    free(hv);
    free(host_out);
    return ok;
}

/* Decoding 64 tokens one at a time equals the causal op over the whole sequence; the final
 * state is the sums over every token. */
static void step_equals_causal(test_ctx *t) {
    la_spec s = spec(2, 4, 2, 64, 16, 24);
    s.causal = 1;
    la_data d;
    const size_t n_out = (size_t)(s.B * s.Hq * s.Sq * s.Dv);
    float *out = calloc(n_out, sizeof(float));
    step_state st = {{0}, {0}};
    if (prepare(t, &s, &d) && zero_state(t, &s, &st)) {
        for (int64_t tok = 0; tok < s.Sq && !t->failed; ++tok)
            run_step(t, &s, &d, &st, NULL, tok, 1, out);
        if (!t->failed) matches(t, &s, d.ref, d.scale, out, "64 single-token steps");
        /* the state now holds S = sum_j phi(k_j) v_j^T over the 64 tokens */
        float *host_s = malloc(sizeof(float) * (size_t)(s.B * s.Hkv * s.D * s.Dv));
        if (!t->failed &&
            test_read(t, st.s.buffer, host_s, sizeof(float) * (size_t)(s.B * s.Hkv * s.D * s.Dv))) {
            double want = 0;
            for (int64_t j = 0; j < s.Sk; ++j)
                want += ref_feature(0, d.k[j * s.D + 3]) * d.v[j * s.Dv + 5];
            if (!(fabs(host_s[3 * s.Dv + 5] - want) <= 1e-5 * (1 + fabs(want))))
                test_fail_at(t, __FILE__, __LINE__, "state S[0,0,3,5] = %.9g, expected %.9g",
                             host_s[3 * s.Dv + 5], want);
        }
        free(host_s);
    }
    free_state(&st);
    free(out);
    free_data(&d);
}

/* A copy of x [B,H,S,width] with batch 1's tokens 1 and 2 set to `value`. */
static float *padded_copy(const float *x, const la_spec *s, int64_t H, int64_t width, float value) {
    const size_t n = (size_t)(s->B * H * s->Sk * width);
    float *copy = malloc(n * sizeof(float));
    memcpy(copy, x, n * sizeof(float));
    for (int64_t h = 0; h < H; ++h)
        for (int64_t e = width; e < 3 * width; ++e) copy[((H + h) * s->Sk) * width + e] = value;
    return copy;
}

/* A step of 3 tokens with lengths {3, 1} from a zero state, under the tuning `override` (NULL:
 * none): batch 1's padded tokens (k NaN, v Inf) get no output and stay out of its z and S, its
 * token 0 is right. */
static void padded_step(test_ctx *t, const la_spec *s, const la_data *d,
                        const clattn_tensor *lengths, const char *override) {
    const size_t n_out = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
    const size_t n_s = (size_t)(s->B * s->Hkv * s->D * s->Dv);
    float *out = calloc(n_out, sizeof(float)), *sb = malloc(n_s * sizeof(float));
    la_data padded = *d;
    padded.k = padded_copy(d->k, s, s->Hkv, s->D, NAN);
    padded.v = padded_copy(d->v, s, s->Hkv, s->Dv, INFINITY);
    step_state fresh = {{0}, {0}};
    float zb[32]; /* B x Hkv x D */
    clattn__traced_kernel traced[8];
    const char *label = override ? override : "default";
    const int set = clattn_tuning_override("linear_attention", override);
    clattn__trace_kernels(true);
    const bool ran = set == CLATTN_SUCCESS && zero_state(t, s, &fresh) &&
                     run_step(t, s, &padded, &fresh, lengths, 0, 3, out) &&
                     test_read(t, fresh.z.buffer, zb, sizeof zb) &&
                     test_read(t, fresh.s.buffer, sb, n_s * sizeof(float));
    clattn__trace_kernels(false);
    const size_t kernels = clattn__trace_take(traced, 8);
    clattn_tuning_override("linear_attention", NULL);
    free_state(&fresh);
    const char *first = kernels ? traced[0].name : "none";
    if (ran && (kernels != (override ? 4u : 1u) ||
                strcmp(first, override ? "linear_features" : "linear_recurrence") != 0))
        test_fail_at(t, __FILE__, __LINE__, "%s: %zu kernels, the first %s", label, kernels, first);
    for (size_t i = 0; i < kernels; ++i) clReleaseEvent(traced[i].event);
    for (int64_t h = 0; ran && h < s->Hq && !t->failed; ++h)
        for (int64_t i = 1; i < 3; ++i)
            for (int64_t e = 0; e < s->Dv; ++e)
                if (out[((s->Hq + h) * s->Sq + i) * s->Dv + e] != 0.0f)
                    test_fail_at(t, __FILE__, __LINE__,
                                 "%s: padded token %lld of batch 1 has an output", label,
                                 (long long)i);
    for (int64_t h = 0; ran && h < s->Hq && !t->failed; ++h) /* batch 1, token 0 is valid */
        for (int64_t e = 0; e < s->Dv; ++e) {
            const size_t i = (size_t)(((s->Hq + h) * s->Sq + 0) * s->Dv + e);
            if (!(fabs(out[i] - d->ref[i]) <= 2e-5 * d->scale[i] + 1e-30))
                test_fail_at(t, __FILE__, __LINE__, "%s: batch 1 token 0: %.9g, expected %.9g",
                             label, out[i], d->ref[i]);
        }
    const size_t z_at = (size_t)(s->Hkv * s->D); /* batch 1, kv head 0 */
    for (int64_t e = 0; ran && e < s->D && !t->failed; ++e) {
        const double want = ref_feature(0, d->k[(size_t)((1 * s->Hkv * s->Sk) * s->D + e)]);
        if (!(fabs(zb[z_at + (size_t)e] - want) <= 1e-6 * (1 + want)))
            test_fail_at(t, __FILE__, __LINE__, "%s: batch 1 z[%lld] = %.9g, expected %.9g", label,
                         (long long)e, zb[z_at + (size_t)e], want);
    }
    const float *k0 = d->k + (size_t)(s->Hkv * s->Sk * s->D); /* batch 1's token 0 */
    const float *v0 = d->v + (size_t)(s->Hkv * s->Sk * s->Dv);
    for (int64_t e = 0; ran && e < s->D * s->Dv && !t->failed; ++e) {
        const double want = ref_feature(0, k0[e / s->Dv]) * v0[e % s->Dv];
        const float got = sb[n_s / 2 + (size_t)e]; /* batch 1's S (one kv head) */
        if (!(fabs(got - want) <= 1e-6 * (1 + fabs(want))))
            test_fail_at(t, __FILE__, __LINE__, "%s: batch 1 S[%lld] = %.9g, expected %.9g", label,
                         (long long)e, got, want);
    }
    free(out);
    free(sb);
    free(padded.k);
    free(padded.v);
}

/* The recurrent form on other shapes: one step over a whole sequence from a zero state equals
 * the causal op over it (MHA with 32-dim rows in the device's widest lanes, f16; four query
 * heads a kv head, bf16, relu; one-lane rows of 7 and 5). */
static void recurrent_step_shapes(test_ctx *t) {
    la_spec specs[3] = {spec(1, 2, 2, 4, 32, 32), spec(2, 8, 2, 2, 16, 8), spec(1, 1, 1, 3, 7, 5)};
    specs[0].dt = CLATTN_F16;
    specs[1].dt = CLATTN_BF16, specs[1].map = CLATTN_FEATURE_RELU;
    static const char *const what[3] = {"MHA, f16", "GQA 4:1, bf16, relu", "D=7 Dv=5"};
    for (int i = 0; i < 3 && !t->failed; ++i) {
        la_spec *s = &specs[i];
        s->causal = 1;
        la_data d;
        const size_t n_out = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
        float *out = calloc(n_out, sizeof(float));
        step_state st = {{0}, {0}};
        if (prepare(t, s, &d) && zero_state(t, s, &st) &&
            run_step(t, s, &d, &st, NULL, 0, s->Sq, out))
            matches(t, s, d.ref, d.scale, out, what[i]);
        free_state(&st);
        free(out);
        free_data(&d);
    }
}

/* Steps of 3, 70 and 77 tokens (3: the recurrent form; the others chunked) equal the causal op,
 * on q, k, v one element into their buffers (no row on a vector boundary); a padded step,
 * recurrent and chunked (RECURRENT=0), leaves the padded tokens out. */
static void uneven_steps_and_lengths(test_ctx *t) {
    static const int32_t valid[2] = {3, 1};
    la_spec s = spec(2, 2, 1, 150, 16, 24);
    s.causal = 1, s.bshd = 3;
    la_data d;
    const size_t n_out = (size_t)(s.B * s.Hq * s.Sq * s.Dv);
    float *out = calloc(n_out, sizeof(float));
    step_state st = {{0}, {0}};
    clattn_tensor lengths = {0};
    if (prepare(t, &s, &d) && zero_state(t, &s, &st) && upload_lengths(t, &s, valid, &lengths)) {
        /* then each takes the rest from there as one step: the sequences stay whole, so this
         * equals the causal op */
        int64_t t0 = 0;
        static const int64_t steps[] = {3, 70, 77};
        for (size_t i = 0; i < 3 && !t->failed; ++i) {
            run_step(t, &s, &d, &st, NULL, t0, steps[i], out);
            t0 += steps[i];
        }
        if (!t->failed) matches(t, &s, d.ref, d.scale, out, "steps of 3, 70 and 77 tokens");
        if (!t->failed) padded_step(t, &s, &d, &lengths, NULL);
        if (!t->failed) padded_step(t, &s, &d, &lengths, "RECURRENT=0");
    }
    free_state(&st);
    if (lengths.buffer) clReleaseMemObject(lengths.buffer);
    free(out);
    free_data(&d);
}

/* The GPU launch (one state row or query per work-item, float4 lanes, groups of 64) and the
 * CPU one, whichever this device would pick, on causal, non-causal and step calls. */
static void both_launches(test_ctx *t) {
    static const int32_t klen[2] = {50, 17};
    static const int launches[2] = {CLATTN__LINEAR_CPU, CLATTN__LINEAR_GPU};
    for (int i = 0; i < 2 && !t->failed; ++i) {
        clattn__hook_set(CLATTN__HOOK_LINEAR_LAUNCH, launches[i]);
        la_spec s = spec(2, 4, 2, 70, 16, 24);
        s.causal = 1, s.dt = CLATTN_BF16;
        check_case(t, &s, i ? "gpu launch, causal bf16" : "cpu launch, causal bf16");
        s = spec(2, 2, 1, 50, 32, 32);
        s.klen = klen, s.bshd = 1;
        check_case(t, &s, i ? "gpu launch, key lengths" : "cpu launch, key lengths");
    }
    clattn__hook_set(CLATTN__HOOK_LINEAR_LAUNCH, CLATTN__LINEAR_GPU);
    step_equals_causal(t);
    clattn__hook_set(CLATTN__HOOK_LINEAR_LAUNCH, -1);
}

/* The launch a spec gets on the device under test (its mask's causality only), and with
 * `kernels` the names of the kernels the forward's four steps take (built, not run). */
static bool picked_launch_and_kernels(test_ctx *t, const la_spec *s, clattn__linear_launch *l,
                                      char (*kernels)[32]) {
    clattn_tensor q = clattn_tensor_4d(NULL, s->dt, s->B, s->Hq, s->Sq, s->D),
                  k = clattn_tensor_4d(NULL, s->dt, s->B, s->Hkv, s->Sk, s->D),
                  v = clattn_tensor_4d(NULL, s->dt, s->B, s->Hkv, s->Sk, s->Dv);
    clattn__linear_args a = {.q = &q, .k = &k, .v = &v, .out = &q};
    a.mask.causal = s->causal;
    clattn__call call;
    cl_kernel built[4] = {NULL, NULL, NULL, NULL};
    size_t items[4], caps[4];
    char options[1024];
    int status = clattn__begin_call(&call, clattn_env_queue(t->env), 0, NULL, NULL);
    if (status == CLATTN_SUCCESS) status = clattn__linear_pick_launch(call.device, &a, l);
    if (status == CLATTN_SUCCESS && kernels) {
        clattn__linear_options(&a, l, false, options, sizeof options);
        status = clattn__linear_prepare_steps(&a, l, &call, NULL, false, "linear_attention.cl",
                                              options, 4, false, built, items, caps);
    }
    for (int i = 0; i < 4; ++i) {
        if (built[i] && clGetKernelInfo(built[i], CL_KERNEL_FUNCTION_NAME, sizeof kernels[i],
                                        kernels[i], NULL) != CL_SUCCESS)
            kernels[i][0] = '\0';
        clattn__release_kernel(built[i]);
    }
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "planning linear attention -> %s: %s",
                     clattn_status_name(status), clattn_last_error());
    return status == CLATTN_SUCCESS;
}

static bool picked_launch(test_ctx *t, const la_spec *s, clattn__linear_launch *l) {
    return picked_launch_and_kernels(t, s, l, NULL);
}

/* The kernels of phi(k), the states and the outputs a spec takes under `override` are
 * `features` ("": none), `states` and `outputs`. */
static void takes_kernels(test_ctx *t, const la_spec *s, const char *override, const char *features,
                          const char *states, const char *outputs) {
    clattn__linear_launch l;
    char kernels[4][32] = {"", "", "", ""};
    CHECK_OK(t, clattn_tuning_override("linear_attention", override));
    const bool planned = picked_launch_and_kernels(t, s, &l, kernels);
    clattn_tuning_override("linear_attention", NULL);
    if (planned)
        CHECK(t,
              strcmp(kernels[0], features) == 0 && strcmp(kernels[1], states) == 0 &&
                  strcmp(kernels[3], outputs) == 0,
              "%s (S=%lld, causal %d): '%s', %s and %s, expected '%s', %s and %s", override,
              (long long)s->Sq, s->causal, kernels[0], kernels[1], kernels[3], features, states,
              outputs);
}

/* A workspace of NaNs, large enough for the tiles' cases (the caller releases it). */
static cl_mem nan_workspace(test_ctx *t) {
    const size_t n = 1 << 18;
    float *nans = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) nans[i] = NAN;
    cl_mem ws = test_buffer(t, n * sizeof(float));
    if (ws && !test_write(t, ws, nans, n * sizeof(float))) {
        clReleaseMemObject(ws);
        ws = NULL;
    }
    free(nans);
    return ws;
}

/* The case under TILES=0 and TILES=1 (and `more` of the override in both: one program): the
 * tiles' output against the reference, and where `same_bits`, against the rows' bit for bit.
 * The tiles' call gets scratch of NaNs, so that a kernel reading phi(k) where the call skipped
 * its kernel fails (fresh scratch may reuse the rows' call's memory, phi(k) and all). */
static void tiles_as_rows(test_ctx *t, const la_spec *s, const char *more, bool same_bits,
                          const char *what) {
    la_data d;
    memset(&d, 0, sizeof d);
    char rows_only[96], tiles[96];
    snprintf(rows_only, sizeof rows_only, "TILES=0%s", more);
    snprintf(tiles, sizeof tiles, "TILES=1%s", more);
    la_spec nan_scratch = *s;
    nan_scratch.workspace = nan_workspace(t);
    if (nan_scratch.workspace && prepare(t, s, &d)) {
        CHECK_OK(t, clattn_tuning_override("linear_attention", rows_only));
        float *rows = t->failed ? NULL : run_with(t, s, &d, d.k, d.v), *tiled = NULL;
        if (rows) CHECK_OK(t, clattn_tuning_override("linear_attention", tiles));
        if (rows && !t->failed) tiled = run_with(t, &nan_scratch, &d, d.k, d.v);
        const size_t n = (size_t)(s->B * s->Hq * s->Sq * s->Dv);
        if (tiled && matches(t, s, d.ref, d.scale, tiled, what) && same_bits)
            for (size_t i = 0; i < n && !t->failed; ++i)
                CHECK(t, memcmp(&rows[i], &tiled[i], sizeof(float)) == 0,
                      "%s: out[%zu] = %.9g by the tiles, %.9g by the rows", what, i, tiled[i],
                      rows[i]);
        free(rows);
        free(tiled);
    }
    clattn_tuning_override("linear_attention", NULL);
    if (nan_scratch.workspace) clReleaseMemObject(nan_scratch.workspace);
    free_data(&d);
}

/* TILES=1 (the GPU row's: states and outputs as group tiles) sums in the row kernels' order, so
 * it gives their bits; not the causal outputs', whose blocks of 64 queries take the state of the
 * whole chunks before their smallest end, the row kernels' blocks of at most 8 those before
 * theirs (causal cases are checked against the reference). Blocks of 8 cut the head dims 20 and
 * 12 into whole and partial blocks, with a last step of fewer keys than TILE_STEP (16), f16 rows
 * loaded as aligned vectors, then read with a stride ([B,H,D,S], causal); D=7 Dv=5 takes
 * one-lane rows; D=64 the GPU row's 64 x 64 blocks; bottom-right blocks of 8 queries start in the
 * middle of chunks. Where the compiler's groups are smaller than the tiles' (a cap of 4 against
 * groups of 6) the call takes the row kernels; where causal phi(q) rows do not fit local memory the
 * blocks take fewer queries, and where a step does not, the launch takes no tiles; a call of fewer
 * queries than a block keeps the row kernel for its outputs. phi(k)'s kernel runs only where a
 * kernel taken reads its output (the tiles map k themselves where blocks of state rows are whole
 * lane vectors). */
static void tiles_match_rows_bit_for_bit(test_ctx *t) {
    static const int32_t klen[2] = {61, 9}, qlen[2] = {21, 13}, qlen30[2] = {30, 21};
    la_spec s = spec(2, 4, 2, 21, 20, 12);
    s.dt = CLATTN_F16, s.klen = s.qlen = qlen; /* rows loaded as aligned vectors (ALIGNED) */
    tiles_as_rows(t, &s, ",LANES=4,BLOCK=8", true, "f16 D=20 Dv=12 in blocks of 8");
    s.causal = 1, s.bottom_right = 1, s.Sq = 30, s.Sk = 80, s.klen = NULL, s.qlen = qlen30;
    s.bshd = 2;
    tiles_as_rows(t, &s, ",LANES=4,BLOCK=8", false,
                  "causal bottom-right Sq=30 Sk=80, f16 [B,H,D,S]");
    /* the rest on the lane of large shapes (under the uninitialized-value checker, at -O0, it
     * took a minute; PoCL built its programs in 12 s a lane) */
    if (!test_large_shapes(t)) return;
    for (int causal = 0; causal < 2; ++causal) {
        s = spec(1, 2, 1, 37, 7, 5);
        s.causal = causal;
        tiles_as_rows(t, &s, ",BLOCK=32", !causal, causal ? "causal D=7 Dv=5" : "D=7 Dv=5");
    }
    s.Sq = s.Sk = 31;
    tiles_as_rows(t, &s, ",BLOCK=32", true, "causal, 31 queries: the row kernel's outputs");
    s = spec(1, 4, 2, 70, 64, 64);
    tiles_as_rows(t, &s, ",LANES=4", true, "D=64 in groups of 64");
    s = spec(1, 2, 1, 40, 48, 32);
    tiles_as_rows(t, &s, ",BLOCK=32,TILE_ROWS=3", true, "16 lanes, rows of 3, two row blocks");
    /* blocks of 33 state rows are no whole lane vectors: the tiles read phi(k) */
    takes_kernels(t, &s, "TILES=1,BLOCK=32,TILE_ROWS=3,LANES=16", "linear_features",
                  "linear_states_tiles", "linear_outputs_tiles");
    s = spec(1, 2, 1, 150, 64, 64);
    s.causal = 1;
    tiles_as_rows(t, &s, ",LANES=4", false, "causal D=64, 150 keys");
    /* blocks of 66 state rows and queries: the causal tiles read phi(k) */
    tiles_as_rows(t, &s, ",LANES=4,TILE_ROWS=6", false, "causal D=64, tiles of 6 rows");
    takes_kernels(t, &s, "TILES=1,LANES=4,TILE_ROWS=6", "linear_features", "linear_states_tiles",
                  "linear_outputs_tiles");
    s = spec(2, 2, 1, 70, 16, 24);
    s.causal = 1, s.klen = klen;
    tiles_as_rows(t, &s, "", false, "causal, key lengths");
    takes_kernels(t, &s, "TILES=1", "", "linear_states_tiles", "linear_outputs_tiles");
    s.Sq = 63; /* causal row outputs read phi(k) */
    takes_kernels(t, &s, "TILES=1", "linear_features", "linear_states_tiles", "linear_outputs");
    s.causal = 0;
    takes_kernels(t, &s, "TILES=1", "", "linear_states_tiles", "linear_outputs");
    s.Sq = 70;
    takes_kernels(t, &s, "TILES=1", "", "linear_states_tiles", "linear_outputs_tiles");
    test_saved_env cap = test_env_set("CLATTN_MAX_WORK_GROUP", "4");
    takes_kernels(t, &s, "TILES=1,LANES=8,GROUP=4", "linear_features", "linear_states",
                  "linear_outputs");
    tiles_as_rows(t, &s, ",LANES=8,GROUP=4", true, "groups of 4 (the tiles' take 6)");
    test_env_restore(&cap);
    clattn__linear_launch l;
    /* the states' step, 16 x (16 + 24) floats, does not fit; the outputs' would, 8 queries a
     * group (16 x (24 + 1 + 8)) */
    cap = test_env_set("CLATTN_MAX_LOCAL_MEMORY", "2200");
    clattn_tuning_override("linear_attention", "TILES=1,LANES=8");
    const bool starved = picked_launch(t, &s, &l);
    test_env_restore(&cap);
    clattn__linear_launch fed;
    const bool planned = starved && picked_launch(t, &s, &fed);
    /* causal D=128 in float4 lanes: 64 queries' phi(q) rows and the rest take 51008 bytes */
    cap = test_env_set("CLATTN_MAX_LOCAL_MEMORY", "49152");
    clattn_tuning_override("linear_attention", "TILES=1,LANES=4");
    la_spec wide = spec(1, 2, 1, 150, 128, 64);
    wide.causal = 1;
    clattn__linear_launch halved;
    const bool fitted = planned && picked_launch(t, &wide, &halved);
    test_env_restore(&cap);
    clattn_tuning_override("linear_attention", NULL);
    if (!fitted) return;
    CHECK(t, !l.t.TILES && l.block_rows == 8 && l.block_queries == 8 && l.block_cols == 8,
          "2200 bytes of local memory: tiles %ld, blocks %d, %d, %d", l.t.TILES, l.block_rows,
          l.block_queries, l.block_cols);
    CHECK(t, fed.t.TILES && fed.block_rows == 16 && fed.block_cols == 24 && fed.t.TILE_STEP == 16,
          "tiles %ld of %d x %d, %ld a step", fed.t.TILES, fed.block_rows, fed.block_cols,
          fed.t.TILE_STEP);
    CHECK(t, halved.t.TILES && halved.block_queries == 32,
          "causal D=128 in 48 KiB: %d queries a group", halved.block_queries);
}

/* The tiles keep the row kernels' promises: changing keys from a position on changes no
 * earlier output row, bit for bit, and keys past a key length (NaN, Inf) reach no output. TILES
 * is the host's, so the programs are those the two tests built before (there the padding test's
 * 40 queries take the outputs' row kernel; blocks of 32 take the tiles, on the lane of large
 * shapes). */
static void tiles_keep_causality_and_padding(test_ctx *t) {
    if (test_under_uninit_checker()) { /* (8 s there; the tiles' reads are checked above) */
        test_skip(t, "under the uninitialized-value checker");
        return;
    }
    CHECK_OK(t, clattn_tuning_override("linear_attention", "TILES=1"));
    causality_bit_exact(t);
    padded_keys_never_read(t);
    if (test_large_shapes(t) && !t->failed) {
        CHECK_OK(t, clattn_tuning_override("linear_attention", "TILES=1,BLOCK=32"));
        padded_keys_never_read(t);
    }
    clattn_tuning_override("linear_attention", NULL);
}

/* The kernel trace (a benchmark's breakdown of a call, runtime/testing.h) records each of a
 * call's kernels with an event that has a device time, and nothing once it is off. */
static void trace_records_each_step(test_ctx *t) {
    la_spec s = spec(1, 2, 1, 37, 16, 24);
    la_data d;
    static const char *const steps[4] = {"linear_features", "linear_states", "linear_scan",
                                         "linear_outputs"};
    clattn__traced_kernel traced[8];
    size_t count = 0, after = 0;
    if (prepare(t, &s, &d)) {
        CHECK_OK(t, clattn_tuning_override("linear_attention", "TILES=0"));
        clattn__trace_kernels(true);
        float *out = t->failed ? NULL : run_with(t, &s, &d, d.k, d.v);
        clattn__trace_kernels(false);
        count = clattn__trace_take(traced, 8);
        free(out);
        out = t->failed ? NULL : run_with(t, &s, &d, d.k, d.v);
        clattn__traced_kernel more[8];
        after = clattn__trace_take(more, 8);
        for (size_t i = 0; i < after; ++i) clReleaseEvent(more[i].event);
        free(out);
        clattn_tuning_override("linear_attention", NULL);
    }
    if (!t->failed && (count != 4 || after != 0))
        test_fail_at(t, __FILE__, __LINE__, "%zu kernels traced, then %zu with the trace off",
                     count, after);
    for (size_t i = 0; i < count; ++i) {
        cl_ulong start = 0, end = 0;
        const bool timed = clGetEventProfilingInfo(traced[i].event, CL_PROFILING_COMMAND_START,
                                                   sizeof start, &start, NULL) == CL_SUCCESS &&
                           clGetEventProfilingInfo(traced[i].event, CL_PROFILING_COMMAND_END,
                                                   sizeof end, &end, NULL) == CL_SUCCESS;
        if (!t->failed &&
            !(i < 4 && strcmp(traced[i].name, steps[i]) == 0 && timed && end >= start))
            test_fail_at(t, __FILE__, __LINE__, "step %zu: %s, %s", i, traced[i].name,
                         timed ? "timed" : "no device time");
        clReleaseEvent(traced[i].event);
    }
    free_data(&d);
}

/* ---- invalid arguments: each status, nothing enqueued, *event NULL ---- */

typedef struct bad_call {
    clattn_tensor q, k, v, out, s, z;
    clattn_mask mask;
    clattn_linear_options options;
} bad_call;

static int call_op(test_ctx *t, bad_call *c, bool step) {
    cl_event event = (cl_event)1;
    int status =
        step ? clattn_linear_attention_step(&c->q, &c->k, &c->v, NULL, &c->s, &c->z, &c->out,
                                            &c->options, clattn_env_queue(t->env), 0, NULL, &event)
             : clattn_linear_attention(&c->q, &c->k, &c->v, &c->mask, &c->out, &c->options,
                                       clattn_env_queue(t->env), 0, NULL, &event);
    if (status == CLATTN_SUCCESS && event) clReleaseEvent(event);
    if (status != CLATTN_SUCCESS && event != NULL)
        test_fail_at(t, __FILE__, __LINE__, "a failed call left *event set");
    return status;
}

static void bad_arguments(test_ctx *t) {
    cl_mem buf = test_buffer(t, 1 << 16), small = test_buffer(t, 64);
    if (!buf || !small) return;
    /* the good calls run: their inputs are zeros, not garbage (written, which Oclgrind's
     * uninitialized-value checker follows, where it does not follow a fill) */
    void *zeros = calloc(1, 1 << 16);
    bool written = zeros && test_write(t, buf, zeros, 1 << 16);
    free(zeros);
    if (!written) return;
    bad_call good;
    memset(&good, 0, sizeof good);
    good.q = clattn_tensor_4d(buf, CLATTN_F32, 1, 2, 8, 16);
    good.k = good.q, good.k.offset = 1024;
    good.k.shape[1] = 1;
    good.v = good.k, good.v.offset = 2048;
    good.out = good.q, good.out.offset = 4096;
    good.s = clattn_tensor_4d(buf, CLATTN_F32, 1, 1, 16, 16), good.s.offset = 6144;
    good.z = clattn_tensor_4d(buf, CLATTN_F32, 1, 1, 1, 16), good.z.offset = 8192;
    good.options = (clattn_linear_options)CLATTN_LINEAR_OPTIONS_DEFAULT;
    CHECK_OK(t, call_op(t, &good, false));
    CHECK_OK(t, call_op(t, &good, true));
    CHECK_OK(t, clFinish(clattn_env_queue(t->env)));
    bad_call c = good;
    c.k.shape[3] = 8;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_SHAPE_MISMATCH);
    c = good, c.q.shape[1] = 3;
    c.out.shape[1] = 3;
    c.k.shape[1] = 2, c.v.shape[1] = 2;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_SHAPE_MISMATCH);
    c = good, c.q.dtype = CLATTN_I32;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_UNSUPPORTED_DTYPE);
    c = good, c.out.offset = 0; /* out over q */
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_ALIASING);
    c = good, c.v.buffer = small;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_BUFFER_TOO_SMALL);
    c = good, c.options.feature_map = (clattn_feature_map)7;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_INVALID_ARGUMENT);
    c = good, c.options.eps = -1.0f;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_INVALID_ARGUMENT);
    c = good, c.options.eps = NAN;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_INVALID_ARGUMENT);
    c = good, c.mask.softcap = 2.0f;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_INVALID_ARGUMENT);
    c = good, c.mask.window = 1;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_INVALID_ARGUMENT);
    c = good, c.mask.keep = &good.q;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_INVALID_ARGUMENT);
    c = good, c.q.shape[3] = c.k.shape[3] = 300;
    c.q.strides[2] = c.k.strides[2] = 300;
    CHECK_STATUS(t, call_op(t, &c, false), CLATTN_ERR_DEVICE_LIMIT);
    /* the step's state */
    c = good, c.s.dtype = CLATTN_F16;
    CHECK_STATUS(t, call_op(t, &c, true), CLATTN_ERR_UNSUPPORTED_DTYPE);
    c = good, c.s.shape[2] = 8;
    CHECK_STATUS(t, call_op(t, &c, true), CLATTN_ERR_SHAPE_MISMATCH);
    c = good, c.z.shape[3] = 8;
    CHECK_STATUS(t, call_op(t, &c, true), CLATTN_ERR_SHAPE_MISMATCH);
    c = good, c.z.offset = 6144; /* z over the state */
    CHECK_STATUS(t, call_op(t, &c, true), CLATTN_ERR_ALIASING);
    c = good, c.s.offset = 1024; /* the state over k */
    CHECK_STATUS(t, call_op(t, &c, true), CLATTN_ERR_ALIASING);
    c = good, c.k.shape[2] = 4, c.v.shape[2] = 4; /* a step takes as many queries as keys */
    CHECK_STATUS(t, call_op(t, &c, true), CLATTN_ERR_SHAPE_MISMATCH);
    cl_event event = (cl_event)1;
    CHECK_STATUS(t,
                 clattn_linear_attention(NULL, &good.k, &good.v, NULL, &good.out, NULL,
                                         clattn_env_queue(t->env), 0, NULL, &event),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t,
                 clattn_linear_attention(&good.q, NULL, &good.v, NULL, &good.out, NULL,
                                         clattn_env_queue(t->env), 0, NULL, &event),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t,
                 clattn_linear_attention_step(&good.q, &good.k, &good.v, NULL, NULL, &good.z,
                                              &good.out, NULL, clattn_env_queue(t->env), 0, NULL,
                                              &event),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK(t, event == NULL, "*event is set after a failure");
    clReleaseMemObject(buf);
    clReleaseMemObject(small);
}

/* A caller's workspace: exactly the size asked for works; smaller, or over a tensor, fails. */
static void caller_workspace(test_ctx *t) {
    la_spec s = spec(1, 2, 1, 100, 16, 24);
    s.causal = 1;
    la_data d;
    if (!prepare(t, &s, &d)) {
        free_data(&d);
        return;
    }
    clattn_tensor q = test_upload_bhsd(t, d.q, s.B, s.Hq, s.Sq, s.D, s.dt, 0), k, v;
    upload_keys(t, &s, d.k, d.v, &k, &v);
    const size_t n_out = (size_t)(s.B * s.Hq * s.Sq * s.Dv);
    /* out's buffer has room past out, so that as a workspace it is large enough for any chunk
     * and refused only for overlapping out */
    clattn_tensor o =
        clattn_tensor_4d(test_buffer(t, n_out * 4 + 65536), CLATTN_F32, s.B, s.Hq, s.Sq, s.Dv);
    size_t bytes = 0;
    cl_command_queue queue = clattn_env_queue(t->env);
    if (q.buffer && k.buffer && v.buffer && o.buffer) {
        CHECK_OK(t, clattn_linear_attention_workspace_size(&q, &k, &v, &d.mask, &o, NULL, queue,
                                                           &bytes));
        /* states: ceil(100 / CHUNK) chunks + 1 of 16*24+16 floats, and phi(k): 100*16 floats;
         * CHUNK is the device's row's (an H200's row has 32) */
        char row[256] = "";
        const char *at = clattn_tuning_lookup(clattn_env_device(t->env), "linear_attention",
                                              CLATTN_F32, row, sizeof row) == CLATTN_SUCCESS
                             ? strstr(row, "CHUNK=")
                             : NULL;
        /* a chunk longer than the keys is cut to them */
        const size_t chunk = at ? (size_t)(atoi(at + 6) < 100 ? atoi(at + 6) : 100) : 0,
                     chunks = chunk ? (100 + chunk - 1) / chunk : 0;
        CHECK(t, chunk > 0, "no CHUNK in the tuning row \"%s\"", row);
        CHECK(t, bytes == 4 * ((chunks + 1) * (16 * 24 + 16) + 100 * 16),
              "workspace %zu bytes (CHUNK %zu)", bytes, chunk);
        cl_mem ws = test_buffer(t, bytes), short_ws = test_buffer(t, bytes - 4);
        clattn_linear_options options = CLATTN_LINEAR_OPTIONS_DEFAULT;
        options.workspace = short_ws;
        CHECK_STATUS(
            t, clattn_linear_attention(&q, &k, &v, &d.mask, &o, &options, queue, 0, NULL, NULL),
            CLATTN_ERR_BUFFER_TOO_SMALL);
        options.workspace = o.buffer;
        CHECK_STATUS(
            t, clattn_linear_attention(&q, &k, &v, &d.mask, &o, &options, queue, 0, NULL, NULL),
            CLATTN_ERR_ALIASING);
        options.workspace = ws;
        clattn_scratch_peak_bytes(1);
        CHECK_OK(t,
                 clattn_linear_attention(&q, &k, &v, &d.mask, &o, &options, queue, 0, NULL, NULL));
        float *out = malloc(n_out * sizeof(float));
        if (test_read(t, o.buffer, out, n_out * 4))
            matches(t, &s, d.ref, d.scale, out, "workspace");
        CHECK(t, clattn_scratch_peak_bytes(0) == 0, "the call allocated scratch of its own");
        free(out);
        clReleaseMemObject(ws);
        clReleaseMemObject(short_ws);
    }
    clattn_tensor *all[4] = {&q, &k, &v, &o};
    for (int i = 0; i < 4; ++i)
        if (all[i]->buffer) clReleaseMemObject(all[i]->buffer);
    free_data(&d);
}

static const test_case cases[] = {
    {"feature_maps", feature_maps},
    {"chunk_boundaries", chunk_boundaries, TAG_SMOKE},
    {"long_sequence", long_sequence},
    {"very_negative_inputs", very_negative_inputs, TAG_SMOKE},
    {"lengths_and_alignment", lengths_and_alignment},
    {"storage_and_layouts", storage_and_layouts},
    {"causality_bit_exact", causality_bit_exact},
    {"padded_keys_never_read", padded_keys_never_read},
    {"step_equals_causal", step_equals_causal},
    {"uneven_steps_and_lengths", uneven_steps_and_lengths},
    {"recurrent_step_shapes", recurrent_step_shapes},
    {"both_launches", both_launches},
    {"tiles_match_rows_bit_for_bit", tiles_match_rows_bit_for_bit},
    {"tiles_keep_causality_and_padding", tiles_keep_causality_and_padding},
    {"trace_records_each_step", trace_records_each_step},
    {"bad_arguments", bad_arguments},
    {"caller_workspace", caller_workspace},
};
SUITE(linear_attention_suite, "linear_attention", cases);
