/* Rows for linear attention: GFLOP/s counting its two GEMM-like products, 4*B*H*S*D*Dv (the
 * same count causal or not: the causal form does about 1.5x that work, the products within
 * chunks), against the FMA kernel timed beside each row, and the ratio against PyTorch as its
 * users write it: non-causal (phi(q) @ (phi(k)^T v)) / (phi(q) @ phi(k).sum), causal with
 * cumsum over the [B,H,S,D,Dv] outer products. linear_step is one decoding token against the
 * running state (a memory row: the state is read and written once). linear_crossover times
 * causal linear attention beside causal fused softmax attention over a range of lengths and
 * reports the shortest from which linear attention is the faster. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct linear_case {
    const char
        *op; /* linear_attention | linear_attention_causal | linear_step | linear_crossover */
    const char *variant; /* "linear", or "softmax" (the fused attention, crossover rows only) */
    int64_t b, h, s, d;
} linear_case;

typedef struct linear_ctx {
    const linear_case *c;
    clattn_tensor q, k, v, out, state, z;
    clattn_mask mask;
    clattn_linear_options options; /* with a workspace the case allocates once */
    float *host[3];                /* q, k, v for the check */
} linear_ctx;

static bool is_softmax(const linear_case *c) {
    return strcmp(c->variant, "softmax") == 0;
}

static int run_linear(void *p, cl_command_queue queue) {
    linear_ctx *x = p;
    if (is_softmax(x->c))
        return clattn_attention(&x->q, &x->k, &x->v, 0.0f, &x->mask, &x->out, NULL, queue, 0, NULL,
                                NULL);
    if (x->state.buffer)
        return clattn_linear_attention_step(&x->q, &x->k, &x->v, NULL, &x->state, &x->z, &x->out,
                                            &x->options, queue, 0, NULL, NULL);
    return clattn_linear_attention(&x->q, &x->k, &x->v, &x->mask, &x->out, &x->options, queue, 0,
                                   NULL, NULL);
}

/* An f32 tensor, random in [-1, 1) (host: its values, or NULL); the state starts at 0. */
static int alloc_filled(clattn_env *env, const int64_t shape[4], clattn_tensor *t, uint64_t seed,
                        float **host) {
    int status = clattn_env_alloc(env, CLATTN_F32, shape, t);
    if (status == CLATTN_SUCCESS) status = bench_fill_random(env, t, seed, 1.0f, host);
    return status;
}

static int zero_fill(clattn_env *env, const clattn_tensor *t) {
    const cl_uchar zero = 0;
    return clEnqueueFillBuffer(clattn_env_queue(env), t->buffer, &zero, 1, 0,
                               (size_t)clattn_tensor_numel(t) * sizeof(float), 0, NULL, NULL);
}

/* The scratch, allocated once like a caller who runs the op in a loop would: a fresh buffer
 * per call pays the OS's page faults on first touch every time (at S=8192, 135 MB of them). */
static int alloc_workspace(clattn_env *env, linear_ctx *x) {
    clattn_linear_options causal = x->options;
    clattn_mask step_mask = {0};
    step_mask.causal = 1;
    size_t bytes = 0;
    int status = clattn_linear_attention_workspace_size(
        &x->q, &x->k, &x->v, x->state.buffer ? &step_mask : &x->mask, &x->out, &causal,
        clattn_env_queue(env), &bytes);
    return status == CLATTN_SUCCESS ? bench_workspace(env, bytes, &x->options.workspace) : status;
}

static int alloc_case(clattn_env *env, const linear_case *c, linear_ctx *x) {
    memset(x, 0, sizeof *x);
    x->c = c;
    x->mask.causal = strcmp(c->op, "linear_attention") != 0;
    const bool step = strcmp(c->op, "linear_step") == 0;
    const int64_t rows[4] = {c->b, c->h, step ? 1 : c->s, c->d};
    const int64_t state[4] = {c->b, c->h, c->d, c->d}, z[4] = {1, c->b, c->h, c->d};
    clattn_tensor *all[4] = {&x->q, &x->k, &x->v, &x->out};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = alloc_filled(env, rows, all[i], (uint64_t)(i + 30), i < 3 ? &x->host[i] : NULL);
    if (status == CLATTN_SUCCESS && step)
        status = clattn_env_alloc(env, CLATTN_F32, state, &x->state);
    if (status == CLATTN_SUCCESS && step) status = zero_fill(env, &x->state);
    if (status == CLATTN_SUCCESS && step) status = clattn_env_alloc(env, CLATTN_F32, z, &x->z);
    if (status == CLATTN_SUCCESS && step) status = zero_fill(env, &x->z);
    x->options = (clattn_linear_options)CLATTN_LINEAR_OPTIONS_DEFAULT;
    if (status == CLATTN_SUCCESS && !is_softmax(c)) status = alloc_workspace(env, x);
    return status;
}

