/* Rows for the backward ops, against the FMA kernel timed beside each row and PyTorch's
 * autograd of the forward as its users write it.
 *
 * attention_backward[_causal|_memory]: GFLOP/s counting FlashAttention's convention, 2.5x the
 * forward's 4*B*H*Sq*Sk*D (the five products dS needs: q k^T, dO v^T, dV, dQ, dK), halved under
 * causal masking; the peer differentiates matmul -> masked_fill -> softmax -> matmul (or SDPA
 * where torch has it). The memory row runs a length whose scores would not fit, and reports
 * the scratch; the cross row attends many queries to a few keys (a diffusion model's 64 x 64
 * latents to 77 text tokens), where the keys pass has few groups, and the gqa row the same with
 * the 8 query heads sharing one kv head (multi-query attention), fewer groups yet; the bias row
 * adds a
 * learned bias shared by the batches ([1,H,S,S], as T5's and Swin's relative position biases)
 * and asks for its gradient, as PyTorch's autograd computes it too. The forward runs once,
 * untimed, for out and lse.
 *
 * linear_attention_backward[_causal]: GFLOP/s counting 8*B*H*S*D*Dv, twice the forward's count
 * (dq and the key side each take two products of its size); the peer differentiates the
 * forward's phi(k)^T v form, causal the cumsum over the outer products. */
#include "bench.h"
#include "../tests/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct backward_case {
    const char *op; /* attention_backward | attention_backward_causal | ..._memory | ..._cross |
                     * ..._bias, or linear_attention_backward[_causal] */
    int64_t b, h, s, d;
    clattn_attention_path path; /* attention: fused, or the composed (GEMM) path */
    int64_t sk;                 /* keys, where not s (the cross and gqa rows) */
    int64_t hkv;                /* kv heads, where not h (the gqa row) */
} backward_case;

static int64_t keys_of(const backward_case *c) {
    return c->sk ? c->sk : c->s;
}

static int64_t kv_heads_of(const backward_case *c) {
    return c->hkv ? c->hkv : c->h;
}

/* The query heads a kv head serves. */
static int64_t group_of(const backward_case *c) {
    return c->h / kv_heads_of(c);
}

/* q, k, v, dout, then the forward's out, then the gradients dq, dk, dv */
enum { Q, K, V, DOUT, OUT, DQ, DK, DV, TENSORS };

typedef struct backward_ctx {
    const backward_case *c;
    clattn_tensor t[TENSORS], lse;
    clattn_mask mask;
    clattn_attention_backward_options options;
    clattn_linear_options linear; /* the linear rows' (feature map elu1) */
    size_t workspace_bytes;
    float *host[4];            /* q, k, v, dout */
    clattn_tensor bias, dbias; /* the bias row's [1,H,S,S] */
    float *host_bias;
} backward_ctx;

static bool is_linear(const backward_case *c) {
    return strncmp(c->op, "linear", 6) == 0;
}

static bool has_bias(const backward_case *c) {
    return strcmp(c->op, "attention_backward_bias") == 0;
}

static bool is_causal(const backward_case *c) {
    return strstr(c->op, "causal") || strcmp(c->op, "attention_backward_memory") == 0;
}

static int run_backward(void *p, cl_command_queue queue) {
    backward_ctx *x = p;
    if (is_linear(x->c))
        return clattn_linear_attention_backward(&x->t[Q], &x->t[K], &x->t[V], &x->t[DOUT], &x->mask,
                                                &x->t[DQ], &x->t[DK], &x->t[DV], &x->linear, queue,
                                                0, NULL, NULL);
    return clattn_attention_backward(&x->t[Q], &x->t[K], &x->t[V], &x->t[OUT], &x->t[DOUT], &x->lse,
                                     0.0f, &x->mask, &x->t[DQ], &x->t[DK], &x->t[DV], &x->options,
                                     queue, 0, NULL, NULL);
}

