/* Randomized differential test of clattn_attention against the float64 reference: random
 * shapes (GQA groups, Sq, Sk, D, Dv from 1 to 256), per-tensor dtypes, permuted and padded
 * layouts (padding holds NaN and must stay unread and unwritten), every mask family with random
 * broadcasts, lengths out of range, NaN K / Inf V past the key length.
 *
 * Knobs: CLATTN_FUZZ_N cases (default 28, 10 with CLATTN_TEST_SMALL), CLATTN_FUZZ_SEED first
 * seed (1), CLATTN_FUZZ_INF puts rare +-inf/NaN in the bias, CLATTN_FUZZ_WIDE forces 64-bit
 * indices, CLATTN_FUZZ_V prints every case. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"
#include "ref.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct store {
    clattn_tensor t;
    void *host; /* raw storage image */
    size_t n;   /* elements in buffer */
} store;

static uint64_t R(uint64_t *s, uint64_t n) {
    return test_rand_u64(s) % n;
}

/* builds a random layout for logical shape sh; padding filled by `pad` value (float) */
static void make_layout(uint64_t *rng, clattn_dtype dt, const int64_t sh[4], int fancy, store *s) {
    int perm[4] = {0, 1, 2, 3};
    if (fancy)
        for (int i = 3; i > 0; --i) {
            int j = (int)R(rng, (uint64_t)i + 1), x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
    int64_t stride = 1;
    memset(&s->t, 0, sizeof s->t);
    s->t.dtype = dt;
    for (int k = 3; k >= 0; --k) { /* perm[3] innermost */
        int d = perm[k];
        s->t.shape[d] = sh[d];
        s->t.strides[d] = stride;
        stride *= sh[d] + (fancy ? (int64_t)R(rng, 3) : 0);
    }
    s->t.offset = fancy ? (size_t)R(rng, 7) : 0;
    s->n = s->t.offset + (size_t)stride + 3;
    s->host = malloc(s->n * 4);
}
static uint64_t idx(const clattn_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return t->offset + (uint64_t)(a * t->strides[0] + b * t->strides[1] + c * t->strides[2] +
                                  d * t->strides[3]);
}
static void fill_pad(store *s, float v) {
    for (size_t i = 0; i < s->n; ++i) ref_store(s->host, s->t.dtype, i, v);
}
static float rnd_in(uint64_t *rng, clattn_dtype dt, float lo, float hi) {
    uint16_t bits[2];
    ref_store(bits, dt, 0, test_rand_uniform(rng, lo, hi));
    return ref_load(bits, dt, 0);
}
static bool upload(test_ctx *t, store *s) {
    size_t bytes = s->n * clattn_dtype_size(s->t.dtype);
    s->t.buffer = test_buffer(t, bytes);
    return s->t.buffer && test_write(t, s->t.buffer, s->host, bytes);
}

static const int64_t dims[] = {1,  2,  3,  4,  5,  8,  12, 16,  20,  24,
                               32, 40, 48, 64, 72, 80, 96, 128, 200, 256};

static int one_case(test_ctx *t, uint64_t seed, int verbose) {
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 12345, *g = &rng;
    int64_t B = 1 + (int64_t)R(g, 3), Hkv = 1 + (int64_t)R(g, 3), grp = 1 + (int64_t)R(g, 3);
    int64_t Hq = Hkv * grp;
    int64_t Sq = 1 + (int64_t)R(g, R(g, 2) ? 40 : 9), Sk = 1 + (int64_t)R(g, R(g, 2) ? 70 : 20);
    if (R(g, 8) == 0) Sq = 60 + (int64_t)R(g, 90); /* past one 64-query group of the tiles kernel */
    /* the composed path, the lanes variant and the key split stay out of runs under Oclgrind's
     * --uninitialized (see test_under_uninit_checker) */
    const bool uninit = test_under_uninit_checker();
    /* the fused variants (blocks, tiles, keys, lanes, micro, mma, units), then
     * CLATTN__ATTENTION_VARIANTS: composed */
    const int variant =
        (int)R(g, uninit ? CLATTN__ATTENTION_LANES : CLATTN__ATTENTION_VARIANTS + 1);
    const int splits = R(g, 3) == 0 && !uninit ? 2 + (int)R(g, 6) : -1;
    int64_t D = dims[R(g, sizeof dims / sizeof dims[0])];
    int64_t Dv = R(g, 2) ? D : dims[R(g, sizeof dims / sizeof dims[0])];
    if (R(g, 3) == 0) {
        D = 16 * (1 + (int64_t)R(g, 4));
        Dv = 16 * (1 + (int64_t)R(g, 4));
    }
    clattn_dtype dts[3] = {CLATTN_F32, CLATTN_F16, CLATTN_BF16};
    clattn_dtype qd = dts[R(g, 3)], kd = dts[R(g, 3)], vd = dts[R(g, 3)], od = dts[R(g, 3)],
                 ld = dts[R(g, 3)];
    int fancy = (int)R(g, 2);
    int want_lse = (int)R(g, 2);
    float scale = R(g, 3) == 0 ? 0.0f : test_rand_uniform(g, -1.0f, 1.0f);
    /* mask */
    clattn_mask mask;
    memset(&mask, 0, sizeof mask);
    ref_mask rm;
    memset(&rm, 0, sizeof rm);
    int use_mask = (int)R(g, 4) != 0;
    int32_t klen[4], qlen[4];
    store keep = {0}, bias = {0}, kl = {0}, ql = {0}, al = {0};
    uint8_t *keep_dense = NULL;
    double *bias_dense = NULL, alibi[16];
    int poison = 0;
    if (use_mask) {
        mask.causal = rm.causal = (int)R(g, 2);
        mask.align = R(g, 2) ? CLATTN_ALIGN_BOTTOM_RIGHT : CLATTN_ALIGN_TOP_LEFT;
        rm.bottom_right = mask.align == CLATTN_ALIGN_BOTTOM_RIGHT;
        if (R(g, 3) == 0) {
            mask.window = rm.window = 1;
            mask.window_left = rm.left = (int64_t)R(g, 7) - 1;
            mask.window_right = rm.right = (int64_t)R(g, 7) - 1;
            if (R(g, 2)) mask.global_stride = rm.global_stride = (int64_t)R(g, 5);
        }
        if (!rm.window || (rm.left < 0 && rm.right < 0))
            rm.global_stride = 0; /* design: irrelevant then */
        if (R(g, 3) == 0) mask.softcap = (float)(rm.softcap = 1.0 + (double)R(g, 5));
        mask.empty_rows_nan = rm.empty_nan = (int)R(g, 3) == 0;
        if (R(g, 2)) {
            for (int b = 0; b < B; ++b) klen[b] = (int32_t)R(g, (uint64_t)Sk + 3) - 1;
            int64_t sh[4] = {1, 1, 1, B};
            make_layout(g, CLATTN_I32, sh, 0, &kl);
            memcpy(kl.host, klen, 4 * (size_t)B);
            if (!upload(t, &kl)) return -1;
            mask.key_lengths = &kl.t;
            rm.key_lengths = klen;
            poison =
                (int)R(g, 2) &&
                variant != CLATTN__ATTENTION_VARIANTS; /* composed: 0 * Inf is NaN, as in torch */
        }
        if (R(g, 3) == 0) {
            for (int b = 0; b < B; ++b) qlen[b] = (int32_t)R(g, (uint64_t)Sq + 3) - 1;
            int64_t sh[4] = {1, 1, 1, B};
            make_layout(g, CLATTN_I32, sh, 0, &ql);
            memcpy(ql.host, qlen, 4 * (size_t)B);
            if (!upload(t, &ql)) return -1;
            mask.query_lengths = &ql.t;
            rm.query_lengths = qlen;
        }
        if (R(g, 3) == 0) { /* keep, random broadcast */
            int64_t sh[4] = {R(g, 2) ? B : 1, R(g, 2) ? Hq : 1, R(g, 3) ? Sq : 1, R(g, 4) ? Sk : 1};
            make_layout(g, CLATTN_U8, sh, fancy, &keep);
            memset(keep.host, 0, keep.n);
            int dens = 1 + (int)R(g, 9);
            keep_dense = malloc((size_t)(B * Hq * Sq * Sk));
            for (int64_t a = 0; a < B; ++a)
                for (int64_t h = 0; h < Hq; ++h)
                    for (int64_t i = 0; i < Sq; ++i)
                        for (int64_t j = 0; j < Sk; ++j) {
                            uint64_t at = idx(&keep.t, sh[0] > 1 ? a : 0, sh[1] > 1 ? h : 0,
                                              sh[2] > 1 ? i : 0, sh[3] > 1 ? j : 0);
                            if (a < sh[0] && h < sh[1] && i < sh[2] && j < sh[3])
                                ((uint8_t *)keep.host)[at] =
                                    (uint8_t)(R(g, 10) < (uint64_t)dens ? 1 + R(g, 200) : 0);
                            keep_dense[((a * Hq + h) * Sq + i) * Sk + j] =
                                ((uint8_t *)keep.host)[at];
                        }
            if (!upload(t, &keep)) return -1;
            mask.keep = &keep.t;
            rm.keep = keep_dense;
            rm.keep_strides[0] = Hq * Sq * Sk, rm.keep_strides[1] = Sq * Sk,
            rm.keep_strides[2] = Sk, rm.keep_strides[3] = 1;
        }
        if (R(g, 3) == 0) { /* bias */
            int64_t sh[4] = {R(g, 2) ? B : 1, R(g, 2) ? Hq : 1, R(g, 3) ? Sq : 1, R(g, 4) ? Sk : 1};
            make_layout(g, dts[R(g, 3)], sh, fancy, &bias);
            fill_pad(&bias, NAN);
            for (int64_t a = 0; a < sh[0]; ++a)
                for (int64_t h = 0; h < sh[1]; ++h)
                    for (int64_t i = 0; i < sh[2]; ++i)
                        for (int64_t j = 0; j < sh[3]; ++j) {
                            float v = test_rand_uniform(g, -3, 3);
                            if (R(g, 40) == 0) v = -INFINITY;
                            if (getenv("CLATTN_FUZZ_INF") && R(g, 300) == 0)
                                v = R(g, 2) ? INFINITY : NAN;
                            ref_store(bias.host, bias.t.dtype, idx(&bias.t, a, h, i, j), v);
                        }
            bias_dense = malloc(sizeof(double) * (size_t)(B * Hq * Sq * Sk));
            for (int64_t a = 0; a < B; ++a)
                for (int64_t h = 0; h < Hq; ++h)
                    for (int64_t i = 0; i < Sq; ++i)
                        for (int64_t j = 0; j < Sk; ++j)
                            bias_dense[((a * Hq + h) * Sq + i) * Sk + j] =
                                ref_load(bias.host, bias.t.dtype,
                                         idx(&bias.t, sh[0] > 1 ? a : 0, sh[1] > 1 ? h : 0,
                                             sh[2] > 1 ? i : 0, sh[3] > 1 ? j : 0));
            if (!upload(t, &bias)) return -1;
            mask.bias = &bias.t;
            rm.bias = bias_dense;
            rm.bias_strides[0] = Hq * Sq * Sk, rm.bias_strides[1] = Sq * Sk,
            rm.bias_strides[2] = Sk, rm.bias_strides[3] = 1;
        }
        if (R(g, 3) == 0) {
            int64_t sh[4] = {1, 1, 1, Hq};
            make_layout(g, CLATTN_F32, sh, 0, &al);
            for (int h = 0; h < Hq; ++h)
                ((float *)al.host)[h] = (float)(alibi[h] = 1.0 / (double)(2 << h));
            if (!upload(t, &al)) return -1;
            mask.alibi_slopes = &al.t;
            rm.alibi = alibi;
        }
    }
    /* q k v */
    int64_t qs[4] = {B, Hq, Sq, D}, ks[4] = {B, Hkv, Sk, D}, vs[4] = {B, Hkv, Sk, Dv},
            os[4] = {B, Hq, Sq, Dv};
    store q, k, v, o, l = {0};
    make_layout(g, qd, qs, fancy, &q);
    make_layout(g, kd, ks, fancy, &k);
    make_layout(g, vd, vs, fancy, &v);
    make_layout(g, od, os, fancy, &o);
    fill_pad(&q, NAN);
    fill_pad(&k, NAN);
    fill_pad(&v, NAN);
    fill_pad(&o, 12345.0f);
    double *Q = malloc(8 * (size_t)(B * Hq * Sq * D)), *K = malloc(8 * (size_t)(B * Hkv * Sk * D)),
           *V = malloc(8 * (size_t)(B * Hkv * Sk * Dv));
    for (int64_t a = 0; a < B; ++a)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Sq; ++i)
                for (int64_t e = 0; e < D; ++e) {
                    float x = rnd_in(g, qd, -2, 2);
                    ref_store(q.host, qd, idx(&q.t, a, h, i, e), x);
                    Q[((a * Hq + h) * Sq + i) * D + e] = x;
                }
    for (int64_t a = 0; a < B; ++a)
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t j = 0; j < Sk; ++j) {
                int bad = poison && j >= (klen[a] < 0 ? 0 : klen[a]);
                for (int64_t e = 0; e < D; ++e) {
                    float x = bad ? NAN : rnd_in(g, kd, -2, 2);
                    ref_store(k.host, kd, idx(&k.t, a, h, j, e), x);
                    K[((a * Hkv + h) * Sk + j) * D + e] = x;
                }
                for (int64_t e = 0; e < Dv; ++e) {
                    float x = bad ? INFINITY : rnd_in(g, vd, -2, 2);
                    ref_store(v.host, vd, idx(&v.t, a, h, j, e), x);
                    V[((a * Hkv + h) * Sk + j) * Dv + e] = x;
                }
            }
    if (!upload(t, &q) || !upload(t, &k) || !upload(t, &v) || !upload(t, &o)) return -1;
    if (want_lse) {
        int64_t sh[4] = {1, B, Hq, Sq};
        make_layout(g, ld, sh, fancy, &l);
        fill_pad(&l, 777.0f);
        if (!upload(t, &l)) return -1;
    }
    /* reference */
    size_t ns = (size_t)(B * Hq * Sq * Sk);
    double *x = malloc(8 * ns), *p = malloc(8 * ns), *rl = malloc(8 * (size_t)(B * Hq * Sq));
    for (int64_t a = 0; a < B; ++a)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Sq; ++i)
                for (int64_t j = 0; j < Sk; ++j) {
                    double d = 0;
                    for (int64_t e = 0; e < D; ++e)
                        d += Q[((a * Hq + h) * Sq + i) * D + e] *
                             K[((a * Hkv + h / grp) * Sk + j) * D + e];
                    x[((a * Hq + h) * Sq + i) * Sk + j] = d;
                }
    double sc = scale != 0.0f ? scale : 1.0 / sqrt((double)D);
    ref_softmax(x, B, Hq, Sq, Sk, sc, &rm, p, rl, NULL);
    const bool fused = variant < CLATTN__ATTENTION_VARIANTS;
    clattn__hook_set(CLATTN__HOOK_ATTENTION_VARIANT, fused ? variant : -1);
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, splits);
    const clattn_attention_options path = {fused ? CLATTN_PATH_FUSED : CLATTN_PATH_COMPOSED, NULL,
                                           NULL};
    int status =
        clattn_attention_ex(&q.t, &k.t, &v.t, scale, use_mask ? &mask : NULL, &o.t,
                            want_lse ? &l.t : NULL, &path, clattn_env_queue(t->env), 0, NULL, NULL);
    clattn__hook_set(CLATTN__HOOK_ATTENTION_VARIANT, -1);
    clattn__hook_set(CLATTN__HOOK_ATTENTION_SPLITS, -1);
    int bad = 0;
    char desc[512];
    snprintf(desc, sizeof desc,
             "seed %llu: B%lld Hq%lld Hkv%lld Sq%lld Sk%lld D%lld Dv%lld q%s k%s v%s o%s lse%s(%d) "
             "fancy%d scale%g mask%d c%d br%d w%d(%lld,%lld) gs%lld sc%g en%d kl%d ql%d keep%d "
             "bias%d(%s) alibi%d poison%d variant%d splits%d",
             (unsigned long long)seed, (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq,
             (long long)Sk, (long long)D, (long long)Dv, clattn_dtype_name(qd),
             clattn_dtype_name(kd), clattn_dtype_name(vd), clattn_dtype_name(od),
             clattn_dtype_name(ld), want_lse, fancy, scale, use_mask, mask.causal, (int)mask.align,
             mask.window, (long long)mask.window_left, (long long)mask.window_right,
             (long long)mask.global_stride, mask.softcap, mask.empty_rows_nan,
             mask.key_lengths != NULL, mask.query_lengths != NULL, mask.keep != NULL,
             mask.bias != NULL, mask.bias ? clattn_dtype_name(bias.t.dtype) : "-",
             mask.alibi_slopes != NULL, poison, variant, splits);
    if (verbose) printf("%s\n", desc);
    if (status != CLATTN_SUCCESS) {
        test_fail_at(t, __FILE__, __LINE__, "%s: status %s: %s", desc, clattn_status_name(status),
                     clattn_last_error());
        bad = 1;
    }
    void *got = malloc(o.n * 4), *gl = want_lse ? malloc(l.n * 4) : NULL;
    if (!bad && (!test_read(t, o.t.buffer, got, o.n * clattn_dtype_size(od)) ||
                 (want_lse && !test_read(t, l.t.buffer, gl, l.n * clattn_dtype_size(ld)))))
        bad = 1;
    double rtol = od == CLATTN_F32 ? 3e-5 : od == CLATTN_F16 ? 1.2e-3 : 8e-3;
    double atol = od == CLATTN_F32 ? 3e-5 : od == CLATTN_F16 ? 2e-4 : 2e-3;
    const bool on_tiles = variant == CLATTN__ATTENTION_MMA || variant == CLATTN__ATTENTION_UNITS;
    if (on_tiles && qd != CLATTN_F32 && kd == qd && vd == qd) {
        /* it rounds the weights to the storage type: u max|v| more (test_attention.c) */
        double vmax = 0.0;
        for (size_t i = 0; i < (size_t)(B * Hkv * Sk * Dv); ++i)
            if (isfinite(V[i])) vmax = fmax(vmax, fabs(V[i]));
        atol += (qd == CLATTN_F16 ? 0x1p-11 : 0x1p-8) * vmax;
    }
    if (!bad) {
        /* padding of o untouched */
        uint8_t *mark = calloc(o.n, 1);
        for (int64_t a = 0; a < B; ++a)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t i = 0; i < Sq; ++i)
                    for (int64_t e = 0; e < Dv; ++e) mark[idx(&o.t, a, h, i, e)] = 1;
        for (size_t z = 0; z < o.n && !bad; ++z)
            if (!mark[z] && !ref_same_element(got, o.host, od, z, false)) {
                test_fail_at(t, __FILE__, __LINE__, "%s: out padding %zu overwritten", desc, z);
                bad = 1;
            }
        free(mark);
    }
    for (int64_t a = 0; a < B && !bad; ++a)
        for (int64_t h = 0; h < Hq && !bad; ++h)
            for (int64_t i = 0; i < Sq && !bad; ++i) {
                size_t row = (size_t)((a * Hq + h) * Sq + i);
                for (int64_t e = 0; e < Dv && !bad; ++e) {
                    double r = 0;
                    int empty = 1;
                    for (int64_t j = 0; j < Sk; ++j) {
                        double w = p[row * (size_t)Sk + (size_t)j];
                        if (w != 0.0) {
                            empty = 0;
                            r += w * V[((a * Hkv + h / grp) * Sk + j) * Dv + e];
                        } else if (isnan(w))
                            r = NAN;
                    }
                    (void)empty;
                    /* empty rows: ref_softmax gives 0 or NaN for all p */
                    int allnan = 1;
                    for (int64_t j = 0; j < Sk; ++j)
                        if (!isnan(p[row * (size_t)Sk + (size_t)j])) allnan = 0;
                    if (allnan) r = NAN;
                    double y = ref_load(got, od, idx(&o.t, a, h, i, e));
                    int ok = (isnan(r) && isnan(y)) || (isinf(r) && r == y) ||
                             fabs(y - r) <= atol + rtol * fabs(r);
                    if (!ok) {
                        test_fail_at(t, __FILE__, __LINE__,
                                     "%s: out[%lld,%lld,%lld,%lld] = %.9g expected %.9g", desc,
                                     (long long)a, (long long)h, (long long)i, (long long)e, y, r);
                        bad = 1;
                    }
                }
                if (want_lse && !bad) {
                    double r = rl[row], y = ref_load(gl, ld, idx(&l.t, 0, a, h, i));
                    double lt = ld == CLATTN_F32 ? 1e-4 : ld == CLATTN_F16 ? 2e-3 : 1e-2;
                    int ok = (isnan(r) && isnan(y)) || (isinf(r) && r == y) ||
                             fabs(y - r) <= lt * (1 + fabs(r));
                    if (!ok) {
                        test_fail_at(t, __FILE__, __LINE__,
                                     "%s: lse[%lld,%lld,%lld] = %.9g expected %.9g", desc,
                                     (long long)a, (long long)h, (long long)i, y, r);
                        bad = 1;
                    }
                }
            }
    store *all[] = {&q, &k, &v, &o, &l, &keep, &bias, &kl, &ql, &al};
    for (size_t z = 0; z < sizeof all / sizeof all[0]; ++z) {
        if (all[z]->t.buffer) clReleaseMemObject(all[z]->t.buffer);
        free(all[z]->host);
    }
    free(Q);
    free(K);
    free(V);
    free(x);
    free(p);
    free(rl);
    free(got);
    free(gl);
    free(keep_dense);
    free(bias_dense);
    return bad;
}