static void free_case(linear_ctx *x) {
    clattn_tensor *all[6] = {&x->q, &x->k, &x->v, &x->out, &x->state, &x->z};
    for (int i = 0; i < 6; ++i) clattn_tensor_free(all[i]);
    for (int i = 0; i < 3; ++i) free(x->host[i]);
    if (x->options.workspace) clReleaseMemObject(x->options.workspace);
}

static double elu1(double v) {
    return v > 0 ? v + 1.0 : exp(v);
}

/* Query row (b, h, i) of linear attention in float64 over keys j <= i (causal; a step's state
 * starts at 0, so its one token sees itself) or every key. */
static void linear_row(const linear_ctx *x, int64_t b, int64_t h, int64_t i, double *out) {
    const linear_case *c = x->c;
    const int64_t d = c->d, s = x->q.shape[2], head = b * c->h + h;
    const float *q = x->host[0] + (head * s + i) * d, *k = x->host[1] + head * s * d;
    const float *v = x->host[2] + head * s * d;
    const int64_t keys = x->mask.causal || x->state.buffer ? i + 1 : s;
    double den = 0;
    for (int64_t e = 0; e < d; ++e) out[e] = 0;
    for (int64_t j = 0; j < keys; ++j) {
        double w = 0;
        for (int64_t e = 0; e < d; ++e) w += elu1(q[e]) * elu1(k[j * d + e]);
        den += w;
        for (int64_t e = 0; e < d; ++e) out[e] += w * v[j * d + e];
    }
    for (int64_t e = 0; e < d; ++e) out[e] /= den + CLATTN_LINEAR_EPS;
}

/* 8 sampled query rows, every output dim (outputs are weighted means of |v| < 1: errors are
 * taken against 1); the crossover's softmax rows against causal softmax attention. */
static int check_linear(void *p, clattn_env *env, bench_report *report, bool *ok) {
    linear_ctx *x = p;
    const linear_case *c = x->c;
    const int64_t d = c->d, s = x->q.shape[2];
    float *out = NULL;
    double *want = malloc((size_t)d * sizeof *want), *w = malloc((size_t)s * sizeof *w);
    int status = want && w ? bench_read(env, &x->out, &out) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    uint64_t state = 23;
    *ok = status == CLATTN_SUCCESS;
    for (int n = 0; n < 8 && *ok; ++n) {
        const size_t row = bench_sample(&state, (size_t)(c->b * c->h * s));
        const int64_t i = (int64_t)row % s, head = (int64_t)row / s;
        if (is_softmax(c))
            bench_attention_row(x->host[0] + (size_t)row * (size_t)d, x->host[1] + head * s * d,
                                x->host[2] + head * s * d, d, i + 1, w, want);
        else
            linear_row(x, head / c->h, head % c->h, i, want);
        for (int64_t e = 0; e < d && *ok; ++e)
            *ok = bench_close(report, "out", row * (size_t)d + (size_t)e,
                              out[row * (size_t)d + (size_t)e], want[e], 1.0, CLATTN_F32);
    }
    free(out), free(want), free(w);
    return status;
}

static const char *case_op(const void *cases, int i) {
    return ((const linear_case *)cases)[i].op;
}

static void case_key(const void *cases, int i, char *key, size_t capacity) {
    const linear_case *c = (const linear_case *)cases + i;
    snprintf(key, capacity, "%s f32 %lld,%lld,%lld,%lld", c->op, (long long)c->b, (long long)c->h,
             (long long)c->s, (long long)c->d);
}

/* The crossover rows' medians, by case index, for the closing line. */
static double crossover_ms[BENCH_MAX_CASES];