static int alloc_case(clattn_env *env, const backward_case *c, backward_ctx *x) {
    memset(x, 0, sizeof *x);
    x->c = c;
    x->mask.causal = is_causal(c);
    x->options.path = c->path;
    const int64_t rows[4] = {c->b, c->h, c->s, c->d};
    const int64_t keys[4] = {c->b, kv_heads_of(c), keys_of(c), c->d};
    const int64_t lse_shape[4] = {1, c->b, c->h, c->s};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < TENSORS && status == CLATTN_SUCCESS; ++i) {
        const bool key_side = i == K || i == V || i == DK || i == DV;
        status = clattn_env_alloc(env, CLATTN_F32, key_side ? keys : rows, &x->t[i]);
        if (status == CLATTN_SUCCESS && i <= DOUT)
            status = bench_fill_random(env, &x->t[i], (uint64_t)(i + 40), 1.0f, &x->host[i]);
    }
    if (status == CLATTN_SUCCESS) status = clattn_env_alloc(env, CLATTN_F32, lse_shape, &x->lse);
    if (status == CLATTN_SUCCESS && has_bias(c)) {
        const int64_t bias_shape[4] = {1, c->h, c->s, c->s};
        status = clattn_env_alloc(env, CLATTN_F32, bias_shape, &x->bias);
        if (status == CLATTN_SUCCESS)
            status = bench_fill_random(env, &x->bias, 45, 1.0f, &x->host_bias);
        if (status == CLATTN_SUCCESS)
            status = clattn_env_alloc(env, CLATTN_F32, bias_shape, &x->dbias);
        x->mask.bias = &x->bias, x->options.dbias = &x->dbias;
    }
    cl_command_queue queue = clattn_env_queue(env);
    x->linear = (clattn_linear_options)CLATTN_LINEAR_OPTIONS_DEFAULT;
    if (status == CLATTN_SUCCESS && is_linear(c))
        status = clattn_linear_attention_backward_workspace_size(
            &x->t[Q], &x->t[K], &x->t[V], &x->t[DOUT], &x->mask, &x->t[DQ], &x->t[DK], &x->t[DV],
            &x->linear, queue, &x->workspace_bytes);
    if (status == CLATTN_SUCCESS && is_linear(c))
        return bench_workspace(env, x->workspace_bytes, &x->linear.workspace);
    if (status == CLATTN_SUCCESS)
        status = clattn_attention(&x->t[Q], &x->t[K], &x->t[V], 0.0f, &x->mask, &x->t[OUT], &x->lse,
                                  queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_attention_backward_workspace_size(
            &x->t[Q], &x->t[K], &x->t[V], &x->t[OUT], &x->t[DOUT], &x->lse, &x->mask, &x->t[DQ],
            &x->t[DK], &x->t[DV], &x->options, queue, &x->workspace_bytes);
    return status == CLATTN_SUCCESS
               ? bench_workspace(env, x->workspace_bytes, &x->options.workspace)
               : status;
}

static void free_case(backward_ctx *x) {
    for (int i = 0; i < TENSORS; ++i) clattn_tensor_free(&x->t[i]);
    clattn_tensor_free(&x->lse);
    clattn_tensor_free(&x->bias), clattn_tensor_free(&x->dbias);
    free(x->host_bias);
    if (x->options.workspace) clReleaseMemObject(x->options.workspace);
    if (x->linear.workspace) clReleaseMemObject(x->linear.workspace);
    for (int i = 0; i < 4; ++i) free(x->host[i]);
}

/* Query row i of head (b, h), in float64: dq_i = scale sum_j P_ij (dO_i . v_j - D_i) k_j. */
static void reference_dq_row(const backward_ctx *x, int64_t bh, int64_t i, double *w, double *dq) {
    const backward_case *c = x->c;
    const int64_t d = c->d, keys = x->mask.causal ? i + 1 : keys_of(c);
    const int64_t bhk = bh / group_of(c);
    const float *q = x->host[Q] + (bh * c->s + i) * d, *dout = x->host[DOUT] + (bh * c->s + i) * d;
    const float *k = x->host[K] + bhk * keys_of(c) * d, *v = x->host[V] + bhk * keys_of(c) * d;
    const double scale = 1.0 / sqrt((double)d);
    double top = -INFINITY, sum = 0, delta = 0;
    for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += (double)q[e] * k[j * d + e];
        top = fmax(top, w[2 * j] = dot * scale);
    }
    for (int64_t j = 0; j < keys; ++j) sum += (w[2 * j] = exp(w[2 * j] - top));
    for (int64_t j = 0; j < keys; ++j) {
        double dp = 0;
        for (int64_t e = 0; e < d; ++e) dp += (double)dout[e] * v[j * d + e];
        w[2 * j] /= sum, w[2 * j + 1] = dp;
        delta += w[2 * j] * dp;
    }
    for (int64_t e = 0; e < d; ++e) dq[e] = 0;
    for (int64_t j = 0; j < keys; ++j)
        for (int64_t e = 0; e < d; ++e)
            dq[e] += scale * w[2 * j] * (w[2 * j + 1] - delta) * k[j * d + e];
}