static void fuzz(test_ctx *t) {
    const uint64_t saved_limit = clattn__narrow_index_limit();
    if (getenv("CLATTN_FUZZ_WIDE")) clattn__narrow_index_limit_set(0);
    const char *n_s = getenv("CLATTN_FUZZ_N"), *s0 = getenv("CLATTN_FUZZ_SEED"),
               *vb = getenv("CLATTN_FUZZ_V");
    int n = n_s ? atoi(n_s) : test_large_shapes(t) ? 28 : 10;
    uint64_t start = s0 ? strtoull(s0, NULL, 10) : 1;
    int fails = 0;
    char first[2048] = "";
    for (int c = 0; c < n; ++c) {
        t->failed = false;
        int r = one_case(t, start + (uint64_t)c, vb != NULL);
        if (r) {
            ++fails;
            if (!first[0]) snprintf(first, sizeof first, "%s", t->message);
            fprintf(stderr, "FAIL %s\n", t->message);
            t->message[0] = 0;
        }
    }
    clattn__narrow_index_limit_set(saved_limit);
    t->failed = fails > 0;
    if (fails) snprintf(t->message, sizeof t->message, "%d/%d failed; first: %s", fails, n, first);
}

static const test_case cases[] = {{"fuzz", fuzz}};
SUITE_TAGGED(attention_fuzz_suite, "attention_fuzz", cases, TAG_SMOKE);
