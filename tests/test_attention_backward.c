/* Tests of the gradients of attention and linear attention. First the float64 references
 * themselves (tests/ref.c: ref_attention_backward, ref_linear_attention_backward), against
 * central finite differences of the forward references on small shapes with every mask part:
 * the kernels' tests will trust them. */
#include "harness.h"
#include "ref.h"

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

static const test_case cases[] = {
    {"reference_matches_finite_differences", reference_matches_finite_differences,
     TAG_HOST | TAG_SMOKE},
    {"linear_reference_matches_finite_differences", linear_reference_matches_finite_differences,
     TAG_HOST | TAG_SMOKE},
};
SUITE(attention_backward_suite, "attention_backward", cases);