/* The whole gradients of one kv head (bhk, of all the batches' kv heads) and its query heads
 * against tests/ref.c's float64 reference (O(heads S^2 D)). */
static bool check_head(const backward_ctx *x, int64_t bhk, const float *const got[3],
                       bench_report *report) {
    const backward_case *c = x->c;
    const int64_t sk = keys_of(c), group = group_of(c);
    const size_t n[3] = {(size_t)(group * c->s * c->d), (size_t)(sk * c->d), (size_t)(sk * c->d)};
    const size_t at[3] = {(size_t)bhk * n[0], (size_t)bhk * n[1], (size_t)bhk * n[2]};
    double *want[3] = {malloc(n[0] * 8), malloc(n[1] * 8), malloc(n[2] * 8)};
    const ref_mask mask = {.causal = x->mask.causal};
    const ref_linear linear = {1, 1, 1, c->s, sk, c->d, c->d, CLATTN_FEATURE_ELU1, 1e-6, &mask};
    const float *in[4] = {x->host[Q] + at[0], x->host[K] + at[1], x->host[V] + at[2],
                          x->host[DOUT] + at[0]};
    bool ok = want[0] && want[1] && want[2];
    if (ok && is_linear(c))
        ok = ref_linear_attention_backward(&linear, in[0], in[1], in[2], in[3], want[0], want[1],
                                           want[2]);
    else if (ok)
        ok = ref_attention_backward(in[0], in[1], in[2], in[3], 1, group, 1, c->s, sk, c->d, c->d,
                                    1.0 / sqrt((double)c->d), &mask, want[0], want[1], want[2],
                                    NULL);
    static const char *const names[3] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3 && ok; ++g)
        for (size_t e = 0; e < n[g] && ok; ++e)
            ok = bench_close(report, names[g], at[g] + e, got[g][at[g] + e], want[g][e], 1.0,
                             CLATTN_F32);
    for (int g = 0; g < 3; ++g) free(want[g]);
    return ok;
}

/* The bias row: the last head of every batch whole (dq, dk, dv), and its bias's gradient, which
 * sums over the batches, against tests/ref.c's float64 reference (B heads' work: the row's
 * shapes keep it to seconds). *ok is whether they agree. */