static int measure(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                   const void *cases, int i, double torch_ms, bench_report *report) {
    const linear_case *c = (const linear_case *)cases + i;
    const bool step = strcmp(c->op, "linear_step") == 0;
    linear_ctx x;
    bench_timing timing;
    double ceiling = 0;
    int status = alloc_case(env, c, &x);
    cl_command_queue queue = clattn_env_queue(env);
    char shape[96];
    const double bhd = (double)(c->b * c->h * c->d);
    if (step)
        snprintf(shape, sizeof shape, "B=%lld H=%lld n=1 D=%lld after any S", (long long)c->b,
                 (long long)c->h, (long long)c->d);
    else
        snprintf(shape, sizeof shape, "B=%lld H=%lld S=%lld D=%lld%s", (long long)c->b,
                 (long long)c->h, (long long)c->s, (long long)c->d,
                 is_softmax(c)   ? " causal(flops/2)"
                 : x.mask.causal ? " causal"
                                 : "");
    const bench_row_name row = {c->op, c->variant, CLATTN_F32, shape};
    bool wrong = false;
    if (status == CLATTN_SUCCESS)
        status = bench_check_row(report, env, run_linear, &x, check_linear, &row, &wrong);
    if (status == CLATTN_SUCCESS && !wrong)
        status = step ? bench_time_vs_copy(opt, ceilings, run_linear, &x, queue, &timing, &ceiling)
                      : bench_time_vs_fma(opt, ceilings, run_linear, &x, queue, &timing, &ceiling);
    /* linear: 4*B*H*S*D*Dv; softmax attention: 4*B*H*S*S*D, halved under causal masking */
    const double flops =
        is_softmax(c) ? 2.0 * bhd * (double)(c->s * c->s) : 4.0 * bhd * (double)(c->s * c->d);
    /* the step reads and writes the state, and reads q, k, v and writes out, once */
    const double bytes = 4.0 * (2.0 * bhd * (double)(c->d + 1) + 4.0 * bhd);
    if (status == CLATTN_SUCCESS && !wrong && step)
        status = bench_add_memory_row(report, env, c->op, c->variant, CLATTN_F32, shape, &timing,
                                      bytes, ceiling, torch_ms);
    else if (status == CLATTN_SUCCESS && !wrong)
        status = bench_add_compute_row(report, env, c->op, c->variant, CLATTN_F32, shape, &timing,
                                       flops, ceiling, torch_ms);
    if (status == CLATTN_SUCCESS && !wrong && i < BENCH_MAX_CASES)
        crossover_ms[i] = timing.median_ms;
    free_case(&x);
    return status;
}

/* The shortest length from which causal linear attention beats the fused softmax attention at
 * every measured length (cases come in softmax, linear pairs by increasing S). */
static void print_crossover(const linear_case *cases, int count) {
    int64_t from = -1;
    for (int i = count - 2; i >= 0; i -= 2) {
        if (strcmp(cases[i].op, "linear_crossover") != 0) break;
        if (crossover_ms[i + 1] <= 0 || crossover_ms[i] <= 0) return;
        if (crossover_ms[i + 1] >= crossover_ms[i]) break;
        from = cases[i].s;
    }
    if (from > 0)
        printf("crossover: causal linear attention is faster than causal fused attention from "
               "S=%lld on (B=%lld H=%lld D=%lld)\n",
               (long long)from, (long long)cases[count - 1].b, (long long)cases[count - 1].h,
               (long long)cases[count - 1].d);
    else
        printf("crossover: causal linear attention is not faster than causal fused attention "
               "up to S=%lld\n",
               (long long)cases[count - 1].s);
}

int bench_linear(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                 bench_report *report) {
    const int64_t b = opt->quick ? 1 : 4, s1 = opt->quick ? 256 : 1024,
                  s2 = opt->quick ? 512 : 4096;
    const int64_t s3 = opt->quick ? 1024 : 8192;
    const linear_case cases[] = {
        {"linear_attention", "linear", b, 8, s1, 64},
        {"linear_attention", "linear", b, 8, s2, 64},
        {"linear_attention", "linear", b, 8, s3, 64},
        {"linear_attention_causal", "linear", b, 8, s1, 64},
        {"linear_attention_causal", "linear", b, 8, s2, 64},
        {"linear_attention_causal", "linear", b, 8, s3, 64},
        {"linear_step", "linear", b, 8, 1, 64},
        {"linear_crossover", "softmax", 1, 8, 16, 64},
        {"linear_crossover", "linear", 1, 8, 16, 64},
        {"linear_crossover", "softmax", 1, 8, 32, 64},
        {"linear_crossover", "linear", 1, 8, 32, 64},
        {"linear_crossover", "softmax", 1, 8, 64, 64},
        {"linear_crossover", "linear", 1, 8, 64, 64},
        {"linear_crossover", "softmax", 1, 8, 128, 64},
        {"linear_crossover", "linear", 1, 8, 128, 64},
        {"linear_crossover", "softmax", 1, 8, 256, 64},
        {"linear_crossover", "linear", 1, 8, 256, 64},
        {"linear_crossover", "softmax", 1, 8, 512, 64},
        {"linear_crossover", "linear", 1, 8, 512, 64},
        {"linear_crossover", "softmax", 1, 8, 1024, 64},
        {"linear_crossover", "linear", 1, 8, 1024, 64},
        {"linear_crossover", "softmax", 1, 8, 2048, 64},
        {"linear_crossover", "linear", 1, 8, 2048, 64},
        {"linear_crossover", "softmax", 1, 8, 4096, 64},
        {"linear_crossover", "linear", 1, 8, 4096, 64},
    };
    const int count = (int)(sizeof cases / sizeof cases[0]);
    memset(crossover_ms, 0, sizeof crossover_ms);
    const bench_family family = {count, case_op, case_key, measure};
    int status = bench_run_family(opt, env, ceilings, report, &family, cases);
    if (status == CLATTN_SUCCESS && !opt->only &&
        (!opt->op || strcmp(opt->op, "linear_crossover") == 0))
        print_crossover(cases, count);
    return status;
}