static int check_bias_head(const backward_ctx *x, const float *const got[3], const float *dbias,
                           bench_report *report, bool *ok) {
    const backward_case *c = x->c;
    const size_t rows = (size_t)(c->s * c->d), scores = (size_t)(c->s * c->s);
    const size_t count = (size_t)c->b * rows, h = (size_t)c->h - 1;
    float *in[4];
    double *want[4] = {calloc(count, 8), calloc(count, 8), calloc(count, 8), calloc(scores, 8)};
    double *bias = malloc(scores * 8);
    bool ready = want[0] && want[1] && want[2] && want[3] && bias;
    for (int g = 0; g < 4; ++g) ready = (in[g] = ready ? malloc(count * 4) : NULL) != NULL;
    for (int64_t b = 0; b < c->b && ready; ++b) /* head h of each batch, dense [B,1,S,D] */
        for (int g = 0; g < 4; ++g)
            memcpy(in[g] + (size_t)b * rows, x->host[g] + ((size_t)b * (size_t)c->h + h) * rows,
                   rows * 4);
    for (size_t e = 0; e < scores && ready; ++e) bias[e] = x->host_bias[h * scores + e];
    const ref_mask mask = {.bias = bias, .bias_strides = {0, 0, c->s, 1}};
    if (ready)
        ready = ref_attention_backward(in[0], in[1], in[2], in[3], c->b, 1, 1, c->s, c->s, c->d,
                                       c->d, 1.0 / sqrt((double)c->d), &mask, want[0], want[1],
                                       want[2], want[3]);
    static const char *const names[3] = {"dq", "dk", "dv"};
    *ok = ready;
    for (int64_t b = 0; b < c->b && *ok; ++b)
        for (int g = 0; g < 3 && *ok; ++g)
            for (size_t e = 0; e < rows && *ok; ++e) {
                const size_t at = ((size_t)b * (size_t)c->h + h) * rows + e;
                *ok = bench_close(report, names[g], at, got[g][at], want[g][(size_t)b * rows + e],
                                  1.0, CLATTN_F32);
            }
    for (size_t e = 0; e < scores && *ok; ++e)
        *ok = bench_close(report, "dbias", h * scores + e, dbias[h * scores + e], want[3][e], 1.0,
                          CLATTN_F32);
    for (int g = 0; g < 4; ++g) free(in[g]), free(want[g]);
    free(bias);
    return ready ? CLATTN_SUCCESS : CLATTN_ERR_OUT_OF_HOST_MEMORY;
}

/* Attention: 8 sampled dq rows at every length. The last head whole where its O(Sq Sk)
 * reference is quick (linear attention's longer rows are checked by the suite, not here); the
 * bias row checks its own way. */
static int check_backward(void *p, clattn_env *env, bench_report *report, bool *ok) {
    backward_ctx *x = p;
    const backward_case *c = x->c;
    float *got[3] = {NULL, NULL, NULL};
    double *w = malloc((size_t)keys_of(c) * 2 * sizeof *w);
    double *want = malloc((size_t)c->d * sizeof *want);
    int status = w && want ? CLATTN_SUCCESS : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    for (int g = 0; g < 3 && status == CLATTN_SUCCESS; ++g)
        status = bench_read(env, &x->t[DQ + g], &got[g]);
    uint64_t state = 17;
    *ok = status == CLATTN_SUCCESS;
    if (*ok && has_bias(c)) {
        float *dbias = NULL;
        status = bench_read(env, &x->dbias, &dbias);
        if (status == CLATTN_SUCCESS)
            status = check_bias_head(x, (const float *const *)got, dbias, report, ok);
        *ok = *ok && status == CLATTN_SUCCESS;
        free(dbias);
        for (int g = 0; g < 3; ++g) free(got[g]);
        free(w), free(want);
        return status;
    }
    for (int n = 0; n < 8 && *ok && !is_linear(c); ++n) {
        const size_t row = bench_sample(&state, (size_t)(c->b * c->h * c->s));
        reference_dq_row(x, (int64_t)row / c->s, (int64_t)row % c->s, w, want);
        for (int64_t e = 0; e < c->d && *ok; ++e)
            *ok = bench_close(report, "dq", row * (size_t)c->d + (size_t)e,
                              got[0][row * (size_t)c->d + (size_t)e], want[e], 1.0, CLATTN_F32);
    }
    if (*ok && group_of(c) * c->s * keys_of(c) <= 2048 * 2048)
        *ok = check_head(x, c->b * kv_heads_of(c) - 1, (const float *const *)got, report);
    for (int g = 0; g < 3; ++g) free(got[g]);
    free(w), free(want);
    return status;
}

static const char *case_op(const void *cases, int i) {
    return ((const backward_case *)cases)[i].op;
}

/* The peer's key: the memory row runs no peer (its scores would need 8 GiB); the cross row's
 * dims are B,H,Sq,Sk,D, the gqa row's B,H,Hkv,Sq,Sk,D. */
static void case_key(const void *cases, int i, char *key, size_t capacity) {
    const backward_case *c = (const backward_case *)cases + i;
    char kv[24] = "", keys[24] = "";
    if (c->hkv) snprintf(kv, sizeof kv, "%lld,", (long long)c->hkv);
    if (c->sk) snprintf(keys, sizeof keys, "%lld,", (long long)c->sk);
    snprintf(key, capacity, "%s f32 %lld,%lld,%s%lld,%s%lld", c->op, (long long)c->b,
             (long long)c->h, kv, (long long)c->s, keys, (long long)c->d);
}

static int measure(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                   const void *cases, int i, double torch_ms, bench_report *report) {
    const backward_case *c = (const backward_case *)cases + i;
    backward_ctx x;
    bench_timing timing;
    double ceiling = 0;
    int status = alloc_case(env, c, &x);
    char shape[160];
    char length[48];
    if (c->sk)
        snprintf(length, sizeof length, "Sq=%lld Sk=%lld", (long long)c->s, (long long)c->sk);
    else
        snprintf(length, sizeof length, "S=%lld", (long long)c->s);
    char heads[48];
    if (c->hkv)
        snprintf(heads, sizeof heads, "Hq=%lld Hkv=%lld", (long long)c->h, (long long)c->hkv);
    else
        snprintf(heads, sizeof heads, "H=%lld", (long long)c->h);
    snprintf(shape, sizeof shape, "B=%lld %s %s D=%lld%s", (long long)c->b, heads, length,
             (long long)c->d,
             !is_causal(c)  ? ""
             : is_linear(c) ? " causal"
                            : " causal(flops/2)");
    const char *variant = c->path == CLATTN_PATH_COMPOSED ? "composed" : "fused";
    const bench_row_name row = {c->op, variant, CLATTN_F32, shape};
    bool wrong = false;
    if (status == CLATTN_SUCCESS)
        status = bench_check_row(report, env, run_backward, &x, check_backward, &row, &wrong);
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_time_vs_fma(opt, ceilings, run_backward, &x, clattn_env_queue(env), &timing,
                                   &ceiling);
    if (strcmp(c->op, "attention_backward_memory") == 0) {
        const size_t n = strlen(shape);
        snprintf(shape + n, sizeof shape - n, " scratch %.1f MiB",
                 (double)x.workspace_bytes / 1048576.0);
    }
    const double flops = is_linear(c) ? 8.0 * (double)(c->b * c->h * c->s * c->d * c->d)
                                      : 10.0 * (double)(c->b * c->h * c->s * keys_of(c) * c->d) *
                                            (is_causal(c) ? 0.5 : 1.0);
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_add_compute_row(report, env, c->op, variant, CLATTN_F32, shape, &timing,
                                       flops, ceiling, torch_ms);
    free_case(&x);
    return status;
}

int bench_attention_backward(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                             bench_report *report) {
    const int64_t b = opt->quick ? 1 : 4, s = opt->quick ? 256 : 1024;
    const int64_t long_s = opt->quick ? 2048 : 16384;
    const clattn_attention_path fused = CLATTN_PATH_FUSED, composed = CLATTN_PATH_COMPOSED;
    const backward_case cases[] = {
        {"attention_backward", b, 8, s, 64, fused, 0, 0},
        {"attention_backward", b, 8, s, 64, composed, 0, 0},
        {"attention_backward_causal", b, 8, s, 64, fused, 0, 0},
        {"attention_backward_memory", 1, 8, long_s, 64, fused, 0, 0},
        {"attention_backward_cross", opt->quick ? 1 : 2, 8, opt->quick ? 1024 : 4096, 64, fused, 77,
         0},
        {"attention_backward_gqa", 1, 8, opt->quick ? 1024 : 4096, 64, fused, 77, 1},
        {"attention_backward_bias", b, 8, s, 64, fused, 0, 0},
        {"linear_attention_backward", b, 8, s, 64, fused, 0, 0},
        {"linear_attention_backward_causal", b, 8, s, 64, fused, 0, 0},
        {"linear_attention_backward_causal", b, 8, opt->quick ? 512 : 4096, 64, fused, 0, 0},
    };
    const bench_family family = {sizeof cases / sizeof cases[0], case_op, case_key, measure};
    return bench_run_family(opt, env, ceilings, report, &family, cases);
}
